"""Fold data-free tensors: masks and positions a program computes from indices alone.

Real models build attention masks through whole chains of index arithmetic:
transformers computes ``position_ids = arange(s)``, gathers it per query and key,
compares ``kv <= q``, detects packed sequences with ``cumsum(diff(pos) != 1)`` and ANDs
the results. Whatever the idiom, such a tensor depends on no input, parameter or
buffer, so its value is known before the program runs. This pass runs the data-free
part of the program on the executor (bounded in size) and describes each such tensor
as a fact for ``ir/known.py``:

* one value everywhere: :class:`~solbound.ir.known.Known`;
* an integer affine function of its coordinates (``arange``): :class:`~solbound.ir.known.Lin`;
* two values, split by a conjunction of affine atoms over its coordinates (one per
  coordinate range and one per coordinate difference ``x_q - x_p``: causal, sliding
  windows, bands, prefixes): :class:`~solbound.ir.known.Cond`;

found from the concrete values and verified on every element. A data-free tensor that is
none of these (a block-diagonal document mask) gets no fact and stays dense.

>>> import numpy as np
>>> i, j = np.indices((5, 5))
>>> f = describe((j <= i) & (j > i - 2))
>>> [str(a) for a in f.atoms], f.t, f.f
(['-x0 + x1 < 1', '-1 <= -x0 + x1'], Known(value=True), Known(value=False))
>>> describe(np.arange(6).reshape(2, 3) * 2 + 1)
Lin(expr=Aff(terms=(('x0', 6), ('x1', 2)), const=1))
"""

from __future__ import annotations

import itertools

import numpy as np

from .affine import Aff, Atom
from .execute import ExecutionError, execute
from .known import Cond, Known, Lin
from .model import EXTERNAL_ROLES, Call, Program, kernel_reads, walk

# the largest data-free tensor folded (elements); larger ones stay data
FOLD_LIMIT = 1 << 24


# dtypes the executor computes exactly (it runs bf16/fp16 in float32 and narrow integers in
# int64: their rounding and wraparound would not be folded faithfully)
EXACT_DTYPES = frozenset({"f32", "f64", "i64", "i32", "bool"})


def data_free(p: Program, limit: int = FOLD_LIMIT,
              constants: dict[str, np.ndarray] | None = None) -> list[str]:
    """Tensors every writer of which reads only data-free tensors (no inputs, parameters,
    buffers or constants, no random draws, not in a sequential loop, exact dtypes), in
    order. A tensor with several writers qualifies only when nothing reads it before its
    last writer (a reader in between sees an earlier value than the folded one).

    ``constants``: values of constant tensors the program holds (a mask or an ``arange``
    a JAX function closes over): they are known before the run, so they and what is
    computed from them alone are data-free too, and listed first."""
    decls = p.tensor_map
    free: dict[str, bool] = {
        t: True for t, v in (constants or {}).items()
        if t in decls and decls[t].role == "constant" and decls[t].dtype in EXACT_DTYPES
        and decls[t].numel <= limit and np.size(v) == decls[t].numel}
    last_write: dict[str, int] = {}
    first_read: dict[str, int] = {}
    for pos, k in enumerate(p.kernels):
        reads = {a.tensor for a in kernel_reads(k)}
        for t in reads:
            first_read.setdefault(t, pos)
        ok = (k.loop is None and all(free.get(t, False) for t in reads)
              and not any(isinstance(e, Call) and e.op == "rand" for e in walk(k.body))
              and all(decls[o].role not in EXTERNAL_ROLES and decls[o].numel <= limit
                      and decls[o].dtype in EXACT_DTYPES for o in k.outputs))
        for o in k.outputs:
            free[o] = ok and free.get(o, True)
            last_write[o] = pos
    return [t for t, ok in free.items()
            if ok and first_read.get(t, len(p.kernels)) > last_write.get(t, -1)]


def fold(p: Program, limit: int = FOLD_LIMIT,
         constants: dict[str, np.ndarray] | None = None) -> dict[str, object]:
    """Facts (over coordinates ``x0, x1, ...``) of the program's data-free tensors."""
    return fold_report(p, limit, constants)[0]


