"""FP8 serving programs: the linear layers and the cache an FP8 engine runs.

transformers' own FP8 linear (``integrations/finegrained_fp8.FP8Linear``) and torchao's
FP8 configurations call CUDA kernels (Triton, DeepGEMM, a compute-capability check), so an
FP8 step is not traced from them. Instead the model's ``nn.Linear`` layers (the LM head
kept, as FP8 checkpoints keep it: ``nvidia/Llama-3.1-8B-Instruct-FP8`` and vLLM's
``Fp8LinearMethod`` leave ``lm_head`` in BF16) run the W8A8 program vLLM's
``Fp8LinearMethod`` and TensorRT-LLM's FP8 GEMMs run, written in PyTorch:

* the weight stored in ``float8_e4m3fn`` with a float32 scale per output row;
* the activations quantized per token (``amax / 448``) in the forward;
* ``torch._scaled_mm`` of the two (row-wise scales, output in the activations' dtype): a
  product on the FP8 tensor cores (solbound's rule for ``_scaled_mm``).

An FP8 key/value cache (vLLM's ``--kv-cache-dtype fp8``) stores its rows in
``float8_e4m3fn`` (scale 1, vLLM's default) and hands attention the rows converted back to
the activations' dtype: :func:`fp8_cache` turns each layer of a transformers cache into one
that does that (its ``update`` casts the new rows in, the whole rows out).
"""

from __future__ import annotations

FP8_MAX = 448.0        # float8_e4m3fn's largest finite value


def _fp8():
    import torch
    return torch.float8_e4m3fn


def _fp8_forward(self, x):
    import torch
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    scale = x2.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
    q = (x2.float() / scale).to(_fp8())
    out = torch._scaled_mm(q, self.weight.t(), scale_a=scale, scale_b=self.weight_scale.t(),
                           bias=self.bias, out_dtype=x.dtype)
    return out.reshape(*shape[:-1], out.shape[-1])


def shard_scales(model) -> None:
    """After transformers' tensor-parallel plan sharded ``model`` (FP8 linears made before,
    so the plan's forward wraps theirs): a column-wise linear's rank holds its rows' scales
    (rank 0's first rows), a row-wise one every row's (the plan knows the weights, not the
    scales). On the meta device: shapes only."""
    import torch
    for mod in model.modules():
        w, ws = getattr(mod, "weight", None), getattr(mod, "weight_scale", None)
        if ws is None or not hasattr(w, "placements"):
            continue
        p = w.placements[0]
        if p.is_shard() and p.dim % w.ndim == 0:
            rows = w.to_local().shape[0]
            mod.weight_scale = torch.nn.Parameter(ws.detach()[:rows], requires_grad=False)


def fp8_linears(model, keep=("lm_head",)) -> int:
    """Every ``nn.Linear`` of ``model`` but those named in ``keep`` as an FP8 W8A8 linear
    (in place; see the module doc); returns how many. On the meta device no values move;
    with real weights each row is scaled onto e4m3's range."""
    import types

    import torch
    n = 0
    for name, mod in list(model.named_modules()):
        if type(mod) is not torch.nn.Linear or name.rsplit(".", 1)[-1] in keep:
            continue
        w = mod.weight.detach()
        amax = w.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12)
        scale = amax / FP8_MAX
        mod.weight = torch.nn.Parameter((w.float() / scale).to(_fp8()), requires_grad=False)
        mod.weight_scale = torch.nn.Parameter(scale, requires_grad=False)
        if mod.bias is not None:
            mod.bias = torch.nn.Parameter(mod.bias.detach(), requires_grad=False)
        mod.forward = types.MethodType(_fp8_forward, mod)
        n += 1
    return n


_CLASSES: dict = {}


def _fp8_layer(cls):
    """``cls`` (a transformers cache layer) storing its rows in FP8."""
    if cls not in _CLASSES:
        def update(self, key_states, value_states, *args, **kwargs):
            dt = key_states.dtype
            keys, values = cls.update(self, key_states.to(_fp8()), value_states.to(_fp8()),
                                      *args, **kwargs)
            return keys.to(dt), values.to(dt)
        _CLASSES[cls] = type(f"Fp8{cls.__name__}", (cls,), {"update": update})
    return _CLASSES[cls]


def fp8_cache(cache):
    """``cache`` (a transformers ``DynamicCache``) with every layer storing FP8 rows."""
    for layer in cache.layers:
        layer.__class__ = _fp8_layer(type(layer))
    return cache
