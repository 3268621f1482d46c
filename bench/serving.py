"""Serving bounds on the bundled configs (meta weights).

    python bench/serving.py [--part step|tp8|anchors|state|all] [--requests 30000] [--arch ...]

``step`` (Llama-3-8B): the step model's capture (traces, seconds), the exact and the float
step evaluation per call (``counts``, ``bound``), the step of ``512@0,1@4095x63``, and a
30,000-request workload's bounds and the seconds they took (the issue's target: <= 60 s,
capture included).

``tp8`` (Llama-3-70B at TP 8): the capture of rank 0's program, the same step per rank with
its all-reduces over NVLink, and 3,000 requests of 1000/1000 tokens on H100 and H200.

``anchors``: NVIDIA's published TensorRT-LLM throughputs (``docs/perf-overview.md``, offline,
fixed lengths, FP8) beside the bound of the same model and lengths with FP8 linears and an
FP8 cache (``serving/quantize.py``; an FP8 cache is the faster assumption, so the check is
the stricter one), and the BF16 bound for reference (FP8 runs may exceed it).

``state`` (models with linear-attention and SSM layers, transformers' default configs in
BF16 on the meta device: Mamba 2 with chunks of 256, then Jamba v0.1, whose capture did
not finish in 8 minutes on a 2-core machine: 32 layers of 3 kinds, 16 experts a MoE
layer, so each point is 4 shallow traces): each one's capture, the step ``512@0,1@4095x63`` and, beside it, the weights and
the sequences' states the step reads and writes."""

import argparse
import random
import sys
import time

from solbound.serving import Seq, StepModel
from solbound.serving.models import load_model
from solbound.serving.workload import Limits, Request, serve


# (isl, osl, requests, output tok/s on H100, on H200): TensorRT-LLM perf-overview.md at
# commit 00f37686 (PyTorch backend), nvidia/Llama-3.1-8B-Instruct-FP8, TP 1
TRT_8B = [(128, 128, 30000, 28312, 27911), (128, 2048, 3000, 22714, 26221),
          (500, 2000, 3000, 17660, 20770), (1000, 1000, 3000, 15220, 17744),
          (2048, 128, 3000, 3450, 3538), (2048, 2048, 1500, 9305, 12194),
          (5000, 500, 1500, 3459, 3902), (20000, 2000, 1000, 1351, 1804)]
# v0.17 of the same file (commit 258c7540): Llama-3.1-70B FP8 (weights and KV), H100 TP 8
TRT_70B = [(1000, 1000, 3000, 11451, None)]


def anchors() -> None:
    for name, rows, tp in (("llama-3.1-8b", TRT_8B, 1), ("llama-3.1-70b", TRT_70B, 8)):
        t0 = time.perf_counter()
        models = {"BF16": StepModel(load_model(name), tp=tp),
                  "FP8": StepModel(load_model(name), tp=tp, weights="fp8", kv_dtype="fp8")}
        for isl, osl, n, h100, h200 in rows:
            reqs = [Request(isl, osl)] * n
            docs = {k: serve(sm, reqs, "h100-sxm,h200", Limits()) for k, sm in models.items()}
            for i, (arch, got) in enumerate((("h100-sxm", h100), ("h200", h200))):
                if got is None:
                    continue
                b = {k: d["serving"][i] for k, d in docs.items()}
                fp8 = b["FP8"]["output_tokens_per_second"]
                print(f"{name} TP {tp} {isl}/{osl} x{n} {arch}: measured {got:,} tok/s; "
                      f"bound FP8 {fp8:,.0f} ({b['FP8']['bound']}; measured "
                      f"{got / fp8:.0%} of it{', ABOVE' if got > fp8 else ''}), BF16 "
                      f"{b['BF16']['output_tokens_per_second']:,.0f}", flush=True)
        print(f"  ({time.perf_counter() - t0:.0f} s with the captures)", flush=True)


