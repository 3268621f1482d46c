"""A tiny Mixtral (2 layers, 8 experts, top-2) called on token ids, for --ep (transformers' own expert-parallel plan)."""
import torch
from transformers import MixtralConfig, MixtralForCausalLM

TOKENS = 8


def config():
    return MixtralConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         vocab_size=256, num_local_experts=8, num_experts_per_tok=2)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lm = MixtralForCausalLM(config()).eval()

    def forward(self, ids):
        return self.lm(input_ids=ids, use_cache=False).logits


def get_inputs():
    return [torch.randint(0, 256, (1, TOKENS))]


def get_init_inputs():
    return []
