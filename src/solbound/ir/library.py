"""Library routines: operations no affine loop nest describes (sorts, FFTs, factorizations).

A library kernel (``Kernel.lib = (routine, params)``) computes the whole of its output
from the tensors its body reads (``operands(...)``). Each routine here has

* ``run(arrays, params) -> ndarray``: the routine on numpy arrays (the operands' tensors,
  in order of first appearance), used to execute and validate the IR;
* ``cost(shapes, params) -> {unit: FLOPs}``: its work by a documented standard convention
  (the README lists them), charged once per call (``params["cost"]``: the kernel of the
  first output the program uses carries it, the routine's other outputs none).

Conventions, per routine call (``n``: the length along the routine's dimension, ``R``: the
number of independent rows or matrices):

* ``sort`` (values or indices, ``sort``/``argsort``): ``R * n * ceil(log2 n)`` comparisons
  (the comparison-sort bound), vector pipe.
* ``select`` (``kthvalue``, ``median``): ``R * n`` comparisons (a selection reads each
  element once), vector pipe.
* ``cumext`` (``cummax``/``cummin`` values and indices): ``R * n`` comparisons.
* ``fft``: ``5 N log2 N`` real FLOPs per complex transform of ``N`` points (FFTW's
  convention, any ``N``), half for real-input (``r2c``) or real-output (``c2r``)
  transforms; an n-d transform is one per dimension over all others. Vector pipe.
* linear algebra (LAPACK counts, per matrix; ``m x n`` with ``m >= n``, ``k`` right-hand
  sides): ``solve`` ``2/3 n^3 + 2 n^2 k`` (LU and two triangular solves), ``inv`` ``2 n^3``,
  ``cholesky`` ``n^3 / 3``, ``qr`` ``4 m n^2 - 4/3 n^3`` (Householder, reduced Q formed),
  ``svd`` values ``4 m n^2 - 4/3 n^3`` (bidiagonalization), with vectors ``6 m n^2 + 20 n^3``
  (R-SVD), ``eigh`` values ``4/3 n^3`` (tridiagonalization), with vectors ``9 n^3``
  (Golub and Van Loan). Matrix pipe, matmul precision class; MACs are half the FLOPs.
* ``histc``: 2 FLOPs per element (its bin and the increment).
* ``searchsorted`` (and ``bucketize``): ``ceil(log2(n + 1))`` comparisons per query.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .collectives import KINDS

MATRIX, VECTOR = "matrix", "vector"


@dataclass(frozen=True)
class Routine:
    run: Callable[[list[np.ndarray], dict], np.ndarray]
    cost: Callable[[list[tuple[int, ...]], dict], dict[str, int]]


def _rows(shape: tuple[int, ...], dim: int) -> tuple[int, int]:
    n = shape[dim] if shape else 1
    return (math.prod(shape) // n if n else 0), n


def _log2c(n: int) -> int:
    return max(0, math.ceil(math.log2(n))) if n > 1 else 0


# --- sorting and selection ----------------------------------------------------------

def _sort_run(a, p):
    x = a[0]
    dim = p["dim"] % max(x.ndim, 1)
    key = -x if p.get("descending") else x
    idx = np.argsort(key, axis=dim, kind="stable")
    if p["output"] == 1:
        return idx
    return np.take_along_axis(x, idx, axis=dim)


def _sort_cost(shapes, p):
    r, n = _rows(shapes[0], p["dim"] % max(len(shapes[0]), 1))
    return {VECTOR: r * n * _log2c(n)}


def _select_run(a, p):
    x = a[0]
    dim = p["dim"] % max(x.ndim, 1)
    n = x.shape[dim]
    k = p["k"] if p["kind"] == "kthvalue" else (n - 1) // 2 + 1     # torch: lower median
    idx = np.argsort(x, axis=dim, kind="stable")
    pick = np.take(idx, [k - 1], axis=dim)
    out = pick if p["output"] == 1 else np.take_along_axis(x, pick, axis=dim)
    return out if p.get("keepdim") else np.squeeze(out, axis=dim)


def _linear_cost(shapes, p):
    r, n = _rows(shapes[0], p["dim"] % max(len(shapes[0]), 1))
    return {VECTOR: r * n}


def _cumext_run(a, p):
    x = a[0]
    dim = p["dim"] % max(x.ndim, 1)
    xm = np.moveaxis(x, dim, -1)
    better = np.greater_equal if p["kind"] == "max" else np.less_equal
    vals = np.empty_like(xm)
    idx = np.zeros(xm.shape, dtype=np.int64)
    vals[..., 0] = xm[..., 0]
    for i in range(1, xm.shape[-1]):
        take = better(xm[..., i], vals[..., i - 1]) | np.isnan(xm[..., i])
        vals[..., i] = np.where(take, xm[..., i], vals[..., i - 1])
        idx[..., i] = np.where(take, i, idx[..., i - 1])
    out = idx if p["output"] == 1 else vals
    return np.moveaxis(out, -1, dim)


# --- FFT -------------------------------------------------------------------------------

def _fft_run(a, p):
    """torch's ``_fft_r2c``/``_fft_c2r``/``_fft_c2c``: the unnormalized transform, then
    torch's normalization code (0 none, 1 by sqrt(n), 2 by n)."""
    x = a[0]
    dims = tuple(p["dims"])
    kind = p["kind"]
    if kind == "r2c":
        out = np.fft.fftn(x, axes=dims, norm="backward")
        if p.get("onesided", True):
            out = np.take(out, range(x.shape[dims[-1]] // 2 + 1), axis=dims[-1])
        n = math.prod(x.shape[d] for d in dims)
    elif kind == "c2r":
        sizes = [p["last_size"] if d == dims[-1] else x.shape[d] for d in dims]
        out = np.fft.irfftn(x, s=sizes, axes=dims, norm="forward")
        n = math.prod(sizes)
    else:
        fn = np.fft.fftn if p["forward"] else np.fft.ifftn
        out = fn(x, axes=dims, norm="backward" if p["forward"] else "forward")
        n = math.prod(x.shape[d] for d in dims)
    if p["norm"] == 1:
        out = out / math.sqrt(n)
    elif p["norm"] == 2:
        out = out / n
    return out


def _fft_cost(shapes, p):
    shape = list(shapes[0])
    dims = [d % len(shape) for d in p["dims"]]
    if p["kind"] == "c2r":
        shape[dims[-1]] = p["last_size"]
    total = math.prod(shape)
    flops = 0
    for d in dims:
        n = shape[d]
        if n > 1:
            flops += 5 * total * math.log2(n)
    if p["kind"] in ("r2c", "c2r"):
        flops /= 2
    return {VECTOR: int(round(flops))}


# --- linear algebra -----------------------------------------------------------------

def _mats(shape):
    *batch, m, n = shape
    return math.prod(batch), m, n


def _solve_run(a, p):
    A, B = a[0], a[1]
    if p.get("vector"):
        return np.linalg.solve(A, B[..., None])[..., 0]
    return np.linalg.solve(A, B)


def _solve_cost(shapes, p):
    b, n, _ = _mats(shapes[0])
    k = 1 if p.get("vector") else shapes[1][-1]
    return {MATRIX: b * (2 * n ** 3 // 3 + 2 * n * n * k)}


def _inv_cost(shapes, p):
    b, n, _ = _mats(shapes[0])
    return {MATRIX: b * 2 * n ** 3}


def _chol_run(a, p):
    L = np.linalg.cholesky(a[0])
    return np.swapaxes(L, -1, -2).conj() if p.get("upper") else L


def _chol_cost(shapes, p):
    b, n, _ = _mats(shapes[0])
    return {MATRIX: b * n ** 3 // 3}


def _qr_run(a, p):
    q, r = np.linalg.qr(a[0], mode="complete" if p.get("mode") == "complete" else "reduced")
    return r if p["output"] == 1 else q


def _qr_cost(shapes, p):
    b, m, n = _mats(shapes[0])
    m, n = max(m, n), min(m, n)
    return {MATRIX: b * (4 * m * n * n - 4 * n ** 3 // 3)}


def _svd_run(a, p):
    if not p.get("vectors"):
        return np.linalg.svd(a[0], compute_uv=False)
    u, s, vh = np.linalg.svd(a[0], full_matrices=bool(p.get("full")))
    return (u, s, vh)[p["output"]]


def _svd_cost(shapes, p):
    b, m, n = _mats(shapes[0])
    m, n = max(m, n), min(m, n)
    if p.get("vectors"):
        return {MATRIX: b * (6 * m * n * n + 20 * n ** 3)}
    return {MATRIX: b * (4 * m * n * n - 4 * n ** 3 // 3)}


def _eigh_run(a, p):
    x = a[0]
    if p.get("uplo", "L") == "U":
        x = np.swapaxes(x, -1, -2).conj()
    w, v = np.linalg.eigh(x, UPLO="L")
    return v if p["output"] == 1 else w


def _eigh_cost(shapes, p):
    b, n, _ = _mats(shapes[0])
    return {MATRIX: b * (9 * n ** 3 if p.get("vectors") else 4 * n ** 3 // 3)}


# --- counting and searching ---------------------------------------------------------

def _histc_run(a, p):
    x = a[0].reshape(-1)
    lo, hi, bins = p["min"], p["max"], p["bins"]
    if lo == hi:
        lo, hi = float(x.min()), float(x.max())
    h, _ = np.histogram(x[(x >= lo) & (x <= hi)], bins=bins, range=(lo, hi))
    return h


def _histc_cost(shapes, p):
    return {VECTOR: 2 * math.prod(shapes[0])}


def _search_run(a, p):
    seq, q = a[0], a[1]
    side = "right" if p.get("right") else "left"
    if seq.ndim == 1:
        return np.searchsorted(seq, q, side=side)
    flat_s = seq.reshape(-1, seq.shape[-1])
    flat_q = q.reshape(flat_s.shape[0], -1)
    out = np.stack([np.searchsorted(s, v, side=side) for s, v in zip(flat_s, flat_q)])
    return out.reshape(q.shape)


def _search_cost(shapes, p):
    n = shapes[0][-1] if shapes[0] else 1
    return {VECTOR: math.prod(shapes[1]) * _log2c(n + 1)}


ROUTINES: dict[str, Routine] = {
    "sort": Routine(_sort_run, _sort_cost),
    "select": Routine(_select_run, _linear_cost),
    "cumext": Routine(_cumext_run, _linear_cost),
    "fft": Routine(_fft_run, _fft_cost),
    "solve": Routine(_solve_run, _solve_cost),
    "inv": Routine(lambda a, p: np.linalg.inv(a[0]), _inv_cost),
    "cholesky": Routine(_chol_run, _chol_cost),
    "qr": Routine(_qr_run, _qr_cost),
    "svd": Routine(_svd_run, _svd_cost),
    "eigh": Routine(_eigh_run, _eigh_cost),
    "histc": Routine(_histc_run, _histc_cost),
    "searchsorted": Routine(_search_run, _search_cost),
}


def _collective_run(a, p):
    raise RuntimeError("a collective needs the other ranks' operands: run the program with "
                       "solbound.ir.execute.execute_spmd")


# collectives (``ir/collectives.py``): no FLOPs; their cost is link time (``bounds/comm.py``)
for _kind in KINDS:
    ROUTINES[_kind] = Routine(_collective_run, lambda shapes, p: {})


def _opaque_run(a, p):
    raise RuntimeError(f"{p.get('op', 'an operator')} has no lowering rule: the IR does not "
                       f"compute it")


# an operator solbound cannot lower: its operands are read and its results written at their
# sizes (nothing vanishes from the bound), its arithmetic is unknown and not counted
ROUTINES["opaque"] = Routine(_opaque_run, lambda shapes, p: {})


# the first operand unchanged: a kernel that reads what the computation it stands for reads
# besides (FlexAttention's block-mask tables) and does no arithmetic of its own
ROUTINES["passthrough"] = Routine(lambda a, p: a[0], lambda shapes, p: {})


def routine_cost(name: str, shapes: list[tuple[int, ...]], params: dict) -> dict[str, int]:
    """FLOPs per unit of one call (zero when another output's kernel carries them)."""
    if not params.get("cost", True):
        return {}
    return ROUTINES[name].cost(shapes, params)


def run_routine(name: str, arrays: list[np.ndarray], params: dict) -> np.ndarray:
    return ROUTINES[name].run(arrays, params)
