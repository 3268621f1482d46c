"""Validation against JAX: the function run by JAX on the CPU with seeded inputs (floating
leaves drawn from a normal distribution, integer and boolean leaves given or zero), the IR
run by the executor on the same values, every output compared with the neutral tolerance
of ``validate/golden.py``."""

from __future__ import annotations

import time

import numpy as np


def real_args(args, seed: int = 0):
    """Concrete values for ``args``: arrays kept, ``ShapeDtypeStruct`` leaves drawn."""
    import jax
    import jax.numpy as jnp
    rng = np.random.default_rng(seed)

    def draw(x):
        if not isinstance(x, jax.ShapeDtypeStruct):
            return x
        dt = np.dtype(x.dtype) if x.dtype != jnp.bfloat16 else None
        if dt is None or np.issubdtype(dt, np.floating):
            return jnp.asarray(rng.standard_normal(x.shape).astype(np.float32), dtype=x.dtype)
        return jnp.zeros(x.shape, x.dtype)
    return jax.tree_util.tree_map(draw, args, is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))


def validate(lowered, fn, args, seed: int = 0) -> dict:
    """Compare the IR with ``fn(*args)`` run by JAX (a result dict as validation's)."""
    import jax
    from ...ir.execute import ExecutionError, execute
    from ...validate.compare import EPS, compare, max_reduction, tolerance

    t0 = time.perf_counter()
    if lowered.unsupported:
        names = sorted({u.operator for u in lowered.unsupported})
        return {"status": "skipped", "seconds": 0.0,
                "reason": f"unsupported operators ({', '.join(names)}): the IR does not compute "
                          f"the whole program, so there is nothing whole to compare"}
    if getattr(lowered, "branch_assumed", False):
        return {"status": "skipped", "seconds": 0.0,
                "reason": "a branch known only at run time was chosen for the bound (see the "
                          "notes): the run takes the branch its data says"}
    values = real_args(args, seed)
    leaves = jax.tree_util.tree_leaves(values)
    feeds = {spec["ir"]: np.asarray(v, dtype=np.float64 if np.asarray(v).dtype.kind == "V" else None)
             for spec, v in zip(lowered.inputs, leaves) if spec.get("ir")}
    for st in lowered.state:
        feeds[st["ir"]] = np.asarray(st["value"])
    out = fn(*values)
    golden = [np.asarray(o, dtype=np.float64) if np.asarray(o).dtype.kind in "fV" else np.asarray(o)
              for o in jax.tree_util.tree_leaves(out)]
    p = lowered.program
    dtypes = [t.dtype for t in p.tensors if t.role == "output"]
    src_dtype = max(dtypes, key=lambda d: EPS.get(d, 0.0)) if dtypes else "f32"
    tol = tolerance(src_dtype, max_reduction(p), len(lowered.groups))
    try:
        arrays = execute(p, feeds)
    except ExecutionError as e:
        return {"status": "failed", "reason": f"IR execution error: {e}", "tolerance": tol,
                "seconds": time.perf_counter() - t0}
    outs = compare(lowered, arrays, golden, tol)
    ok = all(o["ok"] for o in outs)
    worst = max((o["worst_rel_error"] or 0.0 for o in outs), default=0.0)
    return {"status": "passed" if ok else "failed", "tolerance": tol, "outputs": outs,
            "reference": "the function run by JAX on the CPU",
            "summary": f"worst relative error {worst:.3g} (tolerance {tol:.3g})",
            "seconds": time.perf_counter() - t0}
