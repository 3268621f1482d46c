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
                    timings: dict | None = None, cache=None, modes=None) -> Report:
    """Counts and bounds for an already-lowered program (IR stage onwards). ``cache``: the
    on-chip capacity of the cache-aware bound (a level such as ``"smem"``, a size such as
    ``"4MiB"`` or bytes; default each chip's last-level cache). ``modes``: the fidelities
    to bound (default all; a sweep that asks for fused bounds alone skips the cache-aware
    schedule search)."""
    from .bounds.fidelity import parse_cache
    t0 = time.perf_counter()
    policy = precision_policy if isinstance(precision_policy, Policy) else Policy.parse(precision_policy)
    specs = _specs(arch)
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


def analyze(module, inputs: Sequence, arch=None, precision_policy: str | None = None,
            source: str | None = None, validate: bool = False,
            keep_experts_dispatch: bool = False, routing: str | None = None,
            select_fraction: float | None = None, cache=None, train: bool = False,
            optimizer=None, problem_module=None, reroll: bool = True, modes=None,
            dp: int | None = None, **validate_opts) -> Report:
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
        from .frontends.torch.distributed import fake_world
        from .frontends.torch.train import data_parallel
        with fake_world(dp), data_parallel(dp):
            rep = analyze(module, inputs, arch=arch, precision_policy=precision_policy,
                          source=source, keep_experts_dispatch=keep_experts_dispatch,
                          routing=routing, select_fraction=select_fraction, cache=cache,
                          train=True, optimizer=optimizer, problem_module=problem_module,
                          reroll=reroll, modes=modes)
        rep.world_size = dp
        return rep
    if not _is_torch_module(module) and callable(module):
        return _analyze_jax(module, inputs, arch=arch, precision_policy=precision_policy,
                            source=source, validate=validate, cache=cache, train=train,
                            optimizer=optimizer, modes=modes, **validate_opts)
    if not isinstance(inputs, (tuple, list)):
        inputs = (inputs,)                       # a bare tensor: the one input
    src = source or type(module).__name__
    from .frontends.torch.dtensor import has_dtensors
    if not train and has_dtensors(module) and not getattr(module, "solbound_tp", None):
        # parallelize_module / distribute_tensor: traced below DTensor, over local shards
        from .frontends.torch.dtensor import localize
        module = localize(module, tuple(inputs))
    t0 = time.perf_counter()
    if select_fraction is not None and not 0 <= select_fraction <= 1:
        raise ValueError(f"select_fraction {select_fraction}: expected a number in [0, 1]")
    user_files = (source,) if source and os.path.exists(source) else ()
    timings: dict = {}
    if train:
        from .frontends.torch.stacks import export_and_lower_step
        ep, lowered = export_and_lower_step(
            module, tuple(inputs), src, user_files=user_files, reroll_layers=reroll,
            timings=timings, optimizer=optimizer if not isinstance(optimizer, str) else None,
            optimizer_name=optimizer if isinstance(optimizer, str) else None,
            problem_module=problem_module, keep_experts=keep_experts_dispatch, routing=routing)
    else:
        from .frontends.torch.stacks import export_and_lower
        ep, lowered = export_and_lower(module, tuple(inputs), src, user_files=user_files,
                                       reroll_layers=reroll, keep_experts=keep_experts_dispatch,
                                       routing=routing, select_fraction=select_fraction,
                                       timings=timings)
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
    rep.sizes_assumed = bool(getattr(ep, "solbound_sizes_assumed", False))
    if validate:
        from .validate.golden import validate_report
        validate_report(rep, module, tuple(inputs), **validate_opts)
    return rep


def _jax_example(spec: str, params: dict | None = None):
    """``(function, args)`` from a file defining ``example()`` and no ``class Model``, or
    from a ``pkg.module:factory`` whose module uses JAX and not torch. ``params`` replace
    the file's module-level constants, or are the factory's keyword arguments."""
    import re
    if ":" in spec and not spec.endswith(".py"):
        return _jax_factory(spec, params)
    if not (spec.endswith(".py") and os.path.exists(spec)):
        return None
    text = open(spec, encoding="utf-8", errors="replace").read()
    if not re.search(r"^def example\(", text, re.M) or re.search(r"^class Model\b", text, re.M):
        return None
    from .frontends.contract import FrontendError
    from .frontends.loading import import_file
    mod = import_file(spec)
    if params:
        from .frontends.loading import check_params
        check_params(spec, mod, params, module_names=True)
        for k, v in params.items():
            setattr(mod, k, v)
    try:
        res = mod.example()
    except Exception as e:  # noqa: BLE001 - one line for the user
        raise FrontendError(f"{spec}: example() failed: {type(e).__name__}: {e}") from None
    if not (isinstance(res, tuple) and len(res) == 2 and callable(res[0])):
        raise FrontendError(f"{spec}: example() must return (function, args)")
    return res


