"""vLLM's analytic step model (``vllm/v1/metrics/perf.py``, its MFU estimate) beside
solbound's step counts, on the same Llama-3-8B steps (BF16, TP 1, dense, no sliding window).

    python bench/vllm_perf_formulas.py

The formulas are written here from perf.py's definitions (commit 00cee63e of
vllm-project/vllm), for a dense GQA model: per step with ``T`` new tokens, ``TC`` the sum
over requests of new tokens x context length (context = cached + new tokens, as its
docstring counts a 2048-token prefill as ``add(2048, 2048)``), ``L`` layers:

* FLOPs: q/k/v ``2 T D (q + 2 kv) d L``, out ``2 T D q d L``, attention ``2 q TC d L`` for q.k
  and again for p.v, SwiGLU ``2 D 3 F T L``, unembedding ``2 D V`` per prefill request and
  per decode token;
* read bytes: the weights once (q/k/v, out, up/gate, down, LM head), each GEMM's input
  activations, the attention input (prefill: ``(T q + 2 context kv) d`` in the activation
  dtype; decode: ``T q d`` plus ``2 context kv d`` cache bytes), SiLU's input;
* write bytes: q/k/v and the new KV rows, out, up/gate, SiLU, down outputs, the logits.

solbound counts the traced program instead (``StepModel.counts``: MACs, fused bytes); the
script prints both and the ratio of each, and ``docs/serving.md`` explains the differences.
"""

from solbound.serving import Seq, StepModel
from solbound.serving.models import load_model

BYTES = 2          # BF16 weights, activations and cache


def vllm_perf(cfg, seqs: list[Seq]) -> dict:
    D, L, V = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    q, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    d = getattr(cfg, "head_dim", None) or D // q
    F = cfg.intermediate_size
    T = sum(s.new for s in seqs)
    TC = sum(s.new * (s.ctx + s.new) for s in seqs)
    prefill = [s for s in seqs if s.new > 1 or s.ctx == 0]
    decode = [s for s in seqs if s not in prefill]
    logits = len(prefill) + sum(s.new for s in decode)
    flops = {"qkv": 2 * T * D * (q + 2 * kv) * d * L, "out": 2 * T * D * q * d * L,
             "attn": 2 * (2 * q * TC * d * L), "ffn": 2 * D * 3 * F * T * L,
             "unembed": 2 * logits * D * V}
    pt, pc = sum(s.new for s in prefill), sum(s.ctx + s.new for s in prefill)
    dt, dc = sum(s.new for s in decode), sum(s.ctx + s.new for s in decode)
    weights = (D * (q + 2 * kv) * d + q * d * D + 3 * D * F) * L * BYTES + D * V * BYTES
    attn_in = ((pt * q + 2 * pc * kv) * d + dt * q * d + 2 * dc * kv * d) * BYTES * L
    act_in = (T * D + T * q * d + T * D + 2 * T * F + T * F) * BYTES * L + logits * D * BYTES
    writes = ((T * (q + 2 * kv) * d + 2 * T * kv * d + T * D + 3 * T * F + T * D) * BYTES * L
              + logits * V * BYTES)
    return {"flops": sum(flops.values()), "flops_parts": flops, "weights": weights,
            "attn_input": attn_in, "activations": act_in, "writes": writes,
            "bytes": weights + attn_in + act_in + writes}


def main() -> None:
    model = load_model("llama-3-8b")
    sm = StepModel(model)
    steps = {"prefill 512@0": [Seq(512, 0)], "prefill 4096@0": [Seq(4096, 0)],
             "decode 64 x 1@4095": [Seq(1, 4095)] * 64,
             "mixed 512@0 + 63 x 1@4095": [Seq(512, 0)] + [Seq(1, 4095)] * 63,
             "extend 256@1024": [Seq(256, 1024)]}
    print(f"{'step':<28} {'vLLM GFLOP':>11} {'solbound':>9} {'ratio':>6}  "
          f"{'vLLM GB':>8} {'solbound':>9} {'ratio':>6}")
    for name, seqs in steps.items():
        v = vllm_perf(model.config, seqs)
        c = sm.counts(seqs)
        f_sb = sum(c.flops.values())
        print(f"{name:<28} {v['flops'] / 1e9:11.1f} {f_sb / 1e9:9.1f} "
              f"{v['flops'] / f_sb:6.3f}  {v['bytes'] / 1e9:8.3f} {c.bytes / 1e9:9.3f} "
              f"{v['bytes'] / c.bytes:6.3f}")
        parts = ", ".join(f"{k} {x / 1e9:.1f}" for k, x in v["flops_parts"].items())
        print(f"    vLLM FLOPs: {parts}; solbound MACs {c.macs / 1e9:.1f} G")
        print(f"    vLLM bytes: weights {v['weights'] / 1e9:.3f}, attention input "
              f"{v['attn_input'] / 1e9:.3f}, other activations read "
              f"{v['activations'] / 1e9:.3f}, writes {v['writes'] / 1e9:.3f} GB")


if __name__ == "__main__":
    main()
