"""Known values: masks built from indices become guards.

Attention masks are values the program computes without reading data: ``tril`` of a
constant, ``arange(n)[None, :] <= arange(n)[:, None]``, a sliding window
``(j <= i) & (j > i - w)``, a float bias ``where(mask, 0, -inf)``. This pass finds, for
each tensor, a *fact*: a region outside of which its value is a known constant, and
turns that knowledge into guards so that the masked work is neither computed nor read:

* a map whose body, outside some affine region, evaluates to a constant whatever its
  data inputs hold gets that region as its guard and the constant as its fill
  (``scores + bias`` is ``-inf`` outside the causal triangle);
* a reduction skips the points whose body evaluates to the reduction's identity
  (``max`` over ``-inf``, ``sum`` over ``exp(-inf - m) = 0``, ``any`` over ``False``);
* a contraction skips the points where a factor is zero (``softmax @ v`` where the
  probabilities are zero).

The demand pass (``ir/demand.py``), run afterwards, then confines the producers (the
score product ``q @ k^T``) to what those guards read.

Values are evaluated abstractly, per kernel, over a small domain: a known constant
(:class:`Known`), an integer affine function of the loop variables (:class:`Lin`,
``arange``), a conditional ``Cond(atoms, t, f)`` (``t`` where every affine atom holds,
``f`` elsewhere), a masked score (:class:`MaskNeg`: a finite mask constant such as
``finfo.min`` plus data, whose ``exp`` after the row max is subtracted is exactly 0),
``NONFINITE`` (the max of a row that may be entirely masked) or unknown data
(``UNKNOWN``). Assumptions: the values the program computes are finite (so ``0 * x = 0``
and ``-inf + x = -inf``), and a division ``0 / x`` is ``0`` (the denominator of a softmax
is at least 1); a masked max is skipped only when every row keeps an unmasked element
(checked). Every rewrite preserves the program's values under these assumptions, and
validation compares the rewritten IR with the framework, so a program that breaks them
(a ``log(0)`` in a masked region) fails validation rather than passing silently.

Facts are derived only for tensors written by one kernel with an identity index (one
loop variable per coordinate over the whole tensor), outside sequential loops; a
tensor whose facts are not known is data.

>>> from solbound.ir.model import Access, Call, Const, Idx, Kernel
>>> i, j = Aff.var("i"), Aff.var("j")
>>> mask = Kernel("mask", (("i", 4), ("j", 4)), "m", (i, j), Call("le", (Idx(j), Idx(i))))
>>> masked = Kernel("fill", (("i", 4), ("j", 4)), "s", (i, j),
...                 Call("select", (Access("m", (i, j)), Access("x", (i, j)), Const(-math.inf))))
>>> ks = propagate_known([mask, masked], {"m": (4, 4), "s": (4, 4), "x": (4, 4)})
>>> [str(a) for a in ks[1].guard], ks[1].fill
(['j - i < 1'], -inf)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .affine import QUOT, Aff, Atom, quot, split_quot, split_quotients
from .model import Access, Call, Const, Idx, Kernel, accesses, walk


# ----------------------------------------------------------------------------
# the abstract domain


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()


class _NonFinite:
    def __repr__(self) -> str:
        return "NONFINITE"


# a value that may be -inf or a masked score (the max of a row every element of which may
# be masked): none of the finite-data rules apply to it
NONFINITE = _NonFinite()


@dataclass(frozen=True)
class MaskNeg:
    """A finite mask constant (at most ``MASK_LIMIT``) plus finite data: not a known value,
    but ``exp`` of it (minus a row max) is exactly 0."""


class _Bit:
    def __repr__(self) -> str:
        return "BIT"


# unknown data that is 0 or 1 (a boolean tensor, or one converted to a number): the
# minimum of it and 0 is 0, the maximum of it and 1 is 1 (``min(padding_mask, causal)``)
BIT = _Bit()


@dataclass(frozen=True)
class Known:
    value: float | int | bool


@dataclass(frozen=True)
class Lin:
    """An integer-valued affine function of the loop variables (or of coordinates)."""

    expr: Aff


@dataclass(frozen=True)
class Cond:
    """``t`` where every atom holds, ``f`` elsewhere (``t``/``f``: not a Cond)."""

    atoms: tuple[Atom, ...]
    t: object
    f: object


def _eq(a, b) -> bool:
    """Equality of two non-Cond abstract values (NaN-free constants)."""
    return isinstance(a, Known) and isinstance(b, Known) and a.value == b.value


def _sort_atoms(atoms) -> tuple[Atom, ...]:
    seen: dict[str, Atom] = {}
    for a in atoms:
        a = a.canonical()
        seen.setdefault(str(a), a)
    return tuple(seen[k] for k in sorted(seen))


def _cond(atoms, t, f):
    """A normalized Cond: constant atoms folded, nested conditions merged where exact."""
    live = []
    for a in atoms:
        if not a.expr.vars:
            v = a.expr.const
            if (a.lo is not None and v < a.lo) or (a.hi is not None and v >= a.hi):
                return f           # never holds
            continue               # always holds
        live.append(a)
    if not live:
        return t
    if isinstance(t, Cond):
        # inside A: Cond(B, t2, f2); outside A: f. Exact as Cond(A+B, t2, f) iff f2 == f
        if _eq(t.f, f):
            return _cond(tuple(live) + t.atoms, t.t, f)
        return _cond(live, UNKNOWN, f)
    if isinstance(f, Cond):
        return UNKNOWN
    if _eq(t, f):
        return t
    if _mask_value(t) and _mask_value(f) and not (
            isinstance(t, Known) and isinstance(f, Known) and (math.isinf(t.value) or math.isinf(f.value))):
        # two finite mask constants (a window's finfo.min, plus a causal finfo.min on top):
        # masked either way
        return MaskNeg()
    if t is UNKNOWN and f is UNKNOWN:
        return UNKNOWN
    if f is UNKNOWN and len(live) == 1 and (live[0].lo is None) != (live[0].hi is None):
        # only "outside a region, a constant" is useful: the complement of a one-sided
        # atom is one atom, so state it that way round
        a = live[0]
        flipped = Atom(a.expr, a.hi, None) if a.lo is None else Atom(a.expr, None, a.lo)
        return Cond(_sort_atoms([flipped]), f, t)
    return Cond(_sort_atoms(live), t, f)


# ----------------------------------------------------------------------------
# scalar ops on known values

_IDENTITY = {"sum": 0, "prod": 1, "max": -math.inf, "min": math.inf, "any": False,
             "all": True}
# a finite additive mask constant (torch.finfo(dtype).min, the -10000.0 of older models):
# added to a score it stays below every unmasked score and exp() of it is exactly 0
MASK_LIMIT = -1e4


def _mask_value(v) -> bool:
    return (isinstance(v, Known) and isinstance(v.value, float) and v.value <= MASK_LIMIT) \
        or isinstance(v, MaskNeg)


def _is_identity(reduce: str, v) -> bool:
    """``v`` contributes nothing to the reduction (a masked score contributes nothing to
    the max of a row that keeps an unmasked element: checked by the caller)."""
    return _eq(v, Known(_IDENTITY[reduce])) or (reduce == "max" and _mask_value(v))


def _is(v, x) -> bool:
    return isinstance(v, Known) and v.value == x


def _concrete(op: str, vals: list):
    """``op`` on Python constants (None when undefined here)."""
    a = vals[0] if vals else None
    b = vals[1] if len(vals) > 1 else None
    try:
        if op == "add":
            return a + b
        if op == "sub":
            return a - b
        if op == "mul":
            if (a == 0 and math.isinf(b)) or (b == 0 and math.isinf(a)):
                return None
            return a * b
        if op == "div":
            return a / b if b != 0 else None
        if op == "neg":
            return -a
        if op in ("lt", "le", "gt", "ge", "eq", "ne"):
            return {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b, "eq": a == b,
                    "ne": a != b}[op]
        if op in ("and", "or", "xor", "not"):
            if all(isinstance(x, bool) for x in vals):
                return {"and": lambda: a and b, "or": lambda: a or b, "xor": lambda: a != b,
                        "not": lambda: not a}[op]()
            if all(isinstance(x, int) for x in vals):       # integers: bitwise
                return {"and": lambda: a & b, "or": lambda: a | b, "xor": lambda: a ^ b,
                        "not": lambda: ~a}[op]()
            return None
        if op == "maximum":
            return max(a, b)
        if op == "minimum":
            return min(a, b)
        if op == "abs":
            return abs(a)
        if op == "select":
            return vals[1] if vals[0] else vals[2]
        if op == "exp":
            return 0.0 if a == -math.inf else math.exp(a)
        if op == "isnan":
            return a != a
        if op.startswith("to_"):
            dt = op[3:]
            if dt == "bool":
                return bool(a)
            if dt.startswith(("i", "u")):
                return int(a) if not (isinstance(a, float) and not math.isfinite(a)) else None
            return float(a)
    except (TypeError, ValueError, OverflowError, ZeroDivisionError):
        return None
    return None


@dataclass(frozen=True)
class Ratio:
    """``v / c``, a loop variable over a constant (real division): its ``floor`` is the
    block index ``v//c`` (``floor(arange(n) / 64)``, PyTorch's ``//`` on a tensor)."""

    var: str
    c: int


