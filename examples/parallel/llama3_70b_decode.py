"""One decode step of Llama-3-70B (transformers' LlamaForCausalLM, bf16, built on the meta
device): one new token per sequence against a KV cache of CONTEXT - 1 past positions (a
DynamicCache filled from the inputs). Under --tp N each rank holds 1/N of the heads and of
the MLP (transformers' own tensor-parallel plan), so the cache it reads is 8/N key-value
heads.

    solbound analyze examples/parallel/llama3_70b_decode.py --tp 8 --arch h100-sxm
    solbound provision examples/parallel/llama3_70b_decode.py --tp 1,2,4,8 --latency 10ms
"""

import inspect

import torch
import torch.distributed as dist
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

BATCH, CONTEXT = 1, 4096
HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 8192, 80, 64, 8, 128, 28672, 128256


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        cfg = LlamaConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                          num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                          head_dim=HEAD_DIM, intermediate_size=FFN, vocab_size=VOCAB,
                          max_position_embeddings=8192, rope_theta=500000.0)
        self.lm = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()

    def forward(self, ids, *kv):
        cache = DynamicCache(config=self.lm.config)
        for layer, entry in enumerate(cache.layers):     # the past, held as the cache holds it
            entry.device, entry.is_initialized = kv[0].device, True
            entry.keys, entry.values = kv[2 * layer], kv[2 * layer + 1]
        # transformers 5.25 names the argument ``cache`` (``past_key_values`` is deprecated)
        name = "cache" if "cache" in inspect.signature(self.lm.forward).parameters \
            else "past_key_values"
        return self.lm(input_ids=ids, **{name: cache}, use_cache=True).logits


def get_inputs():
    ranks = dist.get_world_size() if dist.is_initialized() else 1
    kv = KV_HEADS // ranks                       # this rank's key-value heads
    ids = torch.zeros(BATCH, 1, dtype=torch.long)
    return [ids] + [torch.zeros(BATCH, kv, CONTEXT - 1, HEAD_DIM, dtype=torch.bfloat16)
                    for _ in range(2 * LAYERS)]


def get_init_inputs():
    return []
