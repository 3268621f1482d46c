"""Frontend-neutral passes over a lowered :class:`~solbound.ir.model.Program`.

* :func:`flatten_bases` declares bases addressed as flat storage one-dimensional and
  linearizes every access to them (a reshape no loop split makes affine);
* :func:`prune_dead` drops kernels whose outputs nothing reads (dead code after a
  decomposition), keeping kernels that update DRAM state in place;
* :func:`mask_inputs` finds the integer inputs used only as masks (taken to hold 0 or 1);
* :func:`refine` runs the fold, known-value and demand passes; :func:`runtime_mask_notes`
  names the inputs a mask is computed from whose values only the run knows.

Every frontend runs them on the program it builds.
"""

from __future__ import annotations

from .affine import Aff
from .model import (EXTERNAL_ROLES, Access, Call, Const, Program, TensorDecl, kernel_reads,
                    loop_segments)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides of ``shape`` (a size-0 dimension counts as 1)."""
    st, acc = [], 1
    for s in reversed(shape):
        st.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(st))


class FlatIndirectError(Exception):
    """A base addressed as flat storage and through a data-dependent index."""


def _linear(index: tuple, shape: tuple[int, ...], name: str) -> tuple[Aff]:
    flat = Aff.lit(0)
    for e, st in zip(index, contiguous_strides(shape)):
        if isinstance(e, Access):
            raise FlatIndirectError(name)
        flat = flat + e * st
    return (flat,)


def flatten_bases(p: Program, names: set[str]) -> Program:
    """Declare the bases in ``names`` one-dimensional and linearize every access to them
    (row-major: the same storage, so values and footprints are unchanged)."""
    if not names:
        return p
    names = set(names)
    changed = True
    while changed:      # a kernel's two outputs (argmax and its value) share one index
        changed = False
        for k in p.kernels:
            if k.out2 is not None and (k.out in names) != (k.out2 in names):
                names |= {k.out, k.out2}
                changed = True
    shapes = {t.name: t.shape for t in p.tensors if t.name in names}

    def fix(e):
        if isinstance(e, Access):
            idx = tuple(fix(i) if isinstance(i, Access) else i for i in e.index)
            if e.tensor in shapes and len(idx) != 1:
                idx = _linear(idx, shapes[e.tensor], e.tensor)
            return Access(e.tensor, idx)
        if isinstance(e, Call):
            return Call(e.op, tuple(fix(a) for a in e.args))
        return e

    kernels = []
    for k in p.kernels:
        out_index = tuple(fix(i) if isinstance(i, Access) else i for i in k.out_index)
        if k.out in shapes and len(out_index) != 1:
            out_index = _linear(out_index, shapes[k.out], k.out)
        kernels.append(k.with_(out_index=out_index, body=fix(k.body)))
    tensors = tuple(TensorDecl(t.name, (t.numel,), t.dtype, t.role) if t.name in shapes else t
                    for t in p.tensors)
    return Program(tensors, tuple(kernels), p.notes)


def prune_dead(p: Program) -> Program:
    """Drop kernels whose outputs nobody reads (dead code after decomposition)."""
    live = {t.name for t in p.tensors if t.role == "output"}
    # a kernel that updates DRAM state in place (a KV-cache write into a buffer) is live
    external = {t.name for t in p.tensors if t.role in EXTERNAL_ROLES}
    live |= {o for k in p.kernels for o in k.outputs if o in external}
    # a sequential loop's body reads, in the next iteration, what later kernels of the
    # body write: liveness over it runs to a fixed point
    kept: set[int] = set()
    for seg in reversed(loop_segments(p.kernels)):
        changed = True
        while changed:
            changed = False
            for k in reversed(seg):
                if id(k) not in kept and any(o in live for o in k.outputs):
                    kept.add(id(k))
                    live.update(k.outputs)
                    live.update(a.tensor for a in kernel_reads(k))
                    changed = True
            if seg[0].loop is None:
                break
    keep = [k for k in p.kernels if id(k) in kept]
    used = live | {t.name for t in p.tensors if t.role != "intermediate"}
    tensors = tuple(t for t in p.tensors if t.name in used)
    return Program(tensors, tuple(keep), p.notes)


def _value_reads(e) -> list[Access]:
    """The accesses whose values an expression uses, not those inside an access's index."""
    if isinstance(e, Access):
        return [e]
    if isinstance(e, Call):
        return [a for x in e.args for a in _value_reads(x)]
    return []


