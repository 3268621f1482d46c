"""A transformer zoo built from transformers configs (random weights, no downloads).

Each model is tiny (2 layers, width 64, 4 heads of 16) and its MACs are derived here in
closed form: projections, attention pairs under its mask, norms (a norm's sum of squares
is a sum of products: T*width MACs per norm), heads. Every model must analyze with an
empty ``unsupported`` list and validate against transformers' own forward.
"""

import pytest
import torch

import solbound

T = pytest.importorskip("transformers")

from programs.hf import LM, Decode, StaticDecode  # noqa: E402  (after the skip: it needs transformers)

L, D, H, HD, KV, F, V = 2, 64, 4, 16, 2, 128, 128      # layers, width, heads, head dim, kv heads, ffn, vocab
S = 16                                                # prefill tokens
DEC = 8                                               # decoder tokens (encoder-decoder models)


def causal(s):
    return s * (s + 1) // 2


def window(s, w):
    return w * (w + 1) // 2 + (s - w) * w


def attn(pairs, heads=H, hd=HD):
    """q.k^T and p.v: one MAC each per (pair, head dim), per head."""
    return 2 * heads * hd * pairs


class Encoder(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, ids):
        return self.m(input_ids=ids).last_hidden_state


class Seq2Seq(torch.nn.Module):
    def __init__(self, m, key="input_ids"):
        super().__init__()
        self.m, self.key = m, key

    def forward(self, x, dec):
        return self.m(**{self.key: x}, decoder_input_ids=dec, use_cache=False).logits


def _check(module, inputs, macs):
    rep = solbound.analyze(module.eval(), inputs, validate=True)
    assert rep.lowered.unsupported == []
    assert rep.counts.macs == macs
    assert rep.validation["status"] == "passed", rep.validation
    return rep


def _ids(n=S):
    torch.manual_seed(0)
    return torch.randint(3, V, (1, n))


LLAMA_LIKE = dict(num_hidden_layers=L, hidden_size=D, intermediate_size=F, num_attention_heads=H,
                  num_key_value_heads=KV, vocab_size=V, max_position_embeddings=64)


def llama_macs(pairs, qk_norm=False, s=S):
    """GQA projections (q, o: D x H*HD; k, v: D x KV*HD), SwiGLU (3 D x F), two RMSNorms per
    layer (+ q/k norms for Qwen3), a final norm and the LM head, for ``s`` tokens."""
    proj = s * D * H * HD * 2 + s * D * KV * HD * 2
    mlp = 3 * s * D * F
    norms = 2 * s * D + (s * H * HD + s * KV * HD if qk_norm else 0)
    return L * (proj + mlp + norms + attn(pairs)) + s * D + s * D * V


