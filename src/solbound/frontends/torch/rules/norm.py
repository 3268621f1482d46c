"""Softmax and normalization layers, each as its natural multi-pass algorithm."""

from __future__ import annotations

from ....ir.affine import Aff
from ..lower import OpCtx, View, rule
from ._util import C, add, dims_vars, div, f, mul, reduce_kernel, sub


def _kept(x: View, rd: list[int]):
    """Keepdim shape and a function mapping x's index to the keepdim index."""
    kshape = tuple(1 if i in rd else s for i, s in enumerate(x.shape))
    return kshape, (lambda xi: [Aff.lit(0) if i in rd else xi[i] for i in range(x.ndim)])


def _map(ctx: OpCtx, out: View, fn, *operands) -> None:
    """out[d...] = fn(loaded operands); operands are (view, index_fn(idx) -> index)."""
    kb = ctx.builder(out.shape)
    idx = dims_vars(out.ndim)
    ctx.emit(kb, out, idx, fn(*[kb.load(v, g(idx)) for v, g in operands]))


def _same(idx):
    return idx


@rule("aten._softmax", "aten._log_softmax", "aten._safe_softmax")
def softmax(ctx: OpCtx) -> None:
    x, dim = ctx.args[0], ctx.args[1] % ctx.args[0].ndim
    log = "log_softmax" in str(ctx.node.target)
    out = ctx.output()
    rd = [dim]
    kshape, k = _kept(x, rd)
    m = ctx.new_tensor(kshape, out.dtype, ctx.node.name + "_max")
    reduce_kernel(ctx, x, rd, "max", lambda a: a, m, kshape)
    s = ctx.new_tensor(kshape, out.dtype, ctx.node.name + "_sum")
    if log:
        reduce_kernel(ctx, x, rd, "sum", lambda a, mm: f("exp", sub(a, mm)), s, kshape,
                      extra=[(m, k)])
        _map(ctx, out, lambda a, mm, ss: sub(sub(a, mm), f("log", ss)), (x, _same), (m, k), (s, k))
    else:
        e = ctx.new_tensor(x.shape, out.dtype, ctx.node.name + "_exp")
        _map(ctx, e, lambda a, mm: f("exp", sub(a, mm)), (x, _same), (m, k))
        reduce_kernel(ctx, e, rd, "sum", lambda a: a, s, kshape)
        _map(ctx, out, lambda a, ss: div(a, ss), (e, _same), (s, k))
    ctx.bind(out)


def _moments(ctx: OpCtx, x: View, rd: list[int], mean: View, rstd: View | None, eps: float,
             var_out: View | None = None) -> View:
    """mean = sum(x)/n; var = sum((x-mean)^2)/n; rstd = rsqrt(var + eps). Returns var."""
    n = 1
    for i in rd:
        n *= x.shape[i]
    kshape = mean.shape
    _, k = _kept(x, rd)
    s = ctx.new_tensor(kshape, mean.dtype, ctx.node.name + "_sum")
    reduce_kernel(ctx, x, rd, "sum", lambda a: a, s, kshape)
    _map(ctx, mean, lambda a: div(a, C(float(n))), (s, _same))
    ss = ctx.new_tensor(kshape, mean.dtype, ctx.node.name + "_ssq")

    def sq(a, mm):
        d = sub(a, mm)
        return mul(d, d)
    reduce_kernel(ctx, x, rd, "sum", sq, ss, kshape, extra=[(mean, k)])
    var = var_out or ctx.new_tensor(kshape, mean.dtype, ctx.node.name + "_var")
    _map(ctx, var, lambda a: div(a, C(float(n))), (ss, _same))
    if rstd is not None:
        _map(ctx, rstd, lambda v: f("rsqrt", add(v, C(float(eps)))), (var, _same))
    return var


@rule("aten.native_layer_norm")
def layer_norm(ctx: OpCtx) -> None:
    x, normalized, w, b, eps = ctx.args[:5]
    y, mean, rstd = ctx.output(0), ctx.output(1), ctx.output(2)
    nn_ = len(normalized)
    rd = list(range(x.ndim - nn_, x.ndim))
    _, k = _kept(x, rd)
    _moments(ctx, x, rd, mean, rstd, eps)
    _normalize(ctx, x, y, mean, rstd, w, b, k, lambda xi: xi[x.ndim - nn_:])
    ctx.bind([y, mean, rstd])


def _bn_apply(ctx, x: View, y: View, mean, rstd, w, b, stat_of) -> None:
    _normalize(ctx, x, y, mean, rstd, w, b, stat_of, lambda xi: [xi[1]])


def _normalize(ctx, x: View, y: View, mean, rstd, w, b, stat_of, param_of) -> None:
    """y = (x - mean) * rstd [* w] [+ b]; statistics and affine parameters broadcast."""
    ops = [(x, _same), (mean, stat_of), (rstd, stat_of)]
    if w is not None:
        ops.append((w, param_of))
    if b is not None:
        ops.append((b, param_of))

    def body(a, mm, rs, *wb):
        yv = mul(sub(a, mm), rs)
        if w is not None:
            yv = mul(yv, wb[0])
        if b is not None:
            yv = add(yv, wb[-1])
        return yv
    _map(ctx, y, body, *ops)


@rule("aten._native_batch_norm_legit_functional", "aten._native_batch_norm_legit.no_stats",
      "aten._native_batch_norm_legit", "aten.native_batch_norm")
