"""Wrappers that give transformers models a tensors-in, tensor-out forward (shared by the
zoo tests and bench/transformers_zoo.py)."""
import torch


class LM(torch.nn.Module):
    """A causal LM's logits for ``input_ids`` (prefill, no cache)."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, ids):
        return self.m(input_ids=ids, use_cache=False).logits


class Decode(torch.nn.Module):
    """One decode step of a transformers decoder against a cache of past positions (a
    DynamicCache filled from the inputs: the past keys and values are program inputs)."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, ids, *kv):
        from transformers import DynamicCache
        cache = DynamicCache(config=self.m.config)
        for i in range(0, len(kv), 2):
            cache.update(kv[i], kv[i + 1], i // 2)
        return self.m(input_ids=ids, past_key_values=cache, use_cache=True).logits
