"""Collectives of a per-rank program (``torch.distributed`` under a process group).

``torch.export`` turns ``dist.all_reduce(x)`` and the other in-place c10d calls into
functional collectives (``_c10d_functional.all_reduce(x, "sum", group_name)`` then
``wait_tensor``, then a ``copy`` back into ``x``); DTensor redistributions and
``torch.distributed._functional_collectives`` give the same ops. Each becomes one
collective library kernel (``ir/collectives.py``) with the group's size and ranks,
resolved from the group's name in the process group the program was traced under;
``wait_tensor`` is the value itself, and the copy back of a collective's result is that
result (the collective writes in place: no copy runs).
"""

from __future__ import annotations

from ....ir.collectives import check
from ..lower import LoweringError, OpCtx, rule
from .library import emit_library


def _group(ctx: OpCtx, name) -> tuple[int, tuple[int, ...]]:
    """(size, global ranks) of the process group named ``name``."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group
    if not dist.is_initialized():
        raise LoweringError(f"{ctx.node.target}: no process group (run with --world-size N)")
    try:
        pg = _resolve_process_group(name)
    except Exception as e:  # noqa: BLE001 - one line for the user
        raise LoweringError(f"{ctx.node.target}: process group {name!r} cannot be resolved "
                            f"({type(e).__name__}: {e})") from None
    try:
        ranks = tuple(int(r) for r in dist.get_process_group_ranks(pg))
    except Exception:  # noqa: BLE001 - a group without a rank list
        ranks = tuple(range(pg.size()))
    return pg.size(), ranks


def _emit(ctx: OpCtx, kind: str, x, group_name, extra: dict | None = None) -> None:
    size, ranks = _group(ctx, group_name)
    out = ctx.output()
    params = {"ranks": size, "group": ranks, **(extra or {})}
    why = check(kind, params, tuple(x.shape), tuple(out.shape))
    if why:
        raise LoweringError(why)
    emit_library(ctx, out, kind, [x], params)
    ctx.bind(out)


@rule("_c10d_functional.all_reduce")
def _all_reduce(ctx: OpCtx) -> None:
    _emit(ctx, "all_reduce", ctx.args[0], ctx.node.args[2], {"op": str(ctx.node.args[1])})


@rule("_c10d_functional.all_gather_into_tensor")
def _all_gather(ctx: OpCtx) -> None:
    _emit(ctx, "all_gather", ctx.args[0], ctx.node.args[2])


@rule("_c10d_functional.reduce_scatter_tensor")
def _reduce_scatter(ctx: OpCtx) -> None:
    _emit(ctx, "reduce_scatter", ctx.args[0], ctx.node.args[3], {"op": str(ctx.node.args[1])})


@rule("_c10d_functional.all_to_all_single")
def _all_to_all(ctx: OpCtx) -> None:
    out_split, in_split = ctx.node.args[1], ctx.node.args[2]
    for name, split in (("output", out_split), ("input", in_split)):
        if split and len(set(int(s) for s in split)) > 1:
            raise LoweringError(f"all_to_all_single with unequal {name} splits {list(split)}: "
                                f"only equal splits are modelled")
    _emit(ctx, "all_to_all", ctx.args[0], ctx.node.args[3])


@rule("_c10d_functional.wait_tensor")
def _wait(ctx: OpCtx) -> None:
    ctx.bind(ctx.args[0])
