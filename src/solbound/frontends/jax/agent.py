"""The agent's target for one equation the JAX lowering cannot lower (a
``jax.pure_callback`` to opaque Python, a primitive without a rule): its code, the shapes
and dtypes of this call, and the equation itself bound by JAX on the CPU as the
reference. ``lower.JaxLowering._translate`` splices an accepted fragment in its place."""

from __future__ import annotations

import inspect

import numpy as np

from ..agent.prompt import Operand
from ..agent.translate import Target
from ...ir.text import RESERVED, fresh_name
from .lower import aval_ir


def _source(eqn) -> str:
    name = eqn.primitive.name
    parts = [f"# JAX primitive {name}"]
    cb = eqn.params.get("callback")
    fn = getattr(cb, "callback_func", None) or (cb if callable(cb) else None)
    if fn is not None:
        try:
            parts.append(inspect.getsource(fn))
        except (OSError, TypeError):
            parts.append(f"# calls {getattr(fn, '__qualname__', fn)!r}")
    shown = {k: v for k, v in eqn.params.items() if k not in ("callback", "jaxpr")}
    if shown:
        parts.append(f"# parameters: {shown!r}"[:2000])
    return "\n".join(parts)


def target_of(eqn, src: str) -> Target | None:
    """The target for ``eqn`` (array operands and results only), or None."""
    from jax.extend.core import Literal
    if any(isinstance(v, Literal) for v in eqn.invars):
        return None
    taken = set(RESERVED)
    try:
        inputs = [Operand(fresh_name(f"x{i}", taken), *aval_ir(v.aval))
                  for i, v in enumerate(eqn.invars)]
        outputs = [Operand(fresh_name("out" if len(eqn.outvars) == 1 else f"out{i}", taken),
                           *aval_ir(v.aval)) for i, v in enumerate(eqn.outvars)]
    except Exception:  # noqa: BLE001 - an aval the IR has no dtype for
        return None
    dtypes = [v.aval.dtype for v in eqn.invars]

    def reference(arrays):
        import jax.numpy as jnp
        args = [jnp.asarray(a, dtype=dt) for a, dt in zip(arrays, dtypes)]
        res = eqn.primitive.bind(*args, **eqn.params)
        res = res if eqn.primitive.multiple_results else [res]
        return [np.asarray(r, dtype=np.float32) if r.dtype.name == "bfloat16"
                else np.asarray(r) for r in res]
    return Target(name=f"jax.{eqn.primitive.name}", source=_source(eqn), inputs=inputs,
                  outputs=outputs, reference=reference, what="operator", src=src)
