"""Operators no affine loop nest describes: sorts and selections, FFTs, factorizations,
histograms, searches. Each lowers to one library kernel per output the program uses
(``ir/library.py``: its numpy routine for execution and validation, its work by a
documented convention, charged once per call on the first output used). Operands are
read whole (footprints exact); strided views are first copied in the operator's group.

Also here: the complex views (``view_as_complex``/``view_as_real``), ``logcumsumexp``
(a max, exponentials, a running sum, a log) and ``with_effects`` wrapping a linear-algebra
error check (which computes nothing).
"""

from __future__ import annotations

import operator

from ....ir.affine import Aff
from ....ir.model import Call
from ..lower import LoweringError, OpCtx, View, rule
from ._util import dims_vars, elementwise, reduce_kernel


def _used_outputs(ctx: OpCtx) -> list[int]:
    """Indices of the node's outputs that something reads."""
    return sorted({u.args[1] for u in ctx.node.users if u.target is operator.getitem})


def _only_checked(ctx: OpCtx, i: int) -> bool:
    """Every reader of output ``i`` is an error check (``with_effects``)."""
    for u in ctx.node.users:
        if u.target is operator.getitem and u.args[1] == i:
            if any(str(w.target) != "with_effects" for w in u.users):
                return False
    return True


def _full(ctx: OpCtx, v: View) -> View:
    if v.is_full:
        return v
    from .views import materialize
    return materialize(ctx, v)


def emit_library(ctx: OpCtx, out: View, routine: str, operands: list[View], params: dict,
                 cost: bool = True) -> None:
    """``out = routine(*operands)``: one library kernel (``Lowering.add_library``), each
    strided operand made whole first."""
    ctx.low.add_library(ctx.node, out, routine, [_full(ctx, v) for v in operands],
                        {**params, "cost": cost})


def _multi(ctx: OpCtx, routine: str, operands: list[View], params: dict,
           n_outputs: int, lowered: tuple[int, ...] | None = None) -> None:
    """A routine with several outputs: a kernel for each one used (the first carries the
    cost); outputs nothing reads are bound to nothing."""
    used = _used_outputs(ctx)
    lowered = tuple(range(n_outputs)) if lowered is None else lowered
    # a status output only an error check reads (with_effects) carries no value
    used = [i for i in used if i in lowered or not _only_checked(ctx, i)]
    missing = [i for i in used if i not in lowered]
    if missing:
        raise LoweringError(f"output {missing[0]} of {routine} (a status or workspace output) "
                            f"is read by the program")
    outs: list = [None] * n_outputs
    for pos, i in enumerate(used):
        outs[i] = ctx.output(i)
        emit_library(ctx, outs[i], routine, operands, {**params, "output": i}, cost=pos == 0)
    ctx.bind(outs)


def _arg(ctx: OpCtx, i: int, name: str, default=None):
    if len(ctx.args) > i and ctx.args[i] is not None:
        return ctx.args[i]
    return ctx.kwargs.get(name, default)


# --- sorting and selection ---------------------------------------------------------

@rule("aten.sort")
def sort(ctx: OpCtx) -> None:
    """``sort``/``argsort``: values and indices along ``dim`` (n ceil(log2 n) comparisons
    per row)."""
    x = ctx.args[0]
    if str(ctx.node.target).endswith(".stable"):
        dim, desc = ctx.kwargs.get("dim", -1), ctx.kwargs.get("descending", False)
    else:
        dim, desc = _arg(ctx, 1, "dim", -1), _arg(ctx, 2, "descending", False)
    _multi(ctx, "sort", [x], {"dim": int(dim) % max(x.ndim, 1), "descending": bool(desc)}, 2)


@rule("aten.kthvalue")
def kthvalue(ctx: OpCtx) -> None:
    x, k = ctx.args[0], ctx.args[1]
    dim, keep = _arg(ctx, 2, "dim", -1), _arg(ctx, 3, "keepdim", False)
    _multi(ctx, "select", [x], {"kind": "kthvalue", "k": int(k), "dim": int(dim) % max(x.ndim, 1),
                                "keepdim": bool(keep)}, 2)


@rule("aten.median.dim")
def median_dim(ctx: OpCtx) -> None:
    x = ctx.args[0]
    dim, keep = _arg(ctx, 1, "dim", -1), _arg(ctx, 2, "keepdim", False)
    _multi(ctx, "select", [x], {"kind": "median", "dim": int(dim) % max(x.ndim, 1),
                                "keepdim": bool(keep)}, 2)


