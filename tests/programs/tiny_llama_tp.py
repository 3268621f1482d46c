"""A tiny Llama (3 layers, grouped-query attention) called on token ids, for --tp."""
import torch
from transformers import LlamaConfig, LlamaForCausalLM

TOKENS = 8


def config():
    return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       vocab_size=256)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lm = LlamaForCausalLM(config()).eval()

    def forward(self, ids):
        return self.lm(input_ids=ids, use_cache=False).logits


def get_inputs():
    return [torch.randint(0, 256, (1, TOKENS))]


def get_init_inputs():
    return []
