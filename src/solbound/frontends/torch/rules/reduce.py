"""Reductions and scans: sum, mean, amax/amin, max/min with indices, argmax,
var, prod, any/all, cumulative sums and products."""

from __future__ import annotations

from ....ir.affine import Aff
import math

from ....ir.model import Call, unpicked
from ..lower import LoweringError, OpCtx, View, rule
from ._util import C, _out_index, dims_vars, div, f, mul, norm_dims, reduce_kernel, sub


def _reduction_count(x: View, rd: list[int]) -> int:
    n = 1
    for i in rd:
        n *= x.shape[i]
    return n


def _dims_arg(ctx: OpCtx, i: int, name: str):
    if len(ctx.args) > i:
        return ctx.args[i]
    return ctx.kwargs.get(name)


def _simple(op: str, post_mean: bool = False):
    def lower(ctx: OpCtx) -> None:
        x = ctx.args[0]
        target = str(ctx.node.target)
        full = target.endswith(".default") and "dim" not in target and op in ("sum", "max", "min", "prod", "any", "all") \
            and len(ctx.args) == 1
        rd = norm_dims(None if full else _dims_arg(ctx, 1, "dim"), x.ndim)
        out = ctx.output()
        if post_mean:
            t = ctx.new_tensor(out.shape, out.dtype, ctx.node.name + "_sum")
            reduce_kernel(ctx, x, rd, "sum", lambda a: a, t, out.shape)
            kb = ctx.builder(out.shape)
            idx = dims_vars(out.ndim)
            ctx.emit(kb, out, idx, div(kb.load(t, idx), C(float(_reduction_count(x, rd)))))
        else:
            body = (lambda a: Call(f"to_{ctx.out_dtype}", (a,))) if x.dtype != ctx.out_dtype \
                and op == "sum" else (lambda a: a)
            reduce_kernel(ctx, x, rd, op, body, out, out.shape)
        ctx.bind(out)
    return lower


rule("aten.sum.dim_IntList", "aten.sum.default", "aten.sum")(_simple("sum"))
rule("aten.mean.dim", "aten.mean.default", "aten.mean")(_simple("sum", post_mean=True))
rule("aten.amax", "aten.max.default")(_simple("max"))
rule("aten.amin", "aten.min.default")(_simple("min"))
rule("aten.prod.dim_int", "aten.prod.default", "aten.prod")(_simple("prod"))
rule("aten.any.dim", "aten.any.dims", "aten.any.default", "aten.any")(_simple("any"))


def _arg_reduce(op: str, with_values: bool):
    """argmax/argmin (one output) and max.dim/min.dim (values, indices)."""
    def lower(ctx: OpCtx) -> None:
        x = ctx.args[0]
        dim = _dims_arg(ctx, 1, "dim")
        rd = list(range(x.ndim)) if dim is None else [dim % x.ndim]
        if with_values:
            vals, idxs = ctx.output(0), ctx.output(1)
            kept = [i for i in range(x.ndim) if i not in rd]
            kb = ctx.builder([x.shape[i] for i in kept], [x.shape[i] for i in rd])
            xi = _index(x.ndim, kept, rd)
            out_idx = _out_index(idxs, x.ndim, kept, rd)
            ctx.emit(kb, idxs, out_idx, kb.load(x, xi), reduce=op, out2=vals.base)
            ctx.bind([vals, idxs])
        else:
            out = ctx.output()
            if len(rd) > 1:
                raise LoweringError(f"{op} over all dims of a {x.ndim}-d tensor (flattened index)")
            kept = [i for i in range(x.ndim) if i not in rd]
            kb = ctx.builder([x.shape[i] for i in kept], [x.shape[i] for i in rd])
            xi = _index(x.ndim, kept, rd)
            ctx.emit(kb, out, _out_index(out, x.ndim, kept, rd), kb.load(x, xi), reduce=op)
            ctx.bind(out)
    return lower


