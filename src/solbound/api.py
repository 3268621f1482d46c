"""The one-call Python API: ``solbound.analyze(module, inputs, arch=...)``."""

from __future__ import annotations

import os
import time
from typing import Sequence

from .analysis.counts import count_program
from .bounds.roofline import Policy, program_bounds
from .graph.einsum import build_graph
from .hardware.catalog import Spec, parse_archs
from .report.report import Report


def _specs(arch) -> list[Spec]:
    if arch is None or isinstance(arch, str):
        return parse_archs(arch)
    return [a if isinstance(a, Spec) else parse_archs(a)[0] for a in arch]


def analyze_lowered(lowered, *, source: str, arch=None, precision_policy: str | Policy | None = None,
                    timings: dict | None = None) -> Report:
    """Counts and bounds for an already-lowered program (IR stage onwards)."""
    t0 = time.perf_counter()
    policy = precision_policy if isinstance(precision_policy, Policy) else Policy.parse(precision_policy)
    specs = _specs(arch)
    graph = build_graph(lowered.program)
    counts = count_program(graph)
    bounds = [b for s in specs for b in program_bounds(counts, s, policy)]
    timings = dict(timings or {})
    timings["analysis_s"] = time.perf_counter() - t0
    return Report(source=source, lowered=lowered, graph=graph, counts=counts, specs=specs,
                  policy=policy, bounds=bounds, timings=timings)


def analyze(module, inputs: Sequence, arch=None, precision_policy: str | None = None,
            source: str | None = None, validate: bool = False,
            keep_experts_dispatch: bool = False, routing: str | None = None,
            select_fraction: float | None = None, **validate_opts) -> Report:
    """Analyze ``module(*inputs)``: capture, lower to the loop IR, count, bound.

    ``inputs`` may be real or meta tensors; capture itself runs on fake tensors.
    ``arch`` is a comma-separated string of catalog ids, a list of ids/specs, or
    ``None`` for the default set. ``routing`` is the assumption a dispatch whose sizes
    follow routing decisions is traced under (``"balanced"``, the default, or
    ``"concentrated"``; see ``frontends/torch/routing.py``). ``select_fraction`` states
    how much of its input a selection whose size only the data knows keeps (``nonzero``,
    ``masked_select``, ``x[mask]``); without it such a program stops with a one-line error.
    """
    from .frontends.torch.capture import export_program, input_structure, state_structure
    from .frontends.torch.lower import lower

    if not isinstance(inputs, (tuple, list)):
        inputs = (inputs,)                       # a bare tensor: the one input
    src = source or type(module).__name__
    t0 = time.perf_counter()
    if select_fraction is not None and not 0 <= select_fraction <= 1:
        raise ValueError(f"select_fraction {select_fraction}: expected a number in [0, 1]")
    ep = export_program(module, tuple(inputs), src, keep_experts=keep_experts_dispatch,
                        routing=routing, select_fraction=select_fraction)
    t1 = time.perf_counter()
    user_files = (source,) if source and os.path.exists(source) else ()
    lowered = lower(ep, user_files, input_structure(inputs), state_structure(module))
    t2 = time.perf_counter()
    rep = analyze_lowered(lowered, source=src, arch=arch, precision_policy=precision_policy,
                          timings={"export_s": t1 - t0, "lower_s": t2 - t1})
    rep.keep_experts_dispatch = keep_experts_dispatch
    rep.routing = routing
    rep.select_fraction = select_fraction
    rep.sizes_assumed = bool(getattr(ep, "solbound_sizes_assumed", False))
    if validate:
        from .validate.golden import validate_report
        validate_report(rep, module, tuple(inputs), **validate_opts)
    return rep


def analyze_source(spec: str, arch=None, precision_policy: str | None = None,
                   validate: bool = False, keep_experts_dispatch: bool = False,
                   routing: str | None = None, select_fraction: float | None = None,
                   **validate_opts) -> Report:
    """``FILE.py`` in KernelBench's convention or ``pkg.module:factory``."""
    from .frontends.torch.capture import load_problem

    problem = load_problem(spec)
    model, inputs, note = problem.build_for_capture()
    rep = analyze(model, inputs, arch=arch, precision_policy=precision_policy, source=spec,
                  keep_experts_dispatch=keep_experts_dispatch, routing=routing,
                  select_fraction=select_fraction)
    if note:
        rep.lowered.program = rep.lowered.program.__class__(
            rep.lowered.program.tensors, rep.lowered.program.kernels,
            rep.lowered.program.notes + (note,))
    rep.problem = problem
    if validate:
        from .validate.golden import validate_report
        validate_report(rep, None, None, problem=problem, **validate_opts)
    return rep
