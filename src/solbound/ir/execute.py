"""Execute a :class:`~solbound.ir.model.Program` on numpy arrays.

Affine accesses become strided views (``as_strided``) of their base array: no
Python loop ever runs over elements. Contractions run as ``einsum`` over those
views (zero padding stands in for boundary guards, so a padded convolution is
one einsum); other kernels evaluate their body with broadcasting over the
loop nest and reduce with numpy, in chunks when the loop nest is large.
Indirect accesses gather with integer index arrays.

Floating-point tensors are computed in float32 (float64 for f64 programs):
bf16/fp16 programs therefore run in a wider type than they were written in,
and the validator's tolerance accounts for the source dtype.
"""

from __future__ import annotations

import math
import threading
from typing import Callable

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .affine import Aff, Atom, guard_holds
from .collectives import is_collective
from .model import (EXTERNAL_ROLES, FLOAT_DTYPES, LOW_FLOATS, Access, Call, Const, Expr, Idx,
                    Kernel, Program, TensorDecl, accesses, loop_segments)

CHUNK_ELEMENTS = 1 << 25


class ExecutionError(RuntimeError):
    pass


def np_dtype(dtype: str, wide: bool = False):
    if dtype == "f64":
        return np.float64
    if dtype in FLOAT_DTYPES:
        return np.float64 if wide else np.float32
    if dtype == "bool":
        return np.bool_
    if dtype in ("c64", "c128"):
        return np.complex128
    return np.int64


def round_to(a, dtype: str) -> np.ndarray:
    """``a`` rounded onto a narrow float format's grid (round to nearest even, by
    ml_dtypes). As PyTorch converts: e4m3fn saturates at its largest finite value (448),
    the fnuz formats give NaN past theirs, e5m2 gives infinity.

    >>> round_to(np.array([0.3, 300.0, 1000.0]), "f8e4m3").tolist()
    [0.3125, 288.0, 448.0]
    >>> round_to(np.array([1e6]), "f8e5m2").tolist()
    [inf]
    """
    import ml_dtypes
    fmt = getattr(ml_dtypes, LOW_FLOATS[dtype])
    a = np.asarray(a, dtype=np.float32)
    if dtype == "f8e4m3":
        top = float(ml_dtypes.finfo(fmt).max)
        a = np.clip(a, -top, top)
    return a.astype(fmt).astype(np.float32)


# fixed-width integers the executor holds in int64: (bits, signed)
INT_WIDTHS = {"i8": (8, True), "u8": (8, False), "i16": (16, True), "u16": (16, False),
              "i32": (32, True), "u32": (32, False)}


def wrap_int(a, dtype: str):
    """``a`` (int64) reduced to ``dtype``'s range as the hardware wraps it: modulo 2^bits,
    two's complement for signed types. int64 arithmetic already wraps modulo 2^64, which
    2^bits divides, so wrapping each kernel's result gives the narrow type's sums,
    differences and products exactly (``jax.random``'s u32 hash arithmetic).

    >>> wrap_int(np.array([2**32 + 5, -1]), "u32").tolist(), wrap_int(np.array([2**31]), "i32").tolist()
    ([5, 4294967295], [-2147483648])
    """
    bits, signed = INT_WIDTHS[dtype]
    a = np.asarray(a, dtype=np.int64)
    if signed:
        half = np.int64(1) << (bits - 1)
        return ((a + half) & ((np.int64(1) << bits) - 1)) - half
    return a & ((np.int64(1) << bits) - 1)


def _erf(x):
    from scipy.special import erf
    return erf(x)


def _erfinv(x):
    from scipy.special import erfinv
    return erfinv(x)


def _sigmoid(x):
    from scipy.special import expit
    return expit(x)


def _logical(fn_bool, fn_int):
    def op(a, b):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype == np.bool_ and b.dtype == np.bool_:
            return fn_bool(a, b)
        return fn_int(a, b)
    return op


