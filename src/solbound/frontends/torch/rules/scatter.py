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

import torch

from ....ir.affine import Aff
from ....ir.model import Access, Call, Idx
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


@rule("aten.index_put")
def index_put(ctx: OpCtx) -> None:
    """``x[..., idx, ...] = v`` (``index_copy_``, KV caches written at ``cache_position``)
    with one index tensor whose values are a known progression (``arange``, a constant):
    the strided slice it names is written, in place when nothing reads the old ``x``."""
    x, indices, v = ctx.args[0], list(ctx.args[1]), ctx.args[2]
    accumulate = ctx.args[3] if len(ctx.args) > 3 else ctx.kwargs.get("accumulate", False)
    pos = [i for i, t in enumerate(indices) if t is not None]
    if accumulate or len(pos) != 1:
        raise LoweringError("index_put with several index tensors or accumulate=True")
    dim = pos[0]
    prog = _progression(ctx, indices[dim])
    if prog is None:
        raise LoweringError("index_put at positions known only at run time (an input or "
                            "computed index): the written rows cannot be told apart")
    start, step = prog
    n = indices[dim].shape[0]
    _write_slice(ctx, x, v, dim, start, start + (n - 1) * step + 1, step)


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
    reads_itself = isinstance(src, View) and src.base == x.base     # y[:, 1:4] = y[:, 0:3]
    if x.is_full and not reads_itself and not _later_readers_of_base(ctx, x.base):
        target = x                                   # in place
    else:
        target = ctx.output()
        _copy_into(ctx, target, x)
    meta = torch.ops.aten.slice.Tensor(target.meta, dim, start, end, step)
    _copy_into(ctx, View(target.base, meta, target.base_shape), src)
    ctx.bind(target)
