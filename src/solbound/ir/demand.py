"""Demanded-region restriction: a kernel computes only the elements someone reads.

``tril(a @ b)`` reads the product only where ``j <= i``; ``(a @ b)[:, :3]`` only its
first three columns. The producer of an intermediate tensor gets guard atoms that
confine its points to a region containing every element its consumers read, so its
work and its reads are what the program needs, as a fused kernel would do it (its
write is still counted whole: a guarded map writes its fill elsewhere). Outputs are unchanged: the elements no longer computed are never read.

The region is an over-approximation built from plain data, per consumer access:

* a box: each index coordinate's range over the consumer's loop nest;
* the consumer's guard atoms, translated to tensor coordinates where every variable of
  the atom is the whole index of one coordinate (``x[i, j]`` under ``j - i <= 0`` gives
  ``x1 - x0 <= 0``).

Several accesses combine by the box hull and the atoms they all share. A producer is
restricted only when it is the tensor's sole writer, writes it with the identity index
(one variable per coordinate), is not a scan, has no second output and is not in a
sequential loop; atoms its own extents already imply are dropped.

>>> from solbound.ir.model import Access, Call, Kernel
>>> i, j, k = Aff.var("i"), Aff.var("j"), Aff.var("k")
>>> mm = Kernel("mm", (("i", 4), ("j", 4), ("k", 4)), "t", (i, j),
...             Call("mul", (Access("a", (i, k)), Access("b", (k, j)))), reduce="sum")
>>> tril = Kernel("tril", (("i", 4), ("j", 4)), "o", (i, j), Access("t", (i, j)),
...               guard=(Atom(j - i, None, 1),))
>>> [str(a) for a in restrict_to_demand([mm, tril], {"t"})[0].guard]
['-i + j < 1']
"""

from __future__ import annotations

from .affine import Aff, Atom
from .model import Access, Kernel, accesses

_X = "x{}"      # tensor-coordinate variables of a region