def _apply(op: str, args: list):
    """The abstract value of ``op(args)`` (no Cond among ``args``)."""
    if op == "select" and isinstance(args[0], Known):
        return args[1] if args[0].value else args[2]
    if any(isinstance(a, Ratio) for a in args):
        if op in ("floor", "trunc", "to_i64", "to_i32") and isinstance(args[0], Ratio):
            # a loop variable is never negative: truncation is the floor
            return Lin(Aff.var(quot(args[0].var, args[0].c)))
        return UNKNOWN
    if any(a is NONFINITE for a in args):
        return NONFINITE
    if any(isinstance(a, MaskNeg) for a in args):
        return _apply_masked(op, args)
    if any(a is BIT for a in args):
        r = _apply_bit(op, args)
        if r is not None:
            return r
    if all(isinstance(a, Known) for a in args):
        r = _concrete(op, [a.value for a in args])
        return UNKNOWN if r is None else Known(r)
    lins = [a for a in args if isinstance(a, Lin)]
    if lins:
        return _apply_lin(op, args)
    # data is finite: absorbing constants
    if op == "mul" and any(_is(a, 0) or _is(a, False) for a in args):
        return Known(0.0)
    if op in ("add", "sub") and len(args) == 2:
        a, b = args
        for v in (a, b):
            if isinstance(v, Known) and isinstance(v.value, float) and math.isinf(v.value):
                if op == "add" or v is a:
                    return Known(v.value)
                return Known(-v.value)
            if _mask_value(v) and (op == "add" or v is a):
                return MaskNeg()    # a finite mask constant plus finite data
    if op == "div" and _is(args[0], 0):
        return Known(0.0)
    if op == "and" and any(_is(a, False) or _is(a, 0) for a in args):
        return Known(False if any(_is(a, False) and type(a.value) is bool for a in args) else 0)
    if op == "or" and any(isinstance(a, Known) and a.value is True for a in args):
        return Known(True)
    if op == "maximum" and any(_is(a, math.inf) for a in args):
        return Known(math.inf)
    if op == "minimum" and any(_is(a, -math.inf) for a in args):
        return Known(-math.inf)
    if op == "select" and _eq(args[1], args[2]):
        return args[1]
    return UNKNOWN


