"""Pooling: max/avg over (strided, padded, dilated) windows and adaptive pools.

A window is a reduction over tap dims ``r_i`` with input index
``p*stride + r*dilation - pad``; out-of-range taps are excluded by a guard.
"""

from __future__ import annotations

from ....ir.affine import Aff, Atom
from ....ir.model import Call, Const, Idx
from ..lower import KernelBuilder, LoweringError, OpCtx, View, rule
from ._util import C, div


def _tuple(v, n, default=None):
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        return default
    if isinstance(v, int):
        return [v] * n
    v = list(v)
    return v * n if len(v) == 1 else v


def _window_kernel(ctx: OpCtx, x: View, out: View, k, s, p, d, op: str, out2=None):
    nsp = len(k)
    lead = x.ndim - nsp
    osp = out.shape[lead:]
    dims = [(f"d{i}", x.shape[i]) for i in range(lead)] + \
           [(f"d{lead + i}", osp[i]) for i in range(nsp)] + [(f"r{i}", k[i]) for i in range(nsp)]
    kb = KernelBuilder(ctx.low, dims)
    ext = dict(dims)
    xi, guard = [Aff.var(f"d{i}") for i in range(lead)], []
    for i in range(nsp):
        e = Aff.var(f"d{lead + i}") * s[i] + Aff.var(f"r{i}") * d[i] - p[i]
        lo, hi = e.bounds(ext)
        if lo < 0 or hi >= x.shape[lead + i]:
            guard.append(Atom(e, 0, x.shape[lead + i]))
        xi.append(e)
    out_idx = [Aff.var(f"d{i}") for i in range(x.ndim)]
    ctx.emit(kb, out, out_idx, kb.load(x, xi), reduce=op, guard=tuple(guard), out2=out2)
    return guard


def _pool_args(ctx: OpCtx, nsp: int):
    x = ctx.args[0]
    k = _tuple(ctx.args[1], nsp)
    s = _tuple(ctx.args[2] if len(ctx.args) > 2 else None, nsp, k)
    p = _tuple(ctx.args[3] if len(ctx.args) > 3 else 0, nsp, [0] * nsp)
    return x, k, s, p


@rule("aten.max_pool2d_with_indices", "aten.max_pool3d_with_indices",
      "aten.max_pool1d_with_indices")
def max_pool(ctx: OpCtx) -> None:
    nsp = int(str(ctx.node.target).split("max_pool")[1][0])
    x, k, s, p = _pool_args(ctx, nsp)
    d = _tuple(ctx.args[4] if len(ctx.args) > 4 else 1, nsp, [1] * nsp)
    vals, idxs = ctx.output(0), ctx.output(1)
    _window_kernel(ctx, x, vals, k, s, p, d, "max")
    # indices (the flat position in the window; pruned when unused)
    _window_kernel(ctx, x, idxs, k, s, p, d, "argmax")
    ctx.bind([vals, idxs])


@rule("aten.avg_pool2d", "aten.avg_pool3d", "aten.avg_pool1d")
def avg_pool(ctx: OpCtx) -> None:
    nsp = int(str(ctx.node.target).split("avg_pool")[1][0])
    x, k, s, p = _pool_args(ctx, nsp)
    ceil_mode = ctx.args[4] if len(ctx.args) > 4 else False
    include_pad = ctx.args[5] if len(ctx.args) > 5 else True
    divisor = ctx.args[6] if len(ctx.args) > 6 else None
    out = ctx.output()
    lead = x.ndim - nsp
    t = ctx.new_tensor(out.shape, out.dtype, ctx.node.name + "_sum")
    _window_kernel(ctx, x, t, k, s, p, [1] * nsp, "sum")
    kb = ctx.builder(out.shape)
    idx = [Aff.var(f"d{i}") for i in range(out.ndim)]
    if divisor:
        den = C(float(divisor))
    elif include_pad and not ceil_mode:
        n = 1
        for kk in k:
            n *= kk
        den = C(float(n))
    else:
        # per-position count: clip each window to [-pad, size + pad) (with pad) or [0, size)
        den = None
        for i in range(nsp):
            size = x.shape[lead + i]
            lo_b, hi_b = (-p[i], size + p[i]) if include_pad else (0, size)
            start = Idx(idx[lead + i] * s[i] - p[i])
            end = Idx(idx[lead + i] * s[i] - p[i] + k[i])
            cnt = Call("sub", (Call("minimum", (end, Const(hi_b))),
                               Call("maximum", (start, Const(lo_b)))))
            den = cnt if den is None else Call("mul", (den, cnt))
    ctx.emit(kb, out, idx, div(kb.load(t, idx), den))
    ctx.bind(out)


