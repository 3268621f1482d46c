"""Helpers shared by the lowering rules: smart scalar constructors, broadcasting."""

from __future__ import annotations

import math

from ....ir.affine import Aff
from ....ir.model import Access, Call, Const, Expr, Idx
from ..lower import KernelBuilder, LoweringError, OpCtx, View


def C(v) -> Const:
    return Const(v)


def is_const(e: Expr, v=None) -> bool:
    return isinstance(e, Const) and (v is None or (not isinstance(e.value, bool) and e.value == v))


def add(a: Expr, b: Expr) -> Expr:
    if is_const(b, 0):
        return a
    if is_const(a, 0):
        return b
    return Call("add", (a, b))


def sub(a: Expr, b: Expr) -> Expr:
    return a if is_const(b, 0) else Call("sub", (a, b))


def mul(a: Expr, b: Expr) -> Expr:
    if is_const(b, 1):
        return a
    if is_const(a, 1):
        return b
    return Call("mul", (a, b))


def div(a: Expr, b: Expr) -> Expr:
    return a if is_const(b, 1) else Call("div", (a, b))


def f(op: str, *args: Expr) -> Call:
    return Call(op, tuple(args))


def dims_vars(n: int, prefix: str = "d") -> list[Aff]:
    return [Aff.var(f"{prefix}{i}") for i in range(n)]


def bcast_index(view: View, out_shape: tuple[int, ...], idx: list[Aff]) -> list[Aff]:
    """Right-aligned broadcasting of ``view`` into an iteration over ``out_shape``."""
    nd = view.ndim
    if nd > len(out_shape):
        raise LoweringError(f"cannot broadcast {view.shape} to {out_shape}")
    lead = len(out_shape) - nd
    res = []
    for i, n in enumerate(view.shape):
        if n == 1 and out_shape[lead + i] != 1:
            res.append(Aff.lit(0))
        else:
            res.append(idx[lead + i])
    return res


def operand(kb: KernelBuilder, x, out_shape: tuple[int, ...], idx: list[Aff]) -> Expr:
    """An elementwise operand: a view (broadcast), or a Python number."""
    if isinstance(x, View):
        return kb.load(x, bcast_index(x, out_shape, idx))
    if isinstance(x, bool):
        return Const(x)
    if isinstance(x, (int, float)):
        return Const(x)
    raise LoweringError(f"unsupported operand {type(x).__name__}")


def norm_dims(dims, ndim: int) -> list[int]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % ndim if ndim else 0 for d in dims})


def elementwise(ctx: OpCtx, body_fn, operands: list) -> View:
    """One map kernel over the output shape: ``out[d...] = body_fn(*loaded operands)``."""
    out = ctx.output()
    shape = out.shape
    kb = ctx.builder(shape)
    idx = dims_vars(len(shape))
    loaded = [operand(kb, x, shape, idx) for x in operands]
    ctx.emit(kb, out, idx, body_fn(*loaded))
    return out


def reduce_kernel(ctx: OpCtx, x: View, rdims: list[int], op: str, body_fn, out: View,
                  keep_shape: tuple[int, ...], extra=None, unit: str = "") -> None:
    """``out[kept] = op(body_fn(x[...]))`` reducing ``x`` over ``rdims``.

    ``out`` may keep reduced dims as size 1 (keepdim) or drop them; ``extra`` is a
    list of (view, index-builder) pairs for further operands indexed by the kept dims.
    """
    kept = [i for i in range(x.ndim) if i not in rdims]
    kb = ctx.builder([x.shape[i] for i in kept], [x.shape[i] for i in rdims])
    xi: list[Aff] = [Aff.lit(0)] * x.ndim
    for n, i in enumerate(kept):
        xi[i] = Aff.var(f"d{n}")
    for n, i in enumerate(rdims):
        xi[i] = Aff.var(f"r{n}")
    xa = kb.load(x, xi)
    extras = [kb.load(v, fn(xi)) for v, fn in (extra or [])]
    out_idx = _out_index(out, x.ndim, kept, rdims)
    ctx.emit(kb, out, out_idx, body_fn(xa, *extras), reduce=op, unit=unit)


def _out_index(out: View, ndim: int, kept: list[int], rdims: list[int]) -> list[Aff]:
    """Output index: kept dims as d-vars; reduced dims either dropped or 0 (keepdim)."""
    if out.ndim == len(kept):
        return [Aff.var(f"d{n}") for n in range(len(kept))]
    if out.ndim == ndim:
        res, n = [], 0
        for i in range(ndim):
            if i in rdims:
                res.append(Aff.lit(0))
            else:
                res.append(Aff.var(f"d{n}"))
                n += 1
        return res
    raise LoweringError(f"reduction output rank {out.ndim} fits neither keepdim nor not")


def numel(shape) -> int:
    return math.prod(shape)


def acc_of(e: Expr) -> Access:
    assert isinstance(e, Access)
    return e


__all__ = ["C", "add", "sub", "mul", "div", "f", "dims_vars", "bcast_index", "operand",
           "norm_dims", "elementwise", "reduce_kernel", "numel", "Idx", "Aff"]