def _index(ndim: int, kept: list[int], rd: list[int]) -> list[Aff]:
    xi = [Aff.lit(0)] * ndim
    for n, i in enumerate(kept):
        xi[i] = Aff.var(f"d{n}")
    for n, i in enumerate(rd):
        xi[i] = Aff.var(f"r{n}")
    return xi


rule("aten.argmax")(_arg_reduce("argmax", False))
rule("aten.argmin")(_arg_reduce("argmin", False))
rule("aten.max.dim")(_arg_reduce("argmax", True))
rule("aten.min.dim")(_arg_reduce("argmin", True))


@rule("aten.var.correction", "aten.var.dim", "aten.var_mean.correction")
def var(ctx: OpCtx) -> None:
    """Two passes: mean, then sum of squared deviations / (n - correction)."""
    x = ctx.args[0]
    rd = norm_dims(_dims_arg(ctx, 1, "dim"), x.ndim)
    corr = ctx.kwargs.get("correction", 1)
    if corr is None:
        corr = 1
    if "unbiased" in ctx.kwargs:
        corr = 1 if ctx.kwargs["unbiased"] else 0
    keep = ctx.kwargs.get("keepdim", False)
    is_pair = "var_mean" in str(ctx.node.target)
    out = ctx.output(0) if is_pair else ctx.output()
    n = _reduction_count(x, rd)
    kshape = tuple(1 if i in rd else s for i, s in enumerate(x.shape))
    mean = ctx.output(1) if (is_pair and keep) else ctx.new_tensor(kshape, out.dtype,
                                                                  ctx.node.name + "_mean")
    s = ctx.new_tensor(kshape, out.dtype, ctx.node.name + "_sum")
    reduce_kernel(ctx, x, rd, "sum", lambda a: a, s, kshape)
    kb = ctx.builder(kshape)
    idx = dims_vars(len(kshape))
    ctx.emit(kb, mean, idx, div(kb.load(s, idx), C(float(n))))
    kept_idx = lambda xi: [Aff.lit(0) if i in rd else xi[i] for i in range(x.ndim)]  # noqa: E731
    ss = ctx.new_tensor(kshape, out.dtype, ctx.node.name + "_ssq")

    def sq(a, m):
        d = sub(a, m)
        return mul(d, d)
    reduce_kernel(ctx, x, rd, "sum", sq, ss, kshape, extra=[(mean, kept_idx)])
    kb = ctx.builder(out.shape)
    idx = dims_vars(out.ndim)
    src_idx = idx if keep else _expand_idx(idx, rd, x.ndim)
    ctx.emit(kb, out, idx, div(kb.load(ss, src_idx), C(float(max(n - corr, 0)))))
    if is_pair:
        if not keep:
            m2 = ctx.output(1)
            kb = ctx.builder(m2.shape)
            idx = dims_vars(m2.ndim)
            ctx.emit(kb, m2, idx, kb.load(mean, _expand_idx(idx, rd, x.ndim)))
            ctx.bind([out, m2])
        else:
            ctx.bind([out, mean])
    else:
        ctx.bind(out)


def _expand_idx(idx: list[Aff], rd: list[int], ndim: int) -> list[Aff]:
    """Index a keepdim-shaped tensor from the loop vars of its squeezed shape."""
    res, n = [], 0
    for i in range(ndim):
        if i in rd:
            res.append(Aff.lit(0))
        else:
            res.append(idx[n])
            n += 1
    return res