def over_limit(p: Program, limit: int = FOLD_LIMIT,
               constants: dict[str, np.ndarray] | None = None) -> list[str]:
    """The boolean tensors that would be data-free but for their size (or a data-free
    producer's) past ``limit`` elements: masks known before the run that are not folded,
    so what they mask is counted dense. The limit changes counts (a causal mask of 8192 x
    8192 tokens is 2^26 elements): a frontend names each such tensor in the notes."""
    small = set(data_free(p, limit, constants))
    decls = p.tensor_map
    return [t for t in data_free(p, 1 << 62, constants)
            if t not in small and decls[t].dtype == "bool"]


def over_limit_notes(p: Program, after: Program,
                     constants: dict[str, np.ndarray] | None = None,
                     described: set | None = None) -> list[str]:
    """One ``assumption:`` note per mask of ``p`` that :func:`over_limit` finds and that
    ``after`` (the program once the known-value pass has run) still reads: the symbolic
    pass turns the common idioms (``tril`` of ones, ``arange`` comparisons) into guards at
    any size, and those masks are no longer read; a mask it ``described`` (its region
    found: a body that still reads it computes the same values, and the region is a guard
    or a skipped region) is not named either. Names the writer's operator and line."""
    big = over_limit(p, FOLD_LIMIT, constants)
    # read by a kernel that is not itself such a mask: the mask that masks work (not the
    # comparisons it is combined from)
    read = {a.tensor for k in after.kernels if not set(k.outputs) & set(big)
            for a in kernel_reads(k)}
    notes = []
    for t in big:
        if t not in read or t in (described or ()):
            continue
        w = next((k for k in p.kernels if k.out == t), None)
        src = f" ({w.opname or w.op}, {w.src})" if w is not None and w.src else ""
        notes.append(f"assumption: mask {t}{src} is known before the run, but it (or a tensor "
                     f"it is computed from) has more than {FOLD_LIMIT:,} elements, the limit "
                     f"of folding masks: the work it masks is counted dense, an overcount")
    return notes


def fold_report(p: Program, limit: int = FOLD_LIMIT,
                constants: dict[str, np.ndarray] | None = None
                ) -> tuple[dict[str, object], list[str]]:
    """(facts, masks): the facts of the data-free tensors (``constants`` as in
    :func:`data_free`), and the boolean data-free tensors that no fact describes (a mask
    known before the run that is not an affine region, such as a block-diagonal document
    mask: what it masks is counted dense). Masks over the size limit are
    :func:`over_limit`'s."""
    names = data_free(p, limit, constants)
    if not names:
        return {}, []
    keep = set(names)
    kernels = tuple(k for k in p.kernels if set(k.outputs) <= keep)
    sub = Program(tuple(t for t in p.tensors if t.name in keep), kernels)
    try:
        with np.errstate(all="ignore"):     # log(0) in relative-position buckets, ...
            arrays = execute(sub, {t: constants[t] for t in keep if t in (constants or {})})
    except ExecutionError:
        return {}, []
    facts, dense = {}, []
    for t in names:
        f = describe(arrays[t])
        if f is not None:
            facts[t] = f
        elif arrays[t].dtype == np.bool_ or _two_valued(arrays[t]):
            # a mask, boolean or additive (0 and -inf), that is no conjunction of atoms
            dense.append(t)
    return facts, dense


def _two_valued(a: np.ndarray) -> bool:
    return a.size > 0 and len(np.unique(a.reshape(-1)[: 1 << 24])) == 2


def still_read(masks: list[str], after: Program) -> list[str]:
    """The masks among ``masks`` that ``after`` (the program once the known-value pass has
    run) still reads from a kernel that is not itself one of them: the masks that still
    mask work (the pass turns what it can describe into guards, and those are no longer
    read)."""
    read = {a.tensor for k in after.kernels if not set(k.outputs) & set(masks)
            for a in kernel_reads(k)}
    return [t for t in masks if t in read]


