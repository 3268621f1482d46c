"""PyTorch's CPU int4 weights: ``_convert_weight_to_int4pack_for_cpu`` packs an int32
``[N, K]`` matrix of 4-bit values into uint8 ``[N, K/2]``, and
``_weight_int4pack_mm_for_cpu(x, packed, group, scale_and_zero)`` multiplies ``x [M, K]`` by
it, dequantizing each weight as ``(q - 8) * scale + zero`` with a scale and zero per group of
``group`` inputs and output (``scale_and_zero [K/group, N, 2]``).

The layout (PyTorch's ``aten/src/ATen/native/cpu/int4mm_kernel.cpp``): outputs in blocks of
``W``, block ``b`` holding output ``Wb + (W/2)h + l`` (``h < 2``, ``l < W/2``) at input ``k`` in
byte ``(W/2)k + l`` of the block's ``(W/2)K`` bytes, nibble ``h`` (low first); the last
``R = N mod W`` outputs (a multiple of 16) in one block where output ``2j + h`` of it is in
byte ``(R/2)k + j``, nibble ``h``. The block width is the kernel's vector width (``W =
BLOCK_N = Vectorized<float>::size() * 4``: 64 with AVX-512, 32 with AVX2), so the same packed
tensor means different weights on different CPUs. The rules therefore state the layout for
each width and find the one this machine's packing kernel uses before lowering
(:func:`block_width`, probed by :func:`layout_holds`): a machine that packs in neither
gets a one-line refusal naming the probe, never a wrong IR.

The dequantization is vector work per weight (a shift, a mask, a conversion, a subtract, a
multiply and an add), on chip in the fused bound; the product runs in the activations' dtype
(weight-only quantization). The CUDA operators (``_weight_int4pack_mm``,
``_convert_weight_to_int4pack``) use tinygemm's tiled int32 layout and cannot run here to
be checked: they have no rule and are reported unsupported.
"""

from __future__ import annotations

import functools

from ....ir.affine import Aff
from ....ir.model import Idx
from ..lower import KernelBuilder, LoweringError, OpCtx, View, rule
from ._util import C, add, f, mul, sub
from .linalg import _matmul


WIDTHS = (64, 32)      # AVX-512, AVX2


