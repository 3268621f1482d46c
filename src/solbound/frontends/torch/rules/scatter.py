"""Writes into a region of an existing tensor: KV-cache updates and their kin.

``slice_scatter(x, src, dim, start, end, step)`` is ``x`` with a strided slice replaced
by ``src`` (what ``cache[:, :, pos:pos+1] = k`` becomes after functionalization).
When nothing reads ``x``'s old value afterwards, the update happens **in place**: one
copy kernel writes ``src`` into the slice of ``x``'s own storage, and the result *is*
``x``. Only the written region is write traffic, and a buffer updated that way keeps its
role (DRAM state the program updates). Otherwise the result is a fresh tensor: a copy
of ``x`` and the region overwritten by ``src`` (two writers of one tensor, in order).
"""

from __future__ import annotations

import math

import torch

from ....ir.affine import Aff
from ....ir.model import Access, Call, Const, Idx
from ..lower import LoweringError, OpCtx, View, rule
from ._util import dims_vars, operand


def _later_readers_of_base(ctx: OpCtx, base: str) -> bool:
    """Does a node after this one read ``base`` through a value made before it?"""
    low, node = ctx.low, ctx.node
    seen_self = False
    for n in node.graph.nodes:
        if n is node:
            seen_self = True
            continue
        if not seen_self:
            continue
        for a in n.all_input_nodes:
            if a is node or a not in low.env:
                continue
            vals = low.env[a] if isinstance(low.env[a], (list, tuple)) else [low.env[a]]
            if any(isinstance(v, View) and v.base == base for v in vals):
                return True
        if n.op == "output":
            for a in n.all_input_nodes:
                v = low.env.get(a)
                if a is not node and isinstance(v, View) and v.base == base \
                        and low.tensors[base].role == "intermediate":
                    return True
    return False


def _copy_into(ctx: OpCtx, region: View, src) -> None:
    kb = ctx.builder(region.shape)
    idx = dims_vars(region.ndim)
    ctx.emit(kb, region, idx, operand(kb, src, region.shape, idx))


def _progression(ctx: OpCtx, index) -> tuple[int, int] | None:
    """``(start, step)`` when a 1-d index tensor is known to be ``start + step*i``: made by
    ``arange`` in the program (its kernel's value is affine in its loop variable), or a
    constant the exported program holds (``torch.tensor([pos])``)."""
    if not isinstance(index, View) or index.ndim != 1 or not index.is_full \
            or index.dtype not in ("i64", "i32"):
        return None                         # a bool mask selects, it does not index
    low = ctx.low
    base = index.base
    n = index.shape[0]
    for _ in range(8):                      # through copies (clone, casts) of the index
        writers = [k for k in low.kernels if k.out == base]
        if len(writers) != 1 or writers[0].guard or len(writers[0].dims) > 1 \
                or writers[0].reduce is not None or writers[0].scan is not None:
            break
        w = writers[0]
        body = w.body
        while isinstance(body, Call) and body.op.startswith("to_"):
            body = body.args[0]
        d0 = w.dims[0][0] if w.dims else None
        if isinstance(body, Idx) and set(body.expr.vars) <= {d0}:
            start, step = body.expr.const, body.expr.coef(d0) if d0 else 1
            # positions written in order, none negative (a negative index counts from the end)
            return (start, step) if start >= 0 and (step > 0 or n == 1) else None
        if not (isinstance(body, Access) and body.index == w.out_index
                and w.out_index[0] in (Aff.lit(0), Aff.var(d0) if d0 else None)):
            break
        base = body.tensor
    values = low.constant_value(base)
    if values is None or values.dtype.is_floating_point or values.numel() == 0:
        return None
    vals = [int(v) for v in values.reshape(-1).tolist()]
    step = vals[1] - vals[0] if len(vals) > 1 else 1
    if step <= 0 or vals[0] < 0 or any(b - a != step for a, b in zip(vals, vals[1:])):
        return None
    return vals[0], step


def _target(ctx: OpCtx, x: View, *sources) -> View:
    """Where an update of ``x`` goes: ``x`` itself (in place) when nothing reads its old
    value afterwards and no source is a view of it; else a fresh copy of ``x``."""
    if x.is_full and not any(isinstance(s, View) and s.base == x.base for s in sources) \
            and not _later_readers_of_base(ctx, x.base):
        return x
    target = ctx.output()
    _copy_into(ctx, target, x)
    return target