def _div(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.true_divide(a, b)


OPS: dict[str, Callable] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": _div,
    "neg": np.negative, "mod": np.mod, "floordiv": np.floor_divide,
    "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
    "eq": np.equal, "ne": np.not_equal,
    "and": _logical(np.logical_and, np.bitwise_and), "or": _logical(np.logical_or, np.bitwise_or),
    "xor": _logical(np.logical_xor, np.bitwise_xor),
    "not": lambda a: np.logical_not(a) if np.asarray(a).dtype == np.bool_ else np.invert(a),
    "maximum": np.maximum, "minimum": np.minimum, "abs": np.abs,
    "select": lambda c, a, b: np.where(c, a, b), "floor": np.floor, "ceil": np.ceil,
    "round": np.round, "trunc": np.trunc, "sign": np.sign,
    "fma": lambda a, b, c: a * b + c, "isnan": np.isnan,
    "exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "log1p": np.log1p,
    "expm1": np.expm1, "tanh": np.tanh, "erf": _erf, "sqrt": np.sqrt,
    "rsqrt": lambda a: 1.0 / np.sqrt(a), "recip": lambda a: _div(1.0, a), "sigmoid": _sigmoid,
    "sin": np.sin, "cos": np.cos, "pow": np.power, "atan": np.arctan, "acos": np.arccos, "asin": np.arcsin, "erfinv": _erfinv,
    "complex": lambda re, im: np.asarray(re) + 1j * np.asarray(im), "real": np.real,
    "imag": np.imag,
    "shr": lambda a, b: np.right_shift(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)),
    "shl": lambda a, b: np.left_shift(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)),
    "bitcast_f32": lambda a: np.asarray(a, dtype=np.int64).astype(np.uint32).view(np.float32),
}

REDUCE = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min, "any": np.any,
          "all": np.all}
SCATTER = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}
SCAN = {"sum": np.cumsum, "prod": np.cumprod, "max": np.maximum.accumulate,
        "min": np.minimum.accumulate}


def _init(op: str, dtype) -> object:
    if op in ("sum",):
        return 0
    if op == "prod":
        return 1
    if op in ("max", "argmax"):
        return -np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(np.int64).min
    if op in ("min", "argmin"):
        return np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(np.int64).max
    if op == "any":
        return False
    if op == "all":
        return True
    raise ExecutionError(f"no init for {op}")


