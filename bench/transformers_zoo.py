"""Transformer zoo at realistic sizes: analyze time, peak memory, MACs against the closed
form, fused bound per chip and the binding unit.

    python bench/transformers_zoo.py                 # every model below
    python bench/transformers_zoo.py --models llama3-8b-prefill --tokens 4096

Models are built from configs on the meta device (random weights are never allocated);
analysis runs on fake tensors. Prefill uses transformers' LlamaForCausalLM; decode steps are
the static-KV-cache block of tests/programs/llama_decode.py stacked to 8B sizes, transformers
with a DynamicCache passed in, and transformers with its StaticCache (full at ``context``
positions, so attention over the whole cache is exact even though the fill counter has no
value on the meta device). The Mixtral-8x7B prefill keeps transformers' eager expert loop,
traced under the balanced routing assumption.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

import torch

import solbound

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

# Llama-3-8B
D, LAYERS, H, KV, HD, F, V = 4096, 32, 32, 8, 128, 14336, 128256
CHIPS = "h100-sxm,b200,mi300x,jetson-thor"


def causal(s):
    return s * (s + 1) // 2


def llama_8b():
    """The Llama-3-8B configuration, bf16, built on the meta device (nothing allocated)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=H,
                      num_key_value_heads=KV, intermediate_size=F, vocab_size=V,
                      max_position_embeddings=8192)
    with torch.device("meta"):
        return LlamaForCausalLM(cfg).to(torch.bfloat16).eval()


def llama_prefill(tokens):
    from programs.hf import LM
    ids = torch.zeros(1, tokens, dtype=torch.long, device="meta")
    t = tokens
    per_layer = (2 * t * D * H * HD + 2 * t * D * KV * HD + 3 * t * D * F
                 + 2 * H * HD * causal(t) + 2 * t * D)
    return LM(llama_8b()), (ids,), LAYERS * per_layer + t * D + t * D * V


def llama_decode(context):
    from programs.llama_decode import Model
    pos = context - 1

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList(Model(D, H, KV, HD, F, context, pos)
                                              for _ in range(LAYERS))

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return x
    import programs.llama_decode as mod
    mod.batch = 1
    with torch.device("meta"):
        m = Decoder().to(torch.bfloat16)
    x = torch.zeros(1, 1, D, dtype=torch.bfloat16, device="meta")
    per_layer = D * H * HD * 2 + 2 * D * KV * HD + 3 * D * F + 2 * H * HD * context + 2 * D
    return m, (x,), LAYERS * per_layer


def llama_decode_transformers(context):
    """transformers' LlamaForCausalLM, one token against ``context - 1`` cached positions
    (a DynamicCache filled from the past keys and values, which are program inputs)."""
    from programs.hf import Decode
    past = context - 1
    kv = [torch.zeros(1, KV, past, HD, dtype=torch.bfloat16, device="meta")
          for _ in range(2 * LAYERS)]
    ids = torch.zeros(1, 1, dtype=torch.long, device="meta")
    per_layer = 2 * D * H * HD + 2 * D * KV * HD + 3 * D * F + 2 * H * HD * context + 2 * D
    return Decode(llama_8b()), (ids, *kv), LAYERS * per_layer + D + D * V


def llama_decode_static(context):
    """transformers' LlamaForCausalLM with its StaticCache of ``context`` positions, the
    first ``context - 1`` filled: one token written in place, attention over the cache."""
    from programs.hf import StaticDecode
    m = llama_8b()
    with torch.device("meta"):
        mod = StaticDecode(m, context, context - 1)
    ids = torch.zeros(1, 1, dtype=torch.long, device="meta")
    per_layer = 2 * D * H * HD + 2 * D * KV * HD + 3 * D * F + 2 * H * HD * context + 2 * D
    return mod, (ids,), LAYERS * per_layer + D + D * V


def llama_decode_executorch(context):
    """transformers' own export wrapper for decode, ``TorchExportableModuleWithStaticCache``
    (what ExecuTorch users export), at cache position ``context - 1`` of a ``context``-long
    StaticCache; it traces only under strict export, which capture retries. On the meta
    device the position has no value: attention over the whole cache (stated)."""
    from transformers import GenerationConfig
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache
    m = llama_8b()
    m.generation_config = GenerationConfig(
        use_cache=True, cache_implementation="static",
        cache_config={"batch_size": 1, "max_cache_len": context})
    with torch.device("meta"):
        mod = TorchExportableModuleWithStaticCache(m)
        ids = torch.zeros(1, 1, dtype=torch.long)
        pos = torch.tensor([context - 1])
    per_layer = 2 * D * H * HD + 2 * D * KV * HD + 3 * D * F + 2 * H * HD * context + 2 * D
    return mod, (ids, None, pos), LAYERS * per_layer + D + D * V


