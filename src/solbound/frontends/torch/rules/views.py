"""Views: they move no data. Each is replayed on the meta tensor of its base,
so the consumer's access becomes an affine access of the base."""

from __future__ import annotations

import torch

from ..lower import LoweringError, OpCtx, View, rule
from ._util import dims_vars

VIEW_NAMES = (
    "aten.view", "aten._unsafe_view", "aten.reshape", "aten.permute", "aten.expand",
    "aten.unsqueeze", "aten.squeeze", "aten.slice", "aten.select", "aten.alias", "aten.t",
    "aten.transpose", "aten.as_strided", "aten.diagonal", "aten.detach", "aten.unfold",
    "aten.split_with_sizes", "aten.split", "aten.unbind", "aten.chunk", "aten.narrow",
    "aten.view_as_real", "aten.movedim", "aten.expand_as", "aten.numpy_T", "aten.flatten",
    "aten.lift_fresh", "aten.squeeze_copy", "aten.view_copy", "aten.permute_copy",
    "aten.unsqueeze_copy", "aten.expand_copy", "aten.slice_copy", "aten.select_copy",
    "aten.alias_copy", "aten.t_copy", "aten.transpose_copy", "aten.as_strided_copy",
    "aten.diagonal_copy", "aten.split_with_sizes_copy", "aten.unbind_copy",
)


def _meta_args(a):
    if isinstance(a, View):
        return a.meta
    if isinstance(a, (list, tuple)):
        return type(a)(_meta_args(x) for x in a)
    return a


def materialize(ctx: OpCtx, v: View) -> View:
    """Copy a view into a fresh contiguous base (what ``reshape`` does when a view can't)."""
    out = ctx.new_tensor(v.shape, v.dtype, ctx.node.name + "_contig")
    kb = ctx.builder(v.shape)
    idx = dims_vars(v.ndim)
    ctx.emit(kb, out, idx, kb.load(v, idx))
    return out


def _wrap(src: View, res):
    if isinstance(res, torch.Tensor):
        return View(src.base, res, src.base_shape)
    if isinstance(res, (list, tuple)):
        return [_wrap(src, r) for r in res]
    raise LoweringError(f"view returned {type(res).__name__}")


@rule(*VIEW_NAMES)
def view_rule(ctx: OpCtx) -> None:
    src = ctx.args[0]
    if not isinstance(src, View):
        raise LoweringError("view of a non-tensor")
    target = ctx.node.target
    try:
        res = target(*_meta_args(ctx.args), **_meta_args(ctx.kwargs))
    except RuntimeError:
        # the view is not expressible on our contiguous layout: copy first
        src = materialize(ctx, src)
        args = (src,) + tuple(ctx.args[1:])
        res = target(*_meta_args(args), **_meta_args(ctx.kwargs))
    ctx.bind(_wrap(src, res))
