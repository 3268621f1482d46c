"""Published training runs against the bound of their own plan (``solbound plan``'s
composition, ``planning/search.evaluate``): every published step must take at least the
bound.

Anchors (H100 SXM, BF16):

* Llama 3 405B pre-training (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 4):
  8,192 GPUs at TP 8, PP 16, DP 64 and 16,384 GPUs at TP 8, PP 16, DP 128, sequences of
  8,192 tokens, 16M tokens a step, 430 and 400 TFLOP/s per GPU (43% and 41% MFU); and
  16,384 GPUs at TP 8, CP 16, PP 16, DP 8 on sequences of 131,072 tokens (16M tokens a
  step), 380 TFLOP/s (38%).

The published time of a step is derived from its TFLOP/s per GPU and our count of the
step's FLOPs (the TP-1 step's tensor-core FLOPs: 6 N T plus causal attention, counted from
the program); where Meta counted attention otherwise the ratio moves by that difference.
The bound takes the better of 1F1B and interleaved (2 chunks) schedules, microbatches of
one sequence, ZeRO 1 (Meta shards optimizer state and gradients), no recompute.

    python bench/plan_anchors.py            # traces Llama-3.1-405B at TP 1 and 8 once
"""

from __future__ import annotations

import time

ANCHORS = [
    # name, chips, tp, cp, pp, dp, seq, global batch (sequences), TFLOP/s per GPU, MFU
    ("Llama 3 405B, 8,192 GPUs", 8192, 8, 1, 16, 64, 8192, 2048, 430e12, 0.43),
    ("Llama 3 405B, 16,384 GPUs", 16384, 8, 1, 16, 128, 8192, 2048, 400e12, 0.41),
    ("Llama 3 405B, 131k, CP 16", 16384, 8, 16, 16, 8, 131072, 128, 380e12, 0.38),
]


def main() -> None:
    from solbound.pipeline import specs_of
    from solbound.planning.search import Plan, evaluate
    from solbound.planning.trace import profiles
    from solbound.serving.models import load_config
    cfg, _ = load_config("llama-3.1-405b")
    spec = specs_of("h100-sxm")[0]
    t0 = time.perf_counter()
    seqs = sorted({a[6] for a in ANCHORS})
    prof = {s: profiles(cfg, [(1, 1), (8, 1)], s, "bfloat16", spec.id) for s in seqs}
    print(f"profiles traced or read in {time.perf_counter() - t0:.1f} s")
    print(f"{'run':<28} {'plan':<40} {'bound':>9} {'published':>10} {'ratio':>6} "
          f"{'bound TF/s':>10} {'memory':>9}")
    for name, chips, tp, cp, pp, dp, seq, gb, tflops, mfu in ANCHORS:
        ref, p = prof[seq][(1, 1)], prof[seq][(tp, 1)]
        flops = ref.tensor_flops * gb
        m = gb // dp
        best = None
        for sch, v in (("1f1b", 1), ("interleaved", 2)):
            r = evaluate(Plan(tp, pp, dp, 1, m, sch, v, 1, "none", cp), p, spec,
                         model_flops=flops)
            if best is None or r["seconds"] < best["seconds"]:
                best = r
        published = flops / (chips * tflops)
        print(f"{name:<28} {best['label']:<40} {best['seconds']:>8.3f}s {published:>9.3f}s "
              f"{published / best['seconds']:>5.2f}x {flops / chips / best['seconds'] / 1e12:>10.0f} "
              f"{best['memory_bytes'] / 2**30:>7.1f}Gi")
        assert published >= best["seconds"], f"{name}: published step below the bound"


if __name__ == "__main__":
    main()