def llama_70b_prefill(tokens):
    """Llama-3-70B (80 layers, hidden 8192, 64 heads, 8 KV heads, FFN 28672), bf16, meta."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from programs.hf import LM
    d, layers, h, kv, hd, f = 8192, 80, 64, 8, 128, 28672
    cfg = LlamaConfig(hidden_size=d, num_hidden_layers=layers, num_attention_heads=h,
                      num_key_value_heads=kv, intermediate_size=f, vocab_size=V,
                      max_position_embeddings=8192)
    with torch.device("meta"):
        m = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    ids = torch.zeros(1, tokens, dtype=torch.long, device="meta")
    t = tokens
    per_layer = (2 * t * d * h * hd + 2 * t * d * kv * hd + 3 * t * d * f
                 + 2 * h * hd * causal(t) + 2 * t * d)
    return LM(m), (ids,), layers * per_layer + t * d + t * d * V


MAMBA_LAYERS = 24


def mamba_slow(tokens):
    """transformers' Mamba at mamba-130m's shape (width 768, state 16, expand 2, conv 4,
    dt rank 48, ``MAMBA_LAYERS`` layers), fp32 on the CPU, through its slow path (the
    one every user without the CUDA kernels gets): a Python loop over the time steps,
    which tracing unrolls. Closed form per layer and token: in_proj D*2E, the depthwise
    conv E*4, x_proj E*(R+2N), dt_proj R*E, the scan's state update and readout E*N
    each (dA*h + dB*x, then h.C), the skip and gate, out_proj E*D, the RMSNorm D."""
    from transformers import MambaConfig, MambaForCausalLM
    d, n, e, r, v = 768, 16, 1536, 48, 50280
    cfg = MambaConfig(hidden_size=d, state_size=n, num_hidden_layers=MAMBA_LAYERS,
                      expand=2, conv_kernel=4, time_step_rank=r, vocab_size=v,
                      use_mambapy=False)
    with torch.device("meta"):
        m = MambaForCausalLM(cfg).eval()
    ids = torch.zeros(1, tokens, dtype=torch.long, device="meta")
    t = tokens
    conv = e * sum(min(i + 1, 4) for i in range(t))     # causal taps: no padding products
    per_layer = (t * d * 2 * e + conv + t * e * (r + 2 * n) + t * r * e + t * e * n
                 + t * e * d + t * d)
    return m, (ids,), MAMBA_LAYERS * per_layer + t * d + t * d * v


E, K = 8, 2


def mixtral_prefill(tokens):
    """Mixtral-8x7B (the Llama-like attention above, 8 experts, top-2), its own eager loop
    over the experts hit: T*k expert evaluations under the balanced routing."""
    from transformers import MixtralConfig, MixtralForCausalLM
    from programs.hf import LM
    cfg = MixtralConfig(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=H,
                        num_key_value_heads=KV, intermediate_size=F, vocab_size=32000,
                        max_position_embeddings=8192, num_local_experts=E,
                        num_experts_per_tok=K, experts_implementation="eager")
    with torch.device("meta"):
        m = MixtralForCausalLM(cfg).to(torch.bfloat16).eval()
    ids = torch.zeros(1, tokens, dtype=torch.long, device="meta")
    t = tokens
    per_layer = (2 * t * D * H * HD + 2 * t * D * KV * HD + 2 * H * HD * causal(t)
                 + t * D * E + t * K * 3 * D * F + t * K * D + 2 * t * D)
    return LM(m), (ids,), LAYERS * per_layer + t * D + t * D * 32000


MODELS = {"llama3-8b-prefill": llama_prefill, "llama3-8b-decode": llama_decode,
          "llama3-8b-decode-transformers": llama_decode_transformers,
          "llama3-8b-decode-static": llama_decode_static,
          "llama3-8b-decode-executorch": llama_decode_executorch,
          "llama3-70b-prefill": llama_70b_prefill, "mamba-130m-slow": mamba_slow,
          "mixtral-8x7b-prefill": mixtral_prefill}
KEEP_DISPATCH = {"mixtral-8x7b-prefill"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--tokens", type=int, default=2048, help="prefill tokens")
    ap.add_argument("--context", type=int, default=4096, help="decode context")
    ap.add_argument("--mamba-tokens", type=int, default=2048)
    ap.add_argument("--mamba-layers", type=int, default=24)
    a = ap.parse_args()
    global MAMBA_LAYERS
    MAMBA_LAYERS = a.mamba_layers
    for name in a.models:
        arg = a.tokens if "prefill" in name else a.mamba_tokens if "mamba" in name else a.context
        module, inputs, closed = MODELS[name](arg)
        t0 = time.perf_counter()
        rep = solbound.analyze(module, inputs, arch=CHIPS,
                               keep_experts_dispatch=name in KEEP_DISPATCH)
        dt = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(f"## {name} ({'tokens' if 'prefill' in name else 'context'} {arg})")
        print(f"analyze {dt:.1f} s, peak RSS {peak:.2f} GiB (process so far), "
              f"unsupported {len(rep.lowered.unsupported)}")
        if closed is not None:
            print(f"MACs {rep.counts.macs:,} vs closed form {closed:,} "
                  f"({'equal' if rep.counts.macs == closed else 'DIFFERENT'})")
        else:
            print(f"MACs {rep.counts.macs:,}")
        print(f"bytes fused {rep.counts.fused.bytes:,}, unfused {rep.counts.unfused.bytes:,}")
        print("| chip | fused | unfused | fused bound by |")
        print("|---|---|---|---|")
        for spec in rep.specs:
            f = rep.bound(spec.id, "fused")
            u = rep.bound(spec.id, "unfused")
            why = f"compute ({f.binding_unit})" if f.bound == "compute" else "memory"
            print(f"| {spec.id} | {f.seconds * 1e3:.3f} ms | {u.seconds * 1e3:.3f} ms | {why} |")
        print()


if __name__ == "__main__":
    main()
