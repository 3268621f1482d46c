"""Rerolling: consecutive copies of one loop body, which tracing unrolled, become one IR
sequential loop (pure functions over the IR; no framework).

A frontend that traced ``k >= 2`` copies of a repeated structure (a stack of identical
layers, iterations of a Python loop) hands :func:`reroll` the kernels of each copy. Copy
``c`` must be copy 0 with tensors renamed: the same kernels in the same order, with the same
loop nests, indices, guards, bodies and operators. Each tensor copy 0 touches (a *slot*) then
has one image per copy, and its images say what it is in the loop:

* **shared**: the same tensor in every copy, only read (a causal mask, rotary tables);
* **stacked**: a different external tensor per copy (the layers' weights): one tensor
  ``[trip, ...]`` read at ``[l, ...]``;
* **carried**: read by copy ``c + 1`` where copy ``c`` wrote it (the residual stream): one
  history tensor ``[trip + 1, ...]``, the body reading ``[l]`` and writing ``[l + 1]``; the
  value from before the loop is ``[0]``, the last copy's ``[trip]``;
* **kept**: written by every copy and read after it or returned (a layer's KV cache): one
  tensor ``[trip, ...]`` written at ``[l]``;
* **private**: written afresh by every copy and read only inside it: copy 0's tensor, not
  indexed by the loop variable (``model.loop_private``).

Copy 1 may also read other rows of a tensor than copy 0 at constants that differ (the
backward of layer 0 reads what the forward kept for layer 0, after layer 1's read layer 1's):
the index becomes affine in the loop variable (``f[1 - l]``), from two copies only.
:func:`extend` then runs loops rerolled from two traced copies over all of them, anchoring
each row at the first or the last copy; :func:`find_copies` finds two copies by structure
where no module path says which kernels are whose (a training step's backward).

``trip`` may exceed ``k``: the loop then runs the body ``trip`` times, which is right when the
untraced copies are the same program as the traced ones (the caller's claim, which it states
and which validation checks on the real program). What is read outside the loop from the
copies is then the first copy's or the last copy's (``[0]``, ``[trip - 1]``, ``[trip]``);
anything else is refused. Counts of the rerolled program over ``k`` iterations equal the
unrolled program's (tests/test_reroll.py).

>>> from solbound.ir.text import parse_program
>>> p = parse_program('''# solbound IR v1
... x = input(f32[4])
... w_0 = parameter(f32[4])
... w_1 = parameter(f32[4])
... h = intermediate(f32[4])
... h1 = intermediate(f32[4])
... h2 = intermediate(f32[4])
... y = output(f32[4])
...
... @kernel(i=4)
... def a():
...     h[i] = x[i] * 2.0
...
... @kernel(i=4)
... def b():
...     h1[i] = h[i] * w_0[i]
...
... @kernel(i=4)
... def c():
...     h2[i] = h1[i] * w_1[i]
...
... @kernel(i=4)
... def d():
...     y[i] = h2[i] + 1.0
... ''')
>>> q, info = reroll(p, [[1], [2]], trip=6)
>>> info.trip, sorted(info.stacked), [t.shape for t in q.tensors if t.name == 'w_x']
(6, ['w_x'], [(6, 4)])
>>> from solbound.ir.text import print_access, print_expr
>>> for k in q.kernels:
...     print(k.loop, print_access(Access(k.out, k.out_index)), '=', print_expr(k.body))
None h_carry[0, i] = x[i] * 2.0
('l', 6, 0) h_carry[l + 1, i] = h_carry[l, i] * w_x[l, i]
None y[i] = h_carry[6, i] + 1.0
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from .affine import Aff
from .model import (EXTERNAL_ROLES, Access, Call, Kernel, Program, TensorDecl, kernel_reads,
                    map_kernel_accesses)
from .text import fresh_name


class RerollError(ValueError):
    """The copies are not one body with renamed tensors; the message says where.
    ``kind``: ``"carry-in"`` (the value carried into the first copy is not an intermediate
    written before it, e.g. a program input) or ``"carry-out"`` (the last copy's carried
    value is a program output): unrolling the first or last copy lets the rest reroll."""

    def __init__(self, msg: str, kind: str = ""):
        super().__init__(msg)
        self.kind = kind


@dataclass
class Rerolled:
    """What :func:`reroll` made: the loop and the fate of each slot."""

    var: str
    trip: int
    traced: int
    loop_id: int
    body: list[str]                                   # kernel names of the body
    stacked: dict[str, list[str]] = field(default_factory=dict)   # new -> traced members
    kept: dict[str, list[str]] = field(default_factory=dict)      # new -> traced members
    carried: dict[str, list[str]] = field(default_factory=dict)   # new -> before, after each
    removed: set[str] = field(default_factory=set)    # tensors no longer in the program


def stacked_name(names: list[str], taken: set[str]) -> str:
    """A name for the tensor that stacks ``names``: the digit run that differs between the
    first two replaced by ``x`` (``w_layers_0_q`` -> ``w_layers_x_q``), else ``<first>_x``;
    made fresh in ``taken`` (``ir.text.fresh_name``), which it joins.

    >>> stacked_name(['p_layers_0_q_weight', 'p_layers_1_q_weight'], set())
    'p_layers_x_q_weight'
    >>> stacked_name(['add_3', 'add_9'], {'add_x'})
    'add_x_2'
    """
    a, b = names[0], names[1]
    ra, rb = re.split(r"(\d+)", a), re.split(r"(\d+)", b)
    base = f"{a}_x"
    if len(ra) == len(rb):
        diff = [i for i, (x, y) in enumerate(zip(ra, rb)) if x != y]
        if len(diff) == 1 and diff[0] % 2 == 1:
            head = "".join(ra[:diff[0]])
            sep = "_" if head and head[-1].isalpha() else ""
            base = head + sep + "x" + "".join(ra[diff[0] + 1:])
    return fresh_name(base, taken)


# ----------------------------------------------------------------------------
# matching copy c against copy 0


def _merge_index(x, y, lv: Aff, where: str, a, b):
    """One index position of copy 0 (``x``) and copy 1 (``y``): equal, or the same affine
    expression with constants that differ (copy 1 reads the next row: ``x + d * l``)."""
    if x == y:
        return x
    if isinstance(x, Aff) and isinstance(y, Aff) and x.terms == y.terms:
        return x + lv * (y.const - x.const)
    raise RerollError(f"{where}: index {a} vs {b}")


def _match_expr(a, b, sigma: dict[str, str], where: str, lv: Aff):
    """Copy 0's expression with copy 1's differences folded in (tensors paired in
    ``sigma``, index constants that differ made affine in the loop variable ``lv``)."""
    if type(a) is not type(b):
        raise RerollError(f"{where}: {a} vs {b}")
    if isinstance(a, Access):
        if len(a.index) != len(b.index):
            raise RerollError(f"{where}: {a} vs {b}")
        _pair(a.tensor, b.tensor, sigma, where)
        idx = []
        for x, y in zip(a.index, b.index):
            if isinstance(x, Access) or isinstance(y, Access):
                idx.append(_match_expr(x, y, sigma, where, lv))
            else:
                idx.append(_merge_index(x, y, lv, where, a, b))
        return Access(a.tensor, tuple(idx))
    if isinstance(a, Call):
        if a.op != b.op or len(a.args) != len(b.args):
            raise RerollError(f"{where}: {a.op} vs {b.op}")
        return Call(a.op, tuple(_match_expr(x, y, sigma, where, lv)
                                for x, y in zip(a.args, b.args)))
    if a != b:
        raise RerollError(f"{where}: {a} vs {b}")
    return a


def _pair(ta: str, tb: str, sigma: dict[str, str], where: str) -> None:
    if sigma.setdefault(ta, tb) != tb:
        raise RerollError(f"{where}: {ta} stands for both {sigma[ta]} and {tb}")


def _match_kernel(a: Kernel, b: Kernel, sigma: dict[str, str], lv: Aff) -> Kernel:
    """Copy 0's kernel ``a`` merged with copy 1's ``b`` (see :func:`_match_expr`)."""
    where = f"kernel {b.name} (against {a.name})"
    same = ("dims", "reduce", "guard", "fill", "scan", "opname", "unit", "lib")
    for f in same:
        if getattr(a, f) != getattr(b, f):
            raise RerollError(f"{where}: {f} differs")
    if a.loop is not None or b.loop is not None:
        raise RerollError(f"{where}: already inside a sequential loop")
    if (a.out2 is None) != (b.out2 is None):
        raise RerollError(f"{where}: outputs differ")
    out = _match_expr(Access(a.out, a.out_index), Access(b.out, b.out_index), sigma, where, lv)
    if a.out2 is not None:
        _pair(a.out2, b.out2, sigma, where)
    body = _match_expr(a.body, b.body, sigma, where, lv)
    return replace(a, out_index=out.index, body=body)


# ----------------------------------------------------------------------------
# rewriting accesses


def reroll(program: Program, copies: list[list[int]], trip: int | None = None,
           var: str = "l") -> tuple[Program, Rerolled]:
    """Fold the kernels of ``copies`` (lists of kernel positions, consecutive, copy 0
    first) into one sequential loop of ``trip`` iterations (default: the number of
    copies). Raises :class:`RerollError` naming the first kernel or tensor that does not
    fit (see the module doc)."""
    ks = list(program.kernels)
    k = len(copies)
    trip = k if trip is None else trip
    if k < 2 or trip < k:
        raise RerollError(f"{k} copies and {trip} iterations: nothing to reroll")
    n = len(copies[0])
    flat = [i for c in copies for i in c]
    if any(len(c) != n for c in copies) or n == 0 or flat != list(range(flat[0], flat[0] + k * n)):
        raise RerollError("the copies are not consecutive runs of equal length")
    start, end = flat[0], flat[-1] + 1
    var = fresh_name(var, {d for kk in ks for d, _ in kk.dims}
                     | {kk.loop[0] for kk in ks if kk.loop})
    lv = Aff.var(var)
    sigmas: list[dict[str, str]] = [{}]
    merged: list[Kernel] = []
    for c in range(1, k):
        sigma: dict[str, str] = {}
        for n_, (i, j) in enumerate(zip(copies[0], copies[c])):
            m = _match_kernel(ks[i], ks[j], sigma, lv)
            if c == 1:
                merged.append(m)
            elif m != merged[n_]:
                raise RerollError(f"kernel {ks[j].name}: indices that advance from copy to "
                                  f"copy are rerolled from two copies only")
        sigmas.append(sigma)
    for t in sigmas[1]:
        sigmas[0][t] = t
    tensors = program.tensor_map
    slots = list(sigmas[0])
    images = {t: [s[t] for s in sigmas] for t in slots}
    for t, im in images.items():
        if len(set(im)) not in (1, k):
            raise RerollError(f"tensor {t}: images {im} are neither one tensor nor one per copy")
        if any((tensors[x].shape, tensors[x].dtype) != (tensors[t].shape, tensors[t].dtype)
               for x in im):
            raise RerollError(f"tensor {t}: its images differ in shape or dtype")
    copy_of: dict[int, int] = {i: c for c, idx in enumerate(copies) for i in idx}
    writers: dict[str, set[int]] = {}
    readers: dict[str, set[int]] = {}
    for pos, kk in enumerate(ks):
        for o in kk.outputs:
            writers.setdefault(o, set()).add(pos)
        for a in kernel_reads(kk):
            readers.setdefault(a.tensor, set()).add(pos)
    written0 = {o for i in copies[0] for o in ks[i].outputs}
    # carries: a slot read by copy c + 1 that copy c wrote
    image_of_write = {im[c]: (w, c) for w, im in images.items() if w in written0
                      for c in range(k)}
    carry_in: dict[str, str] = {}             # read slot -> write slot
    for r, im in images.items():
        if r in written0 or len(set(im)) == 1:
            continue
        hits = [image_of_write.get(im[c]) for c in range(1, k)]
        if all(h is not None for h in hits):
            w = hits[0][0]
            if any(h != (w, c - 1) for c, h in zip(range(1, k), hits)):
                raise RerollError(f"tensor {r}: read from different writers across copies")
            carry_in[r] = w
        elif any(h is not None for h in hits):
            raise RerollError(f"tensor {r}: read from the previous copy in some copies only")
    carried_w = {w: r for r, w in carry_in.items()}
    if len(carried_w) != len(carry_in):
        raise RerollError("one tensor carried into two slots")
    taken = {t.name for t in program.tensors}
    info = Rerolled(var=var, trip=trip, traced=k,
                    loop_id=1 + max((kk.loop[2] for kk in ks if kk.loop), default=-1),
                    body=[ks[i].name for i in copies[0]])
    body_map: dict[str, tuple[str, Aff | None]] = {}   # slot -> (tensor, leading index)
    outside: dict[str, tuple[str, int]] = {}            # traced tensor -> (tensor, index)
    new_decls: dict[str, TensorDecl] = {}               # replaces the decl of its first member
    removed: set[str] = set()

    def outside_readers(x: str, c: int) -> set[int]:
        return {p for p in readers.get(x, ()) if copy_of.get(p) != c}

    def last_or_first(c: int, what: str) -> int:
        if c == 0:
            return 0
        if c == k - 1:
            return trip - 1
        raise RerollError(f"{what} of copy {c} is read outside the loop: only the first or "
                          f"the last copy's can be, when the loop runs more iterations")

    for t in slots:
        im = images[t]
        decl = tensors[t]
        if len(set(im)) == 1:
            # one tensor written by every copy: only at rows that advance with the loop
            if any(p in copy_of for p in writers.get(t, ())) and not all(
                    var in {v for e in m.out_index if isinstance(e, Aff) for v in e.vars}
                    for m in merged if t in m.outputs):
                raise RerollError(f"tensor {t}: the same tensor is written by every copy")
            body_map[t] = (t, None)
            continue
        if t in carried_w or t in carry_in:
            continue                                        # below
        if any(tensors[x].role != decl.role for x in im):
            raise RerollError(f"tensor {t}: its images differ in role")
        if t in written0:
            for c, x in enumerate(im):
                if any(copy_of.get(p) != c for p in writers.get(x, ())):
                    raise RerollError(f"tensor {x}: written outside copy {c}")
            read_out = [c for c, x in enumerate(im) if outside_readers(x, c)]
            if decl.role == "intermediate" and not read_out:
                body_map[t] = (t, None)                     # private
                removed.update(im[1:])
                continue
            if decl.role not in ("intermediate", "output"):
                raise RerollError(f"tensor {t} ({decl.role}): state written in place by every "
                                  f"copy")
            name = stacked_name(im, taken)
            new_decls[t] = TensorDecl(name, (trip,) + decl.shape, decl.dtype, decl.role)
            info.kept[name] = list(im)
            body_map[t] = (name, lv)
            for c in read_out:
                outside[im[c]] = (name, last_or_first(c, f"tensor {im[c]}"))
            removed.update(im)
            continue
        if decl.role not in EXTERNAL_ROLES:
            raise RerollError(f"tensor {t}: an intermediate from before the loop, one per copy")
        name = stacked_name(im, taken)
        for c, x in enumerate(im):
            if outside_readers(x, c):    # a weight the backward reads again
                outside[x] = (name, last_or_first(c, f"tensor {x}"))
        new_decls[t] = TensorDecl(name, (trip,) + decl.shape, decl.dtype, decl.role)
        info.stacked[name] = list(im)
        body_map[t] = (name, lv)
        removed.update(im)
    for r, w in carry_in.items():
        first = images[r][0]
        last = images[w][k - 1]
        decl = tensors[first]
        if decl.role != "intermediate" or not writers.get(first) or \
                any(p >= start for p in writers[first]):
            raise RerollError(f"tensor {first}: carried into the loop but not an intermediate "
                              f"written before it", "carry-in")
        if tensors[last].role != "intermediate":
            raise RerollError(f"tensor {last}: carried out of the loop as a {tensors[last].role}",
                              "carry-out")
        read_between = []
        for c in range(k - 1):
            x = images[w][c]
            if any(p not in (copies[c] + copies[c + 1]) for p in readers.get(x, ())):
                if trip != k:
                    raise RerollError(f"tensor {x}: carried from copy {c} but read elsewhere "
                                      f"too")
                read_between.append((x, c + 1))   # a residual the backward reads again
            if tensors[x].role != "intermediate":
                raise RerollError(f"tensor {x}: carried as a {tensors[x].role}")
        if any(copy_of.get(p, k - 1) != k - 1 for p in readers.get(last, ())):
            raise RerollError(f"tensor {last}: read by an earlier copy")
        name = stacked_name([first, last], set()) if first != last else first
        name = fresh_name(re.sub(r"_x(_\d+)?$", "", name) + "_carry", taken)
        new_decls[r] = TensorDecl(name, (trip + 1,) + decl.shape, decl.dtype, "intermediate")
        info.carried[name] = [first] + [images[w][c] for c in range(k)]
        body_map[r] = (name, lv)
        body_map[w] = (name, lv + 1)
        outside[first] = (name, 0)
        outside[last] = (name, trip)
        for x, row in read_between:
            outside[x] = (name, row)
        removed.update([first] + [images[w][c] for c in range(k)])

    def in_body(a: Access) -> Access:
        name, lead = body_map.get(a.tensor, (a.tensor, None))
        return Access(name, a.index if lead is None else (lead,) + a.index)

    def out_of_loop(a: Access) -> Access:
        if a.tensor in removed and a.tensor not in outside:
            raise RerollError(f"tensor {a.tensor}: read outside the loop")
        if a.tensor not in outside:
            return a
        name, i = outside[a.tensor]
        return Access(name, (Aff.lit(i),) + a.index)

    loop = (var, trip, info.loop_id)
    body = []
    for kk in merged:
        if kk.out2 is not None and body_map.get(kk.out2, (kk.out2, None))[1] is not None:
            raise RerollError(f"kernel {kk.name}: its second output {kk.out2} would need "
                              f"the loop's index")
        body.append(map_kernel_accesses(kk, in_body, loop=loop))
    prefix = [map_kernel_accesses(kk, out_of_loop) for kk in ks[:start]]
    suffix = [map_kernel_accesses(kk, out_of_loop) for kk in ks[end:]]
    # each new tensor takes the place of the declaration of its first member
    first_member = {images[slot][0]: d for slot, d in new_decls.items()}
    decls = [first_member.get(d.name, d) for d in program.tensors
             if d.name in first_member or d.name not in removed]
    info.removed = removed
    return Program(tuple(decls), tuple(prefix + body + suffix), program.notes), info


def one_iteration(kernels, tensors: dict[str, TensorDecl], it: int = 0):
    """The kernels of one loop body for iteration ``it``, as their unrolled copy would be:
    the loop variable bound, and each slice a loop-indexed tensor is read or written at
    (``h[l + 1, ...]``: a leading index of the loop variable plus a constant) a tensor of its
    own, ``h@1``, declared with the slice's shape (returned with the kernels). Reading
    ``h[l]`` and writing ``h[l + 1]`` are then two tensors, as in the unrolled program."""
    sliced: dict[str, TensorDecl] = {}

    def fn(var, a: Access) -> Access:
        lead = a.index[0] if a.index else None
        if isinstance(lead, Aff) and lead.vars == (var,) and lead.coef(var) == 1 \
                and a.tensor in tensors:
            d = tensors[a.tensor]
            name = f"{a.tensor}@{lead.const}"
            sliced.setdefault(name, TensorDecl(name, d.shape[1:], d.dtype, d.role))
            return Access(name, a.index[1:])
        return a
    out = []
    for k in kernels:
        var = k.loop[0]
        k = map_kernel_accesses(k, lambda a, var=var: fn(var, a))
        out.append(k.bind_loop(it))
    return out, sliced


def extend(program: Program, loops: set[int], traced: int, trip: int, stacked: set[str],
           carried: set[str]) -> Program:
    """Loops rerolled from ``traced`` copies (ids ``loops``) run ``trip`` iterations: their
    stacked and kept tensors (``stacked``) grow to ``trip`` rows, carried histories to
    ``trip + 1``. Each access's leading index is anchored at the start (``l + a``, a row
    from the first copies), at the end (``a - l``: a loop that walks the rows backwards, as a
    backward pass does; ``traced - 1`` or ``traced`` outside a loop: the last row), or at
    row 0; anything else is refused."""
    grow = trip - traced
    names = stacked | carried

    def lead(e, var: str | None, t: str, where: str) -> Aff:
        b = e.coef(var) if var else 0
        if set(e.vars) - ({var} if var else set()):
            raise RerollError(f"{where}: row {e} of {t} depends on another loop")
        a = e.const
        if b == 1:
            return e
        if b == -1:
            return e + grow
        if b == 0:
            if a == 0:
                return e
            if (t in stacked and a == traced - 1) or (t in carried and a == traced):
                return e + grow
        raise RerollError(f"{where}: row {e} of {t} is neither the first, the last nor one "
                          f"that advances with a loop")

    def fix(k: Kernel):
        var = k.loop[0] if k.loop is not None and k.loop[2] in loops else None

        def fn(a: Access) -> Access:
            if a.tensor in names:
                return Access(a.tensor, (lead(a.index[0], var, a.tensor, k.name),) + a.index[1:])
            if var is not None and any(isinstance(i, Aff) and var in i.vars for i in a.index):
                raise RerollError(f"kernel {k.name}: rows of {a.tensor} advance with the loop "
                                  f"past the copies traced")
            return a
        loop = (k.loop[0], trip, k.loop[2]) if var is not None else k.loop
        return map_kernel_accesses(k, fn, loop=loop)
    decls = []
    for d in program.tensors:
        if d.name in names:
            d = replace(d, shape=(d.shape[0] + grow,) + d.shape[1:])
        decls.append(d)
    return Program(tuple(decls), tuple(fix(k) for k in program.kernels), program.notes)


def find_copies(program: Program, lo: int, hi: int, min_len: int = 2, limit: int = 64):
    """Candidates for two consecutive copies of one body among kernels ``lo..hi - 1``: runs
    whose kernels have the same structure (up to tensor names and rows that advance), as
    pairs of position lists, the longest first and, for one length, every alignment inside
    a longer repeating run (a body may be found shifted where what precedes it looks like
    its end). Whether a candidate really is one body with renamed tensors is
    :func:`reroll`'s check; which alignment is the layer is the caller's."""
    tensors = program.tensor_map
    ids: dict = {}
    sig = [ids.setdefault(_kernel_shape(k, tensors), len(ids))
           for k in program.kernels[lo:hi]]
    n = len(sig)
    found = 0
    for m in range(n // 2, min_len - 1, -1):
        run = 0
        for i in range(n - m):
            run = run + 1 if sig[i] == sig[i + m] else 0
            if run >= m:
                a = lo + i - m + 1
                yield [list(range(a, a + m)), list(range(a + m, a + 2 * m))]
                found += 1
                if found >= limit:
                    return


def _kernel_shape(k: Kernel, tensors) -> tuple:
    """A kernel's structure with tensors replaced by their shapes and dtypes and indices by
    their terms without constants (rows that advance): equal for the kernels of two copies
    of one body."""
    def sub(e):
        if isinstance(e, Access):
            d = tensors[e.tensor]
            return ("A", d.shape, d.dtype,
                    tuple(sub(i) if isinstance(i, Access) else i.terms for i in e.index))
        if isinstance(e, Call):
            return (e.op, tuple(sub(a) for a in e.args))
        return str(e)
    return (k.dims, k.reduce, str(k.guard), str(k.skip), str(k.fill), k.scan, k.opname, k.unit, k.lib,
            k.out2 is None, sub(Access(k.out, k.out_index)), sub(k.body))
