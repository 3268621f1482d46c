"""Three analytic step models beside solbound's counts of the traced step, on the same
Llama-3-8B steps (BF16, TP 1, dense, no sliding window): vLLM's ``perf.py`` (its MFU
estimate), LLM-Viewer and GenZ, each written here from its own code.

    python bench/step_formulas.py

**vLLM** (``vllm/v1/metrics/perf.py``, commit 00cee63e of vllm-project/vllm), for a dense
GQA model: per step with ``T`` new tokens, ``TC`` the sum over requests of new tokens x
context length (context = cached + new tokens, as its docstring counts a 2048-token
prefill as ``add(2048, 2048)``), ``L`` layers:

* FLOPs: q/k/v ``2 T D (q + 2 kv) d L``, out ``2 T D q d L``, attention ``2 q TC d L`` for q.k
  and again for p.v, SwiGLU ``2 D 3 F T L``, unembedding ``2 D V`` per prefill request and
  per decode token;
* read bytes: the weights once (q/k/v, out, up/gate, down, LM head), each GEMM's input
  activations, the attention input (prefill: ``(T q + 2 context kv) d`` in the activation
  dtype; decode: ``T q d`` plus ``2 context kv d`` cache bytes), SiLU's input;
* write bytes: q/k/v and the new KV rows, out, up/gate, SiLU, down outputs, the logits.

**LLM-Viewer** (hahnyuan/LLM-Viewer commit 472f71f1, ``model_analyzer.py``
``ModelAnalyzer.analyze`` with ``configs/Llama.py``, FlashAttention off): one call is a
prefill of ``B`` sequences of ``n`` tokens or a decode of one token against ``c`` cached;
a layer per op (OPs, bytes) in :func:`llm_viewer`; the LM head once per sequence at ``B h V``
OPs (one per MAC, where every other op counts two) and its weights, no embedding, final
norm or rotary. It has no mixed batch nor a prefill against a cache: the mixed step is its
prefill plus its decode (the weights counted twice), the extend step its prefill of the new
tokens (the cached keys left out).

**GenZ** (abhibambhaniya/GenZ-LLM-Analyzer commit 091bdd0a, ``GenZ/Models/attention.py``,
``ffn.py``, ``embedding.py``, ``get_language_model.py``, ``operators.py``): GEMMs
``T x K -> T x M`` at ``2 T K M`` FLOPs with bytes ``T K + K M + T M`` elements, ``Logit``
and ``Attend`` over the full ``M x N`` rectangle of each request (``N`` = past + new: no
causal half), the embedding as a GEMM of a one-hot ``T x V`` input, the classifier over
every new token (prefill and chunked paths) or one a decode; no norms, softmax, activation
or residual adds. Its chunked path expresses the mixed and extend steps; the decode path is
run with beam 1 (GenZ's default beam of 4 multiplies the GEMM batch). Bytes as GenZ's "Total
Data" (every operand, the score matrices included) and without the scores (``Logit``'s
output and ``Attend``'s input, which GenZ pins on chip).

solbound counts the traced program instead (``StepModel.counts``: MACs, fused bytes); the
script prints each and its ratio to solbound's, and ``docs/serving.md`` explains the
differences.
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


def llm_viewer(cfg, seqs: list[Seq]) -> dict:
    """LLM-Viewer's OPs and bytes (see the module doc): a prefill of equal sequences with
    no cache (``n@0``), a decode (``1@c``), or a mixed step as the sum of the two calls."""
    D, L, V = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    H, KV = cfg.num_attention_heads, cfg.num_key_value_heads
    d = getattr(cfg, "head_dim", None) or D // H
    F, a = cfg.intermediate_size, BYTES
    P = 2 * D * H * d + 2 * D * KV * d + 3 * D * F          # q, o, k, v, gate, up, down

    def call(B, n, c):
        """B sequences: a prefill of n tokens (c = 0) or a decode of 1 against c."""
        T = B * n
        keys = n if c == 0 else c                             # the score row's length
        sq = B * H * n * keys                                 # score elements
        ops = 2 * T * P + 2 * 2 * B * H * n * keys * d + 5 * sq + 14 * T * D + 2 * T * D \
            + 2 * T * D                                       # norms, adds, the activation
        q_read = T * KV * d if c == 0 else B * H * d          # its q.k reads q at KV heads
        kv_read = 2 * B * keys * KV * d if c else 2 * T * KV * d
        byt = (P + T * (6 * D + F) + T * (3 * D + 2 * F) + 2 * T * KV * d        # linears
               + q_read + sq + sq + T * H * d + kv_read                          # q.k, p.v
               + 2 * sq + 2 * 2 * T * D + 2 * 2 * T * D + 3 * T * D) * a         # softmax, ...
        return {"flops": L * ops + B * D * V, "bytes": L * byt + (D * V + D + V) * a}
    parts = []
    pre = [s for s in seqs if s.ctx == 0 and s.new > 1]
    dec = [s for s in seqs if s.new == 1 and s.ctx > 0]
    ext = [s for s in seqs if s not in pre and s not in dec]
    for n in sorted({s.new for s in pre}):
        parts.append(call(sum(1 for s in pre if s.new == n), n, 0))
    for c in sorted({s.ctx for s in dec}):
        parts.append(call(sum(1 for s in dec if s.ctx == c), 1, c))
    for s in ext:                                   # no cache in a prefill: its new tokens
        parts.append(call(1, s.new, 0))
    return {"flops": sum(p["flops"] for p in parts), "bytes": sum(p["bytes"] for p in parts),
            "calls": len(parts)}


def genz(cfg, seqs: list[Seq]) -> dict:
    """GenZ's FLOPs and bytes (see the module doc): the chunked path for a step with
    prefill chunks and decodes (a prefill alone: its prefill path, the same operators)."""
    D, L, V = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    H, KV = cfg.num_attention_heads, cfg.num_key_value_heads
    d = getattr(cfg, "head_dim", None) or D // H
    F, a = cfg.intermediate_size, BYTES
    T = sum(s.new for s in seqs)
    pre = [s for s in seqs if not (s.new == 1 and s.ctx > 0)]
    tp = sum(s.new for s in pre)                     # tokens the embedding GEMM covers
    gemms = [(D, (H + 2 * KV) * d), (H * d, D), (D, 2 * F), (F, D)]   # (K, M) a layer
    macs = L * sum(T * k * m for k, m in gemms)
    byt = L * sum(T * k + k * m + T * m for k, m in gemms)
    scores = 0
    for s in seqs:
        m_, n_ = s.new, s.ctx + s.new
        macs += L * 2 * H * m_ * n_ * d
        sc = H * m_ * n_
        scores += L * 2 * sc
        byt += L * ((H * m_ * d + KV * n_ * d + sc) + (sc + KV * n_ * d + H * m_ * d))
    decode_only = not pre
    logits = len(seqs) if decode_only else T        # the classifier's rows
    macs += logits * D * V
    byt += logits * D + D * V + logits * V
    if not decode_only:                              # the one-hot embedding GEMM
        macs += tp * V * D
        byt += tp * V + V * D + tp * D
    return {"flops": 2 * macs, "bytes": byt * a, "bytes_off_chip": (byt - scores) * a}

def main() -> None:
    model = load_model("llama-3-8b")
    sm = StepModel(model)
    steps = {"prefill 512@0": [Seq(512, 0)], "prefill 4096@0": [Seq(4096, 0)],
             "decode 64 x 1@4095": [Seq(1, 4095)] * 64,
             "mixed 512@0 + 63 x 1@4095": [Seq(512, 0)] + [Seq(1, 4095)] * 63,
             "extend 256@1024": [Seq(256, 1024)]}
    tools = {"vLLM perf.py": vllm_perf, "LLM-Viewer": llm_viewer, "GenZ": genz}
    print(f"{'step':<28} {'tool':<13} {'GFLOP':>9} {'x solbound':>10} {'GB':>8} {'x solbound':>10}")
    for name, seqs in steps.items():
        c = sm.counts(seqs)
        f_sb = sum(c.flops.values())
        print(f"{name:<28} {'solbound':<13} {f_sb / 1e9:9.1f} {'':>10} {c.bytes / 1e9:8.3f}"
              f"    (MACs {c.macs / 1e9:.1f} G, fused bytes)")
        for tool, fn in tools.items():
            v = fn(model.config, seqs)
            print(f"{'':<28} {tool:<13} {v['flops'] / 1e9:9.1f} {v['flops'] / f_sb:10.3f} "
                  f"{v['bytes'] / 1e9:8.3f} {v['bytes'] / c.bytes:10.3f}")
        v = vllm_perf(model.config, seqs)
        parts = ", ".join(f"{k} {x / 1e9:.1f}" for k, x in v["flops_parts"].items())
        print(f"    vLLM FLOPs: {parts}")
        print(f"    vLLM bytes: weights {v['weights'] / 1e9:.3f}, attention input "
              f"{v['attn_input'] / 1e9:.3f}, other activations read "
              f"{v['activations'] / 1e9:.3f}, writes {v['writes'] / 1e9:.3f} GB")
        g = genz(model.config, seqs)
        print(f"    GenZ bytes without the score matrices: {g['bytes_off_chip'] / 1e9:.3f} GB")


if __name__ == "__main__":
    main()
