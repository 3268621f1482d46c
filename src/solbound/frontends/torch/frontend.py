"""The PyTorch frontend's entry points (registered in ``frontends/registry.py``): an
``nn.Module`` with its inputs, or a program file / ``pkg.module:factory``, through
capture (``torch.export``), lowering, the pipeline after it, and validation against the
module itself."""

from __future__ import annotations

import os
import time
from typing import Sequence

from ...pipeline import analyze_lowered


def analyze_module(module, inputs: Sequence, arch=None, precision_policy: str | None = None,
                   source: str | None = None, validate: bool = False,
                   keep_experts_dispatch: bool = False, routing: str | None = None,
                   select_fraction: float | None = None, cache=None, train: bool = False,
                   optimizer=None, problem_module=None, reroll: bool = True, modes=None,
                   dp: int | None = None, agent=None, **validate_opts):
    """Analyze ``module(*inputs)``: capture, lower to the loop IR, count, bound.

    ``train=True`` analyzes the training step instead (``frontends/torch/train.py``):
    the forward's scalar loss (or its output's ``loss``), its backward to every parameter
    that requires a gradient and the optimizer's step. ``optimizer``: a
    ``torch.optim.Optimizer`` over the module's parameters, or the name of a
    ``torch.optim`` class (default: ``make_optimizer(model)`` of ``problem_module`` when it
    defines one, else AdamW with its defaults).

    ``inputs`` may be real or meta tensors; capture itself runs on fake tensors.
    ``arch`` is a comma-separated string of catalog ids, a list of ids/specs, or
    ``None`` for the default set. ``routing`` is the assumption a dispatch whose sizes
    follow routing decisions is traced under (``"balanced"``, the default, or
    ``"concentrated"``; see ``frontends/torch/routing.py``). ``select_fraction`` states
    how much of its input a selection whose size only the data knows keeps (``nonzero``,
    ``masked_select``, ``x[mask]``); without it such a program stops with a one-line error.
    ``cache`` sets the on-chip capacity of the cache-aware bound (``"smem"``, ``"4MiB"``,
    bytes; default each chip's last-level cache). ``reroll``: a stack of identical layers
    (an ``nn.ModuleList`` of one structure) is traced for two layers and run as a loop
    over all of them (``frontends/torch/stacks.py``); ``False`` traces every layer.
    ``dp`` (with ``train``): the step of one of that many data-parallel ranks, each
    gradient averaged by an all-reduce (a fake process group of that size while tracing).
    """
    if dp and dp > 1 and _world(None, None, dp, None, train):
        from .distributed import fake_world
        from .train import data_parallel
        with fake_world(dp), data_parallel(dp):
            rep = analyze_module(module, inputs, arch=arch, precision_policy=precision_policy,
                                 source=source, keep_experts_dispatch=keep_experts_dispatch,
                                 routing=routing, select_fraction=select_fraction, cache=cache,
                                 train=True, optimizer=optimizer, problem_module=problem_module,
                                 reroll=reroll, modes=modes, agent=agent)
        rep.world_size = dp
        return rep
    if not isinstance(inputs, (tuple, list)):
        inputs = (inputs,)                       # a bare tensor: the one input
    src = source or type(module).__name__
    from .dtensor import has_dtensors
    if not train and has_dtensors(module) and not (getattr(module, "solbound_tp", None)
                                                   or getattr(module, "solbound_ep", None)):
        # parallelize_module / distribute_tensor: traced below DTensor, over local shards
        from .dtensor import localize
        module = localize(module, tuple(inputs))
    t0 = time.perf_counter()
    if select_fraction is not None and not 0 <= select_fraction <= 1:
        raise ValueError(f"select_fraction {select_fraction}: expected a number in [0, 1]")
    user_files = (source,) if source and os.path.exists(source) else ()
    timings: dict = {}
    from .lower import translating
    with translating(agent):
        ep, lowered = _export_and_lower(module, inputs, src, user_files, reroll, timings,
                                        optimizer, problem_module, keep_experts_dispatch,
                                        routing, select_fraction, train)
    t1 = t0 + timings.get("export_s", 0.0)
    t2 = time.perf_counter()
    rep = analyze_lowered(lowered, source=src, arch=arch, precision_policy=precision_policy,
                          timings={"export_s": t1 - t0, "lower_s": t2 - t1}, cache=cache,
                          modes=modes)
    rep.keep_experts_dispatch = keep_experts_dispatch
    rep.routing = routing
    rep.train = {"optimizer": optimizer, "problem_module": problem_module} if train else None
    rep.select_fraction = select_fraction
    rep.reroll = reroll
    rep.exported = ep
    rep.sizes_assumed = bool(getattr(ep, "solbound_sizes_assumed", False))
    if validate:
        from .reference import validate_report
        from .agent import triton_on_cpu
        # a re-trace splices the same translations; Triton kernels run interpreted
        with translating(agent), triton_on_cpu():
            validate_report(rep, module, tuple(inputs), **validate_opts)
    return rep