@rule("aten.median.default")
def median_all(ctx: OpCtx) -> None:
    """The lower median of all elements (a 0-d result)."""
    x = _full(ctx, ctx.args[0])
    flat = View(x.base, x.meta.reshape(-1), x.base_shape)
    out = ctx.output()
    emit_library(ctx, out, "select", [flat], {"kind": "median", "dim": 0, "keepdim": False,
                                              "output": 0})
    ctx.bind(out)


@rule("aten.cummax", "aten.cummin")
def cumext(ctx: OpCtx) -> None:
    x, dim = ctx.args[0], ctx.args[1]
    kind = "max" if "cummax" in str(ctx.node.target) else "min"
    _multi(ctx, "cumext", [x], {"kind": kind, "dim": int(dim) % max(x.ndim, 1)}, 2)


# --- FFT -----------------------------------------------------------------------------

def _fft(ctx: OpCtx, kind: str, **params) -> None:
    """One transform over ``dims`` (``_fft_r2c``/``_fft_c2r``/``_fft_c2c``: input, dims,
    normalization, then the variant's own argument)."""
    x, dims, norm = ctx.args[:3]
    out = ctx.output()
    emit_library(ctx, out, "fft", [x], {"kind": kind, "dims": tuple(d % x.ndim for d in dims),
                                        "norm": int(norm), **params})
    ctx.bind(out)


@rule("aten._fft_r2c")
def fft_r2c(ctx: OpCtx) -> None:
    _fft(ctx, "r2c", onesided=bool(ctx.args[3]), forward=True)


@rule("aten._fft_c2r")
def fft_c2r(ctx: OpCtx) -> None:
    _fft(ctx, "c2r", last_size=int(ctx.args[3]), forward=False)


@rule("aten._fft_c2c")
def fft_c2c(ctx: OpCtx) -> None:
    _fft(ctx, "c2c", forward=bool(ctx.args[3]))


# --- linear algebra -------------------------------------------------------------------

@rule("aten._linalg_solve_ex")
def linalg_solve(ctx: OpCtx) -> None:
    a, b = ctx.args[0], ctx.args[1]
    if not _arg(ctx, 2, "left", True):
        raise LoweringError("linalg.solve with left=False")
    _multi(ctx, "solve", [a, b], {"vector": b.ndim == a.ndim - 1}, 4, lowered=(0,))


@rule("aten.linalg_inv_ex")
def linalg_inv(ctx: OpCtx) -> None:
    _multi(ctx, "inv", [ctx.args[0]], {}, 2, lowered=(0,))


@rule("aten.linalg_cholesky_ex")
def linalg_cholesky(ctx: OpCtx) -> None:
    _multi(ctx, "cholesky", [ctx.args[0]], {"upper": bool(_arg(ctx, 1, "upper", False))}, 2,
           lowered=(0,))


@rule("aten.linalg_qr")
def linalg_qr(ctx: OpCtx) -> None:
    mode = _arg(ctx, 1, "mode", "reduced")
    if mode not in ("reduced", "complete"):
        raise LoweringError(f"linalg.qr mode={mode!r}")
    _multi(ctx, "qr", [ctx.args[0]], {"mode": mode}, 2)


@rule("aten._linalg_svd")
def linalg_svd(ctx: OpCtx) -> None:
    full, uv = bool(_arg(ctx, 1, "full_matrices", False)), bool(_arg(ctx, 2, "compute_uv", True))
    # the vectors cost only when the program reads them (svdvals may trace with them on)
    uv = uv and bool({0, 2} & set(_used_outputs(ctx)))
    _multi(ctx, "svd", [ctx.args[0]], {"full": full, "vectors": uv}, 3)


@rule("aten._linalg_eigh")
def linalg_eigh(ctx: OpCtx) -> None:
    uplo, vec = _arg(ctx, 1, "UPLO", "L"), bool(_arg(ctx, 2, "compute_v", True))
    vec = vec and 1 in _used_outputs(ctx)
    _multi(ctx, "eigh", [ctx.args[0]], {"uplo": uplo, "vectors": vec}, 2)


@rule("with_effects")
def with_effects(ctx: OpCtx) -> None:
    """A side-effecting call threaded with a token: a linear-algebra error check
    (``_linalg_check_errors``) or an assertion computes nothing."""
    op = str(ctx.node.args[1])
    if "check_errors" not in op and "assert" not in op:
        raise LoweringError(f"with_effects around {op}")
    ctx.bind([None])


# --- counting and searching -------------------------------------------------------