def _apply_bit(op: str, args: list):
    """``op`` where an argument is 0/1 data (None: no rule beyond finite data)."""
    if op.startswith("to_") and args[0] is BIT:
        return BIT
    if op == "minimum" and any(isinstance(a, Known) and not (a.value > 0) for a in args):
        return next(a for a in args if isinstance(a, Known))
    if op == "maximum" and any(isinstance(a, Known) and a.value >= 1 for a in args):
        return next(a for a in args if isinstance(a, Known))
    if op in ("and", "mul", "minimum", "maximum", "or") and all(a is BIT for a in args):
        return BIT
    # the minimum of 0/1 and something at least 1 is the bit itself; so is the maximum of
    # it and something at most 0 (``min(padding, causal)`` inside the triangle)
    if op == "minimum" and any(isinstance(a, Known) and a.value >= 1 for a in args):
        return BIT
    if op == "maximum" and any(isinstance(a, Known) and a.value <= 0 for a in args):
        return BIT
    return None


_CMP = {"lt": (None, 0), "le": (None, 1), "gt": (1, None), "ge": (0, None), "eq": (0, 1)}


def _apply_lin(op: str, args: list):
    def lin(v) -> Aff | None:
        if isinstance(v, Lin):
            return v.expr
        if isinstance(v, Known) and not isinstance(v.value, bool) and float(v.value).is_integer():
            return Aff.lit(int(v.value))
        return None
    ls = [lin(a) for a in args]
    if any(x is None for x in ls):
        return UNKNOWN
    if op == "add":
        return Lin(ls[0] + ls[1])
    if op == "sub":
        return Lin(ls[0] - ls[1])
    if op == "neg":
        return Lin(-ls[0])
    if op == "mul" and (ls[0].is_const or ls[1].is_const):
        return Lin(ls[0] * ls[1].const if ls[1].is_const else ls[1] * ls[0].const)
    if op in _CMP:
        lo, hi = _CMP[op]
        return _cond((Atom(ls[0] - ls[1], lo, hi),), Known(True), Known(False))
    if op == "ne":
        return _cond((Atom(ls[0] - ls[1], 0, 1),), Known(False), Known(True))
    if op in ("to_i64", "to_i32", "to_f32", "to_f64"):
        return args[0]      # exact for index values (narrower types may round or wrap)
    if op == "div" and ls[1].is_const and ls[1].const > 1 and ls[0].single_var() \
            and QUOT not in ls[0].single_var():
        return Ratio(ls[0].single_var(), ls[1].const)
    if op == "mod" and ls[1].is_const and ls[1].const > 1 and ls[0].single_var() \
            and QUOT not in ls[0].single_var():
        # a loop variable's offset in its block: v - c*(v//c)
        v, c = ls[0].single_var(), ls[1].const
        return Lin(Aff.var(v) - Aff.var(quot(v, c)) * c)
    if op == "floordiv" and ls[1].is_const and ls[1].const > 1 and ls[0].single_var() \
            and QUOT not in ls[0].single_var():
        # a block index (``arange(n) // 64``, a document or a chunk): the quotient
        # variable, exact in guards (``affine.split_quotients``)
        return Lin(Aff.var(quot(ls[0].single_var(), ls[1].const)))
    return UNKNOWN