@rule("aten.index_put")
def index_put(ctx: OpCtx) -> None:
    """``x[..., i, j, ...] = v`` (``index_copy_``, ``x[idx] = v``, ``index_put_``) and
    ``accumulate=True`` (``index_add_``, ``x[idx] += v`` unbuffered).

    One index tensor whose values are a known progression (``arange``, a constant: a KV
    cache written at ``cache_position``) writes that strided slice, exactly a box. Other
    index tensors (known only at run time) make a **scatter** kernel: one point per
    element of ``x[indices]``, written (or added) at the position the indices name. Only
    the written elements are write traffic; in place when nothing reads the old ``x``."""
    x, indices, v = ctx.args[0], list(ctx.args[1]), ctx.args[2]
    accumulate = ctx.args[3] if len(ctx.args) > 3 else ctx.kwargs.get("accumulate", False)
    indices += [None] * (x.ndim - len(indices))
    pos = [i for i, t in enumerate(indices) if t is not None]
    if not pos:
        raise LoweringError("index_put without index tensors")
    if any(indices[i].dtype == "bool" for i in pos):
        _masked_fill(ctx, x, indices, v, accumulate)
        return
    if not accumulate and len(pos) == 1:
        prog = _progression(ctx, indices[pos[0]])
        if prog is not None:
            start, step = prog
            n = indices[pos[0]].shape[0]
            _write_slice(ctx, x, v, pos[0], start, start + (n - 1) * step + 1, step)
            return
    target = _target(ctx, x, v, *[indices[i] for i in pos])
    # the points: the shape of x[indices] (broadcast index dims in place when the index
    # tensors are adjacent, first otherwise: NumPy's rule)
    ishape = tuple(int(s) for s in torch.broadcast_shapes(*[indices[i].shape for i in pos]))
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    first = pos[0] if adjacent else 0
    rest_dims = [x.shape[i] for i in range(x.ndim) if indices[i] is None]
    shape = tuple(rest_dims[:first]) + ishape + tuple(rest_dims[first:])
    kb = ctx.builder(shape)
    idx = dims_vars(len(shape))
    bi = idx[first:first + len(ishape)]
    rest = iter(idx[:first] + idx[first + len(ishape):])
    out_index = [next(rest) if indices[i] is None else operand(kb, indices[i], ishape, bi)
                 for i in range(x.ndim)]
    ctx.emit_scatter(kb, target, out_index, operand(kb, v, shape, idx),
                     reduce="sum" if accumulate else None)
    ctx.bind(target)


def _masked_fill(ctx: OpCtx, x: View, indices: list, v, accumulate: bool) -> None:
    """``x[mask] = v`` with a boolean mask over x's leading dims and a value that is the
    same for every selected element (one number, or a row broadcast over each selected
    element: T5Gemma 2 writes one embedding into every position of a token): a select."""
    pos = [i for i, t in enumerate(indices) if t is not None]
    m = indices[pos[0]]
    if len(pos) != 1 or pos[0] != 0 or tuple(m.shape) != tuple(x.shape[:m.ndim]) \
            or not (not isinstance(v, View) or math.prod(v.shape) == 1
                    or _per_element(v.shape, x.shape[m.ndim:])):
        raise LoweringError("x[mask] = v with a boolean mask and several values: how many "
                            "elements the mask selects is known only at run time")
    out = ctx.output()
    kb = ctx.builder(out.shape)
    idx = dims_vars(out.ndim)
    # v's dims right-aligned with out's; a dim of 1 (or one past out's) is read at 0
    val = kb.load(v, [idx[d] if n != 1 and d >= 0 else Aff.lit(0) for n, d in
                      zip(v.shape, range(out.ndim - v.ndim, out.ndim))]) \
        if isinstance(v, View) else Const(v)
    old = kb.load(x, idx)
    new = Call("add", (old, val)) if accumulate else val
    ctx.emit(kb, out, idx, Call("select", (kb.load(m, idx[:m.ndim]), new, old)))
    ctx.bind(out)


def _per_element(vshape, rest) -> bool:
    """Whether values of shape ``vshape`` broadcast to ``(K, *rest)`` are the same for each
    of the K selected elements: no dim of their own along K, each other dim 1 or rest's."""
    vshape, rest = tuple(vshape), tuple(rest)
    if len(vshape) > len(rest) + 1 or (len(vshape) == len(rest) + 1 and vshape[0] != 1):
        return False
    tail = vshape[len(vshape) - min(len(vshape), len(rest)):]
    return all(a in (1, b) for a, b in zip(tail, rest[len(rest) - len(tail):]))


