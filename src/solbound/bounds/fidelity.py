"""Fidelities: pluggable DRAM traffic models, one registration each.

A fidelity takes the program's counts and graph and the chip, and returns the bytes that
must cross DRAM with an explanation. The roofline (``bounds/roofline.py``), the report
(terminal and JSON) and the KernelBench runner iterate over ``FIDELITIES``: a fourth
fidelity is one more registration here.

* ``unfused``: one DRAM round trip per framework operator (chip independent);
* ``fused``: an unbounded on-chip buffer: only program inputs, parameters, state and
  outputs cross DRAM, each once (chip independent);
* ``cache-aware``: a buffer of the chip's on-chip capacity (its last-level cache by
  default, or ``cache=`` a level or a size): the least traffic over fused, tiled schedules
  (``analysis/cache.py``).

>>> list(FIDELITIES)
['unfused', 'fused', 'cache-aware']
>>> parse_cache("4MiB"), parse_cache("l2"), parse_cache(None)
(4194304, 'l2', None)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from ..analysis.counts import ProgramCounts
from ..hardware.catalog import Spec


@dataclass
class ModeTraffic:
    bytes: int
    explanation: str
    cache_bytes: int | None = None       # the on-chip capacity the traffic assumes
    detail: Any = None


@dataclass
class FidelityInput:
    counts: ProgramCounts
    graph: Any                           # graph.einsum.Graph
    spec: Spec
    cache: str | int | None = None       # an on-chip level, a size in bytes, or None
    memo: dict = field(default_factory=dict)   # shared across chips for one program


@dataclass(frozen=True)
class Fidelity:
    name: str
    summary: str
    traffic: Callable[[FidelityInput], ModeTraffic]
    serial: bool = False                 # also bound each operator alone, in sequence


FIDELITIES: dict[str, Fidelity] = {}


def register(name: str, summary: str, serial: bool = False):
    def deco(fn: Callable[[FidelityInput], ModeTraffic]):
        FIDELITIES[name] = Fidelity(name, summary, fn, serial)
        return fn
    return deco


class CacheOptionError(ValueError):
    pass


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 10**6, "mb": 10**6,
          "mib": 2**20, "g": 10**9, "gb": 10**9, "gib": 2**30}


def parse_cache(text: str | int | None) -> str | int | None:
    """``--cache``: an on-chip level name (``l2``, ``llc``, ``smem``, ``regs``, ``vmem``)
    or a size such as ``4MiB``, ``512KiB``, ``50MB`` or a number of bytes."""
    if text is None or isinstance(text, int):
        return text
    t = str(text).strip().lower()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]*)", t)
    if m:
        if m.group(2) not in _UNITS:
            raise CacheOptionError(f"--cache {text!r}: unknown unit {m.group(2)!r} (use B, KiB, "
                                   f"MiB, GiB, KB, MB, GB)")
        return int(float(m.group(1)) * _UNITS[m.group(2)])
    if re.fullmatch(r"[a-z][a-z0-9_]*", t):
        return t
    raise CacheOptionError(f"--cache {text!r}: give a size such as 4MiB or a level such as "
                           f"l2, smem or regs")


def capacity_of(spec: Spec, cache: str | int | None) -> int:
    if isinstance(cache, int):
        if cache <= 0:
            raise CacheOptionError(f"--cache {cache}: the capacity must be positive")
        return cache
    try:
        return int(spec.capacity(cache))
    except ValueError as e:
        raise CacheOptionError(str(e)) from None


@register("unfused", "one DRAM round trip per framework operator", serial=True)
def _unfused(x: FidelityInput) -> ModeTraffic:
    return ModeTraffic(x.counts.unfused.bytes, "every operator reads its operands from DRAM "
                                               "and writes its results back")


@register("fused", "an unbounded on-chip buffer: inputs, parameters, state and outputs once")
def _fused(x: FidelityInput) -> ModeTraffic:
    return ModeTraffic(x.counts.fused.bytes, "only program inputs, parameters, state and "
                                             "outputs cross DRAM, each once")


@register("cache-aware", "the chip's on-chip capacity: the best fused, tiled schedule")
def _cache_aware(x: FidelityInput) -> ModeTraffic:
    from ..analysis.cache import ProgramCache
    if x.cache is None and not any(x.spec.onchip.get(v) for v in ("llc", "l2", "cmem", "vmem")):
        # a chip whose vendor publishes no cache size (Apple's M series): no capacity to
        # tile for, so the traffic is the fused one (an unbounded buffer: still a bound)
        return ModeTraffic(x.counts.fused.bytes, f"{x.spec.id} publishes no on-chip capacity: "
                                                 f"the fused traffic (an unbounded buffer)")
    cap = capacity_of(x.spec, x.cache)
    pcache = x.memo.get("program_cache")
    if pcache is None:
        pcache = x.memo["program_cache"] = ProgramCache(x.graph, x.counts)
    r = pcache.traffic(cap)
    level = x.cache if isinstance(x.cache, str) else (x.spec.dram_cache() if x.cache is None
                                                      else "given")
    return ModeTraffic(r.bytes, f"{level} ({cap:,} B): {r.explanation}", cap, r)


__all__ = ["FIDELITIES", "Fidelity", "FidelityInput", "ModeTraffic", "register",
           "parse_cache", "capacity_of", "CacheOptionError"]