def _apply_masked(op: str, args: list):
    """``op`` where an argument is a masked score (``MaskNeg``)."""
    if op in ("add", "sub") and isinstance(args[0], MaskNeg) and not isinstance(args[1], MaskNeg):
        return MaskNeg()                        # minus a row max, plus a bias: still masked
    if op == "add" and isinstance(args[1], MaskNeg) and not isinstance(args[0], MaskNeg):
        return MaskNeg()
    if op == "exp":
        return Known(0.0)
    if op in ("to_f32", "to_f64", "to_bf16", "to_f16"):
        return args[0]
    if op == "eq" and any(isinstance(a, Known) and a.value in (math.inf, -math.inf) for a in args):
        return Known(False)
    return UNKNOWN


def _complement(x: tuple, y: tuple) -> bool:
    """One-atom regions that are each other's complement (``e < h`` and ``e >= h``)."""
    if len(x) != 1 or len(y) != 1 or x[0].expr != y[0].expr:
        return False
    a, b = x[0], y[0]
    return (a.lo is None and b.hi is None and a.hi == b.lo) or \
        (a.hi is None and b.lo is None and a.lo == b.hi)


def _negate(a: Atom) -> Atom | None:
    """The complement of a one-sided atom (``e < h`` is ``e >= h``); None if two-sided."""
    if a.lo is None and a.hi is not None:
        return Atom(a.expr, a.hi, None)
    if a.hi is None and a.lo is not None:
        return Atom(a.expr, None, a.lo)
    return None


def _merge_union(atoms, inside, outside: Cond):
    """``inside`` on the region of ``atoms``, ``outside`` (a Cond) elsewhere, as one Cond
    when the value is the same everywhere but on one conjunction: with ``A`` one
    one-sided atom, ``outside = Cond(B, t, f)``, ``f == inside`` gives ``Cond(~A & B, t,
    inside)`` and, for ``B`` one one-sided atom, ``t == inside`` gives ``Cond(~A & ~B, f,
    inside)`` (``j <= i or j < P`` is false exactly where ``j > i and j >= P``)."""
    if len(atoms) != 1 or isinstance(inside, Cond) or isinstance(outside.t, Cond) \
            or isinstance(outside.f, Cond):
        return None
    neg = _negate(atoms[0])
    if neg is None:
        return None
    if _eq(outside.f, inside):
        return _cond((neg,) + tuple(outside.atoms), outside.t, inside)
    if len(outside.atoms) == 1 and _eq(outside.t, inside):
        nb = _negate(outside.atoms[0])
        if nb is not None:
            return _cond((neg, nb), outside.f, inside)
    return None


