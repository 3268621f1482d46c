"""Communication time of a rank's collectives: payload x lower-bound factor / link bandwidth.

Per collective of ``n`` ranks moving ``P`` bytes per rank (``analysis.counts.Collective``),
the bytes each rank must send (and receive) over its link, at least:

* all-reduce: ``2 (n - 1) / n * P`` (a reduce-scatter, then an all-gather: the ring and
  tree algorithms' bound); ``(n - 1) / n * P`` where the switch reduces in the network
  (NVLS, SHARP: each rank sends its data once and receives the reduced result once);
* all-gather, reduce-scatter, all-to-all: ``(n - 1) / n * P`` (``P`` the full tensor:
  every rank lacks or must hand off the other ranks' ``n - 1`` parts);
* permute (a send and a receive): ``P``.

The link is the chip's scale-up fabric (NVLink, Infinity Fabric, ICI) while the group fits
in its domain, else the scale-out link (InfiniBand, Ethernet, DCN); bandwidths are per GPU
and per direction (``[links]`` in the chip's spec). Communication overlaps compute and
memory perfectly in the bound (``max``); the sum without overlap is given beside it.

>>> factor("all_reduce", 8, False), factor("all_reduce", 8, True), factor("all_gather", 4, False)
(1.75, 0.875, 0.75)
"""

from __future__ import annotations

from dataclasses import dataclass

from ..hardware.catalog import Spec


class CommError(ValueError):
    """A collective that cannot be bounded on a chip (no link figures)."""


def factor(kind: str, ranks: int, in_network: bool) -> float:
    """Bytes over the link per byte of payload, at least (see the module doc)."""
    if ranks <= 1:
        return 0.0
    share = (ranks - 1) / ranks
    if kind == "all_reduce":
        return share if in_network else 2 * share
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return share
    if kind == "permute":
        return 1.0
    raise ValueError(f"unknown collective {kind!r}")


@dataclass(frozen=True)
class Link:
    name: str            # "scale_up" or "scale_out"
    bandwidth: float     # bytes/s per direction per GPU
    in_network: bool


def link(spec: Spec, ranks: int) -> Link:
    """The link a group of ``ranks`` GPUs talks over on ``spec``."""
    ln = spec.links
    if not ln.get("scale_up"):
        raise CommError(f"{spec.id} has no link figures ([links] in its spec): a program with "
                        f"collectives cannot be bounded on it; choose a chip that lists them "
                        f"(h100-sxm, h200, b200, gb200-nvl72, a100-sxm, mi300x, tpu-v5e)")
    if ranks <= int(ln.get("scale_up_domain", 1)):
        return Link("scale_up", float(ln["scale_up"]), bool(ln.get("in_network_reduction")))
    if not ln.get("scale_out"):
        raise CommError(f"{spec.id}: a group of {ranks} ranks exceeds its scale-up domain of "
                        f"{int(ln.get('scale_up_domain', 1))} and it lists no scale-out link")
    return Link("scale_out", float(ln["scale_out"]), False)


@dataclass(frozen=True)
class CommTime:
    seconds: float
    link_bandwidth: float       # the link of the largest group (bytes/s per direction)
    per_collective: list        # (collective, link, factor, seconds)


def comm_time(collectives, spec: Spec) -> CommTime:
    """Communication time of a rank's collectives on ``spec`` (zero without any)."""
    total, rows, widest = 0.0, [], None
    for c in collectives:
        ln = link(spec, c.ranks)
        f = factor(c.kind, c.ranks, ln.in_network)
        t = c.bytes * c.calls * f / ln.bandwidth
        total += t
        rows.append((c, ln, f, t))
        if widest is None or c.ranks > widest[0]:
            widest = (c.ranks, ln.bandwidth)
    return CommTime(total, widest[1] if widest else 0.0, rows)