def _jax_factory(spec: str, params: dict | None = None):
    import importlib
    import sys
    from .frontends.contract import FrontendError
    modname, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(modname)
    except Exception:  # noqa: BLE001 - the PyTorch loader reports it
        return None
    names = {getattr(v, "__name__", "").split(".")[0] for v in vars(mod).values()
             if type(v).__name__ == "module"}
    if "jax" not in names or "torch" in names or not callable(getattr(mod, attr, None)):
        return None
    from .frontends.loading import check_params
    check_params(spec, getattr(mod, attr), params or {})
    try:
        res = getattr(mod, attr)(**(params or {}))
    except Exception as e:  # noqa: BLE001
        raise FrontendError(f"{spec}: factory failed: {type(e).__name__}: {e}") from None
    if not (isinstance(res, tuple) and len(res) == 2 and callable(res[0])):
        raise FrontendError(f"{spec}: factory must return (function, args)")
    return res


def _is_torch_module(obj) -> bool:
    """An ``nn.Module`` (decided without importing torch)."""
    return any(c.__name__ == "Module" and c.__module__.startswith("torch.nn")
               for c in type(obj).__mro__)


def _analyze_jax(fn, args, *, arch=None, precision_policy=None, source=None,
                 validate: bool = False, seed: int = 0, max_bytes=None, max_seconds=None,
                 cache=None, train: bool = False, optimizer=None, modes=None,
                 **_ignored) -> Report:
    """A JAX function (``fn(*args)``, args arrays or ``jax.ShapeDtypeStruct`` pytrees).

    ``train=True``: ``fn`` is a training step called as ``fn(params, opt_state, *batch)``
    (the first argument's leaves are the parameters, the second's the optimizer's state;
    ``frontends/jax/train.py``); ``optimizer``, a name for the report (default: from the
    state's types)."""
    try:
        from .frontends.jax.lower import lower
    except ImportError as e:
        from .frontends.contract import FrontendError
        raise FrontendError(f"a JAX function needs jax installed (pip install "
                            f"'solbound[jax]'): {e}") from None
    if not isinstance(args, (tuple, list)):
        args = (args,)
    src = source or getattr(fn, "__name__", None) or type(fn).__name__
    fn, args = _nnx_split(fn, tuple(args))
    # XLA's default for float32 dots and convolutions on NVIDIA GPUs since Ampere is TF32
    # (docs.jax.dev "Matmul precision": "float32 dot products may be computed with
    # reduced-precision arithmetic internally (bfloat16 on TPU, TF32 on recent GPUs)");
    # precision=HIGHEST in the program keeps that operation on the FP32 pipe
    if precision_policy is None:
        precision_policy = "tf32"
    t0 = time.perf_counter()
    if train and optimizer is not None and not isinstance(optimizer, str):
        from .frontends.contract import FrontendError
        raise FrontendError("train=True with a JAX step: the optimizer is the step's own "
                            "code; optimizer= only names it (a string)")
    lowered = lower(fn, tuple(args), train=train, optimizer=optimizer) if train \
        else lower(fn, tuple(args))
    rep = analyze_lowered(lowered, source=src, arch=arch, precision_policy=precision_policy,
                          timings={"export_s": time.perf_counter() - t0}, cache=cache,
                          modes=modes)
    rep.world_size = getattr(lowered, "world_size", 1)
    if validate and rep.world_size > 1:
        from .frontends.jax.reference import validate_shard_map
        rep.validation = validate_shard_map(lowered, fn, tuple(args), seed=seed)
    elif validate:
        from .frontends.jax.reference import validate_within_budget
        rep.validation = validate_within_budget(lowered, fn, tuple(args), seed=seed,
                                                max_bytes=max_bytes, max_seconds=max_seconds)
    return rep


def _nnx_split(fn, args: tuple):
    """A Flax nnx module (real or from ``nnx.eval_shape``): its state becomes the first
    argument, so the parameters are program inputs like a linen ``apply``'s."""
    if not any(c.__module__.startswith("flax.nnx") for c in type(fn).__mro__):
        return fn, args
    from flax import nnx
    graphdef, state = nnx.split(fn)

    def call(state, *xs):
        return nnx.merge(graphdef, state)(*xs)
    return call, (state,) + args


