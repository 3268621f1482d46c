"""Time a JAX function on this machine: real arguments (``reference.real_args``: drawn
floating leaves, integer leaves as given), warm-up (which also compiles), trials with the
caches flushed before each, the median; eager (op by op) and ``jax.jit``."""

from __future__ import annotations

from ...measure.host import flush_bytes, time_calls


def measure_function(fn, args, modes=("eager",), trials: int = 10, warmup: int = 2) -> dict:
    """``{"device", mode: stats}`` with modes ``eager`` and ``jit`` (``compile`` is read as
    ``jit``), seconds per call."""
    import jax
    from .reference import real_args
    values = real_args(args)
    out = {"device": jax.devices()[0].platform, "flush_bytes": flush_bytes()}
    for mode in modes:
        f = jax.jit(fn) if mode in ("jit", "compile") else fn
        out["jit" if mode in ("jit", "compile") else mode] = time_calls(
            lambda f=f: jax.block_until_ready(f(*values)), trials, warmup)
    return out


__all__ = ["measure_function"]
