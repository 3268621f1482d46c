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
    platform = jax.devices()[0].platform
    out = {"device": platform, "flush_bytes": flush_bytes()}
    flush = None
    if platform != "cpu":
        # an accelerator's cache is flushed on the accelerator: a write over 256 MiB
        # (twice the largest L2 of the catalog's GPUs) before each trial
        import jax.numpy as jnp
        buf = [jnp.zeros(64 << 20, jnp.float32)]
        out["flush_bytes"] = 256 << 20

        def flush():
            buf[0] = jax.block_until_ready(buf[0] + 1)
    for mode in modes:
        f = jax.jit(fn) if mode in ("jit", "compile") else fn
        out["jit" if mode in ("jit", "compile") else mode] = time_calls(
            lambda f=f: jax.block_until_ready(f(*values)), trials, warmup, flush=flush)
    return out


__all__ = ["measure_function"]