def _export_and_lower(module, inputs, src, user_files, reroll, timings, optimizer,
                      problem_module, keep_experts_dispatch, routing, select_fraction, train):
    from .loops import capturing
    # Python loops over steps become one scan (loops.py) with ``reroll``; not yet in a
    # training step, whose joint graph would need the scan's backward
    with capturing(reroll and not train):
        return _export_and_lower_as(module, inputs, src, user_files, reroll, timings, optimizer,
                                    problem_module, keep_experts_dispatch, routing,
                                    select_fraction, train)


def _export_and_lower_as(module, inputs, src, user_files, reroll, timings, optimizer,
                         problem_module, keep_experts_dispatch, routing, select_fraction, train):
    if train:
        from .stacks import export_and_lower_step
        return export_and_lower_step(
            module, tuple(inputs), src, user_files=user_files, reroll_layers=reroll,
            timings=timings, optimizer=optimizer if not isinstance(optimizer, str) else None,
            optimizer_name=optimizer if isinstance(optimizer, str) else None,
            problem_module=problem_module, keep_experts=keep_experts_dispatch, routing=routing)
    from .stacks import export_and_lower
    return export_and_lower(module, tuple(inputs), src, user_files=user_files,
                            reroll_layers=reroll, keep_experts=keep_experts_dispatch,
                            routing=routing, select_fraction=select_fraction, timings=timings)


def analyze_source(spec: str, arch=None, precision_policy: str | None = None,
                   validate: bool = False, keep_experts_dispatch: bool = False,
                   routing: str | None = None, select_fraction: float | None = None,
                   cache=None, train: bool = False, optimizer=None, reroll: bool = True,
                   params: dict | None = None, modes=None, world_size: int | None = None,
                   tp: int | None = None, dp: int | None = None, fsdp: int | None = None,
                   agent=None, ep: int | None = None, **validate_opts):
    """``FILE.py`` in KernelBench's convention or ``pkg.module:factory``; a file that
    defines ``example()`` returning ``(function, args)`` (and no ``Model``) is a JAX program.
    ``train``/``optimizer``: the training step (see :func:`analyze`); the file may define
    ``make_optimizer(model)``. ``params``: keyword arguments of the factory, or values of
    the file's module-level constants (``--param``).

    ``world_size``: the program is written per rank (``torch.distributed`` collectives,
    shards sized by ``dist.get_world_size()``); it is built and traced as rank 0 of that
    many under a fake process group (``frontends/torch/distributed.py``), and the counts and
    bounds are one rank's, with its collectives' link time. ``tp``: a transformers model
    sharded by its own tensor-parallel plan over that many ranks
    (``frontends/torch/parallel.py``). ``dp`` (with ``train``): the step of one of that
    many data-parallel ranks, its gradients averaged by an all-reduce each. ``ep``: a
    transformers mixture of experts sharded by its own expert-parallel plan over that many
    ranks, its tokens sent to their experts' ranks all-to-all under the routing assumption
    (``frontends/torch/parallel.py``)."""
    import contextlib
    world = _world(world_size, tp, dp, fsdp, train, ep)
    if world > 1:
        from .distributed import fake_world
        from .train import data_parallel
        with fake_world(world), data_parallel(dp) if dp else contextlib.nullcontext():
            rep = _analyze_source(spec, arch, precision_policy, False, keep_experts_dispatch,
                                  routing, select_fraction, cache, train, optimizer, reroll,
                                  params, modes, tp or 1, validate_opts, fsdp or 1, agent,
                                  ep or 1)
        rep.world_size = world
        if validate:
            # every rank at once under a threaded process group (after the fake one is gone)
            from .spmd import validate_spmd
            if train:
                rep.validation = {"status": "skipped", "reason": "a per-rank training step is "
                                                                 "not validated yet"}
            else:
                rep.validation = validate_spmd(rep, rep.problem, world, tp or 1,
                                               ep=ep or 1, **validate_opts)
        return rep
    return _analyze_source(spec, arch, precision_policy, validate, keep_experts_dispatch,
                           routing, select_fraction, cache, train, optimizer, reroll, params,
                           modes, 1, validate_opts, 1, agent)


