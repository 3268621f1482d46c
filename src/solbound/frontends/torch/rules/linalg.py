"""Contractions: matrix products and convolutions.

A contraction kernel is ``out[...] = sum(a[...] * b[...])``: |I| MACs, 2|I|
FLOPs on the matrix unit. Bias and scaling are separate map kernels of the
same operator (they share on-chip storage in the unfused bound).
"""

from __future__ import annotations


from ....ir.affine import Aff, Atom
from ..lower import OpCtx, View, rule
from ._util import C, add, bcast_index, dims_vars, mul
from .pool import _tuple


def _matmul(ctx: OpCtx, a: View, b: View, out: View, batch: int) -> None:
    """out[b..., m, n] = sum_k a[b..., m, k] * b[b..., k, n] (batch dims leading)."""
    *bs, m, k = a.shape
    n = b.shape[-1]
    shape = out.shape
    kb = ctx.builder(shape, [k])
    idx = dims_vars(len(shape))
    kk = Aff.var("r0")
    ai = bcast_index(a, shape[:-1] + (k,), idx[:-1] + [kk])
    bi = bcast_index(b, shape[:-2] + (k, n), idx[:-2] + [kk, idx[-1]])
    body = mul(kb.load(a, ai), kb.load(b, bi))
    ctx.emit(kb, out, idx, body, reduce="sum", unit="matmul")


def _scale_add(ctx: OpCtx, prod: View, bias, beta, alpha, out: View) -> None:
    shape = out.shape
    kb = ctx.builder(shape)
    idx = dims_vars(len(shape))
    p = mul(kb.load(prod, idx), C(alpha))
    if bias is not None and beta != 0:
        bb = kb.load(bias, bcast_index(bias, shape, idx)) if isinstance(bias, View) else C(bias)
        p = add(mul(bb, C(beta)), p)
    ctx.emit(kb, out, idx, p)


@rule("aten.mm", "aten.bmm", "aten._int_mm")
def mm(ctx: OpCtx) -> None:
    """``_int_mm``: int8 x int8 accumulated in int32 (torchao's dynamic int8 quantization):
    the operands' dtype puts it on the int8 tensor-core pipe."""
    a, b = ctx.args[:2]
    out = ctx.output()
    _matmul(ctx, a, b, out, a.ndim - 2)
    ctx.bind(out)


@rule("out_dtype")
def out_dtype(ctx: OpCtx) -> None:
    """The ``out_dtype`` higher-order operator: ``out_dtype(aten.mm, torch.int32, a, b)``
    runs the inner product and writes its sums at ``out_dtype`` (int8 operands, int32
    sums: torchao's int8 x int8 matmul). Only products are wrapped this way."""
    from ..lower import LoweringError
    inner = str(ctx.node.args[0])
    if inner not in ("aten.mm.default", "aten.bmm.default", "aten._int_mm.default"):
        raise LoweringError(f"out_dtype around {inner}: only mm and bmm are lowered")
    a, b = ctx.args[2:4]
    out = ctx.output()
    _matmul(ctx, a, b, out, a.ndim - 2)
    ctx.bind(out)


def _block(scale, rows: int, cols: int, name: str) -> tuple[int, int] | None:
    """The (row, column) block a 2-d scale tensor covers of a ``rows x cols`` operand
    (``[M, K/128]``: blocks of 1 x 128; ``[K/128, N/128]``: 128 x 128), or None for a
    tensor-wise or row-wise scale."""
    from ..lower import LoweringError
    if not isinstance(scale, View) or scale.ndim < 2 or tuple(scale.shape) in (
            (rows, 1), (1, cols)):
        return None
    if scale.dtype.startswith("f8"):
        raise LoweringError(f"_scaled_mm {name} in {scale.dtype} (MX block scales, stored "
                            f"swizzled): not lowered")
    r, c = scale.shape[-2:]
    if scale.ndim != 2 or rows % r or cols % c:
        raise LoweringError(f"_scaled_mm {name} of shape {tuple(scale.shape)} for a "
                            f"{rows}x{cols} operand: not a tensor-wise, row-wise or "
                            f"block-wise scale")
    return rows // r, cols // c