@rule("aten._adaptive_avg_pool2d", "aten._adaptive_avg_pool3d", "aten.adaptive_avg_pool1d",
      "aten.adaptive_max_pool2d", "aten.adaptive_max_pool1d", "aten.adaptive_max_pool3d")
def adaptive_pool(ctx: OpCtx) -> None:
    name = str(ctx.node.target)
    is_max = "max" in name
    x = ctx.args[0]
    outs = list(ctx.args[1])
    nsp = len(outs)
    lead = x.ndim - nsp
    out = ctx.output(0) if is_max else ctx.output()
    ins = x.shape[lead:]
    if all(i % o == 0 for i, o in zip(ins, outs)):
        k = [i // o for i, o in zip(ins, outs)]
        if is_max:
            _window_kernel(ctx, x, out, k, k, [0] * nsp, [1] * nsp, "max")
            idxs = ctx.output(1)
            _window_kernel(ctx, x, idxs, k, k, [0] * nsp, [1] * nsp, "argmax")
            ctx.bind([out, idxs])
            return
        t = ctx.new_tensor(out.shape, out.dtype, ctx.node.name + "_sum")
        _window_kernel(ctx, x, t, k, k, [0] * nsp, [1] * nsp, "sum")
        n = 1
        for kk in k:
            n *= kk
        kb = ctx.builder(out.shape)
        idx = [Aff.var(f"d{i}") for i in range(out.ndim)]
        ctx.emit(kb, out, idx, div(kb.load(t, idx), C(float(n))))
        ctx.bind(out)
        return
    # general: loop over every input position of the dim, guarded to the window
    # [floor(i*H/O), ceil((i+1)*H/O)):  h*O >= i*H - O + 1  and  h*O < (i+1)*H
    dims = [(f"d{i}", x.shape[i]) for i in range(lead)] + \
           [(f"d{lead + i}", outs[i]) for i in range(nsp)] + [(f"r{i}", ins[i]) for i in range(nsp)]
    kb = KernelBuilder(ctx.low, dims)
    guard = []
    for i in range(nsp):
        o, h = Aff.var(f"d{lead + i}"), Aff.var(f"r{i}")
        guard.append(Atom(h * outs[i] - o * ins[i] + outs[i] - 1, 0, None))
        guard.append(Atom(o * ins[i] + ins[i] - h * outs[i] - 1, 0, None))
    xi = [Aff.var(f"d{i}") for i in range(lead)] + [Aff.var(f"r{i}") for i in range(nsp)]
    out_idx = [Aff.var(f"d{i}") for i in range(x.ndim)]
    if is_max:
        ctx.emit(kb, out, out_idx, kb.load(x, xi), reduce="max", guard=tuple(guard))
        raise LoweringError("adaptive max pool indices for non-divisible sizes")
    t = ctx.new_tensor(out.shape, out.dtype, ctx.node.name + "_sum")
    ctx.emit(kb, t, out_idx, kb.load(x, xi), reduce="sum", guard=tuple(guard))
    kb = ctx.builder(out.shape)
    idx = [Aff.var(f"d{i}") for i in range(out.ndim)]
    den = None
    for i in range(nsp):
        o = idx[lead + i]
        start = Call("floordiv", (Idx(o * ins[i]), Const(outs[i])))
        end = Call("floordiv", (Idx(o * ins[i] + ins[i] + outs[i] - 1), Const(outs[i])))
        cnt = Call("sub", (end, start))
        den = cnt if den is None else Call("mul", (den, cnt))
    ctx.emit(kb, out, idx, div(kb.load(t, idx), den))
    ctx.bind(out)