def dense_mask_notes(p: Program, masks: list[str]) -> list[str]:
    """One ``assumption:`` note per mask known before the run that no affine region
    describes (``fold_report``'s second list, filtered by :func:`still_read`)."""
    notes = []
    for t in masks:
        w = next((k for k in p.kernels if k.out == t), None)
        src = f" ({w.opname or w.op}, {w.src})" if w is not None and w.src else ""
        notes.append(f"assumption: mask {t}{src} is known before the run but is not an "
                     f"affine region: the work it masks is counted dense")
    return notes


def _py(v):
    return v.item() if hasattr(v, "item") else v


def describe(a: np.ndarray):
    """The fact that describes array ``a`` exactly, or ``None``."""
    a = np.asarray(a)
    if a.size == 0:
        return None
    flat = a.reshape(-1)
    first = flat[0]
    if np.all(flat == first) and not (np.issubdtype(a.dtype, np.floating) and np.isnan(first)):
        return Known(_py(first))
    if np.issubdtype(a.dtype, np.integer):
        lin = _affine(a)
        if lin is not None:
            return lin
    values = np.unique(flat)
    if len(values) != 2 or (np.issubdtype(a.dtype, np.floating) and np.isnan(values).any()):
        return None
    # the "kept" value inside first: True or 1, else the finite one (a 0 / -inf bias)
    order = sorted(values.tolist(), key=lambda v: 0 if v == 1 else 1 if np.isfinite(v) else 2)
    for inside in order:
        other = values[values != inside][0]
        atoms = _atoms(a == inside)
        if atoms is not None:
            return Cond(atoms, Known(_py(np.asarray(inside))), Known(_py(other)))
    return None


def _affine(a: np.ndarray) -> Lin | None:
    idx = [0] * a.ndim
    c0 = int(a[tuple(idx)])
    expr = Aff.lit(c0)
    for d, n in enumerate(a.shape):
        if n > 1:
            step = [0] * a.ndim
            step[d] = 1
            expr = expr + Aff.var(f"x{d}") * (int(a[tuple(step)]) - c0)
    grid = np.indices(a.shape)
    if np.array_equal(expr.evaluate({f"x{d}": grid[d] for d in range(a.ndim)}), a):
        return Lin(expr)
    return None


def _atoms(mask: np.ndarray) -> tuple[Atom, ...] | None:
    """A conjunction of coordinate-range and coordinate-difference atoms equal to ``mask``."""
    if not mask.any():
        return None
    grid = np.indices(mask.shape)
    env = {f"x{d}": grid[d] for d in range(mask.ndim)}
    dims = [d for d, n in enumerate(mask.shape) if n > 1]
    exprs = [Aff.var(f"x{d}") for d in dims]
    exprs += [Aff.var(f"x{q}") - Aff.var(f"x{p}") for p, q in itertools.combinations(dims, 2)]
    ext = {f"x{d}": n for d, n in enumerate(mask.shape)}
    atoms = []
    for e in exprs:
        vals = e.evaluate(env)[mask]
        lo, hi = int(vals.min()), int(vals.max())
        blo, bhi = e.bounds(ext)
        if lo > blo or hi < bhi:
            atoms.append(Atom(e, lo if lo > blo else None, hi + 1 if hi < bhi else None).canonical())
    def conj(ats):
        got = np.ones(mask.shape, dtype=bool)
        for at in ats:
            got &= np.broadcast_to(at.holds(env), mask.shape)
        return got
    if not np.array_equal(conj(atoms), mask):
        return None
    # drop atoms the others imply (row/column bounds of a triangle), last first
    for at in reversed(list(atoms)):
        rest = [b for b in atoms if b is not at]
        if np.array_equal(conj(rest), mask):
            atoms = rest
    return tuple(atoms)


__all__ = ["fold", "fold_report", "describe", "data_free", "over_limit", "over_limit_notes",
           "still_read", "dense_mask_notes", "FOLD_LIMIT"]
