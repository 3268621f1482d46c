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

from .affine import QUOT, Aff, Atom, QuotientError, split_quot


def _base(v: str) -> str:
    """The loop variable of a variable or of its block index (``i//64`` -> ``i``)."""
    q = split_quot(v)
    return q[0] if q else v
from .model import Access, Kernel, kernel_reads, subst_expr

_X = "x{}"      # tensor-coordinate variables of a region


def _var_ranges(k: Kernel) -> dict[str, tuple[int, int]]:
    """Inclusive range of each loop variable: its extent, narrowed by the guard's
    one-variable atoms (a kernel already confined to a demanded region reads only that
    region's operands, so demand propagates through chains of producers)."""
    rng = {v: (0, n - 1) for v, n in k.count_extents.items()}
    for a in k.guard:
        if len(a.expr.terms) != 1 or split_quot(a.expr.terms[0][0]):
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


def _digits(e: Aff, rng: dict[str, tuple[int, int]]) -> tuple[tuple[int, ...], list] | None:
    """``e`` as a mixed-radix number ``sum c_i v_i`` (``c_0 = 1``, each ``c_i`` dividing
    ``c_{i+1}``, every digit below its radix): the coefficients and each digit's range.
    A flattened ``(s, n)`` read as ``s*N + n`` with ``n`` confined is a strided set, not a
    box; its digits still describe it exactly."""
    if len(e.terms) < 2 or e.const != 0 or any(c <= 0 for _, c in e.terms):
        return None
    terms = sorted(e.terms, key=lambda t: t[1])
    coefs = tuple(c for _, c in terms)
    if coefs[0] != 1 or len(set(coefs)) != len(coefs):
        return None
    spans = []
    for i, (v, c) in enumerate(terms):
        lo, hi = rng[v]
        if i + 1 < len(terms):
            nxt = terms[i + 1][1]
            if nxt % c or lo < 0 or hi >= nxt // c:
                return None
        spans.append((lo, hi))
    return coefs, spans


def _digit_name(pos: int, coef: int, radix: int | None) -> str:
    """The variable of one mixed-radix digit of coordinate ``pos``: its value is
    ``(x_pos // coef) % radix`` (no modulus for the top digit, ``radix`` None)."""
    return f"x{pos}_{coef}_{radix if radix is not None else 'top'}"


