"""``solbound calibrate`` on a PyTorch install: measure the machine this runs on (its
NVIDIA GPU where PyTorch sees one: ``measure_cuda``; else the CPU: ``measure``).

What is measured (on the CPU; all cores, as PyTorch uses them):

* the FP32 peak: ``torch.mm`` at several sizes and a 3x3 convolution, the best trial of the
  best kernel (2 FLOPs per multiply-add, the vendor convention; on x86 oneDNN's convolution
  reaches about twice MKL's GEMM rate here); bf16 ``torch.mm`` where supported;
* vector throughput: an in-place multiply-add over a cache-resident array (2 FLOPs per
  element), kept when it beats the matmul; the special-function rate: ``torch.exp`` over
  a cache-resident array;
* DRAM bandwidth: STREAM-style copy (2 x 4 bytes per float32 element) and triad
  (3 x 4 bytes) over arrays far above the last-level cache, the best trial;
* cache capacities from the OS (``measure/host.py``).

A peak is the best trial over sizes, and min/median/max over the trials are kept in the
file, so that a bound built from it is not above what this machine can do. On a CPU every
pipe runs on the vector units (``[units]``).
"""

from __future__ import annotations

from ...measure.host import caches, rates_of, spec_toml, time_trials, wall_clock


def _best_matmul(dtype, sizes, trials: int, device: str = "cpu", clock=wall_clock,
                 label: str = "") -> dict:
    """The best rate of ``torch.mm`` over square sizes in ``dtype`` (2 FLOPs per
    multiply-add, the vendor convention), the best trial of the best size."""
    import torch
    best = None
    for n in sizes:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        c = torch.empty(n, n, device=device, dtype=dtype)
        r = rates_of(2 * n ** 3, time_trials(lambda: torch.mm(a, b, out=c), trials,
                                             clock=clock))
        r["how"] = f"torch.mm {n}x{n}x{n} {str(dtype).replace('torch.', '')}{label}"
        if best is None or r["value"] > best["value"]:
            best = r
    return {**best, "unit": "FLOP/s"}


def _stream_bandwidth(elems: int, trials: int, device: str = "cpu", clock=wall_clock,
                      label: str = "") -> dict:
    """DRAM bandwidth: STREAM-style copy (2 x 4 bytes per float32 element) and triad
    (3 x 4 bytes) over arrays of ``elems`` float32, the best trial of the better one."""
    import torch
    a = torch.rand(elems, device=device)
    b = torch.empty(elems, device=device)
    c = torch.rand(elems, device=device)
    copy = rates_of(2 * 4 * elems, time_trials(lambda: b.copy_(a), trials, clock=clock))
    triad = rates_of(3 * 4 * elems, time_trials(lambda: torch.add(c, a, alpha=3.0, out=b),
                                                trials, clock=clock))
    bw = copy if copy["value"] >= triad["value"] else triad
    return {**bw, "unit": "B/s",
            "how": f"STREAM-style {'copy' if bw is copy else 'triad'} over "
                   f"{elems * 4 / 2**20:.0f} MiB arrays{label} (copy best "
                   f"{copy['value'] / 1e9:.4g} GB/s, triad best {triad['value'] / 1e9:.4g} GB/s)"}