@rule("aten.histc")
def histc(ctx: OpCtx) -> None:
    x = ctx.args[0]
    bins, lo, hi = _arg(ctx, 1, "bins", 100), _arg(ctx, 2, "min", 0), _arg(ctx, 3, "max", 0)
    out = ctx.output()
    flat = _full(ctx, x)
    emit_library(ctx, out, "histc", [flat], {"bins": int(bins), "min": float(lo), "max": float(hi)})
    ctx.bind(out)


@rule("aten.bucketize.Tensor")
def bucketize(ctx: OpCtx) -> None:
    """``torch.bucketize(x, boundaries, right)``: a search of each value in the sorted
    boundaries (the searchsorted routine: ceil(log2(n + 1)) comparisons per value)."""
    x, bounds = ctx.args[0], ctx.args[1]
    right = bool(ctx.kwargs.get("right", ctx.args[3] if len(ctx.args) > 3 else False))
    out = ctx.output()
    emit_library(ctx, out, "searchsorted", [bounds, x], {"right": right})
    ctx.bind(out)


@rule("aten.searchsorted.Tensor")
def searchsorted(ctx: OpCtx) -> None:
    seq, q = ctx.args[0], ctx.args[1]
    right = bool(ctx.kwargs.get("right", False)) or ctx.kwargs.get("side") == "right"
    if ctx.kwargs.get("sorter") is not None:
        raise LoweringError("searchsorted with a sorter")
    out = ctx.output()
    emit_library(ctx, out, "searchsorted", [seq, q], {"right": right})
    ctx.bind(out)


# --- complex views, logcumsumexp -------------------------------------------------------

@rule("aten.view_as_complex")
def view_as_complex(ctx: OpCtx) -> None:
    """``x[..., 2]`` real pairs as complex numbers (a copy into a complex tensor)."""
    x = ctx.args[0]
    out = ctx.output()
    kb = ctx.builder(out.shape)
    idx = dims_vars(out.ndim)
    ctx.emit(kb, out, idx, Call("complex", (kb.load(x, idx + [Aff.lit(0)]),
                                            kb.load(x, idx + [Aff.lit(1)]))))
    ctx.bind(out)


@rule("aten.polar")
def polar(ctx: OpCtx) -> None:
    """``abs * (cos(angle) + i sin(angle))`` (Llama 4's rotary frequencies): a cosine, a
    sine and two products per element, assembled into a complex number."""
    def body(r, theta):
        return Call("complex", (Call("mul", (r, Call("cos", (theta,)))),
                                Call("mul", (r, Call("sin", (theta,))))))
    ctx.bind(elementwise(ctx, body, [ctx.args[0], ctx.args[1]]))


@rule("aten.view_as_real")
def view_as_real(ctx: OpCtx) -> None:
    z = ctx.args[0]
    out = ctx.output()
    idx = dims_vars(z.ndim)
    for part, pos in (("real", 0), ("imag", 1)):
        kb = ctx.builder(z.shape)
        ctx.emit(kb, out, idx + [Aff.lit(pos)], Call(part, (kb.load(z, idx),)))
    ctx.bind(out)


@rule("aten.logcumsumexp")
def logcumsumexp(ctx: OpCtx) -> None:
    """``m + log(cumsum(exp(x - m)))`` with ``m`` the row's maximum: one max, one
    exponential and one log per element, a running sum."""
    x, dim = ctx.args[0], ctx.args[1] % max(ctx.args[0].ndim, 1)
    out = ctx.output()
    mshape = tuple(1 if i == dim else n for i, n in enumerate(x.shape))
    m = ctx.new_tensor(mshape, out.dtype, ctx.node.name + "_max")
    reduce_kernel(ctx, x, [dim], "max", lambda a: a, m, mshape)
    e = ctx.new_tensor(x.shape, out.dtype, ctx.node.name + "_exp")
    kb = ctx.builder(x.shape)
    idx = dims_vars(x.ndim)
    mi = [Aff.lit(0) if i == dim else v for i, v in enumerate(idx)]
    ctx.emit(kb, e, idx, Call("exp", (Call("sub", (kb.load(x, idx), kb.load(m, mi))),)))
    c = ctx.new_tensor(x.shape, out.dtype, ctx.node.name + "_cumsum")
    kb = ctx.builder(x.shape)
    ctx.emit(kb, c, idx, kb.load(e, idx), reduce="sum", scan=f"d{dim}")
    kb = ctx.builder(x.shape)
    ctx.emit(kb, out, idx, Call("add", (kb.load(m, mi), Call("log", (kb.load(c, idx),)))))
    ctx.bind(out)



