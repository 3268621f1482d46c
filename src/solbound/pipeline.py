"""From a lowered program to a report: the stages after the frontend (graph, counts,
bounds), the same for every frontend."""

from __future__ import annotations

import time

from .analysis.counts import count_program
from .bounds.roofline import Policy, program_bounds
from .graph.einsum import build_graph
from .hardware.catalog import Spec, parse_archs
from .report.report import Report


def specs_of(arch) -> list[Spec]:
    """The chips ``arch`` names: a comma list, a :class:`Spec`, or a list of either."""
    if isinstance(arch, Spec):
        return [arch]
    if arch is None or isinstance(arch, str):
        return parse_archs(arch)
    return [a if isinstance(a, Spec) else parse_archs(a)[0] for a in arch]


def analyze_lowered(lowered, *, source: str, arch=None, precision_policy: str | Policy | None = None,
                    timings: dict | None = None, cache=None, modes=None) -> Report:
    """Counts and bounds for an already-lowered program (IR stage onwards). ``cache``: the
    on-chip capacity of the cache-aware bound (a level such as ``"smem"``, a size such as
    ``"4MiB"`` or bytes; default each chip's last-level cache). ``modes``: the fidelities
    to bound (default all; a sweep that asks for fused bounds alone skips the cache-aware
    schedule search)."""
    from .bounds.fidelity import parse_cache
    t0 = time.perf_counter()
    policy = precision_policy if isinstance(precision_policy, Policy) else Policy.parse(precision_policy)
    specs = specs_of(arch)
    graph = build_graph(lowered.program)
    counts = count_program(graph)
    memo: dict = {}
    cache = parse_cache(cache)
    bounds = [b for s in specs for b in program_bounds(counts, s, policy, graph, cache, memo,
                                                  modes)]
    timings = dict(timings or {})
    timings["analysis_s"] = time.perf_counter() - t0
    return Report(source=source, lowered=lowered, graph=graph, counts=counts, specs=specs,
                  policy=policy, bounds=bounds, timings=timings, memo=memo)