class _KernelExec:
    """Evaluation of one kernel over a (possibly chunked) loop nest."""

    def __init__(self, k: Kernel, arrays: dict[str, np.ndarray], decls: dict[str, TensorDecl],
                 wide: bool, world=None):
        self.k = k
        self.world = world
        self.arrays = arrays
        self.decls = decls
        self.wide = wide
        self.dims = [d for d, _ in k.dims]
        self.ext = dict(k.dims)
        self._padded: dict[tuple, tuple[np.ndarray, list[int]]] = {}

    # --- accesses -----------------------------------------------------------
    def _padded_base(self, name: str, index: tuple[Aff, ...], ranges: dict[str, tuple[int, int]]):
        arr = self.arrays[name]
        pads, shift = [], []
        for e, n in zip(index, arr.shape):
            lo, hi = _bounds(e, ranges)
            pl, ph = max(0, -lo), max(0, hi - (n - 1))
            pads.append((pl, ph))
            shift.append(pl)
        if any(p != (0, 0) for p in pads):
            key = (name, tuple(pads))
            if key not in self._padded:
                for e, n, (pl, ph) in zip(index, arr.shape, pads):
                    if (pl or ph) and not self._kept_inside(e, n, pl > 0, ph > 0, ranges):
                        raise ExecutionError(
                            f"kernel {self.k.name} reads {name} at index {e}, outside its "
                            f"extent {n}, at points its guard keeps: an IR reads only "
                            f"elements that exist (padding is a guard)")
                self._padded[key] = (np.pad(arr, pads), shift)
            return self._padded[key]
        return arr, shift

    def _kept_inside(self, e: Aff, n: int, low: bool, high: bool, ranges) -> bool:
        """Every point the kernel's guard keeps reads index ``e`` inside ``[0, n)`` (below
        ``low``, above ``high``): a guard atom on ``e`` itself (up to a constant) says so,
        else the points are enumerated over the variables ``e`` and the atoms connected to
        it use (over ``2**22`` of them: assumed, as before)."""
        if any(hi <= lo for lo, hi in ranges.values()):
            return True           # no point at all: nothing is read
        ok_low, ok_high = not low, not high
        for a in self.k.guard:
            d = e - a.expr
            if d.terms:
                continue
            ok_low |= a.lo is not None and a.lo + d.const >= 0
            ok_high |= a.hi is not None and a.hi + d.const <= n
        if ok_low and ok_high:
            return True
        names = set(e.vars)
        atoms: list[Atom] = []
        grew = True
        while grew:
            grew = False
            for a in self.k.guard:
                if a not in atoms and names & set(a.expr.vars):
                    atoms.append(a)
                    names |= set(a.expr.vars)
                    grew = True
        names = sorted(names)
        if any(v not in ranges for v in names) \
                or math.prod(ranges[v][1] - ranges[v][0] for v in names) > 1 << 22:
            return True
        grids = np.ix_(*[np.arange(*ranges[v]) for v in names])
        env = dict(zip(names, grids))
        shape = [ranges[v][1] - ranges[v][0] for v in names]
        keep = np.ones(shape, dtype=bool)
        for a in atoms:
            keep &= np.broadcast_to(a.holds(env), shape)
        vals = np.broadcast_to(e.evaluate(env), shape)[keep]
        return not vals.size or ((not low or vals.min() >= 0) and (not high or vals.max() < n))

    def view(self, acc: Access, ranges: dict[str, tuple[int, int]]) -> np.ndarray:
        """A strided view with one axis per loop dim (size 1 where unused)."""
        if acc.indirect:
            return self.gather(acc, ranges)
        base, shift = self._padded_base(acc.tensor, acc.index, ranges)
        base = np.ascontiguousarray(base)
        item = base.itemsize
        bstr = [s // item for s in base.strides]
        off = 0
        coef = {d: 0 for d in self.dims}
        for e, sh, st in zip(acc.index, shift, bstr):
            off += (e.const + sh) * st
            for v, c in e.terms:
                coef[v] += c * st
        shape, strides = [], []
        for d in self.dims:
            lo, hi = ranges[d]
            if coef[d] == 0:
                shape.append(1)
                strides.append(0)
            else:
                shape.append(hi - lo)
                strides.append(coef[d] * item)
                off += coef[d] * lo
        flat = base.reshape(-1)
        if base.size == 0:
            return np.zeros(shape, dtype=base.dtype)
        return as_strided(flat[off:], shape=shape, strides=strides, writeable=False)

    def env(self, ranges) -> dict[str, np.ndarray]:
        nd = len(self.dims)
        out = {}
        for i, d in enumerate(self.dims):
            lo, hi = ranges[d]
            shp = [1] * nd
            shp[i] = hi - lo
            out[d] = np.arange(lo, hi, dtype=np.int64).reshape(shp)
        return out

    def gather(self, acc: Access, ranges) -> np.ndarray:
        env = self.env(ranges)
        base = self.arrays[acc.tensor]
        idxs = []
        for i, n in zip(acc.index, base.shape):
            if isinstance(i, Access):
                v = self.eval(i, ranges, env).astype(np.int64)
                v = np.where(v < 0, v + n, v)
            else:
                v = np.asarray(i.evaluate(env), dtype=np.int64)
            idxs.append(np.clip(v, 0, max(n - 1, 0)))
        idxs = np.broadcast_arrays(*idxs) if idxs else []
        return base[tuple(idxs)] if idxs else base

    # --- expressions -----------------------------------------------------------
    def eval(self, e: Expr, ranges, env) -> np.ndarray:
        if isinstance(e, Access):
            return self.view(e, ranges)
        if isinstance(e, Const):
            return np.asarray(e.value)
        if isinstance(e, Idx):
            return np.asarray(e.expr.evaluate(env))
        assert isinstance(e, Call)
        args = [self.eval(a, ranges, env) for a in e.args]
        if e.op == "rand":
            shape = tuple(ranges[d][1] - ranges[d][0] for d in self.dims)
            return np.random.default_rng(0).random(shape)
        if e.op.startswith("to_"):
            dt = e.op[3:]
            a = args[0]
            if dt == "bool":
                return a != 0
            if np_dtype(dt) == np.int64 and np.issubdtype(np.asarray(a).dtype, np.floating):
                a = np.trunc(a).astype(np.int64)
                return wrap_int(a, dt) if dt in INT_WIDTHS else a
            if dt in LOW_FLOATS:
                return round_to(a, dt).astype(np_dtype(dt, self.wide))
            a = np.asarray(a).astype(np_dtype(dt, self.wide))
            return wrap_int(a, dt) if dt in INT_WIDTHS else a
        with np.errstate(all="ignore"):
            return OPS[e.op](*args)

    # --- kernel ------------------------------------------------------------------
    def run(self) -> None:
        k = self.k
        out = self.arrays[k.out]
        if k.scatter:
            self.run_scatter(out)
            return
        if k.lib and is_collective(k.lib[0]):
            self.run_collective()
            return
        if k.lib:
            from .library import run_routine
            names = list(dict.fromkeys(a.tensor for a in accesses(k.body)))
            res = run_routine(k.lib[0], [self.arrays[t] for t in names], k.lib_params)
            res = np.asarray(res)
            if not np.iscomplexobj(out) and np.iscomplexobj(res):
                raise ExecutionError(f"library {k.lib[0]} returned complex values for {k.out}")
            out[...] = res.reshape(out.shape).astype(out.dtype, copy=False)
            return
        keep = [d for d in self.dims if d not in k.reduce_vars]
        # chunk over the outermost kept dim when the loop nest is large
        total = math.prod(self.ext.values()) if self.ext else 1
        cdim = next((d for d in keep if self.ext[d] > 1), None)
        nchunks = 1
        if cdim is not None and total > CHUNK_ELEMENTS and not self._is_contraction():
            nchunks = min(self.ext[cdim], -(-total // CHUNK_ELEMENTS))
        if k.scan is not None and cdim == k.scan:
            nchunks = 1
        step = -(-self.ext[cdim] // nchunks) if cdim else 1
        for c in range(nchunks):
            ranges = {d: (0, n) for d, n in k.dims}
            if cdim is not None and nchunks > 1:
                ranges[cdim] = (c * step, min(self.ext[cdim], (c + 1) * step))
                if ranges[cdim][0] >= ranges[cdim][1]:
                    continue
            self.run_range(ranges, keep, out)

    def _is_contraction(self) -> bool:
        from .classify import classify
        return classify(self.k) == "contraction"

    def _is_padding(self, a: Atom, ops: list[Access]) -> bool:
        """The atom bounds an index of some operand to its tensor's range (zero padding)."""
        for acc in ops:
            shape = self.arrays[acc.tensor].shape
            for e, n in zip(acc.index, shape):
                if isinstance(e, Aff) and e == a.expr and (a.lo or 0) <= 0 \
                        and (a.hi is not None and a.hi >= n):
                    return True
        return False

    def run_range(self, ranges, keep, out) -> None:
        k = self.k
        nd = len(self.dims)
        red_axes = tuple(i for i, d in enumerate(self.dims) if d not in keep)
        dtype = out.dtype
        if self._is_contraction():
            from .model import Call as _C
            a, b = k.body.args

            def strip(x):
                while isinstance(x, _C) and x.op.startswith("to_"):
                    x = x.args[0]
                return x
            a, b = strip(a), strip(b)
            # padding atoms read zeros from the padded operands; atoms on output points
            # only (a demanded region) mask the result; atoms on one operand's variables
            # only (a triangular factor's support) mask that operand
            masks = [g for g in k.guard if not self._is_padding(g, [a, b])]
            va_vars = {v for e in a.index for v in e.vars} if not a.indirect else set()
            vb_vars = {v for e in b.index for v in e.vars} if not b.indirect else set()
            out_m, a_m, b_m, rest = [], [], [], []
            for g in masks:
                vs = set(g.expr.vars)
                (out_m if vs <= set(keep) else a_m if vs <= va_vars else b_m if vs <= vb_vars
                 else rest).append(g)
            if not a.indirect and not b.indirect and not rest:
                va, vb = self.view(a, ranges), self.view(b, ranges)
                env = self.env(ranges) if masks else None
                if a_m:
                    va = np.where(guard_holds(tuple(a_m), env), va, 0)
                if b_m:
                    vb = np.where(guard_holds(tuple(b_m), env), vb, 0)
                res = _einsum(va, vb, self.dims, keep, dtype)
                if out_m:
                    m = np.broadcast_to(np.asarray(guard_holds(tuple(out_m), env)),
                                        [ranges[d][1] - ranges[d][0] if d in keep else 1
                                         for d in self.dims])
                    m = m.reshape([ranges[d][1] - ranges[d][0] for d in keep])
                    res = np.where(m, res, 0).astype(dtype, copy=False)
                self.write(res, ranges, keep)
                return
        env = self.env(ranges)
        val = self.eval(k.body, ranges, env)
        full = tuple(ranges[d][1] - ranges[d][0] for d in self.dims)
        mask = guard_holds(k.guard, env) if k.guard else None
        if k.reduce is None:
            val = np.broadcast_to(val, full)
            if mask is not None:
                val = np.where(mask, val, k.fill)
            self.write(np.asarray(val).astype(dtype, copy=False), ranges, keep)
            return
        if k.scan is not None:
            val = np.broadcast_to(val, full).astype(dtype)
            if mask is not None:
                val = np.where(mask, val, _init(k.reduce, dtype))
            axis = self.dims.index(k.scan)
            self.write(SCAN[k.reduce](val, axis=axis).astype(dtype, copy=False), ranges, keep)
            return
        val = np.broadcast_to(val, full)
        if k.reduce in ("argmax", "argmin"):
            fill = _init(k.reduce, val.dtype)
            if mask is not None:
                val = np.where(mask, val, fill)
            moved = np.moveaxis(val, red_axes, tuple(range(nd - len(red_axes), nd)))
            flat = moved.reshape(moved.shape[: nd - len(red_axes)] + (-1,))
            # NaN propagates like torch: the first NaN wins
            fn = np.argmax if k.reduce == "argmax" else np.argmin
            idx = fn(flat, axis=-1)
            if k.out2 is not None:
                vals = np.take_along_axis(flat, idx[..., None], axis=-1)[..., 0]
                self.write(vals.astype(self.arrays[k.out2].dtype), ranges, keep, k.out2)
            self.write(idx.astype(dtype), ranges, keep)
            return
        acc_dtype = dtype if k.reduce in ("sum", "prod") else None
        if mask is not None:
            val = np.where(mask, val, _init(k.reduce, np.asarray(val).dtype))
        if k.reduce in ("sum", "prod") and np.issubdtype(dtype, np.floating):
            res = REDUCE[k.reduce](val, axis=red_axes, dtype=np.float64)
        else:
            res = REDUCE[k.reduce](val, axis=red_axes, dtype=acc_dtype) if acc_dtype \
                else REDUCE[k.reduce](val, axis=red_axes)
        self.write(np.asarray(res).astype(dtype, copy=False), ranges, keep)

    def run_collective(self) -> None:
        """A collective: its one operand and its result through their indices (a rerolled
        layer's collective reads and writes one layer's slice of a stacked tensor), the
        result from every rank's operand (``self.world``)."""
        k = self.k
        if self.world is None:
            raise ExecutionError(f"collective {k.lib[0]} ({k.name}): one rank cannot "
                                 f"compute it; run the ranks with execute_spmd")
        ranges = {d: (0, n) for d, n in k.dims}
        acc = accesses(k.body)[0]
        used = {v for i in acc.index for v in i.vars}
        operand = np.ascontiguousarray(self.view(acc, ranges)).reshape(
            [self.ext[d] for d in self.dims if d in used])
        res = np.asarray(self.world(k, operand))
        keep = [d for d in self.dims if d in k.out_vars]
        self.write(res.astype(self.arrays[k.out].dtype, copy=False), ranges, keep)

    def run_scatter(self, out: np.ndarray) -> None:
        """Every point writes (or combines into) ``out`` at its data-dependent position;
        accumulation is unbuffered (``np.add.at``: repeated positions all count)."""
        k = self.k
        ranges = {d: (0, n) for d, n in k.dims}
        env = self.env(ranges)
        full = tuple(n for _, n in k.dims)
        val = np.broadcast_to(np.asarray(self.eval(k.body, ranges, env)), full)
        idxs = []
        for i, n in zip(k.out_index, out.shape):
            if isinstance(i, Access):
                v = np.asarray(self.eval(i, ranges, env)).astype(np.int64)
                if ((v < -n) | (v >= n)).any():
                    raise ExecutionError(f"scatter into {k.out}: index out of range [0, {n})")
                v = np.where(v < 0, v + n, v)
            else:
                v = np.asarray(i.evaluate(env), dtype=np.int64)
            idxs.append(np.broadcast_to(v, full).reshape(-1))
        val = val.reshape(-1).astype(out.dtype, copy=False)
        where = tuple(idxs)
        if k.reduce is None:
            out[where] = val
        elif k.reduce in SCATTER:
            SCATTER[k.reduce].at(out, where, val)
        else:
            raise ExecutionError(f"scatter with {k.reduce!r}")

    def write(self, res: np.ndarray, ranges, keep, name: str | None = None) -> None:
        k = self.k
        out = self.arrays[name or k.out]
        item = out.itemsize
        bstr = [s // item for s in out.strides]
        off = 0
        coef = {d: 0 for d in keep}
        for e, st in zip(k.out_index, bstr):
            off += e.const * st
            for v, c in e.terms:
                coef[v] += c * st
        shape, strides = [], []
        for d in keep:
            lo, hi = ranges[d]
            shape.append(hi - lo)
            strides.append(coef[d] * item)
            off += coef[d] * lo
        if out.size == 0:
            return
        view = as_strided(out.reshape(-1)[off:], shape=shape, strides=strides)
        view[...] = np.broadcast_to(res.reshape(shape) if res.size == math.prod(shape)
                                    else res, shape)


def _bounds(e: Aff, ranges) -> tuple[int, int]:
    lo = hi = e.const
    for v, c in e.terms:
        a, b = ranges[v][0], ranges[v][1] - 1
        lo += min(c * a, c * b)
        hi += max(c * a, c * b)
    return lo, hi


_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _einsum(va: np.ndarray, vb: np.ndarray, dims: list[str], keep: list[str], dtype) -> np.ndarray:
    import opt_einsum
    letters = {d: _LETTERS[i] for i, d in enumerate(dims)}
    # drop size-1 broadcast axes from each operand
    sa, ax_a = _squeeze(va, dims)
    sb, ax_b = _squeeze(vb, dims)
    spec = f"{''.join(letters[d] for d in ax_a)},{''.join(letters[d] for d in ax_b)}->" \
           f"{''.join(letters[d] for d in keep if d in ax_a or d in ax_b)}"
    wide = np.float64 if dtype == np.float64 else np.float32
    res = opt_einsum.contract(spec, sa.astype(wide, copy=False), sb.astype(wide, copy=False))
    present = [d for d in keep if d in ax_a or d in ax_b]
    shape = [res.shape[present.index(d)] if d in present else 1 for d in keep]
    return res.reshape(shape)


def _squeeze(v: np.ndarray, dims: list[str]):
    keep_axes = [i for i in range(v.ndim) if not (v.strides[i] == 0 and v.shape[i] == 1)]
    names = [dims[i] for i in keep_axes]
    return v.reshape([v.shape[i] for i in keep_axes]) if len(keep_axes) != v.ndim else v, names


def execute(p: Program, inputs: dict[str, np.ndarray], wide: bool = False,
            on_kernel: Callable[[Kernel, dict], None] | None = None,
            on_iteration: Callable[[tuple, int, dict], None] | None = None,
            world: Callable[[Kernel, np.ndarray], np.ndarray] | None = None
            ) -> dict[str, np.ndarray]:
    """Run every kernel; returns all tensors (inputs included) by name. ``on_kernel(k,
    arrays)`` runs after each kernel outside a loop and after each loop's body kernels;
    ``on_iteration(loop, it, arrays)`` before iteration ``it`` of a sequential loop and,
    with ``it`` its trip count, after the last (a validator may read and reset a carry).
    ``world(k, operand)``: the result of collective kernel ``k`` on this rank (see
    :func:`execute_spmd`)."""
    decls = p.tensor_map
    arrays: dict[str, np.ndarray] = {}
    written = {o for k in p.kernels for o in k.outputs}
    for t in p.tensors:
        if t.role in EXTERNAL_ROLES:
            if t.name not in inputs:
                raise ExecutionError(f"missing value for {t.role} {t.name}")
            a = np.asarray(inputs[t.name])
            if len(t.shape) == 1 and a.ndim != 1 and a.size == t.shape[0]:
                a = np.ascontiguousarray(a).reshape(-1)   # a base addressed as flat storage
            if tuple(a.shape) != t.shape:
                raise ExecutionError(f"{t.name}: expected shape {t.shape}, got {a.shape}")
            a = a.astype(np_dtype(t.dtype, wide), copy=t.name in written)  # updated in place
            arrays[t.name] = np.ascontiguousarray(a)
        else:
            arrays[t.name] = np.zeros(t.shape, dtype=np_dtype(t.dtype, wide))
    def run_one(k: Kernel, shown: Kernel) -> None:
        try:
            _KernelExec(k, arrays, decls, wide, world).run()
            for o in k.outputs:             # a narrow integer result wraps
                if decls[o].dtype in INT_WIDTHS:
                    arrays[o][...] = wrap_int(arrays[o], decls[o].dtype)
        except ExecutionError:
            raise
        except Exception as e:  # noqa: BLE001 - name the kernel
            raise ExecutionError(f"kernel {shown.name} ({shown.opname or shown.op}, "
                                 f"{shown.src or '?'}): {type(e).__name__}: {e}") from e

    for seg in loop_segments(p.kernels):
        if seg[0].loop is None:
            run_one(seg[0], seg[0])
        else:
            for it in range(seg[0].loop[1]):     # a sequential loop: iterations in order
                if on_iteration is not None:
                    on_iteration(seg[0].loop, it, arrays)
                for kk in seg:
                    run_one(kk.bind_loop(it), kk)
            if on_iteration is not None:
                on_iteration(seg[0].loop, seg[0].loop[1], arrays)
        if on_kernel is not None:
            for kk in seg:
                on_kernel(kk, arrays)
    return arrays


class _OtherRankFailed(ExecutionError):
    pass


class _World:
    """The ranks of an SPMD run meeting at each collective: every rank's thread leaves its
    operand, waits for the others, computes its own result from all of them, and waits
    again before the slot is reused."""

    def __init__(self, n: int):
        self.n = n
        self.slots: list = [None] * n
        self.barrier = threading.Barrier(n)

    def member(self, rank: int):
        from .collectives import run

        def collective(k: Kernel, operand: np.ndarray) -> np.ndarray:
            params = k.lib_params
            group = tuple(params.get("group") or range(self.n))
            if len(group) != self.n or sorted(group) != list(range(self.n)):
                raise ExecutionError(f"collective {k.name} runs over ranks {group}: an SPMD "
                                     f"run of {self.n} ranks executes only collectives over "
                                     f"all of them")
            try:
                self.slots[rank] = operand
                self.barrier.wait()
                res = run(k.lib[0], params, list(self.slots), group.index(rank))
                self.barrier.wait()
            except threading.BrokenBarrierError:
                raise _OtherRankFailed(f"rank {rank} stopped at {k.name}: another rank "
                                       f"failed") from None
            return res
        return collective


def execute_spmd(p: "Program | list[Program]", inputs: list[dict[str, np.ndarray]],
                 wide: bool = False) -> list[dict[str, np.ndarray]]:
    """Run ``p`` on every rank at once (``inputs[r]``: rank ``r``'s values; ``p`` one
    program for all ranks or one per rank), each rank a thread, its collectives computed
    from every rank's operands. Returns each rank's tensors.

    >>> from solbound.ir.text import parse_program
    >>> prog = parse_program('''
    ... x = input(f32[2])
    ... y = output(f32[2])
    ... @kernel(d0=2, a0_0=2)
    ... @library(name="all_reduce", ranks=2, group=(0, 1), op="sum")
    ... def k0():
    ...     y[d0] = operands(x[a0_0])
    ... ''')
    >>> [r["y"].tolist() for r in execute_spmd(prog, [{"x": [1, 2]}, {"x": [10, 20]}])]
    [[11.0, 22.0], [11.0, 22.0]]
    """
    import threading
    world = _World(len(inputs))
    results: list = [None] * len(inputs)
    errors: list = [None] * len(inputs)

    def one(r: int) -> None:
        try:
            prog = p[r] if isinstance(p, (list, tuple)) else p
            results[r] = execute(prog, inputs[r], wide=wide, world=world.member(r))
        except BaseException as e:  # noqa: BLE001 - re-raised below, in rank order
            errors[r] = e
            world.barrier.abort()         # the others stop waiting at their next collective

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r, e in enumerate(errors):
        if e is not None and not isinstance(e, _OtherRankFailed):
            raise e
    for e in errors:
        if e is not None:
            raise e
    return results


__all__ = ["execute", "execute_spmd", "ExecutionError", "np_dtype", "Atom", "wrap_int"]
