"""Exact counting over affine iteration spaces: guarded domain sizes and access footprints.

Nothing here samples. Domain sizes enumerate all but one variable of each
guard-connected component and count the last one in closed form; footprints
split an access into independent groups of tensor dimensions and count the
distinct values of each group exactly (closed form for one variable, a bitmap
sumset for one dimension, enumeration for coupled dimensions). When a count
would need more than :data:`ENUM_LIMIT` points it falls back to a bound and
says so (``exact=False``).

>>> from solbound.ir.affine import Aff, Atom
>>> domain_size({"i": 4, "j": 4}, (Atom(Aff.var("i") - Aff.var("j"), 0, None),))
10
>>> values_count([("p", 2), ("r", 1)], -1, {"p": (0, 3), "r": (0, 2)}, 0, 8)  # ranges inclusive
8
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ir.affine import Aff, Atom, Guard, split_quotients
from ..ir.model import Access

ENUM_LIMIT = 20_000_000
# the most points a guarded domain's count enumerates (in blocks of ENUM_LIMIT) before
# it is an error that names the size: 2^32 takes minutes
COUNT_LIMIT = 1 << 32
BITMAP_LIMIT = 200_000_000


class _UF:
    def __init__(self):
        self.p: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.p.setdefault(x, x)
        while self.p[x] != x:
            self.p[x] = self.p[self.p[x]]
            x = self.p[x]
        return x

    def union(self, xs) -> None:
        xs = list(xs)
        for a in xs[1:]:
            self.p[self.find(a)] = self.find(xs[0])


# ---------------------------------------------------------------------------
# domain sizes


def _count_component(vars_: list[str], extents: dict[str, int], atoms: list[Atom]) -> int:
    """Points of one guard-connected component: every variable but the one of largest
    extent enumerated (in blocks of ``ENUM_LIMIT`` points, so any size is exact, only
    slower), the last counted in closed form per point."""
    last = max(vars_, key=lambda v: extents[v])
    others = [v for v in vars_ if v != last]
    total_other = math.prod(extents[v] for v in others)
    if total_other > COUNT_LIMIT:
        raise OverflowError(f"guarded domain too large to count exactly ({total_other:,} "
                            f"points to enumerate, more than {COUNT_LIMIT:,})")
    shape = [extents[v] for v in others]
    count = 0
    for start in range(0, max(total_other, 1), ENUM_LIMIT):
        flat = np.arange(start, min(start + ENUM_LIMIT, total_other), dtype=np.int64) \
            if others else np.zeros(1, dtype=np.int64)
        idx = np.unravel_index(flat, shape) if others else ()
        env = dict(zip(others, idx))
        count += _count_block(env, len(flat), extents[last], last, atoms)
    return count


def _count_block(env: dict, size: int, n_last: int, last: str, atoms: list[Atom]) -> int:
    lo = np.zeros(size, dtype=np.int64)
    hi = np.full(size, n_last - 1, dtype=np.int64)
    ok = np.ones(size, dtype=bool)
    for a in atoms:
        c = a.expr.coef(last)
        rest_expr = Aff(tuple((v, k) for v, k in a.expr.terms if v != last), a.expr.const)
        rest = np.broadcast_to(np.asarray(rest_expr.evaluate(env), dtype=np.int64), (size,))
        if c == 0:
            if a.lo is not None:
                ok &= rest >= a.lo
            if a.hi is not None:
                ok &= rest < a.hi
            continue
        # lo <= c*v + rest < hi
        if c > 0:
            if a.lo is not None:
                lo = np.maximum(lo, -((rest - a.lo) // c))           # ceil((lo-rest)/c)
            if a.hi is not None:
                hi = np.minimum(hi, (a.hi - 1 - rest) // c)           # floor((hi-1-rest)/c)
        else:
            cc = -c
            if a.lo is not None:
                hi = np.minimum(hi, (rest - a.lo) // cc)
            if a.hi is not None:
                lo = np.maximum(lo, (rest - a.hi) // cc + 1)
    cnt = np.clip(hi - lo + 1, 0, None)
    return int(cnt[ok].sum())


def domain_size(extents: dict[str, int], guard: Guard) -> int:
    """Number of points of the box ``0 <= v < extent`` that satisfy every atom (a block
    index ``v//c`` in an atom: ``v`` split into its block and its offset, exactly)."""
    if any(a.expr.has_quot for a in guard):
        extents, guard, _, _ = split_quotients(extents, guard)
    uf = _UF()
    for v in extents:
        uf.find(v)
    for a in guard:
        if a.expr.vars:
            uf.union(a.expr.vars)
    comps: dict[str, list[str]] = {}
    for v in extents:
        comps.setdefault(uf.find(v), []).append(v)
    total = 1
    for root, vs in comps.items():
        atoms = [a for a in guard if a.expr.vars and uf.find(a.expr.vars[0]) == root]
        if not atoms:
            total *= math.prod(extents[v] for v in vs)
        else:
            total *= _count_component(vs, extents, atoms)
    for a in guard:  # constant atoms
        if not a.expr.vars and not a.holds({}):
            return 0
    return total


# ---------------------------------------------------------------------------
# one affine expression: number of distinct values


def values_count(terms: list[tuple[str, int]], const: int, ranges: dict[str, tuple[int, int]],
                 clip_lo: int, clip_hi: int) -> int:
    """Distinct values of ``sum(c*v) + const`` in ``[clip_lo, clip_hi)`` with ``v`` in its inclusive range."""
    # substitute v = a + t with t in [0, b - a]; flip negative coefficients
    base = const
    items = []
    for v, c in terms:
        a, b = ranges[v]
        if b < a:
            return 0
        base += c * a
        n = b - a
        if c < 0:
            base += c * n
            c = -c
        if n > 0 and c != 0:
            items.append((c, n))
    if not items:
        return 1 if clip_lo <= base < clip_hi else 0
    if len(items) == 1:
        c, n = items[0]
        # k in [0, n] with clip_lo <= base + c*k < clip_hi
        k_lo = max(0, -((base - clip_lo) // c))
        k_hi = min(n, (clip_hi - 1 - base) // c)
        return max(0, k_hi - k_lo + 1)
    items.sort()
    span = sum(c * n for c, n in items)
    # interval fast path: each step no larger than the span so far + 1
    reach, interval = 0, True
    for c, n in items:
        if c > reach + 1:
            interval = False
            break
        reach += c * n
    if interval:
        lo, hi = max(base, clip_lo), min(base + span, clip_hi - 1)
        return max(0, hi - lo + 1)
    if _mixed_radix(items) and clip_lo <= base and base + span < clip_hi:
        return math.prod(n + 1 for _, n in items)      # every point a distinct value
    if span + 1 > BITMAP_LIMIT:
        raise OverflowError("index range too large for an exact count")
    bm = np.zeros(span + 1, dtype=bool)
    bm[0] = True
    for c, n in items:
        bm = _dilate(bm, c, n)
    lo = max(clip_lo - base, 0)
    hi = min(clip_hi - base, span + 1)
    return int(bm[lo:hi].sum()) if hi > lo else 0


def _mixed_radix(steps) -> bool:
    """Whether ``sum(c*t)``, ``t`` in ``[0, n]`` for each ``(c, n)`` (``c > 0``), takes a
    distinct value at every point: each step, smallest first, is beyond the span of the
    smaller ones.

    >>> _mixed_radix([(1, 7), (8, 3)]), _mixed_radix([(1, 7), (4, 3)])
    (True, False)
    """
    reach = 0
    for c, n in sorted(steps):
        if c <= reach:
            return False
        reach += c * n
    return True


def _dilate(bm: np.ndarray, c: int, n: int) -> np.ndarray:
    """``bm | bm>>c | ... | bm>>(n*c)`` (a sliding-window OR per residue class mod c)."""
    size = bm.size
    m = -(-size // c)
    a = np.zeros(m * c, dtype=np.int64)
    a[:size] = bm
    cs = np.cumsum(a.reshape(m, c), axis=0)
    out = cs.copy()
    if n + 1 < m:
        out[n + 1:] -= cs[:-(n + 1)]
    return out.reshape(-1)[:size] > 0


# ---------------------------------------------------------------------------
# footprints


@dataclass(frozen=True)
class Footprint:
    elements: int
    exact: bool
    note: str = ""


def _var_ranges(vars_, extents: dict[str, int], atoms: list[Atom]) -> dict[str, tuple[int, int]]:
    r = {v: (0, extents[v] - 1) for v in vars_}
    for a in atoms:
        if len(a.expr.terms) == 1:
            v, c = a.expr.terms[0]
            lo, hi = r[v]
            k = a.expr.const
            if c > 0:
                if a.lo is not None:
                    lo = max(lo, -((k - a.lo) // c))
                if a.hi is not None:
                    hi = min(hi, (a.hi - 1 - k) // c)
            else:
                cc = -c
                if a.lo is not None:
                    hi = min(hi, (k - a.lo) // cc)
                if a.hi is not None:
                    lo = max(lo, (k - a.hi) // cc + 1)
            r[v] = (lo, hi)
    return r


def _injective_in_range(vars_, extents, exprs: list[Aff], shape: list[int]) -> bool:
    """Whether the index map (one expression per dimension) is injective over the box and
    lands in range everywhere: the expressions use disjoint variables, together all of
    ``vars_``, each with coefficients in mixed radix (sorted by size, each larger than what
    the smaller ones span), and each expression's least and greatest values are in range.

    >>> d1, d2 = Aff.var("d1"), Aff.var("d2")
    >>> _injective_in_range(["d1", "d2"], {"d1": 4, "d2": 8}, [d1 * 8 + d2], [32])
    True
    >>> _injective_in_range(["d1", "d2"], {"d1": 4, "d2": 8}, [d1 * 4 + d2], [32])
    False
    """
    seen: set[str] = set()
    for e, n in zip(exprs, shape):
        terms = [(v, c) for v, c in e.terms if extents[v] > 1]
        if seen & {v for v, _ in terms} or \
                not _mixed_radix([(abs(c), extents[v] - 1) for v, c in terms]):
            return False
        seen |= {v for v, _ in e.terms}
        lo = e.const + sum(min(0, c) * (extents[v] - 1) for v, c in e.terms)
        hi = e.const + sum(max(0, c) * (extents[v] - 1) for v, c in e.terms)
        if lo < 0 or hi >= n:
            return False
    return seen >= set(vars_)


def _enumerate_tuples(vars_, extents, atoms, exprs: list[Aff], shape: list[int]) -> int:
    singles = [e.terms[0][0] for e in exprs if len(e.terms) == 1]
    if len(singles) == len(exprs) and sorted(singles) == sorted(vars_):
        # one variable per index dim: the map is injective, so distinct elements are
        # guarded points in range (a triangle of A[i, k] under k >= i), counted in closed form
        in_range = tuple(Atom(e, 0, n) for e, n in zip(exprs, shape))
        return domain_size({v: extents[v] for v in vars_}, tuple(atoms) + in_range)
    if _injective_in_range(vars_, extents, exprs, shape):
        # distinct points give distinct elements (a flat view's strides in mixed radix,
        # every point in range): the elements are the guarded points, counted in closed form
        return domain_size({v: extents[v] for v in vars_}, tuple(atoms))
    total = math.prod(extents[v] for v in vars_)
    if total > ENUM_LIMIT:
        raise OverflowError("coupled access too large to enumerate")
    grids = np.meshgrid(*[np.arange(extents[v], dtype=np.int64) for v in vars_], indexing="ij")
    env = {v: g.ravel() for v, g in zip(vars_, grids)}
    mask = np.ones(total, dtype=bool)
    for a in atoms:
        mask &= np.broadcast_to(a.holds(env), (total,))
    lin = np.zeros(total, dtype=np.int64)
    for e, n in zip(exprs, shape):
        val = np.broadcast_to(np.asarray(e.evaluate(env), dtype=np.int64), (total,))
        mask &= (val >= 0) & (val < n)
        lin = lin * n + val
    return int(np.unique(lin[mask]).size)


def _eliminate(atoms: list[Atom], v: str, extent: int):
    """Atoms over the other variables equivalent to "some ``0 <= v < extent`` satisfies
    ``atoms``"; ``None`` when ``v`` has a non-unit coefficient, ``False`` when empty.

    >>> i, j, k = Aff.var("i"), Aff.var("j"), Aff.var("k")
    >>> [str(a) for a in _eliminate([Atom(j - k, 0, None), Atom(j - i, 0, None)], "j", 8)]
    ['0 <= -k + 7', '0 <= -i + 7']
    """
    lows: list[Aff] = [Aff.lit(0)]
    highs: list[Aff] = [Aff.lit(extent - 1)]
    rest: list[Atom] = []
    for a in atoms:
        c = a.expr.coef(v)
        if c == 0:
            rest.append(a)
            continue
        if c not in (1, -1):
            return None
        r = a.expr - Aff.var(v) * c
        if a.lo is not None:       # lo <= c v + r
            (lows if c == 1 else highs).append((Aff.lit(a.lo) - r) if c == 1 else (r - a.lo))
        if a.hi is not None:       # c v + r <= hi - 1
            (highs if c == 1 else lows).append((Aff.lit(a.hi - 1) - r) if c == 1
                                               else (r - (a.hi - 1)))
    for lo in lows:
        for hi in highs:
            d = hi - lo
            if d.is_const:
                if d.const < 0:
                    return False
                continue
            atom = Atom(d, 0, None)
            if atom not in rest:
                rest.append(atom)
    return rest


def access_footprint(acc: Access, shape: tuple[int, ...], extents: dict[str, int],
                     guard: Guard) -> Footprint:
    """Distinct elements of a tensor touched by ``acc`` over the guarded loop nest."""
    numel = math.prod(shape)
    if acc.indirect:
        # each lookup touches a distinct element along the indirect dims, capped by the table
        exprs: list[Aff] = []
        for i in acc.index:
            if isinstance(i, Access):
                exprs.extend(x for x in i.index if isinstance(x, Aff))
            else:
                exprs.append(i)
        vars_ = sorted({v for e in exprs for v in e.vars})
        lookups = math.prod(extents[v] for v in vars_)
        return Footprint(min(numel, lookups), True,
                         "indirect: each lookup assumed to touch a distinct row, capped by the table size")
    if any(a.expr.has_quot for a in guard):
        extents, guard, index, _ = split_quotients(extents, guard, acc.index)
        acc = Access(acc.tensor, index)
    exprs = [i for i in acc.index]
    uf = _UF()
    for e in exprs:
        for v in e.vars:
            uf.find(v)
        if e.vars:
            uf.union(e.vars)
    used = {v for e in exprs for v in e.vars}
    # variables the index does not use, bounded by atoms with unit coefficients: project
    # them out exactly (Fourier-Motzkin on integers with unit coefficients); the others
    # stay and are enumerated with the index variables they are tied to
    atoms_all = list(guard)
    for v in sorted({v for a in atoms_all for v in a.expr.vars} - used):
        proj = _eliminate(atoms_all, v, extents[v])
        if proj is False:
            return Footprint(0, True)
        if proj is not None:
            atoms_all = proj
    for a in [a for a in atoms_all if not a.expr.vars]:
        if not a.holds({}):
            return Footprint(0, True)
    atoms_all = [a for a in atoms_all if a.expr.vars]
    for a in atoms_all:
        uf.union(a.expr.vars)
    atoms_rel = [a for a in atoms_all if set(a.expr.vars) & used
                 or uf.find(a.expr.vars[0]) in {uf.find(v) for v in used}]
    # atoms not connected to the index only decide whether any point exists at all
    loose = [a for a in atoms_all if a not in atoms_rel]
    if loose:
        lvars = sorted({v for a in loose for v in a.expr.vars})
        if domain_size({v: extents[v] for v in lvars}, tuple(loose)) == 0:
            return Footprint(0, True)
    total, exact, notes = 1, True, []
    comps: dict[str, list[int]] = {}
    for d, e in enumerate(exprs):
        if not e.vars:
            if not (0 <= e.const < shape[d]):
                return Footprint(0, True)
            continue
        comps.setdefault(uf.find(e.vars[0]), []).append(d)
    for root, dims in comps.items():
        vars_ = sorted({v for v in extents if v in uf.p and uf.find(v) == root})
        atoms = [a for a in atoms_rel if uf.find(a.expr.vars[0]) == root]
        if len(dims) == 1:
            d = dims[0]
            e = exprs[d]
            clip_lo, clip_hi = 0, shape[d]
            simple = True
            single_atoms = []
            for a in atoms:
                if a.expr == e:
                    if a.lo is not None:
                        clip_lo = max(clip_lo, a.lo)
                    if a.hi is not None:
                        clip_hi = min(clip_hi, a.hi)
                elif len(a.expr.terms) == 1:
                    single_atoms.append(a)
                else:
                    simple = False
            if simple and set(vars_) <= set(e.vars):
                ranges = _var_ranges(e.vars, extents, single_atoms)
                try:
                    total *= values_count(list(e.terms), e.const, ranges, clip_lo, clip_hi)
                    continue
                except OverflowError:
                    pass
        try:
            total *= _enumerate_tuples(vars_, extents, atoms, [exprs[d] for d in dims],
                                       [shape[d] for d in dims])
        except OverflowError:
            exact = False
            notes.append("coupled dims too large to enumerate: box bound used")
            total *= min(math.prod(shape[d] for d in dims),
                         math.prod(extents[v] for v in vars_))
    return Footprint(min(total, numel), exact, "; ".join(notes))