@rule("aten._scaled_mm")
def scaled_mm(ctx: OpCtx) -> None:
    """``_scaled_mm(a, b, scale_a, scale_b, bias, scale_result, out_dtype)``: an fp8 (or
    int8) product on the tensor cores of its operands' dtype, accumulated in fp32, then
    scaled: per tensor (0-d scales) or per row of ``a`` and column of ``b`` ([M, 1] and
    [1, N]), plus an optional bias, written at ``out_dtype``.

    Block-wise scales (DeepSeek-V3's fp8: ``scale_a [M, K/128]`` over 1 x 128 blocks of
    ``a``, ``scale_b [K/128, N/128]`` over 128 x 128 blocks of ``b``; any block sizes the
    shapes divide) scale each block's partial sums: the tensor cores sum each K block
    (``partial[m, n, kb]``), then ``sum_kb partial * scale_a[m/bm, kb] * scale_b[kb, n/bn]``
    on the vector pipe, as block-scaled GEMMs promote each block's sums."""
    from ..lower import LoweringError
    a, b, sa, sb = ctx.args[:4]
    bias = ctx.args[4] if len(ctx.args) > 4 else ctx.kwargs.get("bias")
    result = ctx.args[5] if len(ctx.args) > 5 else ctx.kwargs.get("scale_result")
    out = ctx.output()
    m, n = out.shape
    k = a.shape[1]
    ba, bb = _block(sa, m, k, "scale_a"), _block(sb, k, n, "scale_b")
    if ba is not None or bb is not None:
        _block_scaled(ctx, a, b, sa, sb, ba, bb, out, bias, result)
        return
    for name, s_, ok in (("scale_a", sa, ((), (1,), (m, 1))), ("scale_b", sb, ((), (1,), (1, n)))):
        if isinstance(s_, View) and tuple(s_.shape) not in ok:
            raise LoweringError(f"_scaled_mm {name} of shape {tuple(s_.shape)}: not a "
                                f"tensor-wise, row-wise or block-wise scale")
    acc = ctx.new_tensor(out.shape, "f32", ctx.node.name + "_acc")
    _matmul(ctx, a, b, acc, 0)
    kb = ctx.builder(out.shape)
    idx = dims_vars(2)
    e = kb.load(acc, idx)
    for s_ in (sa, sb, result):
        if isinstance(s_, View):
            e = mul(e, kb.load(s_, bcast_index(s_, out.shape, idx)))
    if isinstance(bias, View):
        e = add(e, kb.load(bias, bcast_index(bias, out.shape, idx)))
    ctx.emit(kb, out, idx, e)
    ctx.bind(out)