def _world(world_size: int | None, tp: int | None, dp: int | None, fsdp: int | None,
           train: bool, ep: int | None = None) -> int:
    """The number of ranks the degrees ask for, each checked before anything is built: at
    most one parallelism (tensor, expert, data or fully sharded), over the whole world."""
    from ..contract import FrontendError
    degrees = {"--tp": tp, "--ep": ep, "--dp": dp, "--fsdp": fsdp}
    for name, v in (("--world-size", world_size), *degrees.items()):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise FrontendError(f"{name} {v!r}: expected a positive integer")
    if dp and not train:
        raise FrontendError(f"--dp {dp}: data parallelism adds the training step's gradient "
                            f"all-reduce: add --train")
    if fsdp and not train:
        raise FrontendError(f"--fsdp {fsdp}: fully sharded data parallelism shards a training "
                            f"step: add --train")
    if tp and tp > 1 and train:
        raise FrontendError("--tp with --train: transformers' training path shards through "
                            "DTensor, which solbound cannot trace yet")
    if ep and ep > 1 and train:
        raise FrontendError("--ep with --train: the expert-parallel training step is not "
                            "traced yet (analyze the forward, or write the step per rank and "
                            "use --world-size)")
    given = [(name, v) for name, v in degrees.items() if v]
    if len(given) > 1 or given and world_size and world_size != given[0][1]:
        used = ", ".join(f"{n} {v}" for n, v in given)
        raise FrontendError(f"{used}{f', --world-size {world_size}' if world_size else ''}: "
                            f"only one parallelism over the whole world is modelled")
    return given[0][1] if given else world_size or 1


def _analyze_source(spec, arch, precision_policy, validate, keep_experts_dispatch, routing,
                    select_fraction, cache, train, optimizer, reroll, params, modes, tp,
                    validate_opts, fsdp: int = 1, agent=None, ep: int = 1):
    from .capture import load_problem

    problem = load_problem(spec, params)
    model, inputs, note = problem.build_for_capture()
    if fsdp > 1:
        from .parallel import fully_shard
        model = fully_shard(model, fsdp)
    if tp > 1:
        from ..contract import FrontendError
        from .parallel import ParallelError, tensor_parallel
        try:
            model = tensor_parallel(model, tp)
        except ParallelError as e:
            raise FrontendError(f"{spec}: {e}") from None
    if ep > 1:
        from ..contract import FrontendError
        from .parallel import ParallelError, expert_parallel
        try:
            model = expert_parallel(model, ep)
        except ParallelError as e:
            raise FrontendError(f"{spec}: {e}") from None
    import contextlib
    import torch
    # transformers' tensor-parallel layers run on local shards with explicit all-reduces
    # for inference (grad disabled); with grad enabled they compute through DTensor
    with torch.no_grad() if tp > 1 or ep > 1 else contextlib.nullcontext():
        rep = analyze_module(model, inputs, arch=arch, precision_policy=precision_policy,
                             source=spec, keep_experts_dispatch=keep_experts_dispatch,
                             routing=routing, select_fraction=select_fraction, cache=cache,
                             train=train, optimizer=optimizer, problem_module=problem.module,
                             reroll=reroll, modes=modes, agent=agent)
    if note:
        rep.lowered.program = rep.lowered.program.__class__(
            rep.lowered.program.tensors, rep.lowered.program.kernels,
            rep.lowered.program.notes + (note,))
    rep.problem = problem
    if validate:
        from .lower import translating
        from .reference import validate_report
        from .agent import triton_on_cpu
        with translating(agent), triton_on_cpu():
            validate_report(rep, None, None, problem=problem, **validate_opts)
    return rep


def measure(spec: str, params: dict, modes: list[str], trials: int) -> dict:
    """``--measure``: the program's own run times on this machine."""
    from .capture import load_problem
    from .timing import measure_problem
    return measure_problem(load_problem(spec, params),
                           [m if m != "jit" else "compile" for m in modes], trials=trials)
