"""Communication time of a rank's collectives: payload x lower-bound factor / link bandwidth.

Per collective of ``n`` ranks moving ``P`` bytes per rank (``analysis.counts.Collective``),
the bytes each rank must send (and receive) over its link, at least:

* all-reduce: ``2 (n - 1) / n * P`` (a reduce-scatter, then an all-gather: the ring and
  tree algorithms' bound); ``(n - 1) / n * P`` where the switch reduces in the network
  (NVLS, SHARP: each rank sends its data once and receives the reduced result once);
* all-gather, reduce-scatter, all-to-all: ``(n - 1) / n * P`` (``P`` the full tensor:
  every rank lacks or must hand off the other ranks' ``n - 1`` parts);
* permute (a send and a receive): ``P``.

The link is the chip's scale-up fabric (NVLink, Infinity Fabric, ICI) while the group's
ranks share one scale-up domain; bandwidths are per GPU and per direction (``[links]`` in
the chip's spec). Ranks are numbered domain by domain (rank ``r`` in domain
``r // domain``). A group that spans ``m`` domains with ``g`` members in each moves, at
least, what crosses the domains over the scale-out link (InfiniBand, Ethernet, DCN): the
``m``-rank collective over ``P / g`` per GPU (the ``g`` GPUs of a domain share its
outbound data), ``(n - g) / n * P`` for an all-to-all; and inside each domain the
``g``-rank collective over the scale-up link. The two run concurrently in a hierarchical
algorithm, so the bound is their max (sending the whole payload over the scale-out link
would not be a lower bound). Communication overlaps compute and memory perfectly in the
bound (``max``); the sum without overlap is given beside it. No per-message latency is
charged: a speed of light is a bandwidth bound.

>>> factor("all_reduce", 8, False), factor("all_reduce", 8, True), factor("all_gather", 4, False)
(1.75, 0.875, 0.75)
>>> from solbound.hardware.catalog import load_spec
>>> h100 = load_spec("h100-sxm")
>>> hops(h100, "all_reduce", tuple(range(16)), 2**20)   # 2 domains of 8: max of both
[('scale_up', 0.875, 1048576, 450000000000.0), ('scale_out', 1.0, 131072, 50000000000.0)]
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


def _scale_up(spec: Spec) -> Link:
    ln = spec.links
    if not ln.get("scale_up"):
        raise CommError(f"{spec.id} has no link figures ([links] in its spec): a program with "
                        f"collectives cannot be bounded on it; choose a chip that lists them "
                        f"(h100-sxm, h200, b200, gb200-nvl72, a100-sxm, mi300x, tpu-v5e)")
    return Link("scale_up", float(ln["scale_up"]), bool(ln.get("in_network_reduction")))


def _scale_out(spec: Spec, ranks: int) -> Link:
    ln = spec.links
    if not ln.get("scale_out"):
        raise CommError(f"{spec.id}: a group of {ranks} ranks exceeds its scale-up domain of "
                        f"{_domain(spec)} and it lists no scale-out link")
    return Link("scale_out", float(ln["scale_out"]), False)


def _domain(spec: Spec) -> int:
    return int(spec.links.get("scale_up_domain", 1))


def link(spec: Spec, ranks: int) -> Link:
    """The link a group of ``ranks`` GPUs talks over on ``spec``."""
    up = _scale_up(spec)
    return up if ranks <= _domain(spec) else _scale_out(spec, ranks)


def hops(spec: Spec, kind: str, group: tuple[int, ...], nbytes: int, perm=(),
         ) -> list[tuple[str, float, float, float]]:
    """``(link, factor, bytes it applies to, bandwidth)`` for each link a collective of
    rank 0's ``group`` (global ranks) uses on ``spec``; its time is the max over them."""
    up, domain, n = _scale_up(spec), _domain(spec), len(group)
    home = group[0] // domain if group else 0
    g = sum(1 for r in group if r // domain == home)          # members in rank 0's domain
    if kind == "permute":
        pos = {r: i for i, r in enumerate(group)}
        peers = [group[d] for s_, d in perm if s_ == pos.get(group[0])] + \
            [group[s_] for s_, d in perm if d == pos.get(group[0])]
        if all(p // domain == home for p in peers):
            return [("scale_up", 1.0 if peers else 0.0, nbytes, up.bandwidth)]
        return [("scale_out", 1.0, nbytes, _scale_out(spec, n).bandwidth)]
    if g == n:
        return [("scale_up", factor(kind, n, up.in_network), nbytes, up.bandwidth)]
    out = _scale_out(spec, n)
    rows = []
    if g > 1:
        rows.append(("scale_up", factor(kind, g, up.in_network), nbytes, up.bandwidth))
    if kind == "all_to_all":
        rows.append(("scale_out", (n - g) / n, nbytes, out.bandwidth))
    else:
        rows.append(("scale_out", factor(kind, -(-n // g), False), nbytes // g, out.bandwidth))
    return rows


@dataclass(frozen=True)
class CommTime:
    seconds: float
    link_bandwidth: float       # the slowest link of the largest group (bytes/s per direction)


def comm_time(collectives, spec: Spec) -> CommTime:
    """Communication time of a rank's collectives on ``spec`` (zero without any)."""
    total, widest = 0.0, None
    for c in collectives:
        hs = hops(spec, c.kind, c.members, c.bytes, c.perm)
        total += c.calls * max(f * b / bw for _, f, b, bw in hs)
        if widest is None or c.ranks > widest[0]:
            widest = (c.ranks, min(bw for _, _, _, bw in hs))
    return CommTime(total, widest[1] if widest else 0.0)
