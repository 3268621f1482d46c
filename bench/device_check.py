"""The device check: calibrate the GPU this runs on, then time KernelBench L1 problems and a
bf16 transformer block against their bounds on it. One prepared script for a lent machine.

    python bench/device_check.py --kb /path/to/KernelBench/KernelBench [--out DIR] [--quick]

1. ``solbound calibrate`` (the GPU where PyTorch sees one: matmul peaks per dtype, exp in a
   compiled kernel, STREAM copy/triad, all timed with CUDA events; else the CPU) into
   ``DIR/config/host.toml``, printed next to the catalog entry the device matches;
2. for each problem: analyze on ``host`` and on that catalog entry, time it eager and with
   ``torch.compile`` (warm-up, trials timed with CUDA events after an L2 flush), and write
   bound/measured per fidelity to ``DIR/device_check.csv``. A fused bound above a measured
   time (ratio > 1) is a bug in a count, in calibrate or in the model.

KernelBench problems are read from ``--kb`` (a checkout; never committed here); the
transformer block is this file's own (a pre-norm decoder layer, causal SDPA, SwiGLU, bf16).
The whole run takes a few minutes on an H100-class GPU; ``--quick`` fewer trials and sizes.
On a machine without a GPU it runs the same steps on the CPU (a dry run of the script).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
import warnings

L1 = ["1_Square_matrix_multiplication_.py", "2_Standard_matrix_multiplication_.py",
      "19_ReLU.py", "23_Softmax.py", "40_LayerNorm.py", "47_Sum_reduction_over_a_dimension.py",
      "54_conv_standard_3D__square_input__square_kernel.py",
      "63_conv_standard_2D__square_input__square_kernel.py", "97_ScaledDotProductAttention.py",
      "36_RMSNorm_.py"]

BLOCK = '''import torch
import torch.nn.functional as F

HIDDEN, HEADS, FFN, BATCH, SEQ = {hidden}, {heads}, {ffn}, {batch}, {seq}


class Model(torch.nn.Module):
    """A pre-norm decoder layer: RMSNorm, causal attention, RMSNorm, SwiGLU; bf16."""

    def __init__(self):
        super().__init__()
        self.n1 = torch.nn.RMSNorm(HIDDEN)
        self.qkv = torch.nn.Linear(HIDDEN, 3 * HIDDEN, bias=False)
        self.o = torch.nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.n2 = torch.nn.RMSNorm(HIDDEN)
        self.gate_up = torch.nn.Linear(HIDDEN, 2 * FFN, bias=False)
        self.down = torch.nn.Linear(FFN, HIDDEN, bias=False)
        self.to(torch.bfloat16)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, s, 3, HEADS, h // HEADS).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, h))
        g, u = self.gate_up(self.n2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


def get_inputs():
    return [torch.randn(BATCH, SEQ, HIDDEN, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
'''


def main() -> int:
    warnings.filterwarnings("ignore")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kb", help="KernelBench/KernelBench (the folder with level1/)")
    ap.add_argument("--out", default="device_check")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--trials", type=int, default=None)
    ap.add_argument("--problems", nargs="*", default=None, help="L1 file names (default: ten)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    os.environ["SOLBOUND_CONFIG_DIR"] = os.path.abspath(os.path.join(a.out, "config"))
    import torch

    import solbound
    from solbound.cli import main as cli
    from solbound.frontends.torch.capture import load_problem
    from solbound.frontends.torch.timing import MeasureError, measure_problem
    from solbound.hardware.catalog import load_spec, match_device
    t0 = time.perf_counter()
    gpu = torch.cuda.is_available()
    print(f"device: {torch.cuda.get_device_name() if gpu else 'cpu (no GPU: a dry run)'}; "
          f"torch {torch.__version__}", flush=True)
    if cli(["calibrate"] + (["--quick"] if a.quick else [])) != 0:
        return 1
    host = load_spec("host")
    ref = match_device(host.name) if gpu else None
    archs = [host] + ([ref] if ref is not None else [])
    print(f"calibrated in {time.perf_counter() - t0:.0f} s", flush=True)

    files = []
    if a.kb:
        names = a.problems or (L1[:4] if a.quick else L1)
        for n in names:
            p = os.path.join(a.kb, "level1", n)
            if os.path.exists(p):
                files.append(p)
            else:
                print(f"skip {n}: not in {a.kb}/level1", flush=True)
    shape = (dict(hidden=4096, heads=32, ffn=14336, batch=4, seq=2048) if gpu and not a.quick
             else dict(hidden=1024, heads=8, ffn=2816, batch=1, seq=512) if gpu
             else dict(hidden=256, heads=4, ffn=704, batch=1, seq=128))
    block = os.path.join(a.out, "bf16_decoder_block.py")
    with open(block, "w") as f:
        f.write(BLOCK.format(**shape))
    files.append(block)

    trials = a.trials or (5 if a.quick else 20)
    fields = ["problem", "arch", "fidelity", "bound_s", "eager_s", "compile_s",
              "bound_over_eager", "bound_over_compile", "eager_spread", "compile_spread"]
    rows = []
    for path in files:
        name = os.path.basename(path)
        t = time.perf_counter()
        try:
            rep = solbound.analyze_source(path, arch=archs)
            meas = measure_problem(load_problem(path), ("eager", "compile"), trials=trials,
                                   warmup=3)
        except (MeasureError, Exception) as e:  # noqa: BLE001  (one problem's failure is a row)
            print(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
            rows.append({"problem": name, "arch": "error", "fidelity": str(e)[:200]})
            continue
        for b in rep.bounds:
            e, c = meas["eager"], meas["compile"]
            rows.append({"problem": name, "arch": b.arch, "fidelity": b.mode,
                         "bound_s": f"{b.seconds:.6g}", "eager_s": f"{e['median']:.6g}",
                         "compile_s": f"{c['median']:.6g}",
                         "bound_over_eager": f"{b.seconds / e['median']:.4f}",
                         "bound_over_compile": f"{b.seconds / c['median']:.4f}",
                         "eager_spread": f"{e['min']:.4g}..{e['max']:.4g}",
                         "compile_spread": f"{c['min']:.4g}..{c['max']:.4g}"})
        fused = rep.bound("host", "fused").seconds
        best = min(meas["eager"]["median"], meas["compile"]["median"])
        flag = "  <-- bound above measured" if fused > best else ""
        print(f"{name}: fused bound {fused * 1e6:.1f} us, eager {meas['eager']['median'] * 1e6:.1f}"
              f" us, compile {meas['compile']['median'] * 1e6:.1f} us, bound/best "
              f"{fused / best:.3f} ({time.perf_counter() - t:.0f} s){flag}", flush=True)
    out = os.path.join(a.out, "device_check.csv")
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {out} ({len(rows)} rows) in {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
