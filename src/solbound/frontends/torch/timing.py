"""Time the original program on this machine, the way careful benchmarks do: real inputs,
warm-up, many trials with the caches flushed before each (a write over a buffer larger than
the last-level cache), median and spread; eager, and ``torch.compile`` on request."""

from __future__ import annotations

from ...measure.host import flush_bytes, time_calls


class MeasureError(RuntimeError):
    pass


def _nbytes(x) -> int:
    import torch
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(y) for y in x)
    if isinstance(x, dict):
        return sum(_nbytes(y) for y in x.values())
    return 0


def _available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def measure_problem(problem, modes=("eager",), trials: int = 10, warmup: int = 2) -> dict:
    """``{"device", "eager": stats, "compile": stats}`` for a KernelBench-style problem on
    the CPU (seconds per call)."""
    import torch
    model, inputs = problem.build("meta")
    need = sum(p.numel() * p.element_size() for p in model.parameters()) + _nbytes(inputs)
    if need * 3 > _available():
        raise MeasureError(f"--measure: the real inputs and parameters need about "
                           f"{need / 2**30:.1f} GiB (three times that with activations), more "
                           f"than this machine has free ({_available() / 2**30:.1f} GiB)")
    torch.manual_seed(0)
    model, inputs = problem.build("cpu")
    out = {"device": "cpu", "flush_bytes": flush_bytes()}
    for mode in modes:
        fn = model if mode == "eager" else torch.compile(model)
        with torch.no_grad():
            out[mode] = time_calls(lambda fn=fn: fn(*inputs), trials, warmup)
    return out


__all__ = ["measure_problem", "MeasureError"]