def measure(quick: bool = False, trials: int | None = None, progress=print) -> dict:
    """The measurements (``{key: {"value", "min", "median", "max", "unit", "how"}}``)."""
    import torch
    trials = trials or (3 if quick else 5)
    res: dict[str, dict] = {}

    sizes = [512, 1024] if quick else [512, 1024, 2048]
    progress("calibrate: fp32 matmul and convolution")
    res["vector_fp32"] = _best_matmul(torch.float32, sizes, trials)
    # the convolution library (oneDNN on x86) may reach a higher FP32 rate than the GEMM:
    # the peak is the best any kernel reaches
    for n, c, hw, k in ((4, 64, 56, 64), (4, 32, 64, 64), (8, 128, 28, 128)):
        x = torch.randn(n, c, hw, hw)
        w = torch.randn(k, c, 3, 3)

        def conv(x=x, w=w):
            for _ in range(5):
                torch.nn.functional.conv2d(x, w, padding=1)
        conv()                                    # the library builds its kernel once
        # a shared machine's rate varies by tens of percent from trial to trial: the peak is
        # the best of many short trials
        r = rates_of(5 * 2 * n * k * hw * hw * c * 9, time_trials(conv, max(trials, 15)))
        if r["value"] > res["vector_fp32"]["value"]:
            res["vector_fp32"] = {**r, "unit": "FLOP/s",
                                  "how": f"conv2d {n}x{c}x{hw}x{hw}, {k} 3x3 filters, float32"}
    try:
        progress("calibrate: bf16 matmul")
        res["tensor_bf16"] = _best_matmul(torch.bfloat16, sizes[:2], trials)
    except RuntimeError:
        pass
    # half the per-core caches the OS reports (1 MiB here): resident, and large enough that
    # the per-call dispatch cost is small against the work
    cs0 = caches()
    n = max(16384, min(cs0.get("l2", 2 << 20) // 2 // 4, 1 << 20))
    x = torch.rand(n)
    y = torch.rand(n)
    reps = 20 if quick else 100

    def fma():
        for _ in range(reps):
            x.mul_(1.0000001).add_(y)
    progress("calibrate: vector and special-function throughput")
    v = rates_of(2 * n * reps, time_trials(fma, trials))
    if v["value"] > res["vector_fp32"]["value"]:
        res["vector_fp32"] = {**v, "unit": "FLOP/s", "how": f"in-place multiply-add over {n * 4 // 1024} KiB"}
    z = torch.empty(n)
    u = torch.rand(n)                       # in [0, 1): the FMA loop above grew x without bound

    def exp():
        for _ in range(reps):
            torch.exp(u, out=z)
    res["sfu"] = {**rates_of(n * reps, time_trials(exp, trials)), "unit": "OP/s",
                  "how": f"torch.exp over {n * 4 // 1024} KiB"}
    cs = caches()
    llc = max(cs.values()) if cs else 32 * 2**20
    elems = max(64 * 2**20, 8 * llc) // 4
    if quick:
        elems = max(16 * 2**20, 4 * llc) // 4
    progress(f"calibrate: DRAM bandwidth ({elems * 4 / 2**20:.0f} MiB arrays)")
    res["bandwidth"] = _stream_bandwidth(elems, trials)
    res["caches"] = cs
    return res


def measure_cuda(quick: bool = False, trials: int | None = None, progress=print) -> dict:
    """The GPU's measurements, each timed with CUDA events: matmul peaks per dtype
    (``torch.mm``, cuBLAS; FP32 with TF32 off is the CUDA cores' FMA rate, with TF32 on the
    tensor cores'), the special-function rate (``exp`` in one compiled kernel, many per
    element loaded, when ``torch.compile`` works here), DRAM bandwidth (copy and triad over
    arrays eight times the L2) and what the driver reports (L2, shared memory and
    registers per SM times SMs, SM count, memory)."""
    import torch
    trials = trials or (3 if quick else 10)
    dev = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(dev)
    res: dict = {"device_name": props.name}

    from .timing import cuda_clock

    def mm(dtype, tf32: bool, sizes):
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            return _best_matmul(dtype, sizes, trials, "cuda", cuda_clock,
                                f"{' (TF32)' if tf32 else ''}, CUDA events")
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old
    sizes = [4096] if quick else [4096, 8192]
    for key, dtype, tf32 in (("vector_fp32", torch.float32, False),
                             ("tensor_tf32", torch.float32, True),
                             ("tensor_bf16", torch.bfloat16, False),
                             ("tensor_fp16", torch.float16, False)):
        progress(f"calibrate: {key} (torch.mm on {props.name})")
        res[key] = mm(dtype, tf32, sizes)
    progress("calibrate: special functions (exp, one compiled kernel)")
    try:
        res["sfu"] = _cuda_sfu(trials)
    except Exception as e:  # noqa: BLE001  (no Triton, no compiler: the pipe is not measured)
        progress(f"calibrate: special functions not measured ({type(e).__name__}: "
                 f"{str(e).splitlines()[0][:120] if str(e) else ''})")
    elems = max(8 * props.L2_cache_size, 256 << 20) // 4
    progress(f"calibrate: DRAM bandwidth ({elems * 4 / 2**20:.0f} MiB arrays)")
    res["bandwidth"] = _stream_bandwidth(elems, trials, "cuda", cuda_clock, ", CUDA events")
    res["memory"] = (props.total_memory, "cudaDeviceProp.totalGlobalMem")
    sms = props.multi_processor_count
    onchip = {"l2": (props.L2_cache_size, "cudaDeviceProp.l2CacheSize")}
    smem = getattr(props, "shared_memory_per_multiprocessor", None)
    if smem:
        onchip["smem"] = (smem * sms, f"cudaDeviceProp.sharedMemPerMultiprocessor x {sms} SMs")
    regs = getattr(props, "regs_per_multiprocessor", None)
    if regs:
        onchip["regs"] = (regs * 4 * sms, f"cudaDeviceProp.regsPerMultiprocessor x 4 B x "
                                          f"{sms} SMs")
    res["onchip"] = onchip
    res["compute"] = {"sm_count": (sms, "cudaDeviceProp.multiProcessorCount")}
    return res


def _cuda_sfu(trials: int) -> dict:
    """``exp`` throughput: one compiled kernel that loads each element once and applies
    ``exp`` 64 times (``x = exp(-x)`` stays in (0, 1]), so the loads are negligible."""
    import torch
    reps = 64

    def chain(x):
        for _ in range(reps):
            x = torch.exp(-x)
        return x
    f = torch.compile(chain, fullgraph=True)
    n = 1 << 26
    x = torch.rand(n, device="cuda")
    f(x)
    torch.cuda.synchronize()
    from .timing import cuda_clock
    r = rates_of(n * reps, time_trials(lambda: f(x), trials, clock=cuda_clock))
    return {**r, "unit": "OP/s", "how": f"exp applied {reps} times per element of {n} in one "
                                        f"compiled kernel, CUDA events"}


def host_toml(quick: bool = False, progress=print, device: str | None = None) -> str:
    """Measure and return the spec text: the GPU where PyTorch sees one (or ``device``),
    else the CPU."""
    import torch
    from .timing import device_of_choice
    if device_of_choice(device) == "cuda":
        from ...hardware.catalog import match_device
        res = measure_cuda(quick=quick, progress=progress)
        ref = match_device(res["device_name"])
        return spec_toml(res, f"torch {torch.__version__}, CUDA {torch.version.cuda}",
                         name=res["device_name"], kind="gpu", vendor="nvidia", fallback=ref)
    res = measure(quick=quick, progress=progress)
    return spec_toml(res, f"torch {torch.__version__}, {torch.get_num_threads()} threads")


__all__ = ["measure", "measure_cuda", "host_toml"]