def _eval_call(op: str, args: list):
    """``op(args)``, splitting on the first conditional argument."""
    for pos, a in enumerate(args):
        if isinstance(a, Cond):
            # arguments conditional on the same region take their own side of it
            # (``p*g - p*s`` with both products zero outside a triangle is zero there),
            # on its complement the other side (``where(~tril, 0, dS)``: masked_fill's
            # gradient, with dS zero outside the triangle)
            def side(b, inside: bool):
                if b is a:
                    return a.t if inside else a.f
                if isinstance(b, Cond) and b.atoms == a.atoms:
                    return b.t if inside else b.f
                if isinstance(b, Cond) and _complement(b.atoms, a.atoms):
                    return b.f if inside else b.t
                return b
            inside = _eval_call(op, [side(b, True) for b in args])
            outside = _eval_call(op, [side(b, False) for b in args])
            if isinstance(outside, Cond):
                # not of the form "outside a region, a constant", unless one value holds
                # everywhere but on one conjunction (a union of regions, "causal or in the
                # prefix", is the complement of one)
                merged = _merge_union(a.atoms, inside, outside)
                return UNKNOWN if merged is None else merged
            return _cond(a.atoms, inside, outside)
    return _apply(op, args)


# ----------------------------------------------------------------------------
# facts about tensors (over coordinates x0, x1, ...)

_X = "x{}"


def _to_coords(atoms, names: list[str | None]) -> tuple[Atom, ...] | None:
    sub = {v: Aff.var(_X.format(d)) for d, v in enumerate(names) if v is not None}
    out = []
    for a in atoms:
        if not {(split_quot(v) or (v,))[0] for v in a.expr.vars} <= set(sub):
            return None
        out.append(a.subst(sub))
    return tuple(out)


def _fact_at(fact, index: tuple):
    """A tensor fact seen through an access index (affine in the kernel's variables); a
    block index of a coordinate read at an expression that is no variable is not known."""
    from .affine import QuotientError
    sub = {_X.format(d): e for d, e in enumerate(index)}
    try:
        if isinstance(fact, Lin):
            return Lin(fact.expr.subst(sub))
        if isinstance(fact, Cond):
            return _cond(tuple(a.subst(sub) for a in fact.atoms), fact.t, fact.f)
    except QuotientError:
        return UNKNOWN
    return fact


def _eval(e, facts: dict, bools: frozenset = frozenset()):
    if isinstance(e, Const):
        return Known(e.value)
    if isinstance(e, Idx):
        return Lin(e.expr)
    if isinstance(e, Access):
        fact = facts.get(e.tensor)
        if fact is None or e.indirect:
            return BIT if e.tensor in bools else UNKNOWN
        return _fact_at(fact, e.index)
    if isinstance(e, Call):
        return _eval_call(e.op, [_eval(a, facts, bools) for a in e.args])
    return UNKNOWN


def _identity_names(k: Kernel, shape) -> list[str | None] | None:
    """The loop variable of each coordinate when ``k`` writes the whole tensor, one
    variable per coordinate (``None`` for a coordinate of size 1 written at 0)."""
    if len(k.out_index) != len(shape):
        return None
    names = []
    ext = k.extents
    for a, n in zip(k.out_index, shape):
        v = a.single_var()
        if v is not None and ext.get(v) == n:
            names.append(v)
        elif _covers(a, ext, n):
            names.append(None)
        else:
            return None
    used = [w for a in k.out_index for w in a.vars]
    return names if len(set(used)) == len(used) else None


def _covers(a: Aff, ext: dict[str, int], n: int) -> bool:
    """``a`` enumerates ``0..n-1`` exactly once (mixed radix: ``d0h*3 + d0l``)."""
    if a.const != 0 or any(c <= 0 for _, c in a.terms):
        return False
    stride = 1
    for v, c in sorted(a.terms, key=lambda t: t[1]):
        if c != stride:
            return False
        stride *= ext[v]
    return stride == n


