"""The inverse roofline: what a chip needs for a program to meet a latency target, and how
one program fares across chips.

For a target ``T`` (seconds; a rate ``r`` in Hz is ``T = 1 / r``) and a fidelity moving ``B``
bytes, the least DRAM bandwidth is ``B / T`` and the least peak of each pipe is its work over
``T`` (the work of one pipe alone; pipes that share a physical unit add up in time). On a
given chip each resource falls short by a factor: bandwidth ``(B / T) / BW``, and each physical
unit ``(its seconds of work on that chip) / T`` (1 = just enough). The program meets the target on
the chip when no factor exceeds 1; the largest factor binds.

>>> factors({"memory_seconds": 2e-3, "unit_seconds": {"tensor": 1e-3, "vector": 4e-3}}, 2e-3)
{'bandwidth': 1.0, 'tensor': 0.5, 'vector': 2.0}
"""

from __future__ import annotations

import re

from .roofline import Bound, kernel_pipe_work

SCHEMA = "solbound.provision/1"


class TargetError(ValueError):
    pass


def parse_latency(text: str) -> float:
    """``2ms``, ``500us``, ``0.002`` (seconds) -> seconds.

    >>> parse_latency("2ms"), parse_latency("250 us"), parse_latency("1.5s")
    (0.002, 0.00025, 1.5)
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?(?:e-?\d+)?)\s*(s|ms|us|µs|ns)?\s*", str(text))
    if not m:
        raise TargetError(f"--latency {text!r}: give a time such as 2ms, 500us or 0.002")
    v = float(m.group(1)) * {"s": 1, None: 1, "ms": 1e-3, "us": 1e-6, "µs": 1e-6,
                             "ns": 1e-9}[m.group(2)]
    if v <= 0:
        raise TargetError(f"--latency {text!r}: the target must be positive")
    return v


def parse_rate(text: str) -> float:
    """``500`` or ``500Hz`` -> the latency it allows (seconds).

    >>> parse_rate("500"), parse_rate("1kHz")
    (0.002, 0.001)
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(hz|khz)?\s*", str(text).lower())
    if not m or float(m.group(1)) <= 0:
        raise TargetError(f"--rate {text!r}: give a positive rate such as 500 or 500Hz")
    hz = float(m.group(1)) * (1000 if m.group(2) == "khz" else 1)
    return 1.0 / hz


def factors(bound, target: float) -> dict[str, float]:
    """Resource -> the factor by which it falls short of meeting ``target`` on this chip
    (``bound``: a :class:`Bound` or its JSON dict)."""
    get = (lambda k: bound[k]) if isinstance(bound, dict) else (lambda k: getattr(bound, k))
    out = {"bandwidth": get("memory_seconds") / target}
    for unit, secs in sorted(get("unit_seconds").items()):
        out[unit] = secs / target
    comm = get("comm_seconds") if isinstance(bound, dict) and "comm_seconds" in bound \
        else getattr(bound, "comm_seconds", 0.0) if not isinstance(bound, dict) else 0.0
    if comm:
        out["link"] = comm / target
    return out


def requirements(report, target: float) -> list[dict]:
    """Per fidelity: the least DRAM bandwidth (B/s) and the least peak per pipe (FLOP/s)
    that meet ``target`` (chip independent but for the cache-aware bytes, taken on the first
    chip)."""
    work: dict[str, float] = {}
    for k in report.counts.kernels:
        for p, n in kernel_pipe_work(k, report.policy).items():
            work[p] = work.get(p, 0.0) + n
    first = report.specs[0].id if report.specs else None
    out = []
    for b in report.bounds:
        if b.arch != first:
            continue
        out.append({"mode": b.mode, "bytes": b.bytes, "bandwidth": b.bytes / target,
                    "pipes": {p: n / target for p, n in sorted(work.items())},
                    **({"cache_bytes": b.cache_bytes} if b.cache_bytes else {})})
    return out


def chips(report, target: float) -> list[dict]:
    """Every (chip, fidelity): its factors, whether it meets the target, what binds; sorted
    by shortfall (the largest factor), smallest first."""
    rows = []
    for b in report.bounds:
        f = factors(b, target)
        binding = max(f, key=f.get)
        rows.append({"arch": b.arch, "mode": b.mode, "seconds": b.seconds,
                     "meets": f[binding] <= 1.0, "binding": binding, "shortfall": f[binding],
                     "factors": f})
    rows.sort(key=lambda r: (r["mode"], r["shortfall"]))
    return rows


def cache_curve(report, target: float) -> list[dict]:
    """Cache-aware: the bandwidth the target needs as a function of on-chip capacity (a
    larger buffer buys a smaller bandwidth), powers of two from 64 KiB until the traffic
    meets the fused traffic."""
    pc = report.program_cache()
    return [{"capacity": c, "bytes": pc.traffic(c).bytes,
             "bandwidth": pc.traffic(c).bytes / target} for c in pc.capacities()]


