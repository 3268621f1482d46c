"""Wrappers that give transformers models a tensors-in, tensor-out forward (shared by the
zoo tests and bench/transformers_zoo.py)."""
import inspect

import torch


def cache_kw(model, cache) -> dict:
    """The cache argument as ``model``'s forward names it: ``cache`` from transformers 5.25
    on (``past_key_values`` is deprecated there, to be removed in 5.40), else
    ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return {"cache" if "cache" in params else "past_key_values": cache}


class LM(torch.nn.Module):
    """A causal LM's logits for ``input_ids`` (prefill, no cache)."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, ids):
        return self.m(input_ids=ids, use_cache=False).logits


class ImageTextLM(torch.nn.Module):
    """A vision-language model's logits for ``input_ids`` (image tokens among them) and
    ``pixel_values`` (prefill, no cache), called as its documentation calls it."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, pixel_values):
        return self.m(input_ids=input_ids, pixel_values=pixel_values, use_cache=False).logits


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
        return self.m(input_ids=ids, **cache_kw(self.m, cache), use_cache=True).logits


class StaticDecode(torch.nn.Module):
    """One decode step against transformers' ``StaticCache`` (preallocated to ``max_len``
    positions, written in place at the cache position), as a served model runs. The
    position is ``past`` (known to the program) or, with ``runtime_position``, an input."""

    def __init__(self, m, max_len: int, past: int, runtime_position: bool = False):
        super().__init__()
        from transformers import StaticCache
        self.m, self.past, self.runtime = m, past, runtime_position
        self.cache = StaticCache(config=m.config, max_cache_len=max_len)
        with torch.no_grad():       # fill positions 0..past-1 (and allocate the cache)
            g = torch.Generator().manual_seed(1)
            ids = torch.randint(0, m.config.vocab_size, (1, past), generator=g)
            m(input_ids=ids, **cache_kw(m, self.cache), cache_position=torch.arange(past),
              use_cache=True)

    def forward(self, ids, *position):
        pos = position[0] if self.runtime else torch.arange(self.past, self.past + ids.shape[1])
        return self.m(input_ids=ids, **cache_kw(self.m, self.cache), cache_position=pos,
                      use_cache=True).logits