def _scan(op: str):
    def lower(ctx: OpCtx) -> None:
        x = ctx.args[0]
        dim = ctx.args[1] % max(x.ndim, 1)
        out = ctx.output(0) if op in ("max", "min") else ctx.output()
        kb = ctx.builder(x.shape)
        idx = dims_vars(x.ndim)
        body = kb.load(x, idx)
        if f"d{dim}" not in dict(kb.dims):
            # the scanned dimension flattens several of the base's (its loop variable was
            # split): the base addressed as the flat array it is, so the scan runs over one
            kb = ctx.builder(x.shape)
            kb.low.flat.add(x.base)
            body = kb.load(x, idx)
        if x.dtype != out.dtype:
            body = Call(f"to_{out.dtype}", (body,))
        ctx.emit(kb, out, idx, body, reduce=op, scan=f"d{dim}")
        if op in ("max", "min"):
            raise LoweringError(f"cum{op} indices are not modelled")
        ctx.bind(out)
    return lower


rule("aten.cumsum")(_scan("sum"))
rule("aten.cumprod")(_scan("prod"))


@rule("aten.linalg_vector_norm")
def vector_norm(ctx: OpCtx) -> None:
    """||x||_p: sqrt(sum x*x) for p=2, sum|x| for 1, max|x| for inf, else (sum |x|^p)^(1/p)."""
    x = ctx.args[0]
    ordp = ctx.args[1] if len(ctx.args) > 1 else ctx.kwargs.get("ord", 2)
    rd = norm_dims(_dims_arg(ctx, 2, "dim"), x.ndim)
    out = ctx.output()
    if ordp == float("inf"):
        reduce_kernel(ctx, x, rd, "max", lambda a: f("abs", a), out, out.shape)
        ctx.bind(out)
        return
    if ordp == 1:
        reduce_kernel(ctx, x, rd, "sum", lambda a: f("abs", a), out, out.shape)
        ctx.bind(out)
        return
    t = ctx.new_tensor(out.shape, out.dtype, ctx.node.name + "_sum")
    if ordp == 2:
        reduce_kernel(ctx, x, rd, "sum", lambda a: mul(a, a), t, out.shape)
        post = lambda s: f("sqrt", s)  # noqa: E731
    else:
        reduce_kernel(ctx, x, rd, "sum", lambda a: f("pow", f("abs", a), C(float(ordp))), t,
                      out.shape)
        post = lambda s: f("pow", s, C(1.0 / ordp))  # noqa: E731
    kb = ctx.builder(out.shape)
    idx = dims_vars(out.ndim)
    ctx.emit(kb, out, idx, post(kb.load(t, idx)))
    ctx.bind(out)


@rule("aten.topk")
def topk(ctx: OpCtx) -> None:
    """``topk(x, k, dim, largest)``: k selection passes, pass ``i`` an arg-reduction over the
    elements the earlier passes did not pick (``select(j == idx[p] for p < i, -inf, x)``),
    writing column ``i`` of the indices and values. This is the selection algorithm for
    the small k of routers and samplers: k*n comparisons (+ the exclusion tests), values
    in sorted order, ties to the first index. Known limit: a row holding -inf (largest)
    or +inf (smallest) among its top k can repeat an index, as taken elements are
    excluded by that same value."""
    x, k = ctx.args[0], int(ctx.args[1])
    a = list(ctx.args[2:]) + [None, None]
    dim = a[0] if a[0] is not None else ctx.kwargs.get("dim", -1)
    largest = a[1] if a[1] is not None else ctx.kwargs.get("largest", True)
    dim %= x.ndim
    vals, idxs = ctx.output(0), ctx.output(1)
    kept = [i for i in range(x.ndim) if i != dim]
    op, fill = ("argmax", -math.inf) if largest else ("argmin", math.inf)
    for i in range(k):
        kb = ctx.builder([x.shape[j] for j in kept], [x.shape[dim]])
        xi = _index(x.ndim, kept, [dim])
        body = unpicked(kb.load(x, xi), lambda pi, kb=kb: kb.load(idxs, pi), xi, dim, i, fill)
        out_idx = list(xi)
        out_idx[dim] = Aff.lit(i)
        ctx.emit(kb, idxs, out_idx, body, reduce=op, out2=vals.base)
    ctx.bind([vals, idxs])
