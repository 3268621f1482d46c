"""Time a JAX function on this machine: real arguments (``reference.real_args``: drawn
floating leaves, integer leaves as given), warm-up (which also compiles), trials with the
caches flushed before each, the median; eager (op by op) and ``jax.jit``."""

from __future__ import annotations

import time

import numpy as np

from ...measure.host import caches, trial_stats


def measure_function(fn, args, modes=("eager",), trials: int = 10, warmup: int = 2) -> dict:
    """``{"device", mode: stats}`` with modes ``eager`` and ``jit`` (``compile`` is read as
    ``jit``), seconds per call."""
    import jax
    from .reference import real_args
    values = real_args(args)
    flush = np.empty(max(caches().values() or [32 << 20]) * 2 // 8)
    out = {"device": jax.devices()[0].platform}
    for mode in modes:
        f = jax.jit(fn) if mode in ("jit", "compile") else fn
        times = []
        for i in range(warmup + trials):
            flush.fill(i)                            # evict the arguments from the caches
            t0 = time.perf_counter()
            jax.block_until_ready(f(*values))
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        out["jit" if mode in ("jit", "compile") else mode] = trial_stats(times)
    return out


__all__ = ["measure_function"]