def tp8(arch: str) -> None:
    t0 = time.perf_counter()
    sm = StepModel(load_model("llama-3-70b"), tp=8)
    seqs = [Seq(512, 0)] + [Seq(1, 4095)] * 63
    sm.warm(seqs)
    print(f"Llama-3-70B TP 8 capture: {time.perf_counter() - t0:.1f} s, {sm.traces} traces; "
          f"{sm.weights_bytes() / 1e9:.2f} GB of weights per rank")
    for b in sm.bounds(seqs, arch):
        print(f"  step 512@0,1@4095x63 per rank on {b.arch}: {b.seconds * 1e3:.3f} ms "
              f"({b.bound}; link {b.comm_seconds * 1e3:.3f} ms, compute "
              f"{b.compute_seconds * 1e3:.3f} ms, memory {b.memory_seconds * 1e3:.3f} ms)")
    t = time.perf_counter()
    doc = serve(sm, [Request(1000, 1000)] * 3000, arch, Limits())
    print(f"  3000 requests 1000/1000: {time.perf_counter() - t:.1f} s")
    for e in doc["serving"]:
        print(f"  {e['arch']}: <= {e['output_tokens_per_second']:,.0f} output tok/s "
              f"({e['output_tokens_per_second_per_chip']:,.0f} per chip; {e['bound']}), TPOT "
              f">= {e['tpot_seconds']['p50'] * 1e3:.2f} ms, link "
              f"{e['work_seconds']['communication']:.1f} s of {e['makespan_seconds']:.1f} s")


def state() -> None:
    import transformers
    from solbound.serving.capacity import weights_bytes
    seqs = [Seq(512, 0)] + [Seq(1, 4095)] * 63
    for cfg in (transformers.Mamba2Config(), transformers.JambaConfig()):
        import torch
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        t0 = time.perf_counter()
        sm = StepModel(model.eval())
        c = sm.counts(seqs)
        b = sm.bound(seqs, "h100-sxm")
        st = sum(L.state_bytes() for L in sm.layout)
        w = weights_bytes(model)
        print(f"{type(model).__name__} (transformers' default {type(cfg).__name__}): "
              f"{sm.traces} traces, {time.perf_counter() - t0:.1f} s; step 512@0,1@4095x63: "
              f"{c.macs:.4g} MACs, {c.bytes / 1e9:.2f} GB fused, {b.seconds * 1e3:.2f} ms "
              f"on h100-sxm ({b.bound}); beside it: weights {w / 1e9:.2f} GB (the "
              f"embedding table gathered, not read whole), a sequence's state "
              f"{st / 1e6:.2f} MB (63 decodes read it, but the oldest convolution column, "
              f"and 64 sequences write it: about {127 * st / 1e9:.2f} GB)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", choices=("step", "tp8", "anchors", "state", "all"),
                    default="step")
    ap.add_argument("--requests", type=int, default=30000)
    ap.add_argument("--arch", default="h100-sxm,b200")
    a = ap.parse_args()
    if a.part in ("tp8", "all"):
        tp8("h100-sxm,h200")
    if a.part in ("anchors", "all"):
        anchors()
    if a.part in ("state", "all"):
        state()
    if a.part not in ("step", "all"):
        return
    t0 = time.perf_counter()
    sm = StepModel(load_model("llama-3-8b"))
    seqs = [Seq(512, 0)] + [Seq(1, 4095)] * 63
    sm.warm(seqs)
    print(f"capture (prefill and decode regions): {time.perf_counter() - t0:.1f} s, "
          f"{sm.traces} shallow traces")
    for name, fn in (("counts (exact)", lambda: sm.counts(seqs)),
                     ("bound (float)", lambda: sm.bound(seqs, "h100-sxm"))):
        n, t = 0, time.perf_counter()
        while time.perf_counter() - t < 1.0:
            fn()
            n += 1
        print(f"  {name:<15} {1e3 * (time.perf_counter() - t) / n:.3f} ms per call "
              f"(64 sequences)")
    for b in sm.bounds(seqs, a.arch):
        print(f"  step 512@0,1@4095x63 on {b.arch}: {b.seconds * 1e3:.3f} ms ({b.bound})")
    rng = random.Random(0)      # ShareGPT-like spread: prompts 16..4096, outputs 16..1024
    reqs = [Request(rng.randint(16, 4096), rng.randint(16, 1024))
            for _ in range(a.requests)]
    t = time.perf_counter()
    doc = serve(sm, reqs, a.arch, Limits())
    print(f"{a.requests} requests: {time.perf_counter() - t:.1f} s for the bounds "
          f"({time.perf_counter() - t0:.1f} s with the capture); notes: {doc['notes'] or 'none'}")
    for e in doc["serving"]:
        print(f"  {e['arch']}: makespan >= {e['makespan_seconds']:.1f} s, <= "
              f"{e['output_tokens_per_second']:,.0f} output tok/s ({e['bound']}), TTFT p50 >= "
              f"{e['ttft_seconds']['p50']:.3f} s, TPOT p50 >= "
              f"{e['tpot_seconds']['p50'] * 1e3:.2f} ms, {e['min_steps']} steps at least")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