def _scatter_along(ctx: OpCtx, x: View, dim: int, index: View, src, reduce: str | None,
                   include_self: bool = True) -> None:
    """``out[.., index[p], ..] (reduce)= src[p]`` for every position ``p`` of ``index``
    (``scatter``, ``scatter_add``, ``scatter_reduce``): a scatter kernel over ``index``."""
    dim %= x.ndim
    target = _target(ctx, x, src, index)
    shape = tuple(index.shape)
    idx = dims_vars(len(shape))
    if not include_self and reduce is not None:
        # positions any point hits start from the reduction's identity, not from x
        kb = ctx.builder(shape)
        oi = list(idx)
        oi[dim] = kb.load(index, idx)
        ident = {"sum": 0, "prod": 1, "max": -math.inf, "min": math.inf}[reduce]
        if target.dtype not in ("f64", "f32", "f16", "bf16") and reduce in ("max", "min"):
            raise LoweringError("scatter_reduce amax/amin with include_self=False on integers")
        ctx.emit_scatter(kb, target, oi, Const(ident))
    kb = ctx.builder(shape)
    oi = list(idx)
    oi[dim] = kb.load(index, idx)
    body = kb.load(src, idx) if isinstance(src, View) else Const(src)
    ctx.emit_scatter(kb, target, oi, body, reduce=reduce)
    ctx.bind(target)


@rule("aten.scatter.src", "aten.scatter.value")
def scatter(ctx: OpCtx) -> None:
    """``x.scatter(dim, index, src|value)``: every position of ``index`` overwrites one
    element (a scatter kernel; indices repeated within a row leave which write wins
    undefined, as in PyTorch)."""
    x, dim, index, v = ctx.args[0], ctx.args[1], ctx.args[2], ctx.args[3]
    if len(ctx.args) > 4 or ctx.kwargs.get("reduce"):
        raise LoweringError("scatter with reduce= (deprecated): use scatter_reduce")
    _scatter_along(ctx, x, dim, index, v, None)


@rule("aten.scatter_add")
def scatter_add(ctx: OpCtx) -> None:
    """``x.scatter_add(dim, index, src)``: ``out[.., index[p], ..] += src[p]``."""
    x, dim, index, src = ctx.args[:4]
    _scatter_along(ctx, x, dim, index, src, "sum")


SCATTER_REDUCE = {"sum": "sum", "prod": "prod", "amax": "max", "amin": "min"}


@rule("aten.scatter_reduce.two")
def scatter_reduce(ctx: OpCtx) -> None:
    """``x.scatter_reduce(dim, index, src, reduce, include_self)``, ``reduce`` one of
    sum, prod, amax, amin (``mean`` divides by a count per position: not lowered)."""
    x, dim, index, src, red = ctx.args[:5]
    include_self = ctx.args[5] if len(ctx.args) > 5 else ctx.kwargs.get("include_self", True)
    if red not in SCATTER_REDUCE:
        raise LoweringError(f"scatter_reduce with reduce={red!r}")
    _scatter_along(ctx, x, dim, index, src, SCATTER_REDUCE[red], include_self)


@rule("aten.diagonal_scatter")
def diagonal_scatter(ctx: OpCtx) -> None:
    """``torch.diagonal_scatter(x, src, offset, dim1, dim2)``: ``src`` written on a diagonal
    of ``x`` (an affine write: the diagonal's index in both of its coordinates)."""
    x, src = ctx.args[0], ctx.args[1]
    a = list(ctx.args[2:]) + [None] * 3
    offset = a[0] if a[0] is not None else ctx.kwargs.get("offset", 0)
    d1 = (a[1] if a[1] is not None else ctx.kwargs.get("dim1", 0)) % x.ndim
    d2 = (a[2] if a[2] is not None else ctx.kwargs.get("dim2", 1)) % x.ndim
    target = _target(ctx, x, src)
    kb = ctx.builder(src.shape)
    idx = dims_vars(src.ndim)
    rest = iter(idx[:-1])
    i = idx[-1]
    out_index = []
    for d in range(x.ndim):
        if d == d1:
            out_index.append(i + max(-offset, 0))
        elif d == d2:
            out_index.append(i + max(offset, 0))
        else:
            out_index.append(next(rest))
    ctx.emit(kb, target, out_index, kb.load(src, idx))
    ctx.bind(target)


@rule("aten.slice_scatter")
def slice_scatter(ctx: OpCtx) -> None:
    x, src = ctx.args[0], ctx.args[1]
    a = list(ctx.args[2:]) + [None] * 4
    dim = a[0] if a[0] is not None else ctx.kwargs.get("dim", 0)
    start = a[1] if a[1] is not None else ctx.kwargs.get("start")
    end = a[2] if a[2] is not None else ctx.kwargs.get("end")
    step = a[3] if a[3] is not None else ctx.kwargs.get("step", 1)
    _write_slice(ctx, x, src, dim % x.ndim, start, end, step)