def batch_norm_train(ctx: OpCtx) -> None:
    """Training-mode batch norm: batch statistics; the functional form also
    returns the updated running mean and variance (buffer writes)."""
    target = str(ctx.node.target)
    x = ctx.args[0]
    w, b = ctx.args[1], ctx.args[2]
    no_stats = "no_stats" in target
    if no_stats:
        training, momentum, eps = ctx.args[3], ctx.args[4], ctx.args[5]
        rm = rv = None
    else:
        rm, rv, training, momentum, eps = ctx.args[3:8]
    c = x.shape[1]
    rd = [i for i in range(x.ndim) if i != 1]
    y = ctx.output(0)
    chan_of = (lambda xi: [xi[1]])
    if not training and rm is not None:
        # eval mode through the training op: normalize with running stats
        rstd = ctx.new_tensor((c,), x.dtype, ctx.node.name + "_rstd")
        _map(ctx, rstd, lambda v: f("rsqrt", add(v, C(float(eps)))), (rv, _same))
        _bn_apply(ctx, x, y, rm, rstd, w, b, chan_of)
        outs = [y, ctx.output(1), ctx.output(2)]
        ctx.bind(outs + [rm, rv] if "functional" in target else outs)
        return
    mean1 = ctx.new_tensor(tuple(1 if i in rd else s for i, s in enumerate(x.shape)), x.dtype,
                           ctx.node.name + "_mean")
    rstd1 = ctx.new_tensor(mean1.shape, x.dtype, ctx.node.name + "_rstd")
    var1 = _moments(ctx, x, rd, mean1, rstd1, eps)
    chan_k = (lambda xi: [Aff.lit(0) if i in rd else xi[i] for i in range(x.ndim)])
    _bn_apply(ctx, x, y, mean1, rstd1, w, b, chan_k)
    save_mean, save_rstd = ctx.output(1), ctx.output(2)
    to_k = (lambda idx: [Aff.lit(0) if i in rd else idx[0] for i in range(x.ndim)])
    _map(ctx, save_mean, lambda a: a, (mean1, to_k))
    _map(ctx, save_rstd, lambda a: a, (rstd1, to_k))
    outs = [y, save_mean, save_rstd]
    if "functional" in target:
        n = 1
        for i in rd:
            n *= x.shape[i]
        new_rm, new_rv = ctx.output(3), ctx.output(4)
        _map(ctx, new_rm, lambda r, m: add(mul(r, C(1.0 - momentum)), mul(m, C(momentum))),
             (rm, _same), (mean1, to_k))
        unb = n / max(n - 1, 1)
        _map(ctx, new_rv,
             lambda r, v: add(mul(r, C(1.0 - momentum)), mul(v, C(momentum * unb))),
             (rv, _same), (var1, to_k))
        outs += [new_rm, new_rv]
    ctx.bind(outs)


@rule("aten._native_batch_norm_legit_no_training")
def batch_norm_eval(ctx: OpCtx) -> None:
    x, w, b, rm, rv, momentum, eps = ctx.args[:7]
    c = x.shape[1]
    y = ctx.output(0)
    rstd = ctx.new_tensor((c,), x.dtype, ctx.node.name + "_rstd")
    _map(ctx, rstd, lambda v: f("rsqrt", add(v, C(float(eps)))), (rv, _same))
    _bn_apply(ctx, x, y, rm, rstd, w, b, lambda xi: [xi[1]])
    ctx.bind([y, ctx.output(1), ctx.output(2)])


@rule("aten.native_group_norm")
def group_norm(ctx: OpCtx) -> None:
    x, w, b, n, c, hw, groups, eps = ctx.args[:8]
    y, mean, rstd = ctx.output(0), ctx.output(1), ctx.output(2)
    # view x as [N, G, C/G * HW] through a 3-d view of its base
    import torch
    xv = View(x.base, x.meta.reshape(n, groups, -1), x.base_shape) if x.is_full else None
    if xv is None:
        from .views import materialize
        xm = materialize(ctx, x)
        xv = View(xm.base, xm.meta.reshape(n, groups, -1), xm.base_shape)
    _moments(ctx, xv, [2], View(mean.base, mean.meta.reshape(n, groups, 1), mean.base_shape),
             View(rstd.base, rstd.meta.reshape(n, groups, 1), rstd.base_shape), eps)
    cg = c // groups
    # y[n, c, s...] = (x - mean[n, c//cg]) * rstd[...] * w[c] + b[c]
    kb = ctx.builder(x.shape)
    idx = dims_vars(x.ndim)
    # split the channel loop into (group, channel-in-group) so the group index is affine
    from ..lower import KernelBuilder
    dims = [("d0", x.shape[0]), ("g", groups), ("cc", cg)] + \
           [(f"d{i}", x.shape[i]) for i in range(2, x.ndim)]
    kb = KernelBuilder(ctx.low, dims)
    g, cc = Aff.var("g"), Aff.var("cc")
    ch = g * cg + cc
    xi = [Aff.var("d0"), ch] + [Aff.var(f"d{i}") for i in range(2, x.ndim)]
    yv = mul(sub(kb.load(x, xi), kb.load(mean, [Aff.var("d0"), g])),
             kb.load(rstd, [Aff.var("d0"), g]))
    if w is not None:
        yv = mul(yv, kb.load(w, [ch]))
    if b is not None:
        yv = add(yv, kb.load(b, [ch]))
    ctx.emit(kb, y, xi, yv)
    ctx.bind([y, mean, rstd])
    del torch, idx