def _digit_vars(pos: int, e: Aff, coefs: tuple[int, ...]) -> dict[str, str]:
    """Loop variable -> digit variable for a coordinate written or read as a mixed-radix
    number with coefficients ``coefs`` (ascending)."""
    by_coef = {c: v for v, c in e.terms}
    return {by_coef[c]: _digit_name(pos, c, coefs[i + 1] // c if i + 1 < len(coefs) else None)
            for i, c in enumerate(coefs)}


def _access_region(k: Kernel, acc: Access) -> tuple[list[tuple[int, int] | None], set[Atom],
                                                    list]:
    """(box per coordinate, atoms, mixed-radix digits per coordinate) containing what
    ``acc`` reads. The atoms are the reader's guard atoms over tensor coordinates
    ``x0, x1, ...`` (a variable that is the whole index of one coordinate) and over digit
    variables (``_digit_name``: a variable that is one digit of a flattened coordinate), so
    a guard coupling the digits of one flattened coordinate is kept (``t*32 + n*8 + s`` read
    under ``s <= t``: a causal mask over a flattened score tensor)."""
    rng = _var_ranges(k)
    digits = [None if isinstance(e, Access) else _digits(e, rng) for e in acc.index]
    box: list[tuple[int, int] | None] = []
    # loop variable -> its value in tensor coordinates or digit variables (used by one
    # coordinate only)
    tvar: dict[str, Aff] = {}

    def alone(v):
        return sum(1 for f in acc.index if isinstance(f, Aff) and v in f.vars) == 1
    for pos, (e, dg) in enumerate(zip(acc.index, digits)):
        if isinstance(e, Access):
            box.append(None)
            continue
        box.append(_bounds(e, rng))
        v = e.terms[0][0] if len(e.terms) == 1 and e.terms[0][1] == 1 else None
        if v is not None and alone(v):
            tvar[v] = Aff.var(_X.format(pos)) - e.const
        if dg is not None:
            tvar.update({v: Aff.var(name) for v, name in _digit_vars(pos, e, dg[0]).items()
                         if alone(v)})
    atoms = set()
    for a in k.guard:
        if a.expr.vars and all(_base(v) in tvar for v in a.expr.vars):
            try:
                e = a.expr.subst(tvar)
            except QuotientError:       # a block index of a shifted coordinate
                continue
            atoms.add(Atom(Aff(tuple(sorted(e.terms)), e.const), a.lo, a.hi))
    return box, atoms, digits, _skip_region(k, tvar)


def _skip_region(k: Kernel, tvar: dict[str, Aff]) -> frozenset | None:
    """The reader's skipped region (``Kernel.skip``: where it needs no operand's value)
    over tensor coordinates: every atom over variables that are whole coordinates (all the
    points reading one element agree on it), else None (dropping an atom of a conjunction
    would grow the region)."""
    if not k.skip:
        return None
    out = set()
    for a in k.skip:
        if not a.expr.vars or not all(_base(v) in tvar for v in a.expr.vars):
            return None
        try:
            e = a.expr.subst(tvar)
        except QuotientError:
            return None
        out.add(Atom(Aff(tuple(sorted(e.terms)), e.const), a.lo, a.hi).canonical())
    return frozenset(out)


def _writer_digits(p: Kernel) -> dict[str, Aff]:
    """Digit variable -> the producer's loop variable, for each coordinate the producer
    writes as a mixed-radix number of loop variables no other coordinate uses."""
    full = {v: (0, n - 1) for v, n in p.extents.items()}
    out: dict[str, Aff] = {}
    for pos, e in enumerate(p.out_index):
        dg = _digits(e, full)
        if dg is None or any(v in f.vars for q, f in enumerate(p.out_index) if q != pos
                             for v in e.vars):
            continue
        out.update({name: Aff.var(v) for v, name in _digit_vars(pos, e, dg[0]).items()})
    return out


def _identity_writer(k: Kernel) -> tuple[list[str | None], list[int]] | None:
    """One loop variable per coordinate, with its offset (a region of a concatenation is
    written at ``v + c``), or ``None`` for a coordinate that is not restricted: written at
    a constant (a size-1 dimension whose loop was folded away) or by variables no other
    coordinate uses (a batch fold ``d0h*3 + d0l``)."""
    names, offsets = [], []
    for pos, a in enumerate(k.out_index):
        v = a.terms[0][0] if len(a.terms) == 1 and a.terms[0][1] == 1 else None
        if v is None:
            others = {w for q, b in enumerate(k.out_index) if q != pos for w in b.vars}
            if set(a.vars) & others:
                return None
        names.append(v)
        offsets.append(a.const if v is not None else 0)
    used = [v for v in names if v is not None]
    return (names, offsets) if used and len(set(used)) == len(used) else None


def restrict_to_demand(kernels: list[Kernel], intermediates: set[str]) -> list[Kernel]:
    """The kernels with producers of ``intermediates`` confined to their demanded regions.

    One pass in reverse program order: every consumer of a tensor comes after its
    producer, so it is final (already restricted itself) when the producer is visited.
    """
    from .model import loop_private
    ks = list(kernels)
    private = loop_private(ks)
    writers: dict[str, int] = {}
    readers: dict[str, list[int]] = {}
    for pos, k in enumerate(ks):
        for o in k.outputs:
            writers[o] = writers.get(o, 0) + 1
        for t in {a.tensor for a in kernel_reads(k)}:
            readers.setdefault(t, []).append(pos)
    for pos in range(len(ks) - 1, -1, -1):
        p = ks[pos]
        t = p.out
        # several writers (the parts of a concatenation) are each confined to the
        # readers' region: what a writer skips is never read after it
        elementwise_lib = _elementwise_collective(p)
        if (t not in intermediates or p.scan is not None or p.scatter
                or (p.lib and not elementwise_lib)
                or p.out2 is not None or (p.loop is not None and t not in private)):
            continue
        regions = [_access_region(ks[c], a) for c in readers.get(t, ()) if c > pos
                   for a in kernel_reads(ks[c]) if a.tensor == t]
        if not regions:
            continue
        shared = set.intersection(*(r[1] for r in regions))
        found = _identity_writer(p)
        if found is None:
            # no coordinate written by one variable: only digit atoms can reach it
            ks[pos] = _add_atoms(p, _translate(shared, _writer_digits(p)))
            continue
        names, offsets = found
        rank = len(p.out_index)
        hull: list[tuple[int, int] | None] = []
        for d in range(rank):
            spans = [r[0][d] for r in regions]
            hull.append(None if any(s is None for s in spans)
                        else (min(s[0] for s in spans), max(s[1] for s in spans)))
        to_var = {_X.format(d): Aff.var(names[d]) + offsets[d] for d in range(rank)
                  if names[d] is not None}
        ext = p.extents
        new: list[Atom] = []
        for d, span in enumerate(hull):
            if names[d] is None:
                continue
            n = ext[names[d]]
            if span is not None:
                lo, hi = span[0] - offsets[d], span[1] - offsets[d]
                if lo > 0 or hi < n - 1:
                    new.append(Atom(Aff.var(names[d]), lo if lo > 0 else None,
                                    hi + 1 if hi < n - 1 else None))
        p = _add_atoms(p, new + _translate(shared, {**_writer_digits(p), **to_var}))
        if elementwise_lib:
            # an all-reduce's element i is the sum of the ranks' elements i: its operand is
            # needed where its result is (the guard over the read's own variables too)
            ks[pos] = _guard_operand(p)
            continue
        p = _add_skip(p, [r[3] for r in regions], {**_writer_digits(p), **to_var})
        for d in range(rank):
            digits = [r[2][d] for r in regions]
            if names[d] is not None:
                if offsets[d] == 0:
                    p = _split_by_digits(p, names[d], digits)
            else:
                p = _confine_digits(p, p.out_index[d], digits)
        ks[pos] = p
    return ks


def _elementwise_collective(k: Kernel) -> bool:
    """An all-reduce library kernel (``ir/collectives.py``): each result element is the
    reduction of the ranks' same element, so demand passes through it."""
    return bool(k.lib) and k.lib[0] == "all_reduce" and k.loop is None


def _guard_operand(p: Kernel) -> Kernel:
    """``p`` (an elementwise collective whose operand is read through variables of its own)
    with each guard atom over its result's variables repeated over the operand's variables
    at the same coordinate, so its reads, and through them its producer, are confined."""
    reads = list(kernel_reads(p))
    if len(reads) != 1 or len(reads[0].index) != len(p.out_index):
        return p
    sub: dict[str, Aff] = {}
    for o, r in zip(p.out_index, reads[0].index):
        if len(o.terms) == 1 and o.terms[0][1] == 1 and o.const == 0 and \
                len(r.terms) == 1 and r.terms[0][1] == 1 and r.const == 0:
            sub[o.terms[0][0]] = Aff.var(r.terms[0][0])
    return _add_atoms(p, _translate(set(p.guard), sub))


def _add_skip(p: Kernel, skips: list, sub: dict[str, Aff]) -> Kernel:
    """``p`` skipping the region every reader skips (the same conjunction in tensor
    coordinates for each access), every atom over the producer's variables; unchanged
    when a reader needs the region, or when ``p`` skips a region of its own."""
    if p.skip or not skips or any(r is None for r in skips) or len(set(skips)) != 1:
        return p
    atoms = sorted(skips[0], key=str)
    out = []
    for a in atoms:
        if not {_base(v) for v in a.expr.vars} <= set(sub):
            return p
        try:
            out.append(Atom(a.expr.subst(sub), a.lo, a.hi))
        except QuotientError:
            return p
    return p.with_(skip=tuple(out))


def _translate(atoms: set[Atom], sub: dict[str, Aff]) -> list[Atom]:
    """The readers' shared atoms whose every variable (a tensor coordinate, or a digit the
    producer writes with the same coefficient and radix: the same value for every element)
    is one of the producer's loop variables, over those variables."""
    out = []
    for a in sorted(atoms, key=str):
        if {_base(v) for v in a.expr.vars} <= set(sub):
            try:
                out.append(Atom(a.expr.subst(sub), a.lo, a.hi))
            except QuotientError:
                pass
    return out


def _add_atoms(p: Kernel, atoms: list[Atom]) -> Kernel:
    """``p`` with the atoms its guard and its own extents do not already imply."""
    ext = p.extents
    keep = []
    for atom in atoms:
        lo, hi = atom.expr.bounds(ext)
        if (atom.lo is None or lo >= atom.lo) and (atom.hi is None or hi < atom.hi):
            continue
        keep.append(atom)
    have = {a.canonical() for a in p.guard}
    new = [a for a in dict.fromkeys(a.canonical() for a in keep) if a not in have]
    return p.with_(guard=p.guard + tuple(new)) if new else p


def _confine_digits(p: Kernel, e: Aff, digits: list) -> Kernel:
    """A producer already writing the coordinate as the readers' mixed-radix number (a
    batch fold split at lowering): confine each of its digit variables to the readers' hull."""
    if not digits or any(dg is None for dg in digits) or len({dg[0] for dg in digits}) != 1:
        return p
    mine = _digits(e, {v: (0, n - 1) for v, n in p.extents.items()})
    if mine is None or mine[0] != digits[0][0]:
        return p
    terms = sorted(e.terms, key=lambda t: t[1])
    atoms = []
    for i, ((v, _), (lo0, hi0)) in enumerate(zip(terms, mine[1])):
        lo = min(dg[1][i][0] for dg in digits)
        hi = max(dg[1][i][1] for dg in digits)
        if lo > lo0 or hi < hi0:
            atoms.append(Atom(Aff.var(v), lo if lo > lo0 else None, hi + 1 if hi < hi0 else None))
    have = {a.canonical() for a in p.guard}
    atoms = [a for a in atoms if a.canonical() not in have]
    return p.with_(guard=p.guard + tuple(atoms)) if atoms else p


def _split_by_digits(p: Kernel, v: str, digits: list) -> Kernel:
    """Split the producer's loop ``v`` into the mixed-radix digits every reader uses for
    it, and confine each digit to the readers' hull (``(s, n)`` flattened, only ``n = 0``
    read: ``v = v_1*N + v_0`` with ``v_0 < 1``)."""
    if not digits or any(dg is None for dg in digits) or len({dg[0] for dg in digits}) != 1:
        return p
    if any(QUOT in w and w.startswith(v + QUOT) for a in p.guard for w in a.expr.vars):
        return p            # its block index would not survive the split: left whole
    coefs = digits[0][0]
    n = p.extents[v]
    if n % coefs[-1]:
        return p
    radix = [coefs[i + 1] // coefs[i] for i in range(len(coefs) - 1)] + [n // coefs[-1]]
    hull = [(min(dg[1][i][0] for dg in digits), max(dg[1][i][1] for dg in digits))
            for i in range(len(coefs))]
    if all(lo <= 0 and hi >= r - 1 for (lo, hi), r in zip(hull, radix)):
        return p
    taken = set(p.extents) | ({p.loop[0]} if p.loop else set())
    names = []
    for i in range(len(coefs)):
        name, j = f"{v}_{i}", 0
        while name in taken:
            j += 1
            name = f"{v}_{i}_{j}"
        taken.add(name)
        names.append(name)
    value = Aff.lit(0)
    for c, name in zip(coefs, names):
        value = value + Aff.var(name) * c
    sub = {v: value}
    dims = []
    for d, e in p.dims:
        if d == v:
            dims += [(name, r) for name, r in reversed(list(zip(names, radix)))]
        else:
            dims.append((d, e))
    guard = tuple(Atom(a.expr.subst(sub), a.lo, a.hi) for a in p.guard)
    guard += tuple(Atom(Aff.var(name), lo if lo > 0 else None, hi + 1 if hi < r - 1 else None)
                   for name, (lo, hi), r in zip(names, hull, radix)
                   if lo > 0 or hi < r - 1)
    return p.with_(dims=tuple(dims), out_index=tuple(a.subst(sub) for a in p.out_index),
                   body=subst_expr(p.body, sub), guard=guard,
                   skip=tuple(Atom(a.expr.subst(sub), a.lo, a.hi) for a in p.skip))


__all__ = ["restrict_to_demand"]



def _narrowable(k: Kernel) -> dict[str, int]:
    """Loop variables of ``k`` its guards bound from above, with the extent they allow: a
    reduction variable (the points cut contribute the identity; not for an arg-max or
    arg-min, whose index counts every reduction point), or an output variable that is one
    coordinate of the output index by itself (``t[i + c]``), so cutting it drops whole rows
    of the write and nothing in between."""
    if k.loop is not None or k.lib or k.scatter:
        return {}
    alone = set()
    for e in k.out_index:
        if len(e.terms) == 1 and e.terms[0][1] == 1:
            alone.add(e.terms[0][0])
    uses = [v for e in k.out_index for v, _ in e.terms]
    rng = _var_ranges(k)
    out = {}
    for v, n in k.dims:
        m = max(1, min(n, rng[v][1] + 1))
        if v not in k.out_vars and k.reduce in ("argmax", "argmin"):
            continue
        if m < n and (v not in k.out_vars or (v in alone and uses.count(v) == 1)):
            out[v] = m
    return out


def _box(k: Kernel, acc: Access, dims) -> list[tuple[int, int]] | None:
    """Each coordinate's range of ``acc`` over ``k``'s loop nest (``dims``, and the
    sequential loop's variable); None for a data-dependent index."""
    if not all(isinstance(e, Aff) for e in acc.index):
        return None
    rng = {v: (0, n - 1) for v, n in dims}
    if k.loop is not None:
        rng[k.loop[0]] = (0, k.loop[1] - 1)
    return [_bounds(e, rng) for e in acc.index]


def shrink_to_demand(kernels: list[Kernel], tensors: list,
                     compared: dict[str, int] | None = None) -> tuple[list[Kernel], list]:
    """Kernels and tensor declarations that hold only what confined kernels touch.

    After :func:`restrict_to_demand` (or a slice's guard on an output's rows), a kernel's
    points outside its guards compute nothing anyone reads. Here a loop variable its guards
    bound from above gets that bound as its extent (see :func:`_narrowable`), unless what
    the kernel writes is needed in the rows cut: read there by a kernel (a guard that means
    something, ``x[i] if i < 3 else -inf``), or a program output compared there (its first
    ``compared[name]`` rows, every other coordinate whole; all of it when not named). Then
    each intermediate tensor is declared as the box its accesses touch (from 0; only its
    upper ends shrink). An executor then allocates and visits the demanded region only: the
    same values there, a smaller program.

    Left whole: tensors a sequential loop, a library routine or a scatter touches, any read
    or written through a data-dependent index, reached below 0 or past the end (padding a
    guard stands in for), or touched by no kernel. ``tensors`` are
    :class:`~.model.TensorDecl`; only intermediates shrink.

    >>> from solbound.ir.model import Access, Kernel, TensorDecl
    >>> i, j = Aff.var("i"), Aff.var("j")
    >>> sq = Kernel("sq", (("i", 8), ("j", 8)), "t", (i, j), Access("x", (i, j)),
    ...             guard=(Atom(i, None, 2),))
    >>> rows = Kernel("rows", (("i", 8), ("j", 8)), "y", (i,), Access("t", (i, j)),
    ...               reduce="sum", guard=(Atom(i, None, 2),))
    >>> decl = [TensorDecl("x", (8, 8), "f32", "input"), TensorDecl("t", (8, 8), "f32"),
    ...         TensorDecl("y", (8,), "f32", "output")]
    >>> ks, ts = shrink_to_demand([sq, rows], decl, {"y": 2})
    >>> [k.dims for k in ks], [t.shape for t in ts]
    ([(('i', 2), ('j', 8)), (('i', 2), ('j', 8))], [(8, 8), (2, 8), (8,)])
    """
    from dataclasses import replace
    compared = compared or {}
    decl = {t.name: t for t in tensors}
    ks = list(kernels)
    cut = {pos: _narrowable(k) for pos, k in enumerate(ks)}
    cut = {pos: c for pos, c in cut.items() if c}

    def dims(pos):
        c = cut.get(pos, {})
        return tuple((v, c.get(v, n)) for v, n in ks[pos].dims)

    readers: dict[str, list[tuple[int, Access]]] = {}
    for pos, k in enumerate(ks):
        for a in kernel_reads(k):
            readers.setdefault(a.tensor, []).append((pos, a))

    def needed(t: str):
        """The boxes of ``t`` something needs: each reader's, and a program output's
        compared region."""
        for r, a in readers.get(t, ()):
            yield _box(ks[r], a, dims(r))
        d = decl.get(t)
        if d is not None and d.role != "intermediate" and d.shape:
            rows = compared.get(t, d.shape[0])
            yield [(0, rows - 1)] + [(0, n - 1) for n in d.shape[1:]]

    changed = True
    while changed:               # a cut undone widens its reads: check the rest again
        changed = False
        for pos in list(cut):
            k = ks[pos]
            for o in k.outputs:
                whole = _box(k, Access(o, k.out_index), k.dims)
                kept = _box(k, Access(o, k.out_index), dims(pos))
                if any(got is None or any(g[1] > kp[1] and g[0] <= w[1]
                                          for g, kp, w in zip(got, kept, whole))
                       for got in needed(o)):
                    del cut[pos]
                    changed = True
                    break
    out = [ks[pos].with_(dims=dims(pos)) if pos in cut else k for pos, k in enumerate(ks)]
    decl = {t.name: t for t in tensors}
    whole_t: set[str] = set()
    top: dict[str, list[int]] = {}
    for k in out:
        acc = list(kernel_reads(k)) + [Access(o, k.out_index) for o in k.outputs]
        if k.loop is not None or k.lib or k.scatter:
            whole_t.update(a.tensor for a in acc)
            continue
        for a in acc:
            t = decl.get(a.tensor)
            if t is None or a.tensor in whole_t:
                continue
            box = _box(k, a, k.dims) if len(a.index) == len(t.shape) else None
            if box is None or any(lo < 0 or hi >= n for (lo, hi), n in zip(box, t.shape)):
                whole_t.add(a.tensor)
                continue
            hi = top.setdefault(a.tensor, [0] * len(t.shape))
            for d, (_, h) in enumerate(box):
                hi[d] = max(hi[d], h)
    shrunk = [replace(t, shape=tuple(h + 1 for h in top[t.name]))
              if t.role == "intermediate" and t.name in top and t.name not in whole_t else t
              for t in tensors]
    return out, shrunk
