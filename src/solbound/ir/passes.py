"""Frontend-neutral passes over a lowered :class:`~solbound.ir.model.Program`.

* :func:`flatten_bases` declares bases addressed as flat storage one-dimensional and
  linearizes every access to them (a reshape no loop split makes affine);
* :func:`prune_dead` drops kernels whose outputs nothing reads (dead code after a
  decomposition), keeping kernels that update DRAM state in place.

Every frontend runs them on the program it builds.
"""

from __future__ import annotations

from .affine import Aff
from .model import EXTERNAL_ROLES, Access, Call, Program, TensorDecl, kernel_reads, loop_segments


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
    for k in p.kernels:         # copies of a product's result carry it (views made real)
        if isinstance(k.body, Access) and k.body.tensor in products and not k.reduce:
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


def refine(p: Program, constants: dict | None = None) -> tuple[Program, set[str], list[str]]:
    """The known-value and demand passes a frontend runs on the program it built: masks
    known before the run (data-free tensors and what is computed from ``constants``, the
    values of the program's constant tensors, folded) become guards, producers compute only
    what their readers read. Returns (program, tensors computed only where read, data-free
    masks no fact describes: counted dense)."""
    from .demand import restrict_to_demand
    from .fold import fold_report
    from .known import propagate_known
    folded, dense = fold_report(p, constants=constants)
    shapes = {t.name: t.shape for t in p.tensors}
    bools = frozenset(t.name for t in p.tensors if t.dtype == "bool")
    kernels = propagate_known(list(p.kernels), shapes, {}, folded, bools=bools)
    p = prune_dead(Program(p.tensors, tuple(kernels), p.notes))
    whole = list(p.kernels)
    kernels = restrict_to_demand(whole, {t.name for t in p.by_role("intermediate")})
    partial = {k.out for k, w in zip(kernels, whole) if k.guard != w.guard}
    return Program(p.tensors, tuple(kernels), p.notes), partial, dense
