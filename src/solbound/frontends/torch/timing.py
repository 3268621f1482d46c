"""Time the original program on this machine, the way careful benchmarks do: real inputs,
warm-up, many trials with the caches flushed before each (a write over a buffer larger than
the last-level cache), median and spread; eager, and ``torch.compile`` on request.

On an NVIDIA GPU (``torch.cuda.is_available()``) the program runs there, each trial is
timed with CUDA events (GPU time, not host time) after a write over a buffer twice the L2,
as KernelBench took its published timings; on the CPU with ``time.perf_counter`` after a
write over twice the largest cache."""

from __future__ import annotations

from ...measure.host import MeasureError, flush_bytes, time_calls


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


def cuda_flush_bytes() -> int:
    """What ``cuda_time_calls`` writes before each trial: twice the GPU's L2, at least
    64 MiB."""
    import torch
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return max(2 * props.L2_cache_size, 64 << 20)


def cuda_clock(call) -> float:
    """Seconds ``call()`` takes on the current CUDA stream: events recorded around it."""
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def cuda_time_calls(call, trials: int, warmup: int) -> dict:
    """``call()`` on the current CUDA device: ``warmup`` calls, then ``trials`` calls each
    timed with CUDA events (``cuda_clock``), after a write over a buffer twice the L2 (the
    inputs and weights come from DRAM); statistics in seconds."""
    import torch
    buf = torch.empty(cuda_flush_bytes() // 4, dtype=torch.float32, device="cuda")
    return time_calls(call, trials, warmup, flush=lambda: buf.add_(1.0), clock=cuda_clock)


def _cuda_free() -> int:
    import torch
    return torch.cuda.mem_get_info()[0]


def device_of_choice(device: str | None = None) -> str:
    """``cuda`` where PyTorch sees an NVIDIA GPU (or where asked), else ``cpu``."""
    import torch
    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise MeasureError("--device cuda: PyTorch sees no CUDA device here "
                           f"(torch {torch.__version__})")
    return device


def check_fits(need: int, device: str) -> None:
    """Refuse (``MeasureError``) when ``need`` bytes of real inputs and parameters, three
    times over with activations, do not fit in the device's free memory."""
    free = _cuda_free() if device == "cuda" else _available()
    if need * 3 > free:
        where = "the GPU" if device == "cuda" else "this machine"
        raise MeasureError(f"--measure: the real inputs and parameters need about "
                           f"{need / 2**30:.1f} GiB (three times that with activations), more "
                           f"than {where} has free ({free / 2**30:.1f} GiB)")


def measure_problem(problem, modes=("eager",), trials: int = 10, warmup: int = 2,
                    device: str | None = None) -> dict:
    """``{"device", "eager": stats, "compile": stats}`` for a KernelBench-style problem on
    the GPU when there is one, else the CPU (seconds per call)."""
    import torch
    device = device_of_choice(device)
    model, inputs = problem.build("meta")
    check_fits(sum(p.numel() * p.element_size() for p in model.parameters()) + _nbytes(inputs),
               device)
    torch.manual_seed(0)
    model, inputs = problem.build(device)
    if device == "cuda":
        out = {"device": "cuda", "device_name": torch.cuda.get_device_name(),
               "flush_bytes": cuda_flush_bytes(), "timer": "CUDA events"}
        timer = cuda_time_calls
    else:
        out = {"device": "cpu", "flush_bytes": flush_bytes(), "timer": "perf_counter"}
        timer = time_calls
    for mode in modes:
        fn = model if mode == "eager" else torch.compile(model)
        with torch.no_grad():
            out[mode] = timer(lambda fn=fn: fn(*inputs), trials, warmup)
    return out


__all__ = ["measure_problem", "MeasureError", "cuda_time_calls", "cuda_clock",
           "device_of_choice", "check_fits"]