def _var_ranges(k: Kernel) -> dict[str, tuple[int, int]]:
    """Inclusive range of each loop variable: its extent, narrowed by the guard's
    one-variable atoms (a kernel already confined to a demanded region reads only that
    region's operands, so demand propagates through chains of producers)."""
    rng = {v: (0, n - 1) for v, n in k.count_extents.items()}
    for a in k.guard:
        if len(a.expr.terms) != 1:
            continue
        v, c = a.expr.terms[0]
        lo, hi = rng[v]
        if a.lo is not None:       # c*v + const >= lo
            t = a.lo - a.expr.const
            lo, hi = (max(lo, -(-t // c)), hi) if c > 0 else (lo, min(hi, t // c))
        if a.hi is not None:       # c*v + const <= hi - 1
            t = a.hi - 1 - a.expr.const
            lo, hi = (lo, min(hi, t // c)) if c > 0 else (max(lo, -(-t // c)), hi)
        rng[v] = (lo, hi)
    return rng


def _bounds(e: Aff, rng: dict[str, tuple[int, int]]) -> tuple[int, int]:
    lo = hi = e.const
    for v, c in e.terms:
        a, b = rng[v]
        lo += min(c * a, c * b)
        hi += max(c * a, c * b)
    return lo, hi


def _access_region(k: Kernel, acc: Access) -> tuple[list[tuple[int, int] | None], set[Atom]]:
    """(box per coordinate, atoms over x0, x1, ...) containing what ``acc`` reads."""
    rng = _var_ranges(k)
    box: list[tuple[int, int] | None] = []
    owner: dict[str, Aff] = {}          # loop variable -> its value in tensor coordinates
    for pos, e in enumerate(acc.index):
        if isinstance(e, Access):
            box.append(None)
            continue
        lo, hi = _bounds(e, rng)
        box.append((lo, hi))
        v = e.terms[0][0] if len(e.terms) == 1 and e.terms[0][1] == 1 else None
        if v is not None and sum(1 for f in acc.index if isinstance(f, Aff) and v in f.vars) == 1:
            owner[v] = Aff.var(_X.format(pos)) - e.const
    atoms = set()
    for a in k.guard:
        if a.expr.vars and all(v in owner for v in a.expr.vars):
            e = a.expr.subst(owner)
            atoms.add(Atom(Aff(tuple(sorted(e.terms)), e.const), a.lo, a.hi))
    return box, atoms


def _identity_writer(k: Kernel) -> list[str | None] | None:
    """One loop variable per coordinate, or ``None`` for a coordinate that is not
    restricted: written at a constant (a size-1 dimension whose loop was folded away)
    or by variables no other coordinate uses (a batch fold ``d0h*3 + d0l``)."""
    names = []
    for pos, a in enumerate(k.out_index):
        v = a.single_var()
        if v is None:
            others = {w for q, b in enumerate(k.out_index) if q != pos for w in b.vars}
            if set(a.vars) & others:
                return None
        names.append(v)
    used = [v for v in names if v is not None]
    return names if used and len(set(used)) == len(used) else None


def restrict_to_demand(kernels: list[Kernel], intermediates: set[str]) -> list[Kernel]:
    """The kernels with producers of ``intermediates`` confined to their demanded regions.

    One pass in reverse program order: every consumer of a tensor comes after its
    producer, so it is final (already restricted itself) when the producer is visited.
    """
    ks = list(kernels)
    writers: dict[str, int] = {}
    readers: dict[str, list[int]] = {}
    for pos, k in enumerate(ks):
        for o in k.outputs:
            writers[o] = writers.get(o, 0) + 1
        for t in {a.tensor for a in accesses(k.body)}:
            readers.setdefault(t, []).append(pos)
    for pos in range(len(ks) - 1, -1, -1):
        p = ks[pos]
        t = p.out
        if (t not in intermediates or writers.get(t) != 1 or p.scan is not None
                or p.out2 is not None or p.loop is not None):
            continue
        names = _identity_writer(p)
        if names is None:
            continue
        regions = [_access_region(ks[c], a) for c in readers.get(t, ()) if c > pos
                   for a in accesses(ks[c].body) if a.tensor == t]
        if not regions:
            continue
        rank = len(p.out_index)
        hull: list[tuple[int, int] | None] = []
        for d in range(rank):
            spans = [r[0][d] for r in regions]
            hull.append(None if any(s is None for s in spans)
                        else (min(s[0] for s in spans), max(s[1] for s in spans)))
        shared = set.intersection(*(r[1] for r in regions))
        to_var = {_X.format(d): Aff.var(names[d]) for d in range(rank) if names[d] is not None}
        ext = p.extents
        new: list[Atom] = []
        for d, span in enumerate(hull):
            if names[d] is None:
                continue
            n = ext[names[d]]
            if span is not None and (span[0] > 0 or span[1] < n - 1):
                new.append(Atom(Aff.var(names[d]), span[0] if span[0] > 0 else None,
                                span[1] + 1 if span[1] < n - 1 else None))
        for a in sorted(shared, key=str):
            if not set(a.expr.vars) <= set(to_var):
                continue
            atom = Atom(a.expr.subst(to_var), a.lo, a.hi)
            lo, hi = atom.expr.bounds(ext)
            if (atom.lo is None or lo >= atom.lo) and (atom.hi is None or hi < atom.hi):
                continue            # implied by the producer's own extents
            new.append(atom)
        new = [a for a in new if a not in p.guard]
        if new:
            ks[pos] = p.with_(guard=p.guard + tuple(new))
    return ks





def restrict_to_support(kernels: list[Kernel], support: dict[str, tuple[Atom, ...]]
                        ) -> list[Kernel]:
    """Skip the points of a product where a factor is known to be zero.

    ``support`` maps a tensor to atoms over its coordinates ``x0, x1, ...`` outside
    which it is zero (an input that ``get_inputs`` builds with ``torch.triu``:
    ``x1 - x0 >= 0``). In a sum-reduction whose body is a product with that tensor as
    a factor (a matmul of triangular matrices), points outside contribute nothing; the
    atoms, written in the kernel's variables through the access index, join its guard.

    >>> from solbound.ir.model import Access, Call
    >>> i, j, k = Aff.var("i"), Aff.var("j"), Aff.var("k")
    >>> mm = Kernel("mm", (("i", 4), ("j", 4), ("k", 4)), "t", (i, j),
    ...             Call("mul", (Access("a", (i, k)), Access("b", (k, j)))), reduce="sum")
    >>> upper = (Atom(Aff.var("x1") - Aff.var("x0"), 0, None),)
    >>> [str(a) for a in restrict_to_support([mm], {"a": upper, "b": upper})[0].guard]
    ['0 <= k - i', '0 <= j - k']
    """
    out = []
    for k in kernels:
        if k.reduce == "sum" and k.scan is None:
            new = []
            for acc in _factors(k.body):
                for a in support.get(acc.tensor, ()):
                    if any(isinstance(e, Access) for e in acc.index):
                        continue
                    coords = {_X.format(d): e for d, e in enumerate(acc.index)}
                    e = a.expr.subst(coords)
                    atom = Atom(e, a.lo, a.hi)
                    if atom not in k.guard and atom not in new:
                        new.append(atom)
            if new:
                k = k.with_(guard=k.guard + tuple(new))
        out.append(k)
    return out


def _factors(e) -> list[Access]:
    """The accesses that multiply the whole of ``e`` (through ``mul`` and casts)."""
    from .model import Call
    if isinstance(e, Access):
        return [e]
    if isinstance(e, Call) and e.op == "mul":
        return _factors(e.args[0]) + _factors(e.args[1])
    if isinstance(e, Call) and e.op.startswith("to_"):
        return _factors(e.args[0])
    return []


__all__ = ["restrict_to_demand", "restrict_to_support"]
