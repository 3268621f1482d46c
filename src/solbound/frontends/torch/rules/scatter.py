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

from ..lower import OpCtx, View, rule
from ._util import dims_vars


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
    from ._util import operand
    ctx.emit(kb, region, idx, operand(kb, src, region.shape, idx))


@rule("aten.slice_scatter")
def slice_scatter(ctx: OpCtx) -> None:
    x, src = ctx.args[0], ctx.args[1]
    a = list(ctx.args[2:]) + [None] * 4
    dim = a[0] if a[0] is not None else ctx.kwargs.get("dim", 0)
    start = a[1] if a[1] is not None else ctx.kwargs.get("start")
    end = a[2] if a[2] is not None else ctx.kwargs.get("end")
    step = a[3] if a[3] is not None else ctx.kwargs.get("step", 1)
    dim %= x.ndim
    if x.is_full and not _later_readers_of_base(ctx, x.base):
        target = x                                   # in place
    else:
        target = ctx.output()
        _copy_into(ctx, target, x)
    meta = torch.ops.aten.slice.Tensor(target.meta, dim, start, end, step)
    _copy_into(ctx, View(target.base, meta, target.base_shape), src)
    ctx.bind(target)
