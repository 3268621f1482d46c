"""Backward operators a training step's joint graph keeps whole (core ATen has no
decomposition for them): the convolution's and max-pooling's gradients.

* ``convolution_backward``: the input gradient is the transposed convolution of the
  output gradient with the same weights (one kernel per output residue class, only the
  taps that exist: no zeros multiplied), the weight gradient a correlation of the input
  with the output gradient over batch and output positions, the bias gradient a sum.
  Each is computed only when the output mask asks for it (no gradient for an input).
* ``max_pool{1,2,3}d_with_indices_backward``: the gradient goes to the window element the
  forward chose. The lowering's max-pool indices are window-local (the arg-max over the
  window's taps, row-major), so each output position's input coordinate is computed from
  its index (one map kernel), and the gradients are added there (a scatter-add into
  zeros): PyTorch's own kernel, which scatters through its flat indices.
"""

from __future__ import annotations

from ....ir.affine import Aff
from ....ir.model import Call, Const, Idx
from ..lower import KernelBuilder, LoweringError, OpCtx, View, rule
from ._util import C, dims_vars, mul
from .linalg import _conv_transposed, _spatial
from .pool import _tuple


@rule("aten.convolution_backward")
def convolution_backward(ctx: OpCtx) -> None:
    gout, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, \
        mask = ctx.args[:11]
    if transposed:
        raise LoweringError("the backward of a transposed convolution")
    nsp = x.ndim - 2
    stride, padding, dilation = (_tuple(v, nsp) for v in (stride, padding, dilation))
    outs: list = [None, None, None]
    if mask[0]:
        gin = ctx.output(0)
        _conv_transposed(ctx, gout, w, gin, stride, padding, dilation, groups, nsp)
        outs[0] = gin
    if mask[1]:
        gw = ctx.output(1)
        _weight_grad(ctx, gout, x, gw, stride, padding, dilation, groups, nsp)
        outs[1] = gw
    if mask[2]:
        gb = ctx.output(2)
        red = [gout.shape[0]] + list(gout.shape[2:])
        kb = ctx.builder([gb.shape[0]], red)
        idx = [Aff.var("r0"), Aff.var("d0")] + [Aff.var(f"r{1 + i}") for i in range(nsp)]
        ctx.emit(kb, gb, [Aff.var("d0")], kb.load(gout, idx), reduce="sum")
        outs[2] = gb
    ctx.bind(outs)


def _weight_grad(ctx, gout: View, x: View, gw: View, stride, padding, dilation, groups,
                 nsp) -> None:
    """``gw[g*kg + kk, c, r] = sum_{n, p} gout[n, g*kg + kk, p] x[n, g*cg + c, p*s + r*d - pad]``
    (input positions outside the tensor are padding: guarded out)."""
    n, cin = x.shape[:2]
    kout = gw.shape[0]
    cg, kg = cin // groups, kout // groups
    osp = gout.shape[2:]
    rsp = gw.shape[2:]
    dims = [("g", groups), ("kk", kg), ("c", cg)] + [(f"r{i}", rsp[i]) for i in range(nsp)]
    red = [("b", n)] + [(f"p{i}", osp[i]) for i in range(nsp)]
    kb = KernelBuilder(ctx.low, dims + red)
    ext = dict(dims + red)
    g, kk, c, b = Aff.var("g"), Aff.var("kk"), Aff.var("c"), Aff.var("b")
    xs, guard = [], []
    for i in range(nsp):
        e = Aff.var(f"p{i}") * stride[i] + Aff.var(f"r{i}") * dilation[i] - padding[i]
        _spatial(guard, e, x.shape[2 + i], ext)
        xs.append(e)
    ga = kb.load(gout, [b, g * kg + kk] + [Aff.var(f"p{i}") for i in range(nsp)])
    xa = kb.load(x, [b, g * cg + c] + xs)
    out_idx = [g * kg + kk, c] + [Aff.var(f"r{i}") for i in range(nsp)]
    ctx.emit(kb, gw, out_idx, mul(ga, xa), reduce="sum", guard=tuple(guard), unit="conv")


@rule("aten.max_pool2d_with_indices_backward", "aten.max_pool3d_with_indices_backward",
      "aten.max_pool1d_with_indices_backward")
def max_pool_backward(ctx: OpCtx) -> None:
    gout, x = ctx.args[0], ctx.args[1]
    nsp = int(str(ctx.node.target).split("max_pool")[1][0])
    k = _tuple(ctx.args[2], nsp)
    s = _tuple(ctx.args[3], nsp, k)
    p = _tuple(ctx.args[4], nsp, [0] * nsp)
    d = _tuple(ctx.args[5], nsp, [1] * nsp)
    indices = ctx.args[7]        # (ceil_mode, args[6], is in the output's shape already)
    if not isinstance(indices, View):
        raise LoweringError("max-pool backward without the forward's indices")
    lead = x.ndim - nsp
    insp = x.shape[lead:]
    # 1. the flat input position (within its plane) of each output position's chosen tap
    pos = ctx.new_tensor(gout.shape, "i64", ctx.node.name + "_pos")
    kb = ctx.builder(gout.shape)
    idx = dims_vars(gout.ndim)
    tap = kb.load(indices, idx)
    flat = None
    rest = tap
    for i in range(nsp):
        inner = 1
        for kk in k[i + 1:]:
            inner *= kk
        ri = Call("floordiv", (rest, C(inner))) if inner > 1 else rest
        if i + 1 < nsp:
            rest = Call("mod", (rest, C(inner)))
        coord = Call("add", (Idx(idx[lead + i] * s[i] - p[i]),
                             Call("mul", (ri, C(d[i]))) if d[i] != 1 else ri))
        plane = 1
        for sz in insp[i + 1:]:
            plane *= sz
        term = Call("mul", (coord, C(plane))) if plane > 1 else coord
        flat = term if flat is None else Call("add", (flat, term))
    ctx.emit(kb, pos, idx, flat)
    # 2. zeros, then the gradients added at those positions
    plane = 1
    for sz in insp:
        plane *= sz
    base = ctx.low.new_base(ctx.node.name, tuple(x.shape[:lead]) + (plane,), gout.dtype)
    kb = ctx.builder(base.shape)
    ctx.emit(kb, base, dims_vars(base.ndim), Const(0.0))
    kb = ctx.builder(gout.shape)
    idx = dims_vars(gout.ndim)
    out_index = list(idx[:lead]) + [kb.load(pos, idx)]
    ctx.emit_scatter(kb, base, out_index, kb.load(gout, idx), reduce="sum")
    meta = base.meta.reshape(tuple(x.shape))
    ctx.bind(View(base.base, meta, base.base_shape))
