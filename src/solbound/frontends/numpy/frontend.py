"""A numpy program: a file whose ``example()`` returns ``(function, args)`` with numpy
arrays (and plain scalars) as arguments, and that imports neither PyTorch nor JAX.

No tracer reads it: the agent translates the whole function (``frontends/agent``), the
IR runs against ``function(*args)`` on the example's own arrays, and only an IR that
matches is lowered. Without ``--agent`` such a file stops with one line saying so.
"""

from __future__ import annotations

import inspect
import os

import numpy as np

from ...ir.text import RESERVED, fresh_name
from ..contract import FrontendError, LoweredProgram
from ..agent.prompt import Operand
from ..agent.translate import Target, dtype_of


def _names(fn, n: int) -> list[str]:
    """IR names for the function's first ``n`` positional parameters."""
    try:
        params = [p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    taken = set(RESERVED)
    return [fresh_name(params[i] if i < len(params) else f"x{i}", taken) for i in range(n)]


def _leaves(res) -> list[np.ndarray]:
    if isinstance(res, (tuple, list)):
        return [np.asarray(r) for r in res]
    return [np.asarray(res)]


def target(fn, args: tuple, spec: str) -> Target:
    """The agent's target for ``fn(*args)``: its arrays are the inputs, its scalars
    non-tensor arguments shown in the prompt, its returned arrays the outputs."""
    names = _names(fn, len(args))
    arrays = [(n, a) for n, a in zip(names, args) if isinstance(a, np.ndarray)]
    scalars = {n: a for n, a in zip(names, args) if not isinstance(a, np.ndarray)}
    for n, a in scalars.items():
        if not isinstance(a, (int, float, bool, str, np.generic)):
            raise FrontendError(f"{spec}: argument {n} is a {type(a).__name__}; a numpy "
                                f"program takes arrays and plain scalars")
    inputs = [Operand(n, tuple(int(s) for s in a.shape), dtype_of(a)) for n, a in arrays]
    positions = [i for i, a in enumerate(args) if isinstance(a, np.ndarray)]

    def call(arrs):
        full = list(args)
        for i, a in zip(positions, arrs):
            full[i] = a
        return _leaves(fn(*full))
    try:
        outs = call([np.copy(a) for _, a in arrays])
    except Exception as e:  # noqa: BLE001 - the user's program failed on its own example
        raise FrontendError(f"{spec}: the function failed on example()'s arguments: "
                            f"{type(e).__name__}: {e}") from None
    taken = set(RESERVED) | {o.name for o in inputs}
    one = len(outs) == 1
    outputs = [Operand(fresh_name("out" if one else f"out{i}", taken),
                       tuple(int(s) for s in o.shape), dtype_of(o)) for i, o in enumerate(outs)]
    src = _source(fn, spec)
    where = f"{os.path.basename(spec)}:{getattr(getattr(fn, '__code__', None), 'co_firstlineno', '?')}"
    return Target(name=f"{os.path.basename(spec)}:{getattr(fn, '__name__', 'function')}",
                  source=src, inputs=inputs, outputs=outputs, reference=call,
                  feeds=[np.copy(a) for _, a in arrays], params=dict(scalars),
                  what="program", src=where)


def _source(fn, spec: str) -> str:
    if os.path.exists(spec):
        with open(spec, encoding="utf-8", errors="replace") as f:
            return f.read()
    try:
        return inspect.getsource(inspect.getmodule(fn))
    except (OSError, TypeError):
        return inspect.getsource(fn)


def lower(fn, args: tuple, spec: str, agent) -> LoweredProgram:
    """The agent's validated IR of ``fn(*args)`` as a lowered program."""
    if agent is None:
        raise FrontendError(f"{spec}: a numpy program is read by the agent frontend only: "
                            f"add --agent (with an endpoint and --llm-model)")
    t = target(fn, tuple(args), spec)
    tr = agent.translate(t)
    if not tr.accepted:
        last = tr.feedback[-1]["feedback"] if tr.feedback else "no reply"
        raise FrontendError(f"{spec}: the agent's IR did not validate in {tr.attempts} "
                            f"attempt(s) (--agent-rounds); last feedback: {last}")
    from ..agent.splice import stamp
    program = stamp(tr.program, t.name, t.src)
    groups = {}
    for k in program.kernels:
        groups.setdefault(k.op, {"name": k.opname, "src": k.src,
                                 "agent": {"model": agent.model, "target": t.name,
                                           "attempts": tr.attempts, "cached": tr.cached}})
    outputs = [{"kind": "output", "ir": o.name, "target": o.name, "path": o.name,
                "shape": list(o.shape), "strides": _contiguous(o.shape), "offset": 0}
               for o in t.outputs]
    low = LoweredProgram(program, [], outputs, [{"name": o.name, "ir": o.name}
                                                for o in t.inputs], [], groups)
    low.agent_validation = tr.validation
    return low


def _contiguous(shape) -> list[int]:
    out, s = [], 1
    for n in reversed(shape):
        out.append(s)
        s *= n
    return out[::-1]


def analyze_function(fn, args, *, arch=None, precision_policy=None, source=None,
                     validate: bool = False, agent=None, cache=None, modes=None,
                     train: bool = False, **_ignored):
    """``fn(*args)`` with numpy arrays, translated by ``agent``. The report's validation
    is the accepted IR's (run against ``fn`` on ``args``)."""
    import time
    from ...pipeline import analyze_lowered
    src = source or getattr(fn, "__name__", "function")
    if train:
        raise FrontendError(f"{src}: --train differentiates a PyTorch or JAX program; a "
                            f"numpy program has no backward to read")
    t0 = time.perf_counter()
    lowered = lower(fn, tuple(args), src, agent)
    rep = analyze_lowered(lowered, source=src, arch=arch, precision_policy=precision_policy,
                          timings={"translate_s": time.perf_counter() - t0}, cache=cache,
                          modes=modes)
    rep.validation = dict(lowered.agent_validation or {})
    return rep


def analyze_source(spec: str, params: dict | None = None, world_size=None, tp=None, dp=None,
                   fsdp=None, ep=None, **opts):
    """A file whose ``example()`` returns ``(function, args)`` with numpy arrays."""
    from ..loading import example_of
    for name, v in (("--world-size", world_size), ("--tp", tp), ("--ep", ep), ("--dp", dp),
                    ("--fsdp", fsdp)):
        if v not in (None, 1):
            raise FrontendError(f"{spec}: {name} shards PyTorch programs; a numpy program "
                                f"runs on one chip")
    fn, args = example_of(spec, params)
    return analyze_function(fn, args if isinstance(args, (tuple, list)) else (args,),
                            source=spec, **opts)