def _block_scaled(ctx: OpCtx, a: View, b: View, sa, sb, ba, bb, out: View, bias,
                  result) -> None:
    from ..lower import KernelBuilder, LoweringError
    m, n = out.shape
    k = a.shape[1]
    if ba is not None and bb is not None and ba[1] != bb[0]:
        raise LoweringError(f"_scaled_mm: scale_a's blocks span {ba[1]} inputs, scale_b's "
                            f"{bb[0]}")
    bk = ba[1] if ba is not None else bb[0]
    r = ba[0] if ba is not None else 1           # rows of a per scale_a block
    c = bb[1] if bb is not None else 1           # columns of b per scale_b block
    nk = k // bk
    v = {x: Aff.var(x) for x in ("mh", "ml", "nh", "nl", "kb", "ki")}
    mi, ni = v["mh"] * r + v["ml"], v["nh"] * c + v["nl"]
    kk = v["kb"] * bk + v["ki"]
    # the tensor cores: each K block's partial sums
    part = ctx.new_tensor((m, n, nk), "f32", ctx.node.name + "_blocks")
    pb = KernelBuilder(ctx.low, [("mh", m // r), ("ml", r), ("nh", n // c), ("nl", c),
                                 ("kb", nk), ("ki", bk)])
    ctx.emit(pb, part, [mi, ni, v["kb"]], mul(pb.load(a, [mi, kk]), pb.load(b, [kk, ni])),
             reduce="sum", unit="matmul")
    # the vector pipe: each block's sums scaled, then summed over the blocks
    sk = KernelBuilder(ctx.low, [("mh", m // r), ("ml", r), ("nh", n // c), ("nl", c),
                                 ("kb", nk)])
    e = sk.load(part, [mi, ni, v["kb"]])
    e = mul(e, sk.load(sa, [v["mh"], v["kb"]]) if ba is not None
            else sk.load(sa, bcast_index(sa, (m, n), [mi, ni])))
    e = mul(e, sk.load(sb, [v["kb"], v["nh"]]) if bb is not None
            else sk.load(sb, bcast_index(sb, (m, n), [mi, ni])))
    if isinstance(result, View):
        e = mul(e, sk.load(result, bcast_index(result, (m, n), [mi, ni])))
    if not isinstance(bias, View):
        ctx.emit(sk, out, [mi, ni], e, reduce="sum")
        ctx.bind(out)
        return
    acc = ctx.new_tensor((m, n), "f32", ctx.node.name + "_acc")
    ctx.emit(sk, acc, [mi, ni], e, reduce="sum")
    kb = ctx.builder(out.shape)
    idx = dims_vars(2)
    ctx.emit(kb, out, idx, add(kb.load(acc, idx), kb.load(bias, bcast_index(bias, out.shape,
                                                                              idx))))
    ctx.bind(out)


@rule("aten._weight_int8pack_mm")
def weight_int8pack_mm(ctx: OpCtx) -> None:
    """``_weight_int8pack_mm(x, w, scales)``: int8 weights [N, K] with one scale per output,
    dequantized on chip; the product runs in the activations' dtype (weight-only
    quantization: the tensor cores of ``x``'s dtype), then each column is scaled."""
    x, w, scales = ctx.args[:3]
    out = ctx.output()
    wt = View(w.base, w.meta.transpose(0, 1), w.base_shape)
    acc = ctx.new_tensor(out.shape, out.dtype, ctx.node.name + "_acc")
    _matmul(ctx, x, wt, acc, x.ndim - 2)
    kb = ctx.builder(out.shape)
    idx = dims_vars(len(out.shape))
    ctx.emit(kb, out, idx, mul(kb.load(acc, idx), kb.load(scales, bcast_index(scales, out.shape, idx))))
    ctx.bind(out)


@rule("aten.addmm", "aten.baddbmm")
def addmm(ctx: OpCtx) -> None:
    bias, a, b = ctx.args[:3]
    beta = ctx.kwargs.get("beta", 1)
    alpha = ctx.kwargs.get("alpha", 1)
    out = ctx.output()
    t = ctx.new_tensor(out.shape, out.dtype, ctx.node.name + "_mm")
    _matmul(ctx, a, b, t, a.ndim - 2)
    _scale_add(ctx, t, bias, beta, alpha, out)
    ctx.bind(out)


def _spatial(guard: list, e: Aff, size: int, extents: dict[str, int]) -> None:
    lo, hi = e.bounds(extents)
    if lo < 0 or hi >= size:
        guard.append(Atom(e, 0, size))


@rule("aten.convolution")
def convolution(ctx: OpCtx) -> None:
    x, w, bias, stride, padding, dilation, transposed, output_padding, groups = ctx.args[:9]
    out = ctx.output()
    nsp = x.ndim - 2
    # one value for every spatial dim (``padding="valid"`` exports as ``[0]``)
    stride, padding, dilation = (_tuple(v, nsp) for v in (stride, padding, dilation))
    if transposed:
        conv_out = out if bias is None else ctx.new_tensor(out.shape, out.dtype,
                                                            ctx.node.name + "_conv")
        _conv_transposed(ctx, x, w, conv_out, stride, padding, dilation, groups, nsp)
    else:
        conv_out = out if bias is None else ctx.new_tensor(out.shape, out.dtype,
                                                            ctx.node.name + "_conv")
        _conv(ctx, x, w, conv_out, stride, padding, dilation, groups, nsp)
    if bias is not None:
        shape = out.shape
        kb = ctx.builder(shape)
        idx = dims_vars(len(shape))
        ctx.emit(kb, out, idx, add(kb.load(conv_out, idx), kb.load(bias, [idx[1]])))
    ctx.bind(out)


def _conv(ctx, x: View, w: View, out: View, stride, padding, dilation, groups, nsp) -> None:
    n, cin = x.shape[:2]
    kout = w.shape[0]
    cg, kg = cin // groups, kout // groups
    osp = out.shape[2:]
    rsp = w.shape[2:]
    # loops: n, g, kk, p..., then reductions c, r...
    dims = [("d0", n), ("g", groups), ("kk", kg)] + [(f"d{2 + i}", osp[i]) for i in range(nsp)]
    red = [("c", cg)] + [(f"r{i}", rsp[i]) for i in range(nsp)]
    from ..lower import KernelBuilder
    kb = KernelBuilder(ctx.low, dims + red)
    ext = dict(dims + red)
    g, kk, c = Aff.var("g"), Aff.var("kk"), Aff.var("c")
    chan_in = g * cg + c
    chan_out = g * kg + kk
    xs, guard = [], []
    for i in range(nsp):
        e = Aff.var(f"d{2 + i}") * stride[i] + Aff.var(f"r{i}") * dilation[i] - padding[i]
        _spatial(guard, e, x.shape[2 + i], ext)
        xs.append(e)
    xa = kb.load(x, [Aff.var("d0"), chan_in] + xs)
    wa = kb.load(w, [chan_out, c] + [Aff.var(f"r{i}") for i in range(nsp)])
    out_idx = [Aff.var("d0"), chan_out] + [Aff.var(f"d{2 + i}") for i in range(nsp)]
    ctx.emit(kb, out, out_idx, mul(xa, wa), reduce="sum", guard=tuple(guard), unit="conv")


def _conv_transposed(ctx, x: View, w: View, out: View, stride, padding, dilation, groups,
                     nsp) -> None:
    """Output-stationary transposed convolution, one kernel per output residue class.

    Output position ``p = ph*s + pl`` receives ``x[h] * w[r]`` where
    ``h*s + r*d - pad = p``; for a fixed residue ``pl`` the contributing taps are
    an arithmetic progression ``r = r0 + step*t``, so ``h`` is affine in
    ``(ph, t)``: no zero-stuffing, no wasted MACs.
    """
    from ..lower import KernelBuilder
    n, cin = x.shape[:2]
    kg = w.shape[1]
    cg = cin // groups
    osp = out.shape[2:]
    rsp = w.shape[2:]
    per_dim = []
    for i in range(nsp):
        s, d, pad = stride[i], dilation[i], padding[i]
        classes = []
        for pl in range(s):
            taps = [r for r in range(rsp[i]) if (pl + pad - r * d) % s == 0]
            ph_n = -(-(osp[i] - pl) // s) if osp[i] > pl else 0
            if ph_n == 0:
                continue
            if taps:
                step = taps[1] - taps[0] if len(taps) > 1 else 1
                classes.append((pl, ph_n, taps[0], step, len(taps)))
            else:
                classes.append((pl, ph_n, None, None, 0))
        per_dim.append(classes)
    import itertools
    for combo in itertools.product(*per_dim):
        empty = any(cl[4] == 0 for cl in combo)
        dims = [("d0", n), ("g", groups), ("kk", kg)] + \
               [(f"d{2 + i}", cl[1]) for i, cl in enumerate(combo)]
        red = [] if empty else [("c", cg)] + [(f"r{i}", cl[4]) for i, cl in enumerate(combo)]
        kb = KernelBuilder(ctx.low, dims + red)
        ext = dict(dims + red)
        g, kk = Aff.var("g"), Aff.var("kk")
        out_idx = [Aff.var("d0"), g * kg + kk] + \
                  [Aff.var(f"d{2 + i}") * stride[i] + cl[0] for i, cl in enumerate(combo)]
        if empty:
            ctx.emit(kb, out, out_idx, C(0.0))
            continue
        c = Aff.var("c")
        hs, ws, guard = [], [], []
        for i, (pl, ph_n, r0, step, nt) in enumerate(combo):
            s, d, pad = stride[i], dilation[i], padding[i]
            t = Aff.var(f"r{i}")
            # h = (p + pad - r*d) / s with p = ph*s + pl, r = r0 + step*t
            h = Aff.var(f"d{2 + i}") + (pl + pad - r0 * d) // s - t * (step * d // s)
            _spatial(guard, h, x.shape[2 + i], ext)
            hs.append(h)
            ws.append(t * step + r0)
        xa = kb.load(x, [Aff.var("d0"), g * cg + c] + hs)
        wa = kb.load(w, [g * cg + c, kk] + ws)
        ctx.emit(kb, out, out_idx, mul(xa, wa), reduce="sum", guard=tuple(guard), unit="conv")