def _only_constants_besides(e) -> bool:
    """Every leaf of ``e`` is an access or a constant (no index value, no draw)."""
    if isinstance(e, Call):
        return e.op != "rand" and all(_only_constants_besides(a) for a in e.args)
    return isinstance(e, (Access, Const))


def runtime_mask_notes(p: Program, seeded=frozenset(), noted: tuple[str, ...] = ()) -> list[str]:
    """Notes naming the inputs (and buffers) that may mask work but whose values only the
    run knows: what they may mask is counted, and the note says so. ``seeded``: tensors
    whose values the frontend stated (not named); ``noted``: notes already made.

    * an input combined, in one kernel, with attention scores (an additive mask), and any
      boolean input;
    * the integer and boolean inputs a mask is computed from, where the mask is combined
      with a product's result (the product, or a copy of it: a reshape or transpose JAX
      materializes), found through integer and boolean producers (a gather's index is not a
      mask: indices inside an access are not followed)."""
    from .model import accesses
    notes: list[str] = []
    scores = {k.out for k in p.kernels if k.unit == "attention"}
    with_scores = set()
    for k in p.kernels:
        reads = {a.tensor for a in accesses(k.body)}
        if reads & scores:
            with_scores |= reads
    for t in p.by_role("input"):
        if t.dtype == "bool" or t.name in with_scores:
            notes.append(f"assumption: input {t.name} is known only at run time: work it "
                         f"may mask is counted dense (a mask built from indices in the "
                         f"program, a causal flag, or a constant would be skipped)")
    products = {k.out for k in p.kernels if k.unit}
    for k in p.kernels:
        # copies of a product's result carry it (views made real), and so do its scalings
        # by constants (``scores * scale`` before the mask, a cast)
        reads = {a.tensor for a in _value_reads(k.body)}
        if not k.reduce and not k.scatter and len(reads) == 1 and reads <= products \
                and _only_constants_besides(k.body):
            products.add(k.out)
    writers: dict[str, list] = {}
    with_products: set[str] = set()
    for k in p.kernels:
        writers.setdefault(k.out, []).append(k)
        reads = {a.tensor for a in _value_reads(k.body)}
        if reads & products:
            with_products |= reads - products
    tmap = p.tensor_map
    ints = ("i64", "i32", "u32", "i16", "i8", "u8", "bool")
    todo, seen = list(with_products), set()
    while todo:
        t = todo.pop()
        if t in seen:
            continue
        seen.add(t)
        for k in writers.get(t, ()):
            todo.extend(a.tensor for a in _value_reads(k.body)
                        if a.tensor not in products and tmap[a.tensor].dtype in ints)
    done = tuple(noted) + tuple(notes)
    for t in sorted(seen):
        d = tmap[t]
        if d.role in ("buffer", "input") and t not in seeded and d.dtype in ints:
            if not any(n.startswith(f"assumption: input {t} ") for n in done):
                notes.append(f"assumption: {d.role} {t} is known only at run time and a mask "
                             f"is computed from it: the work it may mask is counted dense")
    return notes


INT_DTYPES = ("i64", "i32", "u32", "i16", "i8", "u8")
# integer ops under which a 0/1 value combines with another mask (``min(padding, causal)``)
_MASK_COMBINE = ("minimum", "maximum", "mul", "and", "or")
_COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")
_BAD = "bad"


def _mask_use(e, chain: set[str], combined: list) -> str | None:
    """How ``e`` uses the tensors of ``chain`` (an integer input and what is computed from
    it): ``None`` not at all; ``"bool"`` only through a boolean made of it (a conversion to
    bool, a comparison with a constant); ``"int"`` as an integer combined with other masks
    (minimum, maximum, product, bitwise and/or, integer conversions, a select's branch);
    ``"bad"`` any other way (arithmetic, a float conversion, an index). ``combined`` gets
    True when an integer of ``chain`` is combined with something else."""
    if isinstance(e, Access):
        if any(isinstance(i, Access) and _mask_use(i, chain, combined) for i in e.index):
            return _BAD         # an index: its values are positions, not a mask
        return "int" if e.tensor in chain else None
    if not isinstance(e, Call):
        return None
    uses = [_mask_use(a, chain, combined) for a in e.args]
    if _BAD in uses:
        return _BAD
    live = [u == "int" for u in uses]
    if not any(live):
        return None             # booleans made of the chain are booleans: any use is fine
    op = e.op
    if op == "to_bool" or (op in _COMPARE and all(
            isinstance(a, Const) for a, u in zip(e.args, live) if not u)):
        return "bool"
    if op in _MASK_COMBINE:
        if not all(live):
            combined.append(True)
        return "int"
    if op.startswith("to_") and op[3:] in INT_DTYPES:
        return "int"
    if op == "select" and not live[0]:
        if not all(live[1:]):
            combined.append(True)
        return "int"
    return _BAD


