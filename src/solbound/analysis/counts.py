"""Mechanical counts from the einsum graph: MACs, FLOPs per unit, DRAM bytes.

* ``points`` = |I|, the guarded iteration-space size (exact).
* FLOPs = points x (distinct scalar ops in the body, plus one accumulation per
  point when the kernel reduces or scans). Identical sub-expressions are
  computed once (structural CSE). A contraction (``sum(a*b)`` tagged as a
  matmul/conv/attention) is ``points`` MACs = ``2*points`` matrix FLOPs.
* Bytes: the exact footprint of each access times the element size.
  *Unfused*: each framework operator (kernel group) reads the footprint of
  every tensor it consumes from outside the group and writes every tensor it
  produces that is read outside the group or is a program output.
  *Fused*: program inputs, parameters, buffers and constants are read once
  (their footprint), program outputs written once.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ..graph.einsum import MATRIX_UNITS, Einsum, Graph, _strip_cast, lift
from ..ir.model import (DRAM_ROLES, EXTERNAL_ROLES, MATRIX, SCALAR_OPS, SFU_OPS, SPECIAL, VECTOR, Access,
                        Call, Kernel, per_iteration_loops, walk)
from ..ir.affine import Atom
from .footprint import Footprint, access_footprint, domain_size


@dataclass
class KernelCounts:
    name: str
    op: str
    opname: str
    src: str
    kind: str
    points: int
    macs: int
    flops: dict[str, int]            # unit -> FLOPs (matrix, vector, special)
    matrix_class: str                # matmul | conv | attention | "" (for the precision policy)
    dtype: str                       # dtype of the matrix operands or of the output
    reads: dict[str, list[tuple[tuple, Footprint]]]   # tensor -> (access key, footprint)
    writes: dict[str, Footprint]
    einsum: str
    ops_per_point: dict[str, int]
    sfu_per_point: int = 0
    # the SFU ops per point by function (``exp``: 1): which of them an FMA-pipe emulation
    # may take over (``bounds/special.py``)
    sfu_ops: dict[str, int] = field(default_factory=dict)

    @property
    def total_flops(self) -> int:
        return sum(self.flops.values())


class CountError(ValueError):
    """A count this module cannot make exactly (the message names the operator)."""


# real FLOPs of one complex operation (a complex product is 4 multiplies and 2 adds; a
# quotient, 6 multiplies, 3 adds and 2 divisions)
COMPLEX_FLOPS = {"mul": 6, "add": 2, "sub": 2, "neg": 2, "div": 11}


def _body_ops(k: Kernel, cplx: bool = False) -> tuple[dict[str, int], dict[str, int]]:
    """Distinct scalar ops per unit (structural CSE), and those that use the SFU, by
    function. In a kernel computing complex values, arithmetic counts its real FLOPs."""
    seen: set = set()
    per_unit: dict[str, int] = defaultdict(int)
    sfu: dict[str, int] = defaultdict(int)
    for e in walk(k.body):
        if isinstance(e, Call) and e not in seen:
            seen.add(e)
            unit = SCALAR_OPS[e.op][1]
            if unit is not None:
                per_unit[unit] += COMPLEX_FLOPS.get(e.op, 1) if cplx else 1
            if e.op in SFU_OPS:
                sfu[e.op] += 1
    return dict(per_unit), dict(sfu)


def _access_key(acc: Access, ext: dict[str, int], guard) -> tuple:
    """A name-independent key: equal keys touch the same elements."""
    order: dict[str, str] = {}

    def ren(a):
        if isinstance(a, Access):
            return (a.tensor, tuple(ren(i) for i in a.index))
        for v in a.vars:
            order.setdefault(v, f"v{len(order)}")
        return str(a.rename(order))
    idx = ren(acc)
    atoms = tuple(sorted(str(type(a)(a.expr.rename(order), a.lo, a.hi)) for a in guard
                         if set(a.expr.vars) <= set(order)))
    coupled = any(set(a.expr.vars) & set(order) and not set(a.expr.vars) <= set(order)
                  for a in guard)
    return (idx, tuple(ext[v] for v in order), atoms, coupled and str(guard))


def union_elements(sizes, numel: int) -> int:
    """Elements of a tensor that distinct footprints of these sizes touch: all of it if
    one covers it, else their sum capped at its size (exact when they are disjoint)."""
    total = 0
    for n in sizes:
        if n >= numel:
            return numel
        total += n
    return min(numel, total)


def _union(fps: list[Footprint], numel: int) -> Footprint:
    """Union of distinct footprints of one tensor (:func:`union_elements`), with whether
    it is exact."""
    if not fps:
        return Footprint(0, True)
    if any(f.elements >= numel for f in fps):
        return Footprint(numel, all(f.exact for f in fps))
    if len(fps) == 1:
        return fps[0]
    return Footprint(union_elements((f.elements for f in fps), numel), False,
                     "union of partial footprints taken as their sum (exact if disjoint)")


# narrower first: the precision a contraction runs at is its narrowest operand's
_WIDTH = {"f8e4m3": 1, "f8e5m2": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "f16": 2, "bf16": 2,
          "f32": 4, "f64": 8}


def program_dtypes(g: Graph) -> dict[str, str]:
    """The precision of each tensor *in the program*, not in its decomposition.

    A framework operator's decomposition may widen its operands (the CPU
    decomposition of a bf16 ``scaled_dot_product_attention`` computes in fp32); the
    library kernel it stands for runs at the precision of the operator's own inputs.
    A tensor produced inside an operator therefore carries the narrowest float
    precision of what its kernel reads, through the operator's own intermediates, down
    to the tensors the operator receives, or its own when that is narrower (a
    ``linear`` under ``torch.autocast`` casts its fp32 operands to bf16 and multiplies
    in bf16). Constants (no float reads) carry none.
    """
    tensors = g.program.tensor_map
    origin: dict[str, str] = {}
    # a copy that widens a 16-bit float to fp32 (``q.float()``) carries its source's
    # precision to whoever reads it: a training step's graph holds the CPU decomposition
    # of attention as separate operators (``bmm`` of upcast bf16 operands, fp32 score
    # gradients times upcast keys), which a GPU runs in bf16 (a dequantizing copy of fp8
    # weights to bf16 is not one: the product runs at bf16)
    copies = {o for n in g.nodes if n.kernel.reduce is None and len(n.operands) == 1
              and isinstance(_strip_cast(n.kernel.body), Access)
              and tensors[n.operands[0].tensor].dtype in ("bf16", "f16")
              for o in n.kernel.outputs if tensors[o].dtype == "f32"}
    for n in g.nodes:
        k = n.kernel
        best = None
        for acc in n.operands:
            t = acc.tensor
            inside = (bool(k.op) and any(g.nodes[i].kernel.op == k.op
                                         for i in g.producers.get(t, ()))) or \
                (t in copies and t in origin)
            dt = origin.get(t) if inside else tensors[t].dtype
            if dt in _WIDTH and (best is None or _WIDTH[dt] < _WIDTH[best]):
                best = dt
        for o in k.outputs:
            own = tensors[o].dtype
            if best is not None and own in _WIDTH and _WIDTH[own] < _WIDTH[best]:
                best = own          # a narrowing cast inside the operator (autocast's)
            if best is not None and tensors[o].dtype in _WIDTH:
                prev = origin.get(o)
                origin[o] = best if prev is None or _WIDTH[best] < _WIDTH[prev] else prev
    return origin


def _is_product(e) -> bool:
    e = _strip_cast(e)
    return (isinstance(e, Call) and e.op == "mul"
            and all(isinstance(_strip_cast(a), (Access, Call)) for a in e.args))


def _sums_of_products(g: Graph, kcs: list[KernelCounts]) -> None:
    """One definition of a MAC: every multiply-add of a sum of products, whether the
    product and the sum are one kernel (``sum(x * x)``) or an elementwise product summed
    by the next kernel (``(x ** 2).mean()``, ``x ** 2`` being ``x * x``), or products added
    into place by a scatter (``out.index_add_(0, top, w * y)``, a mixture of experts'
    weighted combine). The sum's points are then MACs (its adds were already counted as
    FLOPs: a MAC is 2 FLOPs either way)."""
    summed: set[str] = set()
    for i, n in enumerate(g.nodes):
        k = n.kernel
        if n.kind not in ("reduction", "scatter") or k.reduce != "sum" or kcs[i].macs:
            continue
        body = _strip_cast(k.body)
        if n.kind == "scatter" and _is_product(body):
            kcs[i].macs = kcs[i].points
            continue
        if not isinstance(body, Access) or body.indirect:
            continue
        src = body.tensor
        prod = g.producers.get(src, [])
        # through copies and casts (a product cast to the output's dtype, then added)
        for _ in range(4):
            if len(prod) != 1 or g.nodes[prod[0]].kind != "map":
                break
            inner = _strip_cast(g.nodes[prod[0]].kernel.body)
            if not isinstance(inner, Access) or inner.indirect \
                    or kcs[prod[0]].points != kcs[i].points:
                break
            src = inner.tensor
            prod = g.producers.get(src, [])
        # a product summed by several reductions is one set of multiplies: the first sum
        # that reads it whole carries the MACs, the others are plain additions
        if len(prod) == 1 and g.nodes[prod[0]].kind == "map" \
                and _is_product(g.nodes[prod[0]].kernel.body) and src not in summed \
                and kcs[i].points == kcs[prod[0]].points:
            summed.add(src)
            kcs[i].macs = kcs[i].points


def count_kernel(n: Einsum, tensors, origin: dict[str, str] | None = None) -> KernelCounts:
    k = n.kernel
    ext = k.count_extents
    try:
        points = domain_size(ext, k.guard)
        if k.skip and points:
            # points whose value is known without their operands (model.Kernel.skip)
            points -= domain_size(ext, k.guard + k.skip)
    except OverflowError as e:
        raise CountError(f"{k.opname or k.op or k.name}"
                         f"{f' at {k.src}' if k.src else ''}: {e}") from None
    body, sfu = _body_ops(k, tensors[k.out].dtype in ("c64", "c128"))
    flops: dict[str, int] = {MATRIX: 0, VECTOR: 0, SPECIAL: 0}
    macs = 0
    matrix_class = ""
    dtype = tensors[k.out].dtype
    if n.kind == "library":
        from ..ir.library import routine_cost
        names = list(dict.fromkeys(a.tensor for a in n.operands))
        cost = routine_cost(k.lib[0], [tensors[t].shape for t in names], k.lib_params)
        for unit, c in cost.items():
            flops[unit] += c
        if flops[MATRIX]:
            matrix_class, macs = "matmul", flops[MATRIX] // 2
        if names:
            dtype = tensors[names[0]].dtype
        points = tensors[k.out].numel
        per_point = {}
        sfu = {}
    elif n.kind == "contraction":
        macs = points
        # the precision of the program's own operands (narrowest of the two)
        dts = [(origin or {}).get(x.tensor) or tensors[x.tensor].dtype
               for x in (_strip_cast(a) for a in k.body.args)]
        dts = [d for d in dts if d in _WIDTH] or dts
        dtype = min(dts, key=lambda d: _WIDTH.get(d, 9))
        if k.unit in MATRIX_UNITS:
            matrix_class = k.unit
            flops[MATRIX] += 2 * points
        else:
            flops[VECTOR] += 2 * points
        per_point = {MATRIX if matrix_class else VECTOR: 2}
        sfu = {}
    else:
        for unit, c in body.items():
            flops[unit] += c * points
        per_point = dict(body)
        if k.reduce is not None:
            flops[VECTOR] += points
            per_point[VECTOR] = per_point.get(VECTOR, 0) + 1
            if k.reduce == "sum" and isinstance(k.body, Call) and k.body.op == "mul":
                macs = points
    # footprints: distinct accesses per tensor (none at all when no point runs: an
    # expert that receives no token reads none of its weights)
    reads: dict[str, list[tuple[tuple, Footprint]]] = defaultdict(list)
    for acc in (n.operands if points else ()):
        t = tensors[acc.tensor]
        key = _access_key(acc, ext, k.guard)
        if all(key != kk for kk, _ in reads[acc.tensor]):
            reads[acc.tensor].append((key, access_footprint(acc, t.shape, ext, k.guard)))
    reads = dict(reads)
    writes = {}
    for o in (k.outputs if points else ()):
        t = tensors[o]
        writes[o] = access_footprint(Access(o, k.out_index), t.shape, ext, ())
    return KernelCounts(k.name, k.op or k.name, k.opname, k.src, n.kind, points, macs, flops,
                        matrix_class, dtype, reads, writes, n.signature, per_point,
                        sum(sfu.values()), sfu)


@dataclass
class Traffic:
    bytes: int
    reads: dict[str, int]            # tensor -> bytes
    writes: dict[str, int]
    exact: bool = True
    notes: list[str] = field(default_factory=list)


@dataclass
class GroupCounts:
    op: str
    opname: str
    src: str
    kernels: list[int]
    macs: int
    flops: dict[str, int]
    traffic: Traffic                 # unfused traffic of this operator


@dataclass
class ProgramCounts:
    kernels: list[KernelCounts]
    groups: list[GroupCounts]
    macs: int
    flops: dict[str, int]
    unfused: Traffic
    fused: Traffic
    collectives: list["Collective"] = field(default_factory=list)


@dataclass(frozen=True)
class Collective:
    """One collective kernel of a rank's program (``ir/collectives.py``): ``bytes`` is its
    payload per rank and call, ``calls`` how often it runs (a loop's trip count)."""

    kind: str
    bytes: int
    ranks: int
    calls: int
    kernel: str
    op: str          # the framework operator's node (its group)
    opname: str
    src: str
    group: tuple = ()
    reduce: str = ""
    perm: tuple = ()          # a permute's (source, destination) positions

    @property
    def members(self) -> tuple[int, ...]:
        """Rank 0's group as global ranks (the whole world when the kernel names none)."""
        return self.group or tuple(range(self.ranks))


def collectives(g: Graph, kcs: list[KernelCounts]) -> list[Collective]:
    """Every collective of the program, in program order; the operand's size is the
    elements the kernel reads (a view of a larger tensor moves only itself)."""
    from ..ir.collectives import is_collective
    tensors = g.program.tensor_map
    out = []
    for n, kc in zip(g.nodes, kcs):
        k = n.kernel
        if not (k.lib and is_collective(k.lib[0])):
            continue
        p = k.lib_params
        read = sum(fp.elements for lst in kc.reads.values() for _, fp in lst)
        wrote = sum(fp.elements for fp in kc.writes.values())
        # an all-reduce confined to the rows its readers need (``ir/demand.py``) moves
        # those rows (its operand's); other kinds move the larger of operand and result
        moved = read if k.lib[0] == "all_reduce" and k.guard else max(read, wrote)
        nbytes = moved * tensors[k.out].itemsize
        out.append(Collective(k.lib[0], nbytes, int(p.get("ranks", 1)),
                              k.loop[1] if k.loop is not None else 1, k.name, k.op,
                              k.opname, k.src, tuple(p.get("group") or ()),
                              p.get("op", "") if k.lib[0] in ("all_reduce", "reduce_scatter") else "",
                              tuple(tuple(x) for x in p.get("perm", ()))))
    return out


def _traffic(kcs: list[KernelCounts], idxs: list[int], tensors, read_filter, write_filter) -> Traffic:
    reads: dict[str, list[Footprint]] = defaultdict(list)
    writes: dict[str, list[Footprint]] = defaultdict(list)
    for i in idxs:
        for t, lst in kcs[i].reads.items():
            if read_filter(t):
                reads[t].extend(lst)
        for t, fp in kcs[i].writes.items():
            if write_filter(t):
                writes[t].append(fp)
    rb, wb, exact, notes = {}, {}, True, []
    for t, fps in reads.items():
        u = _union(_dedupe(fps), tensors[t].numel)
        rb[t] = u.elements * tensors[t].itemsize
        exact &= u.exact
        if u.note and u.note not in notes:
            notes.append(f"{t}: {u.note}")
    for t, fps in writes.items():
        u = _union(fps, tensors[t].numel)
        wb[t] = u.elements * tensors[t].itemsize
    return Traffic(sum(rb.values()) + sum(wb.values()), rb, wb, exact, notes)


def _dedupe(fps: list[tuple[tuple, Footprint]]) -> list[Footprint]:
    """Accesses with the same key touch the same elements: count them once."""
    seen: dict[tuple, Footprint] = {}
    for key, fp in fps:
        seen.setdefault(key, fp)
    return list(seen.values())


def _reads_after_writes(g: Graph, fused: Traffic, updated: set[str]) -> None:
    """With an infinite on-chip buffer, what the program wrote into DRAM state (a new
    KV-cache row) and then reads back (attention over the cache, new row included) is
    read from chip, not DRAM: subtract the part of each read inside earlier writes'
    regions (boxes: a slice write's region is one). Rows a scatter wrote (a cache row
    placed at a run-time position) are taken as read back from chip by any later read,
    direct or at run-time positions, up to their number: the bound may only err low."""
    tensors = g.program.tensor_map
    for t in sorted(updated):
        boxes: list[tuple[int, tuple]] = []       # (writer position, box atoms over x_d)
        scattered = 0                             # elements written at run-time positions
        before = 0          # elements read before (or by) the first scatter: from DRAM
        seen: set = set()
        saved = 0
        for pos, n in enumerate(g.nodes):
            k = n.kernel
            ext = k.count_extents
            for acc in n.operands:
                if acc.tensor != t or not (boxes or scattered) \
                        or (acc.indirect and not scattered):
                    continue
                key = _access_key(acc, ext, k.guard)
                if key in seen:
                    continue
                seen.add(key)
                shape = tensors[t].shape
                for _, box in (boxes if not acc.indirect else ()):
                    atoms = tuple(Atom(e, lo, hi + 1) for e, (lo, hi) in zip(acc.index, box))
                    saved += access_footprint(acc, shape, ext, k.guard + atoms).elements
                if scattered:
                    saved += min(scattered, access_footprint(acc, shape, ext, k.guard).elements)
            if not scattered:
                before += sum(access_footprint(a, tensors[t].shape, ext, k.guard).elements
                              for a in n.operands if a.tensor == t)
            if t in k.outputs and k.out == t and k.scatter:
                scattered += access_footprint(Access(t, k.out_index), tensors[t].shape,
                                              ext, ()).elements
            # a write region that is a box (unit-stride or constant coordinates); a strided
            # write (every other row) is not subtracted: its box would overstate it
            if t in k.outputs and k.out == t and not k.scatter and all(
                    len(e.terms) == 0 or (len(e.terms) == 1 and abs(e.terms[0][1]) == 1)
                    for e in k.out_index):
                boxes.append((pos, tuple(e.bounds(ext) for e in k.out_index)))
        if saved:
            # what was read before a scatter wrote (the values it adds to) stays a DRAM read
            floor = min(before, tensors[t].numel) * tensors[t].itemsize if scattered else 0
            b = min(saved * tensors[t].itemsize, max(0, fused.reads.get(t, 0) - floor))
            fused.reads[t] = fused.reads.get(t, 0) - b
            fused.bytes -= b


def _per_iteration(g: Graph, idxs: list[int], looped: set) -> tuple[str, int] | None:
    """An operator called once per iteration of a sequential loop (``looped``:
    ``ir.model.per_iteration_loops``, a rerolled layer's ``linear``): its eager calls each
    move their own operands, so its unfused traffic is the sum over iterations. An operator
    that is the whole loop (an LSTM, a JAX ``scan``) is one library call."""
    loops = {g.nodes[i].kernel.loop for i in idxs}
    if len(loops) != 1:
        return None
    (loop,) = loops
    return (loop[0], loop[1]) if loop in looped else None


def _iterated_traffic(g: Graph, idxs, loop: tuple[str, int], tensors, origin,
                      inside: set[int]) -> Traffic:
    """Unfused traffic of an operator called in every iteration: the traffic of its
    unrolled copy (``ir.reroll.one_iteration``: the loop variable bound, each loop-indexed
    slice a tensor of its own), summed over iterations (one iteration times the trip count
    when the variable is in no guard: the footprints are then the same in every one)."""
    from ..ir.reroll import one_iteration
    var, trip = loop
    steady = not any(var in a.expr.vars for i in idxs
                     for a in g.nodes[i].kernel.guard + g.nodes[i].kernel.skip)
    total = None
    for it in ([0] if steady else range(trip)):
        ks, sliced = one_iteration([g.nodes[i].kernel for i in idxs], tensors, it)
        tmap = {**tensors, **sliced}
        sub = {i: count_kernel(lift(k), tmap, origin) for i, k in zip(idxs, ks)}
        produced = {o for k in ks for o in k.outputs}

        def read_f(t, produced=produced):
            return t not in produced

        def write_f(t, tmap=tmap):
            return tmap[t].role == "output" or any(
                c not in inside for c in g.consumers.get(t.split("@")[0], []))
        tr = _traffic(sub, idxs, tmap, read_f, write_f)
        if total is None:
            total = tr
            continue
        total.bytes += tr.bytes
        for t, b in tr.reads.items():
            total.reads[t] = total.reads.get(t, 0) + b
        for t, b in tr.writes.items():
            total.writes[t] = total.writes.get(t, 0) + b
        total.exact &= tr.exact
    if steady:
        total.bytes *= trip
        total.reads = {t: b * trip for t, b in total.reads.items()}
        total.writes = {t: b * trip for t, b in total.writes.items()}
    return total


def count_program(g: Graph) -> ProgramCounts:
    tensors = g.program.tensor_map
    origin = program_dtypes(g)
    looped = per_iteration_loops(g.program.kernels)
    kcs = [count_kernel(n, tensors, origin) for n in g.nodes]
    _sums_of_products(g, kcs)
    groups = []
    for op, idxs in g.groups.items():
        inside = set(idxs)
        produced_here = {o for i in idxs for o in g.nodes[i].kernel.outputs}

        def read_f(t, produced_here=produced_here):
            return t not in produced_here

        def write_f(t, inside=inside):
            if tensors[t].role == "output":
                return True
            return any(c not in inside for c in g.consumers.get(t, []))
        per_iter = _per_iteration(g, idxs, looped)
        if per_iter is None:
            tr = _traffic(kcs, idxs, tensors, read_f, write_f)
        else:
            tr = _iterated_traffic(g, idxs, per_iter, tensors, origin, inside)
        flops = {u: sum(kcs[i].flops[u] for i in idxs) for u in (MATRIX, VECTOR, SPECIAL)}
        first = kcs[idxs[0]]
        groups.append(GroupCounts(op, first.opname, first.src, idxs,
                                  sum(kcs[i].macs for i in idxs), flops, tr))
    all_idx = list(range(len(kcs)))
    # DRAM state updated in place (a KV-cache buffer): its written region is traffic
    updated = {o for n in g.nodes for o in n.kernel.outputs if tensors[o].role in EXTERNAL_ROLES}
    fused = _traffic(kcs, all_idx, tensors, lambda t: tensors[t].role in DRAM_ROLES,
                     lambda t: tensors[t].role == "output" or t in updated)
    if updated:
        _reads_after_writes(g, fused, updated)
    unfused = Traffic(sum(gc.traffic.bytes for gc in groups), {}, {},
                      all(gc.traffic.exact for gc in groups),
                      [n for gc in groups for n in gc.traffic.notes])
    flops = {u: sum(k.flops[u] for k in kcs) for u in (MATRIX, VECTOR, SPECIAL)}
    return ProgramCounts(kcs, groups, sum(k.macs for k in kcs), flops, unfused, fused,
                         collectives(g, kcs))