def _implied(atom: Atom, ext: dict[str, int]) -> bool:
    lo, hi = atom.expr.bounds(ext)
    return (atom.lo is None or lo >= atom.lo) and (atom.hi is None or hi < atom.hi)


def _new_atoms(k: Kernel, atoms) -> tuple[Atom, ...]:
    ext = k.extents
    have = {a.canonical() for a in k.guard}
    return tuple(a for a in _sort_atoms(atoms) if a not in have and not _implied(a, ext))


def propagate_known(kernels: list[Kernel], shapes: dict[str, tuple[int, ...]],
                    seeds: dict | None = None, folded: dict | None = None,
                    state: frozenset[str] = frozenset(),
                    bools: frozenset[str] = frozenset(),
                    undecided: list | None = None,
                    described: set | None = None,
                    integers: frozenset[str] = frozenset()) -> list[Kernel]:
    """The kernels with known-constant regions turned into guards (see the module doc).
    ``undecided``: ``(kernel, why)`` of reductions whose mask is left dense: telling
    whether a row keeps a point took more than ``ROWS_LIMIT`` points (``limit``), or the
    mask keeps a union of regions (``union``). ``described``: the tensors this pass found
    a region or a constant for (a mask ``fold`` could not describe, such as a comparison
    with a coefficient of 2, may be one).

    ``shapes`` gives every tensor's shape; ``seeds`` maps tensors the program receives
    (inputs built triangular, constant mask buffers, a position counter's value) to facts
    over their coordinates ``x0, x1, ...``, which hold until the first kernel that writes
    the tensor (a counter the step increments); ``folded`` gives facts of computed
    tensors known before the program runs (``ir/fold.py``); facts of the other tensors
    the kernels write are derived here. Seeds named in ``state`` are values of run-time
    state taken at analysis (a counter): they may turn masks into guards, but a kernel
    computed from them keeps its body (the run reads and computes it). Tensors named in
    ``bools`` hold booleans: their unknown values are 0 or 1 (``BIT``). Tensors named in
    ``integers`` hold integers: a loop variable divided by a constant there is truncated,
    which for a variable (never negative) is its block index.
    """
    writers: dict[str, int] = {}
    for k in kernels:
        for o in k.outputs:
            writers[o] = writers.get(o, 0) + 1
    seeded = set(seeds or ())
    facts: dict = dict(seeds or {})
    facts.update(folded or {})
    from .model import loop_private
    private = loop_private(kernels)
    out = []
    tainted = set(state)
    expire: list[str] = []
    for k in kernels:
        for t in expire:                   # written by the previous kernel: no longer known
            facts.pop(t, None)
        expire = [o for o in k.outputs if o in seeded]
        if (k.loop is not None and k.out not in private) or k.scan is not None \
                or k.out2 is not None or k.scatter \
                or k.lib:
            out.append(k)
            continue
        val = _eval(k.body, facts, bools)
        if isinstance(val, Ratio) and k.out in integers:
            val = Lin(Aff.var(quot(val.var, val.c)))
        reads = {a.tensor for a in accesses(k.body)}
        if reads & tainted:
            tainted.update(k.outputs)
        if k.reduce is None:
            if not (reads & tainted and isinstance(val, Known)):
                k, val = _rewrite_map(k, val)
            names = _identity_names(k, shapes[k.out])
            if writers.get(k.out) == 1 and names is not None and k.out not in facts:
                fact = _fact_of(k, val, names)
                if fact is not None:
                    facts[k.out] = fact
                    if described is not None and (isinstance(fact, Known) or isinstance(
                            fact, Cond) and isinstance(fact.t, Known) and isinstance(fact.f, Known)):
                        described.add(k.out)
        elif k.reduce in _IDENTITY and isinstance(val, Cond) \
                and _is_identity(k.reduce, val.t) and not _is_identity(k.reduce, val.f) \
                and _new_atoms(k, val.atoms):
            # the masked part is one affine region, the kept part is not (a union: a
            # prefix-LM's "causal or in the prefix"): no conjunction of atoms guards it, but
            # the masked part is skipped (its points add the identity: Kernel.skip)
            if not k.skip:
                k = k.with_(skip=_new_atoms(k, val.atoms))
            elif undecided is not None:
                undecided.append((k, "union"))
        elif k.reduce in _IDENTITY and isinstance(val, Cond) and _is_identity(k.reduce, val.f) \
                and not _eq(val.t, val.f):
            new = _new_atoms(k, val.atoms)
            nonempty = _rows_nonempty(k, new) if new and k.reduce in ("max", "min") else True
            if nonempty is None and undecided is not None:
                undecided.append((k, "limit"))
            if not nonempty:
                # a row entirely masked (or too many points to tell): its max is the masked
                # value itself, not -inf, so the mask stays data and the reduction dense
                facts[k.out] = NONFINITE
            elif new:
                k = k.with_(guard=k.guard + new)
        out.append(k)
    return out