def positions(n_out: int, k_in: int, width: int = 64):
    """``[n_out, k_in / 2, 2]``: the weight (``output * k_in + input``) in each nibble of
    the packed tensor, evaluated from the very indices the kernels use (:func:`_blocks`)."""
    import numpy as np
    want = np.full(n_out * k_in, -1, dtype=np.int64)
    for loops, n, byte, h in _blocks(n_out, k_in, width):
        names = [v for v, _ in loops] + ["k"]
        grids = np.meshgrid(*[np.arange(e) for _, e in loops], np.arange(k_in), indexing="ij")
        env = dict(zip(names, grids))
        want[byte.evaluate(env) * 2 + h.evaluate(env)] = n.evaluate(env) * k_in + env["k"]
    return want.reshape(n_out, k_in // 2, 2)


@functools.lru_cache(maxsize=None)
def layout_holds(n_out: int, k_in: int = 64, width: int = 64) -> bool:
    """This machine's ``_convert_weight_to_int4pack_for_cpu`` puts every 4-bit weight of an
    ``n_out x k_in`` matrix where :func:`positions` says for blocks of ``width`` outputs:
    each weight's position is packed, four bits at a time, and read back from the
    nibbles."""
    import torch
    idx = torch.arange(n_out * k_in, dtype=torch.int64).reshape(n_out, k_in)
    got = torch.zeros(n_out, k_in // 2, 2, dtype=torch.int64)
    for p in range(((n_out * k_in - 1).bit_length() + 3) // 4):
        digit = ((idx >> (4 * p)) & 0xF).to(torch.int32)
        packed = torch._convert_weight_to_int4pack_for_cpu(digit, 1).to(torch.int64)
        got[..., 0] |= (packed & 0xF) << (4 * p)
        got[..., 1] |= (packed >> 4) << (4 * p)
    return bool(torch.equal(got, torch.from_numpy(positions(n_out, k_in, width))))


def _probe_size(n_out: int, width: int) -> int:
    """The layout repeats block by block: two blocks and the tail stand for all."""
    return min(n_out, 2 * width + n_out % width)


def block_width(n_out: int) -> int | None:
    """The block width this machine packs ``n_out`` outputs with (:data:`WIDTHS`), or
    ``None`` when its packing kernel follows neither layout."""
    for w in WIDTHS:
        if layout_holds(_probe_size(n_out, w), 64, w):
            return w
    return None


def _check(n_out: int, k_in: int, what: str) -> int:
    """The block width to lower ``n_out x k_in`` packed weights with (refused otherwise)."""
    if n_out % 16 or k_in % 2:
        raise LoweringError(f"{what}: {n_out} outputs and {k_in} inputs: PyTorch packs int4 "
                            f"weights of a multiple of 16 outputs and an even number of inputs")
    width = block_width(n_out)
    if width is None:
        raise LoweringError(f"{what}: this machine's int4 packing kernel does not put weights "
                            f"where solbound's model of the layout says for blocks of "
                            f"{' or '.join(map(str, WIDTHS))} outputs (probed with "
                            f"_convert_weight_to_int4pack_for_cpu on "
                            f"{_probe_size(n_out, WIDTHS[-1])}x64 positions: "
                            f"frontends/torch/rules/int4pack.py)")
    return width


def _flat(v: View) -> View:
    if not v.is_full:
        raise LoweringError("int4 packed weights that are a strided view of another tensor")
    return View(v.base, v.meta.reshape(-1), v.base_shape)


def _blocks(n_out: int, k_in: int, width: int = 64):
    """(kernel loops, output, byte offset in the flat packed tensor, nibble) per block
    kind: the blocks of ``width`` outputs, then the rest (module docstring)."""
    full = n_out // width * width
    half = width // 2
    out = []
    if full:
        b, h, l, k = (Aff.var(v) for v in ("b", "h", "l", "k"))
        out.append(([("b", full // width), ("h", 2), ("l", half)], b * width + h * half + l,
                    b * (half * k_in) + k * half + l, h))
    rest = n_out - full
    if rest:
        j, h, k = Aff.var("j"), Aff.var("h"), Aff.var("k")
        out.append(([("j", rest // 2), ("h", 2)], j * 2 + h + full,
                    k * (rest // 2) + j + full * k_in // 2, h))
    return out


@rule("aten._convert_weight_to_int4pack_for_cpu")
def convert_weight_to_int4pack_for_cpu(ctx: OpCtx) -> None:
    """Pack: each byte is its low-nibble weight OR its high-nibble weight shifted by 4
    (no mask, as the kernel: the write wraps to the byte)."""
    q = ctx.args[0]
    n_out, k_in = q.shape
    width = _check(n_out, k_in, "_convert_weight_to_int4pack_for_cpu")
    out = ctx.output()
    flat = _flat(out)
    k = Aff.var("k")
    for loops, n, byte, h in _blocks(n_out, k_in, width):
        if h.single_var() is None:
            raise LoweringError("internal: int4 block without a nibble variable")
        # one kernel per block kind writes both nibbles of its bytes: h is a loop of the
        # unpacking side only; here the byte's two weights are read at h = 0 and h = 1
        loops = [d for d in loops if d[0] != "h"]
        kb = KernelBuilder(ctx.low, loops + [("k", k_in)])
        lo = kb.load(q, [n.subst({"h": Aff.lit(0)}), k])
        hi = kb.load(q, [n.subst({"h": Aff.lit(1)}), k])
        ctx.emit(kb, flat, [byte], f("or", lo, f("shl", hi, C(4))))
    ctx.bind(out)


@rule("aten._weight_int4pack_mm_for_cpu")
def weight_int4pack_mm_for_cpu(ctx: OpCtx) -> None:
    """``x @ dequantize(packed).T``: the weights unpacked and dequantized on chip
    (``(q - 8) * scale + zero`` per group), then the product in ``x``'s dtype."""
    x, packed, group, sz = ctx.args[:4]
    n_out, half = packed.shape
    k_in = 2 * half
    width = _check(n_out, k_in, "_weight_int4pack_mm_for_cpu")
    if not isinstance(group, int) or k_in % group:
        raise LoweringError(f"_weight_int4pack_mm_for_cpu: group size {group!r} does not "
                            f"divide the {k_in} inputs")
    out = ctx.output()
    w = ctx.new_tensor((n_out, k_in), x.dtype, ctx.node.name + "_w")
    flat = _flat(packed)
    g, i = Aff.var("g"), Aff.var("i")
    k = g * group + i
    for loops, n, byte, h in _blocks(n_out, k_in, width):
        kb = KernelBuilder(ctx.low, loops + [("g", k_in // group), ("i", group)])
        nib = kb.load(flat, [byte.subst({"k": k})])
        q = f("to_f32", f("and", f("shr", nib, Idx(h * 4)), C(15)))
        scale = kb.load(sz, [g, n, Aff.lit(0)])
        zero = kb.load(sz, [g, n, Aff.lit(1)])
        ctx.emit(kb, w, [n, k], add(mul(sub(q, C(8.0)), scale), zero))
    wt = View(w.base, w.meta.transpose(0, 1), w.base_shape)
    _matmul(ctx, x, wt, out, 0)
    ctx.bind(out)