def analyze_source(spec: str, arch=None, precision_policy: str | None = None,
                   validate: bool = False, keep_experts_dispatch: bool = False,
                   routing: str | None = None, select_fraction: float | None = None,
                   cache=None, train: bool = False, optimizer=None, reroll: bool = True,
                   params: dict | None = None, modes=None, world_size: int | None = None,
                   tp: int | None = None, dp: int | None = None, fsdp: int | None = None,
                   **validate_opts) -> Report:
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
    many data-parallel ranks, its gradients averaged by an all-reduce each."""
    import contextlib
    world = _world(world_size, tp, dp, fsdp, train)
    if world > 1:
        from .frontends.torch.distributed import fake_world
        from .frontends.torch.train import data_parallel
        with fake_world(world), data_parallel(dp) if dp else contextlib.nullcontext():
            rep = _analyze_source(spec, arch, precision_policy, False, keep_experts_dispatch,
                                  routing, select_fraction, cache, train, optimizer, reroll,
                                  params, modes, tp or 1, validate_opts, fsdp or 1)
        rep.world_size = world
        if validate:
            # every rank at once under a threaded process group (after the fake one is gone)
            from .frontends.torch.spmd import validate_spmd
            if train:
                rep.validation = {"status": "skipped", "reason": "a per-rank training step is "
                                                                 "not validated yet"}
            else:
                rep.validation = validate_spmd(rep, rep.problem, world, tp or 1,
                                               **validate_opts)
        return rep
    return _analyze_source(spec, arch, precision_policy, validate, keep_experts_dispatch,
                           routing, select_fraction, cache, train, optimizer, reroll, params,
                           modes, 1, validate_opts)


def _world(world_size: int | None, tp: int | None, dp: int | None, fsdp: int | None,
           train: bool) -> int:
    """The number of ranks the degrees ask for, each checked before anything is built: at
    most one parallelism (tensor, data or fully sharded), over the whole world."""
    from .frontends.contract import FrontendError
    degrees = {"--tp": tp, "--dp": dp, "--fsdp": fsdp}
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
    given = [(name, v) for name, v in degrees.items() if v]
    if len(given) > 1 or given and world_size and world_size != given[0][1]:
        used = ", ".join(f"{n} {v}" for n, v in given)
        raise FrontendError(f"{used}{f', --world-size {world_size}' if world_size else ''}: "
                            f"only one parallelism over the whole world is modelled")
    return given[0][1] if given else world_size or 1


def _analyze_source(spec, arch, precision_policy, validate, keep_experts_dispatch, routing,
                    select_fraction, cache, train, optimizer, reroll, params, modes, tp,
                    validate_opts, fsdp: int = 1) -> Report:
    jax_example = _jax_example(spec, params)
    if jax_example is not None:
        fn, args = jax_example
        return _analyze_jax(fn, args, arch=arch, precision_policy=precision_policy, source=spec,
                            validate=validate, cache=cache, train=train, optimizer=optimizer,
                            modes=modes, **validate_opts)
    from .frontends.torch.capture import load_problem

    problem = load_problem(spec, params)
    model, inputs, note = problem.build_for_capture()
    if fsdp > 1:
        from .frontends.torch.parallel import fully_shard
        model = fully_shard(model, fsdp)
    if tp > 1:
        from .frontends.contract import FrontendError
        from .frontends.torch.parallel import ParallelError, tensor_parallel
        try:
            model = tensor_parallel(model, tp)
        except ParallelError as e:
            raise FrontendError(f"{spec}: {e}") from None
    import contextlib
    import torch
    # transformers' tensor-parallel layers run on local shards with explicit all-reduces
    # for inference (grad disabled); with grad enabled they compute through DTensor
    with torch.no_grad() if tp > 1 else contextlib.nullcontext():
        rep = analyze(model, inputs, arch=arch, precision_policy=precision_policy, source=spec,
                      keep_experts_dispatch=keep_experts_dispatch, routing=routing,
                      select_fraction=select_fraction, cache=cache, train=train,
                      optimizer=optimizer, problem_module=problem.module, reroll=reroll,
                      modes=modes)
    if note:
        rep.lowered.program = rep.lowered.program.__class__(
            rep.lowered.program.tensors, rep.lowered.program.kernels,
            rep.lowered.program.notes + (note,))
    rep.problem = problem
    if validate:
        from .validate.golden import validate_report
        validate_report(rep, None, None, problem=problem, **validate_opts)
    return rep