ROWS_LIMIT = 1 << 25


def _rows_nonempty(k: Kernel, atoms) -> bool | None:
    """Every output element of reduction ``k`` keeps at least one point under its guard
    plus ``atoms``; ``None`` when that is too many points to decide. One reduced variable
    ``j`` among the atoms' variables (the one of largest extent) is solved per row in closed
    form, an interval from the atoms (a causal or windowed row: ``j <= i``); the rows and any
    other reduced variables of the atoms are enumerated, up to ``ROWS_LIMIT`` (a causal mask
    of 131,072 tokens: 131,072 rows, not 2^34 points; a 2-d neighbourhood window: the rows
    times one key axis)."""
    import numpy as np
    guard = tuple(k.guard) + tuple(atoms)
    ext = k.extents
    red = set(k.reduce_vars)
    domain: list[Atom] = []       # atoms that only bound a split row to the real rows
    if any(a.expr.has_quot for a in guard):
        # block indices: each divided variable split into its block and its offset
        ext, guard, _, fused = split_quotients(ext, guard)
        red |= {x for w, (q, r, _) in fused.items() if w in red for x in (q, r)}
        domain = [b for w, (_, _, b) in fused.items() if w not in red and b is not None]
        guard = tuple(a for a in guard if a not in domain)
    names = sorted({v for a in guard + tuple(domain) for v in a.expr.vars})
    if not names:
        return True
    inner = [v for v in names if v in red]
    if not inner:
        # no reduced variable in the atoms: a row keeps all or nothing
        rows = names
        if math.prod(ext[v] for v in rows) > ROWS_LIMIT:
            return None
        grids = np.ix_(*[np.arange(ext[v]) for v in rows])
        env = dict(zip(rows, grids))
        ok = np.ones([ext[v] for v in rows], dtype=bool)
        for a in guard:
            ok &= np.broadcast_to(a.holds(env), ok.shape)
        for a in domain:                 # a split's points past the old extent: no row
            ok |= ~np.broadcast_to(a.holds(env), ok.shape)
        return bool(ok.all())
    j = max(inner, key=lambda v: (ext[v], v))
    rows = [v for v in names if v != j]
    if math.prod(ext[v] for v in rows) > ROWS_LIMIT:
        return None
    grids = np.ix_(*[np.arange(ext[v]) for v in rows]) if rows else ()
    env = dict(zip(rows, grids))
    shape = [ext[v] for v in rows]
    lo = np.zeros(shape, dtype=np.int64)
    hi = np.full(shape, ext[j] - 1, dtype=np.int64)
    ok = np.ones(shape, dtype=bool)
    for a in guard:
        c = a.expr.coef(j)
        rest = Aff(tuple((v, x) for v, x in a.expr.terms if v != j), a.expr.const)
        r = np.broadcast_to(np.asarray(rest.evaluate(env), dtype=np.int64), shape)
        if c == 0:
            ok &= np.broadcast_to(Atom(rest, a.lo, a.hi).holds(env), shape)
            continue
        # a.lo <= c*j + r <= a.hi - 1: bounds on j (ceil(x / c) is -(-x // c))
        if a.lo is not None:
            b = a.lo - r
            if c > 0:
                lo = np.maximum(lo, -((-b) // c))
            else:
                hi = np.minimum(hi, b // c)
        if a.hi is not None:
            b = a.hi - 1 - r
            if c > 0:
                hi = np.minimum(hi, b // c)
            else:
                lo = np.maximum(lo, -((-b) // c))
    kept = ok & (lo <= hi)
    # the other reduced variables: a row is kept if any of their values keeps a point
    axes = tuple(i for i, v in enumerate(rows) if v in red)
    kept = kept.any(axis=axes, keepdims=True) if axes else kept
    for a in domain:                     # a split's points past the old extent: no row
        kept = kept | ~np.broadcast_to(a.holds(env), shape).any(axis=axes, keepdims=True) \
            if axes else kept | ~np.broadcast_to(a.holds(env), shape)
    return bool(kept.all())


def undecided_notes(undecided: list[tuple[Kernel, str]]) -> list[str]:
    """One note per reduction ``propagate_known`` left dense: for want of ``ROWS_LIMIT``
    (``limit``), or because what its mask keeps is a union of regions (``union``)."""
    notes = []
    for k, why in undecided:
        where = f"{k.opname or k.op or k.name}" + (f" ({k.src})" if k.src else "")
        if why == "limit":
            notes.append(f"assumption: the mask of {where} is counted dense: telling whether "
                         f"every row keeps a point takes more than {ROWS_LIMIT:,} points (the "
                         f"masked work is counted, so the bound may be above the fastest "
                         f"kernel's)")
        else:
            notes.append(f"assumption: the mask of {where} keeps a union of regions (what it "
                         f"masks is one affine region, what it keeps is not, as a prefix-LM's "
                         f"causal-or-prefix mask): the masked work is counted dense, so the "
                         f"bound may be above the fastest kernel's")
    return list(dict.fromkeys(notes))


def _rewrite_map(k: Kernel, val):
    """A map whose body is constant outside a region: guard it, fill the constant."""
    if isinstance(val, Cond) and isinstance(val.f, Known) and (not k.guard or _eq(val.f, Known(k.fill))):
        new = _new_atoms(k, val.atoms)
        body = Const(val.t.value) if isinstance(val.t, Known) else k.body
        if new or body != k.body:
            k = k.with_(guard=k.guard + new, fill=val.f.value, body=body)
    elif isinstance(val, Known) and not isinstance(k.body, Const) and _data_free_ok(k):
        k = k.with_(body=Const(val.value))
    elif isinstance(val, Cond) and isinstance(val.t, Known) and not isinstance(val.f, Known) \
            and not k.skip:
        # a constant inside one region, computed outside it (scores plus a prefix-LM's
        # bias: -inf where masked): the region is skipped, not guarded (Kernel.skip)
        new = _new_atoms(k, val.atoms)
        if new:
            k = k.with_(skip=new)
    return k, val


def _data_free_ok(k: Kernel) -> bool:
    """A map's body may be replaced by its known value (it reads something)."""
    return any(isinstance(e, Access) for e in walk(k.body))


def _fact_of(k: Kernel, val, names: list[str]):
    """What is known of the tensor ``k`` writes (identity writer), over coordinates."""
    if k.guard:
        atoms = _to_coords(k.guard, names)
        if atoms is None:
            return None
        inside = val if isinstance(val, (Known, Lin)) or val is BIT else UNKNOWN
        if isinstance(val, Cond) and set(val.atoms) <= set(k.guard):
            inside = val.t
        if isinstance(inside, Lin):
            inside = UNKNOWN
        return _cond(atoms, inside, Known(k.fill))
    if isinstance(val, (Known, Lin, Cond)):
        if isinstance(val, Lin):
            e = _to_coords((Atom(val.expr, None, None),), names)
            return Lin(e[0].expr) if e is not None else None
        if isinstance(val, Cond):
            atoms = _to_coords(val.atoms, names)
            return None if atoms is None else Cond(atoms, val.t, val.f)
        return val
    if val is BIT:
        return BIT
    return None


def seed_from_structure(kind: str, diag: int, rank: int, inside=None):
    """The fact of a tensor that is ``tril``/``triu`` (of ``inside``, or of data), or a
    ``band`` (``diag = (lo, hi)``: nonzero where ``lo <= col - row < hi``)."""
    diff = Aff.var(_X.format(rank - 1)) - Aff.var(_X.format(rank - 2))
    if kind == "band":
        atom = Atom(diff, diag[0], diag[1])
    else:
        atom = Atom(diff, None, diag + 1) if kind == "tril" else Atom(diff, diag, None)
    return Cond((atom,), UNKNOWN if inside is None else Known(inside), Known(0))


__all__ = ["propagate_known", "seed_from_structure", "Known", "Lin", "Cond", "UNKNOWN",
           "NONFINITE", "MaskNeg"]
