"""What the model's cache really keeps, and how many sequences fit a chip next to the weights.

The cache is read from the model's own cache class (:func:`.step.cache_layout`): per layer
the key and value rows of one token and, for a sliding-window layer, the ``window - 1`` rows
it keeps at most; a linear-attention or SSM layer's convolution and recurrent state per
sequence. Nothing here is a per-family formula.

>>> from solbound.serving.step import CacheLayer
>>> full = CacheLayer("full", (8, 128), (8, 128), "bfloat16", "bfloat16")
>>> local = CacheLayer("window", (8, 128), (8, 128), "bfloat16", "bfloat16", window=4096)
>>> m = Memory(80e9, 0.9, 16_000_000_000, (full, local))
>>> m.kv_bytes(10_000) == 4096 * 10_000 + 4096 * 4095
True
>>> m.kv_steps(3, 4) == sum(m.kv_bytes(t) for t in range(3, 7))
True
>>> m.max_sequences(8192)   # (72e9 - 16e9) // (4096 * 8192 + 4096 * 4095)
1112

A linear-attention or SSM layer holds a state per sequence, whatever its length:

>>> ssm = CacheLayer("state", (), (), "", "", None,
...                  (("conv", 0, (8192, 4), "bfloat16"), ("recurrent", 0, (64, 128, 128), "float32")))
>>> h = Memory(80e9, 0.9, 16_000_000_000, (full, ssm))
>>> h.state_bytes(), h.kv_bytes(100) == 4096 * 100 + 65536 + 4194304
(4259840, True)
>>> h.kv_steps(3, 4) == sum(h.kv_bytes(t) for t in range(3, 7))
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..hardware.catalog import Spec
from .step import CacheLayer, StepError


@dataclass(frozen=True)
class Memory:
    """A chip's DRAM as a serving engine splits it: ``capacity * fraction`` (vLLM's
    ``gpu_memory_utilization``) holds the weights and the cache; ``layout`` is the cache."""
    capacity: float
    fraction: float
    weights: int
    layout: tuple[CacheLayer, ...]

    @property
    def free(self) -> float:
        """Bytes left for the cache."""
        return self.capacity * self.fraction - self.weights

    def kv_bytes(self, tokens: int) -> int:
        """The cache bytes of one sequence of ``tokens`` tokens (window layers keep at most
        ``window - 1`` rows)."""
        return self.state_bytes() + sum(
            L.bytes_per_token() * (min(tokens, L.window - 1) if L.window else tokens)
            for L in self.layout)

    def state_bytes(self) -> int:
        """The state one sequence holds whatever its length: its linear-attention and SSM
        layers' convolution and recurrent states (0 for a key/value cache)."""
        return sum(L.state_bytes() for L in self.layout)

    def bytes_per_token(self) -> dict[str, int]:
        """Cache bytes per token per kind of layer (``full``, ``window``), all layers."""
        out: dict[str, int] = {}
        for L in self.layout:
            if L.kind != "state":
                out[L.kind] = out.get(L.kind, 0) + L.bytes_per_token()
        return out

    def kv_steps(self, start: int, count: int) -> int:
        """``sum(kv_bytes(t) for t in range(start, start + count))`` in closed form: the
        cache a sequence holds over ``count`` consecutive steps of one new token each."""
        if count <= 0:
            return 0
        total = count * self.state_bytes()
        last = start + count - 1
        for L in self.layout:
            cap = L.window - 1 if L.window else last
            lo, hi = start, min(last, cap)          # rows grow up to the cap ...
            grow = (lo + hi) * (hi - lo + 1) // 2 if hi >= lo else 0
            flat = (last - max(hi, lo - 1)) * cap if last > hi else 0   # ... then stay
            total += L.bytes_per_token() * (grow + flat)
        return total

    def max_sequences(self, tokens: int) -> int:
        """The most sequences of ``tokens`` tokens whose caches fit next to the weights."""
        per = self.kv_bytes(tokens)
        return max(0, math.floor(self.free / per)) if per else 0


def weights_bytes(model) -> int:
    """The bytes of the model's parameters and persistent buffers (tied weights once); of a
    DTensor (a tensor-parallel shard), this rank's local part."""
    seen, total = set(), 0
    for t in list(model.parameters()) + [b for _, b in _persistent_buffers(model)]:
        if id(t) in seen:
            continue
        seen.add(id(t))
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def _persistent_buffers(model):
    for mname, mod in model.named_modules():
        skip = getattr(mod, "_non_persistent_buffers_set", set())
        for bname, b in mod.named_buffers(recurse=False):
            if bname not in skip and b is not None:
                yield f"{mname}.{bname}" if mname else bname, b


def dram_capacity(spec: Spec) -> float:
    """The chip's DRAM bytes from its catalog entry (``[dram] capacity``)."""
    v = spec.entries.get("dram.capacity", {}).get("value")
    if v is None:
        raise StepError(f"{spec.id} lists no DRAM capacity ([dram] capacity): serving "
                        f"capacity needs it")
    return float(v)


def memory_of(step_model, spec: Spec, fraction: float = 0.9) -> Memory:
    """The :class:`Memory` of ``step_model`` on ``spec``; :class:`StepError` when the
    weights alone do not fit ``capacity * fraction``."""
    if not 0 < fraction <= 1:
        raise StepError(f"memory fraction {fraction} is not in (0, 1]")
    m = Memory(dram_capacity(spec), fraction, step_model.weights_bytes(),
               tuple(step_model.layout))
    if m.free <= 0:
        tp = getattr(step_model, "tp", 1)
        need = math.ceil(m.weights * tp / (m.capacity * fraction))      # chips, at least
        raise StepError(f"{step_model.name}'s weights ({m.weights / 1e9:.1f} GB"
                        f"{' per chip' if tp > 1 else ''}) do not fit {fraction:g} of "
                        f"{spec.id}'s {m.capacity / 1e9:.0f} GB: they need at least "
                        f"{need} chips (--tp {1 << (need - 1).bit_length()} or more)")
    return m
