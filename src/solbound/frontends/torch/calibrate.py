"""``solbound calibrate`` on a PyTorch install: measure the machine this runs on.

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

from ...measure.host import time_trials, rates_of, caches, spec_toml


def measure(quick: bool = False, trials: int | None = None, progress=print) -> dict:
    """The measurements (``{key: {"value", "min", "median", "max", "unit", "how"}}``)."""
    import torch
    trials = trials or (3 if quick else 5)
    res: dict[str, dict] = {}

    def matmul(dtype, sizes):
        best = None
        for n in sizes:
            a = torch.randn(n, n).to(dtype)
            b = torch.randn(n, n).to(dtype)
            c = torch.empty(n, n, dtype=dtype)
            r = rates_of(2 * n ** 3, time_trials(lambda: torch.mm(a, b, out=c), trials))
            r["how"] = f"torch.mm {n}x{n}x{n} {dtype}".replace("torch.", "")
            if best is None or r["value"] > best["value"]:
                best = r
        return best
    sizes = [512, 1024] if quick else [512, 1024, 2048]
    progress("calibrate: fp32 matmul and convolution")
    res["vector_fp32"] = {**matmul(torch.float32, sizes), "unit": "FLOP/s"}
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
        bf = matmul(torch.bfloat16, sizes[:2])
        res["tensor_bf16"] = {**bf, "unit": "FLOP/s"}
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
    a = torch.rand(elems)
    b = torch.empty(elems)
    c = torch.rand(elems)
    progress(f"calibrate: DRAM bandwidth ({elems * 4 / 2**20:.0f} MiB arrays)")
    copy = rates_of(2 * 4 * elems, time_trials(lambda: b.copy_(a), trials))
    triad = rates_of(3 * 4 * elems, time_trials(lambda: torch.add(c, a, alpha=3.0, out=b), trials))
    bw = copy if copy["value"] >= triad["value"] else triad
    res["bandwidth"] = {**bw, "unit": "B/s",
                        "how": f"STREAM-style {'copy' if bw is copy else 'triad'} over "
                               f"{elems * 4 / 2**20:.0f} MiB arrays (copy best "
                               f"{copy['value'] / 1e9:.3g} GB/s, triad best "
                               f"{triad['value'] / 1e9:.3g} GB/s)"}
    res["caches"] = cs
    return res


def host_toml(quick: bool = False, progress=print) -> str:
    """Measure and return the spec text."""
    import torch
    res = measure(quick=quick, progress=progress)
    return spec_toml(res, f"torch {torch.__version__}, {torch.get_num_threads()} threads")


__all__ = ["measure", "host_toml"]
