"""The JAX frontend's entry points (registered in ``frontends/registry.py``): a function
with its arguments, or a file whose ``example()`` returns ``(function, args)`` / a
``pkg.module:factory`` doing the same, through ``jax.make_jaxpr``, lowering, the pipeline
after it, and validation against JAX on the CPU."""

from __future__ import annotations

import time

from ...pipeline import analyze_lowered


def analyze_function(fn, args, *, arch=None, precision_policy=None, source=None,
                     validate: bool = False, seed: int = 0, max_bytes=None, max_seconds=None,
                     cache=None, train: bool = False, optimizer=None, modes=None,
                     agent=None, **_ignored):
    """A JAX function (``fn(*args)``, args arrays or ``jax.ShapeDtypeStruct`` pytrees).

    ``train=True``: ``fn`` is a training step called as ``fn(params, opt_state, *batch)``
    (the first argument's leaves are the parameters, the second's the optimizer's state;
    ``frontends/jax/train.py``); ``optimizer``, a name for the report (default: from the
    state's types)."""
    try:
        from .lower import lower
    except ImportError as e:
        from ..contract import FrontendError
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
        from ..contract import FrontendError
        raise FrontendError("train=True with a JAX step: the optimizer is the step's own "
                            "code; optimizer= only names it (a string)")
    from .lower import translating
    with translating(agent):
        lowered = lower(fn, tuple(args), train=train, optimizer=optimizer) if train \
            else lower(fn, tuple(args))
    rep = analyze_lowered(lowered, source=src, arch=arch, precision_policy=precision_policy,
                          timings={"export_s": time.perf_counter() - t0}, cache=cache,
                          modes=modes)
    rep.world_size = getattr(lowered, "world_size", 1)
    lowered = rep.lowered           # one program, one verdict: what was analyzed runs
    if validate and rep.world_size > 1:
        from .reference import validate_shard_map
        rep.validation = validate_shard_map(lowered, fn, tuple(args), seed=seed)
    elif validate:
        from .reference import validate_within_budget
        with translating(agent):      # a re-trace at reduced shapes translates those
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


def analyze_source(spec: str, arch=None, precision_policy=None, validate: bool = False,
                   params: dict | None = None, cache=None, train: bool = False,
                   optimizer=None, modes=None, agent=None, world_size=None, tp=None, dp=None,
                   fsdp=None, ep=None, **opts):
    """A file whose ``example()`` returns ``(function, args)``, or a factory doing so."""
    from ..contract import FrontendError
    for name, v in (("--world-size", world_size), ("--tp", tp), ("--ep", ep), ("--dp", dp),
                    ("--fsdp", fsdp)):
        if v not in (None, 1):
            raise FrontendError(f"{spec}: {name} shards PyTorch programs; a JAX program states "
                                f"its own mesh (shard_map)")
    from ..loading import example_of
    fn, args = example_of(spec, params)
    return analyze_function(fn, args, arch=arch, precision_policy=precision_policy,
                            source=spec, validate=validate, cache=cache, train=train,
                            optimizer=optimizer, modes=modes, agent=agent,
                            **{k: v for k, v in opts.items()
                               if k in ("seed", "max_bytes", "max_seconds")})


def measure(spec: str, params: dict, modes: list[str], trials: int) -> dict:
    """``--measure``: the function's own run times on this machine (eager, jit)."""
    from ..loading import example_of
    from .timing import measure_function
    return measure_function(*example_of(spec, params), modes, trials=trials)