def _fits(report) -> dict | None:
    """A training step's resident bytes against each chip's DRAM capacity (``None`` for a
    program that is not a step): ``{arch: {"capacity", "fits"}}``."""
    tr = getattr(report, "training", None)
    return tr["memory"]["fits"] if tr else None


def provision(report, target: float) -> dict:
    """The ``solbound.provision/1`` document. A training step adds the least DRAM capacity
    it needs (its resident bytes) and whether each chip has it; a chip that meets the time
    but not the capacity does not meet the target."""
    doc = {"schema": SCHEMA, "source": report.source, "target_seconds": target,
           "requirements": requirements(report, target),
           "chips": chips(report, target),
           "cache_curve": cache_curve(report, target)}
    fits = _fits(report)
    if fits is not None:
        doc["dram_capacity"] = report.training["memory"]["total"]
        for r in doc["chips"]:
            f = fits.get(r["arch"], {})
            r["fits_dram"] = f.get("fits")
            if f.get("fits") is False:
                r["meets"] = False
    return doc


def projection(report) -> list[dict]:
    """Per chip: each fidelity's bound, the fusion benefit (unfused / fused time) and the
    cache penalty (cache-aware / fused time), and what binds the fused bound."""
    out = []
    for spec in report.specs:
        bs = {b.mode: b for b in report.bounds if b.arch == spec.id}
        fused = bs.get("fused")
        row = {"arch": spec.id, "seconds": {m: b.seconds for m, b in bs.items()}}
        if fused and fused.seconds:
            if "unfused" in bs:
                row["fusion_benefit"] = bs["unfused"].seconds / fused.seconds
            if "cache-aware" in bs:
                row["cache_penalty"] = bs["cache-aware"].seconds / fused.seconds
            row["binding"] = binding_resource(fused)
        fits = _fits(report)
        if fits is not None:
            row["fits_dram"] = fits.get(spec.id, {}).get("fits")
        out.append(row)
    return out


def binding_resource(b: Bound) -> str:
    if b.bound == "communication":
        return "link"
    return "bandwidth" if b.bound == "memory" else (b.binding_unit or "compute")


def resident_bytes(report) -> int:
    """What one rank holds in DRAM while the program runs, at least: its parameters,
    buffers, constants and inputs (a KV cache passed in) and its outputs."""
    roles = {"input", "parameter", "buffer", "constant", "output"}
    return sum(t.nbytes for t in report.program.tensors if t.role in roles)


def parallel_projection(reports: dict, target: float | None = None,
                        mode: str = "fused") -> dict:
    """One program at several tensor-parallel degrees (``reports``: degree -> the report of
    that degree's per-rank program): per chip and degree the bound, its compute, memory and
    link time, the communication's share of the time without overlap, the bytes a rank
    holds and whether they fit its DRAM; with ``target``, whether the degree meets it, and
    per chip the least degree that does (fits and is fast enough)."""
    rows = []
    for degree, rep in sorted(reports.items()):
        held = resident_bytes(rep)
        for b in rep.bounds:
            if b.mode != mode:
                continue
            spec = next(s for s in rep.specs if s.id == b.arch)
            cap = spec.entries.get("dram.capacity", {}).get("value")
            no_overlap = b.no_overlap_seconds if b.no_overlap_seconds is not None else b.seconds
            row = {"arch": b.arch, "tp": degree, "seconds": b.seconds,
                   "compute_seconds": b.compute_seconds, "memory_seconds": b.memory_seconds,
                   "comm_seconds": b.comm_seconds, "no_overlap_seconds": no_overlap,
                   "comm_share": b.comm_seconds / no_overlap if no_overlap else 0.0,
                   "binding": binding_resource(b), "resident_bytes": held,
                   "dram_capacity": cap, "fits_dram": None if cap is None else held <= cap}
            if target is not None:
                row["meets"] = b.seconds <= target and row["fits_dram"] is not False
            rows.append(row)
    doc = {"schema": "solbound.parallel/1", "mode": mode, "rows": rows}
    if target is not None:
        doc["target_seconds"] = target
        least = {}
        for r in rows:
            if r["meets"] and (r["arch"] not in least or r["tp"] < least[r["arch"]]):
                least[r["arch"]] = r["tp"]
        doc["least_tp"] = {a: least.get(a) for a in dict.fromkeys(r["arch"] for r in rows)}
    return doc


__all__ = ["parse_latency", "parse_rate", "factors", "requirements", "chips", "cache_curve",
           "provision", "projection", "TargetError", "SCHEMA", "parallel_projection",
           "resident_bytes"]