def _write_slice(ctx: OpCtx, x: View, src, dim: int, start, end, step) -> None:
    target = _target(ctx, x, src)          # y[:, 1:4] = y[:, 0:3] reads itself: a copy
    meta = torch.ops.aten.slice.Tensor(target.meta, dim, start, end, step)
    _copy_into(ctx, View(target.base, meta, target.base_shape), src)
    ctx.bind(target)


@rule("aten._embedding_bag", "aten._embedding_bag_forward_only")
def embedding_bag(ctx: OpCtx) -> None:
    """``F.embedding_bag(indices, weight, offsets, mode)``: rows of ``weight`` gathered and
    combined per bag, bags given by ``offsets`` (known only at run time in general).

    Lowered as PyTorch computes it: each index's bag (a scatter of ones at the offsets,
    then a running sum), then every looked-up row added (``sum``/``mean``) or maxed into
    its bag's output row (a scatter), ``mean`` divided by the bag sizes. Each looked-up
    row is read once (an indirect access); empty bags are zero."""
    a = list(ctx.args) + [None] * 9
    w, idx, offsets = a[0], a[1], a[2]
    mode = a[4] if a[4] is not None else ctx.kwargs.get("mode", 0)
    psw = a[6] if a[6] is not None else ctx.kwargs.get("per_sample_weights")
    last = a[7] if a[7] is not None else ctx.kwargs.get("include_last_offset", False)
    pad = a[8] if a[8] is not None else ctx.kwargs.get("padding_idx", -1)
    if [i for i in (1, 2, 3) if any(u.args[1] == i for u in ctx.node.users)]:
        raise LoweringError("embedding_bag's offset2bag, bag_size or max_indices outputs are read")
    if pad is not None and pad >= 0:
        raise LoweringError("embedding_bag with padding_idx")
    if idx.ndim != 1 or offsets is None:
        raise LoweringError("embedding_bag with 2-d indices left undecomposed")
    n, e = idx.shape[0], w.shape[1]
    out = ctx.output(0)
    nbags = out.shape[0]
    # bag of each index: ones scattered at offsets[1:], then a running sum
    starts = ctx.new_tensor((n,), "i64", ctx.node.name + "_starts")
    kb = ctx.builder((n,))
    ctx.emit(kb, starts, dims_vars(1), Const(0))
    nb = offsets.shape[0] - (1 if last else 0)
    if nb > 1:
        kb = ctx.builder((nb - 1,))
        d = dims_vars(1)[0]
        ctx.emit_scatter(kb, starts, [kb.load(offsets, [d + 1])], Const(1), reduce="sum")
    bag = ctx.new_tensor((n,), "i64", ctx.node.name + "_bag")
    kb = ctx.builder((n,))
    ctx.emit(kb, bag, dims_vars(1), kb.load(starts, dims_vars(1)), reduce="sum", scan="d0")
    # the rows, combined into their bags
    red = {0: "sum", 1: "sum", 2: "max"}[int(mode)]
    kb = ctx.builder((nbags, e))
    ctx.emit(kb, out, dims_vars(2), Const(-math.inf if red == "max" else 0))
    kb = ctx.builder((n, e))
    i, j = dims_vars(2)
    row = Access(w.base, (kb.load(idx, [i]), j)) if w.is_full else None
    if row is None:
        raise LoweringError("embedding_bag of a strided weight view")
    if psw is not None:
        row = Call("mul", (row, kb.load(psw, [i])))
    ctx.emit_scatter(kb, out, [kb.load(bag, [i]), j], row, reduce=red)
    if int(mode) in (1, 2):
        # bag sizes: mean divides by them, max turns an empty bag's -inf into 0
        size = ctx.new_tensor((nbags,), "i64", ctx.node.name + "_size")
        kb = ctx.builder((nbags,))
        ctx.emit(kb, size, dims_vars(1), Const(0))
        kb = ctx.builder((n,))
        ctx.emit_scatter(kb, size, [kb.load(bag, dims_vars(1))], Const(1), reduce="sum")
        final = ctx.new_tensor(out.shape, out.dtype, ctx.node.name + "_out")
        kb = ctx.builder((nbags, e))
        b, j = dims_vars(2)
        cnt = kb.load(size, [b])
        val = kb.load(out, [b, j])
        body = (Call("div", (val, Call("maximum", (cnt, Const(1))))) if int(mode) == 1
                else Call("select", (Call("gt", (cnt, Const(0))), val, Const(0.0))))
        ctx.emit(kb, final, [b, j], body)
        out = final
    ctx.bind([out, None, None, None])