def mask_inputs(p: Program) -> list[str]:
    """Integer inputs the program uses only as masks: every use of their values is a
    minimum, maximum, product or bitwise and/or with another mask (or an integer
    conversion) that ends in a boolean (a conversion to bool, a comparison with a
    constant), and at least one use combines them with another mask. keras-hub's
    ``padding_mask`` (int32) is one: ``min(int(padding), causal) != 0``. Such an input is
    taken to hold 0 or 1 (what a mask holds: then ``min(padding, 0)`` is 0, so the causal
    triangle is kept whatever the padding); a negative value would keep pairs it then
    counts as masked, so each one is stated as an assumption."""
    from .model import accesses
    tmap = p.tensor_map
    readers: dict[str, list] = {}
    for k in p.kernels:
        for t in {a.tensor for a in kernel_reads(k)}:
            readers.setdefault(t, []).append(k)
        for i in k.out_index:
            if isinstance(i, Access):       # a scatter's position: not a mask
                for a in accesses(i):
                    readers.setdefault(a.tensor, []).append(None)
    found = []
    for t in p.by_role("input"):
        if t.dtype not in INT_DTYPES:
            continue
        chain, todo, combined, ok = {t.name}, [t.name], [], True
        while todo and ok:
            s = todo.pop()
            if tmap[s].role == "output":
                ok = False
                break
            for k in readers.get(s, ()):
                if k is None or k.reduce or k.scan or k.scatter or k.lib or k.out2:
                    ok = False
                    break
                use = _mask_use(k.body, chain, combined)
                if use == _BAD or (use == "int" and tmap[k.out].dtype not in INT_DTYPES):
                    ok = False
                    break
                if use == "int" and k.out not in chain:
                    chain.add(k.out)
                    todo.append(k.out)
        if ok and combined:
            found.append(t.name)
    return found


def refine(p: Program, constants: dict | None = None,
           masks: list[str] | None = None) -> tuple[Program, set[str], list[str]]:
    """The known-value and demand passes a frontend runs on the program it built: masks
    known before the run (data-free tensors and what is computed from ``constants``, the
    values of the program's constant tensors, folded) become guards, producers compute only
    what their readers read; ``masks``: the integer inputs taken to hold 0 or 1
    (``mask_inputs``, found here when not given). Returns (program, tensors computed only
    where read, data-free masks no fact describes: counted dense)."""
    from .demand import restrict_to_demand
    from .fold import fold_report, over_limit_notes, still_read
    from .known import propagate_known, undecided_notes
    folded, dense = fold_report(p, constants=constants)
    before = p
    shapes = {t.name: t.shape for t in p.tensors}
    masks = mask_inputs(p) if masks is None else masks
    bools = frozenset(t.name for t in p.tensors if t.dtype == "bool") | frozenset(masks)
    undecided: list = []
    described: set = set()
    integers = frozenset(t.name for t in p.tensors if t.dtype[:1] in ("i", "u"))
    kernels = propagate_known(list(p.kernels), shapes, {}, folded, bools=bools,
                              undecided=undecided, described=described, integers=integers)
    notes = p.notes + tuple(undecided_notes(undecided)) + tuple(
        f"assumption: integer input {t} is used only as a mask (combined with another mask "
        f"by minimum, maximum or product, then made a boolean): taken to hold 0 or 1, so "
        f"what the other mask masks stays masked (a negative value would keep it)"
        for t in masks)
    p = prune_dead(Program(p.tensors, tuple(kernels), notes))
    p = Program(p.tensors, p.kernels, p.notes + tuple(over_limit_notes(before, p, constants, described)))
    dense = [t for t in still_read(dense, p) if t not in described]
    whole = list(p.kernels)
    kernels = restrict_to_demand(whole, {t.name for t in p.by_role("intermediate")})
    partial = {k.out for k, w in zip(kernels, whole) if k.guard != w.guard}
    return Program(p.tensors, tuple(kernels), p.notes), partial, dense