def test_gpt2():
    cfg = T.GPT2Config(n_layer=L, n_embd=D, n_head=H, vocab_size=V, n_positions=64,
                       bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    per_layer = S * D * 3 * D + S * D * D + 2 * S * D * 4 * D + attn(causal(S)) + 2 * S * D
    _check(LM(T.GPT2LMHeadModel(cfg)), (_ids(),), L * per_layer + S * D + S * D * V)


def test_llama_gqa():
    torch.manual_seed(0)
    _check(LM(T.LlamaForCausalLM(T.LlamaConfig(**LLAMA_LIKE))), (_ids(),), llama_macs(causal(S)))


def test_llama_bf16_on_meta_runs_on_bf16_tensor_cores():
    with torch.device("meta"):
        m = T.LlamaForCausalLM(T.LlamaConfig(**LLAMA_LIKE)).to(torch.bfloat16)
    rep = solbound.analyze(LM(m), (torch.zeros(1, S, dtype=torch.long, device="meta"),))
    assert rep.lowered.unsupported == []
    assert rep.counts.macs == llama_macs(causal(S))
    pipes = rep.bound("h100-sxm", "fused").pipe_seconds
    assert "tensor_bf16" in pipes and "tensor_tf32" not in pipes and "vector_fp32" in pipes


def test_mistral_sliding_window():
    torch.manual_seed(0)
    cfg = T.MistralConfig(sliding_window=5, **LLAMA_LIKE)
    _check(LM(T.MistralForCausalLM(cfg)), (_ids(),), llama_macs(window(S, 5)))


def test_qwen2():
    torch.manual_seed(0)
    _check(LM(T.Qwen2ForCausalLM(T.Qwen2Config(**LLAMA_LIKE))), (_ids(),), llama_macs(causal(S)))


def test_qwen3_qk_norm():
    torch.manual_seed(0)
    _check(LM(T.Qwen3ForCausalLM(T.Qwen3Config(head_dim=HD, **LLAMA_LIKE))), (_ids(),),
           llama_macs(causal(S), qk_norm=True))


def test_bert_bidirectional():
    torch.manual_seed(0)
    cfg = T.BertConfig(num_hidden_layers=L, hidden_size=D, intermediate_size=F,
                       num_attention_heads=H, vocab_size=V, max_position_embeddings=64)
    per_layer = 4 * S * D * D + 2 * S * D * F + attn(S * S) + 2 * S * D
    _check(Encoder(T.BertModel(cfg, add_pooling_layer=False)), (_ids(),), L * per_layer + S * D)


def _enc_dec(s_enc, ffn=2):
    """Encoder and decoder stacks of width D, heads H x HD, FFN of ``ffn`` D x F matmuls;
    norms: 2 per encoder layer + final, 3 per decoder layer + final."""
    enc = L * (4 * s_enc * D * D + ffn * s_enc * D * F + attn(s_enc * s_enc) + 2 * s_enc * D) \
        + s_enc * D
    dec = L * (4 * DEC * D * D + attn(causal(DEC))                  # self-attention
               + 2 * DEC * D * D + 2 * s_enc * D * D + attn(DEC * s_enc)   # cross-attention
               + ffn * DEC * D * F + 3 * DEC * D) + DEC * D
    return enc + dec + DEC * D * V


def test_t5():
    torch.manual_seed(0)
    cfg = T.T5Config(num_layers=L, num_decoder_layers=L, d_model=D, d_ff=F, num_heads=H,
                     d_kv=HD, vocab_size=V)
    # relative position buckets (log of distances) are data-free: folded, not counted
    _check(Seq2Seq(T.T5ForConditionalGeneration(cfg)), (_ids(), _ids(DEC)), _enc_dec(S))


def test_whisper():
    torch.manual_seed(0)
    mel, frames = 16, 2 * S
    cfg = T.WhisperConfig(encoder_layers=L, decoder_layers=L, d_model=D, encoder_attention_heads=H,
                          decoder_attention_heads=H, encoder_ffn_dim=F, decoder_ffn_dim=F,
                          vocab_size=V, num_mel_bins=mel, max_source_positions=S,
                          max_target_positions=32, pad_token_id=0, bos_token_id=1,
                          eos_token_id=2, decoder_start_token_id=1)
    # conv1 (k3, pad 1) over 32 frames: 32*3 - 2 valid taps; conv2 (k3, stride 2, pad 1)
    # to 16 frames: 2 + 15*3 valid taps (taps on padding are not work)
    convs = D * mel * (frames * 3 - 2) + D * D * (2 + (S - 1) * 3)
    feats = torch.randn(1, mel, frames)
    _check(Seq2Seq(T.WhisperForConditionalGeneration(cfg), "input_features"), (feats, _ids(DEC)),
           convs + _enc_dec(S))


E, TOPK = 4, 2                                        # experts, experts per token


def moe(inter, shared=0, s=S):
    """Routed experts as T*k expert evaluations (SwiGLU: 3 D x inter each), the router
    (D x E per token), the weighted combine (a sum over k of weight * output: T*k*D), and
    ``shared`` always-on experts."""
    return s * D * E + s * TOPK * 3 * D * inter + s * TOPK * D + shared * 3 * s * D * inter


@pytest.mark.parametrize("dispatch", ["grouped_mm", "eager", "batched_mm"])
def test_mixtral_moe_routed_whatever_the_dispatch(dispatch):
    # every dispatch evaluates each (token, chosen expert) pair once; sorted (grouped_mm)
    # and looped (eager) dispatches are traced as batched_mm (stated), and validated
    # against the model running its own dispatch
    torch.manual_seed(0)
    cfg = T.MixtralConfig(num_local_experts=E, num_experts_per_tok=TOPK,
                          experts_implementation=dispatch, **LLAMA_LIKE)
    dense_mlp = 3 * S * D * F
    rep = _check(LM(T.MixtralForCausalLM(cfg)), (_ids(),),
                 llama_macs(causal(S)) + L * (moe(F) - dense_mlp))
    stated = [a for a in rep.to_dict()["assumptions"] if "mixture-of-experts" in a]
    assert len(stated) == (dispatch != "batched_mm")


def test_keeping_the_sorted_dispatch_reports_what_is_missing():
    cfg = T.MixtralConfig(num_local_experts=E, num_experts_per_tok=TOPK, **LLAMA_LIKE)
    rep = solbound.analyze(LM(T.MixtralForCausalLM(cfg).eval()), (_ids(),),
                           keep_experts_dispatch=True)
    # the sort and histogram that route tokens are counted (library routines); the grouped
    # matrix product over data-dependent group sizes is not, and is named
    missing = {u.operator for u in rep.lowered.unsupported}
    assert missing and all("grouped_mm" in m for m in missing), missing


def test_keeping_the_eager_dispatch_traces_it_under_balanced_routing():
    # transformers' own loop over the experts hit (nonzero, where, index_add_): traced
    # under the stated balanced routing, the same T*k evaluations, validated against the
    # model's own loop running under that routing
    torch.manual_seed(0)
    cfg = T.MixtralConfig(num_local_experts=E, num_experts_per_tok=TOPK,
                          experts_implementation="eager", **LLAMA_LIKE)
    rep = solbound.analyze(LM(T.MixtralForCausalLM(cfg).eval()), (_ids(),),
                           keep_experts_dispatch=True, validate=True)
    assert rep.lowered.unsupported == []
    assert rep.validation["status"] == "passed", rep.validation
    assert rep.counts.macs == llama_macs(causal(S)) + L * (moe(F) - 3 * S * D * F)
    assert any(a.startswith("assumption: routing is balanced")
               for a in rep.to_dict()["assumptions"])


def test_deepseek_v3_mla_and_moe():
    torch.manual_seed(0)
    q_lora, kv_lora, rope, nope, v_dim, inter = 24, 16, 8, 8, 16, 32
    cfg = T.DeepseekV3Config(num_hidden_layers=L, hidden_size=D, intermediate_size=F,
                             moe_intermediate_size=inter, num_attention_heads=H,
                             num_key_value_heads=H, vocab_size=V, max_position_embeddings=64,
                             kv_lora_rank=kv_lora, q_lora_rank=q_lora, qk_rope_head_dim=rope,
                             qk_nope_head_dim=nope, v_head_dim=v_dim, n_routed_experts=E,
                             num_experts_per_tok=TOPK, n_shared_experts=1,
                             first_k_dense_replace=1, n_group=1, topk_group=1)
    # multi-head latent attention: q down (D -> q_lora), norm, q up (-> H x (nope+rope));
    # kv down (D -> kv_lora + rope), norm, kv up (kv_lora -> H x (nope + v)); o (H*v -> D)
    mla = (S * D * q_lora + S * q_lora + S * q_lora * H * (nope + rope)
           + S * D * (kv_lora + rope) + S * kv_lora + S * kv_lora * H * (nope + v_dim)
           + S * H * v_dim * D)
    scores = H * causal(S) * (nope + rope) + H * causal(S) * v_dim
    per_layer = mla + scores + 2 * S * D
    mlps = 3 * S * D * F + moe(inter, shared=1)      # layer 0 dense, layer 1 routed + shared
    _check(LM(T.DeepseekV3ForCausalLM(cfg)), (_ids(),), L * per_layer + mlps + S * D + S * D * V)


def test_llama_decode_step_exact_macs_and_fused_bytes():
    torch.manual_seed(0)
    past = 20
    m = T.LlamaForCausalLM(T.LlamaConfig(**LLAMA_LIKE))
    kv = [torch.randn(1, KV, past, HD) for _ in range(2 * L)]
    rep = _check(Decode(m), (_ids(1), *kv),
                 L * (2 * D * H * HD + 2 * D * KV * HD + 3 * D * F + attn(past + 1) + 2 * D)
                 + D + D * V)
    # fused: every weight once (the embedding: the one row looked up), the past keys and
    # values, the token id (int64), the rotary inverse frequencies (HD/2), the logits
    weights = L * (2 * D * H * HD + 2 * D * KV * HD + 3 * D * F + 2 * D) + D + D * V + D
    assert rep.counts.fused.bytes == 4 * (weights + 2 * L * KV * past * HD + HD // 2 + V) + 8


MAX_LEN = 32


def test_llama_decode_step_against_a_static_cache():
    """transformers' StaticCache (preallocated to MAX_LEN positions), written in place at
    the position its fill counter gives. With the counter's value (stated), attention reads
    the PAST + 1 rows its mask keeps; the new row is written in place, nothing is copied."""
    torch.manual_seed(0)
    past = 20
    m = T.LlamaForCausalLM(T.LlamaConfig(**LLAMA_LIKE)).eval()
    rep = _check(StaticDecode(m, MAX_LEN, past), (_ids(1),),
                 L * (2 * D * H * HD + 2 * D * KV * HD + 3 * D * F + attn(past + 1) + 2 * D)
                 + D + D * V)
    caches = [t for t in rep.lowered.program.tensors if t.shape == (1, KV, MAX_LEN, HD)]
    assert len(caches) == 2 * L
    # one row per layer written (k and v), the PAST rows before it read; the new row is
    # read back from chip
    assert all(rep.counts.fused.writes[t.name] == KV * HD * 4 for t in caches)
    assert sum(rep.counts.fused.reads[t.name] for t in caches) == 2 * L * KV * past * HD * 4
    assert sum("holds 20, its value when analyzed" in a
               for a in rep.to_dict()["assumptions"]) == L          # one counter per layer


def test_static_cache_on_meta_counts_the_whole_cache_and_says_so():
    # on the meta device the fill counter has no value: attention over all MAX_LEN rows
    with torch.device("meta"):
        m = T.LlamaForCausalLM(T.LlamaConfig(**LLAMA_LIKE)).eval()
        mod = StaticDecode(m, MAX_LEN, 20)
        ids = torch.zeros(1, 1, dtype=torch.long)
    rep = solbound.analyze(mod, (ids,))
    assert rep.lowered.unsupported == []
    assert rep.counts.macs == L * (2 * D * H * HD + 2 * D * KV * HD + 3 * D * F
                                   + attn(MAX_LEN) + 2 * D) + D + D * V
    assert any("is known only at run time and a mask" in a for a in rep.to_dict()["assumptions"])


PAST = 20


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("name", ["llama", "mistral", "qwen2", "qwen3", "mixtral"])
def test_decoder_llms_decode_one_token(name, cache):
    """One decode step of each decoder LLM against PAST cached positions, the cache passed in
    (DynamicCache) or preallocated and updated in place (StaticCache): projections for one
    token, attention over the positions its mask keeps (all PAST+1, or the window)."""
    torch.manual_seed(0)
    models = {
        "llama": (T.LlamaForCausalLM, T.LlamaConfig(**LLAMA_LIKE), PAST + 1, False),
        "mistral": (T.MistralForCausalLM, T.MistralConfig(sliding_window=5, **LLAMA_LIKE), 5, False),
        "qwen2": (T.Qwen2ForCausalLM, T.Qwen2Config(**LLAMA_LIKE), PAST + 1, False),
        "qwen3": (T.Qwen3ForCausalLM, T.Qwen3Config(head_dim=HD, **LLAMA_LIKE), PAST + 1, True),
        "mixtral": (T.MixtralForCausalLM, T.MixtralConfig(num_local_experts=E, num_experts_per_tok=TOPK,
                                                          **LLAMA_LIKE), PAST + 1, False),
    }
    cls, cfg, keys, qk_norm = models[name]
    macs = llama_macs(keys, qk_norm, s=1)
    if name == "mixtral":
        macs += L * (moe(F, s=1) - 3 * D * F)
    if cache == "static":
        _check(StaticDecode(cls(cfg).eval(), MAX_LEN, PAST), (_ids(1),), macs)
        return
    kv = [torch.randn(1, KV, PAST, HD) for _ in range(2 * L)]
    _check(Decode(cls(cfg)), (_ids(1), *kv), macs)


def test_gpt2_decode_one_token():
    torch.manual_seed(0)
    cfg = T.GPT2Config(n_layer=L, n_embd=D, n_head=H, vocab_size=V, n_positions=64,
                       bos_token_id=0, eos_token_id=0)
    kv = [torch.randn(1, H, PAST, HD) for _ in range(2 * L)]
    per_layer = D * 3 * D + D * D + 2 * D * 4 * D + attn(PAST + 1) + 2 * D
    _check(Decode(T.GPT2LMHeadModel(cfg)), (_ids(1), *kv), L * per_layer + D + D * V)
