"""The cache-aware fused traffic: the least DRAM traffic of a program on a chip whose
on-chip buffer holds ``S`` bytes, minimized over a family of fused, tiled schedules
(Orojenesis-style; the nest model and its search are ``analysis/tiling.py``).

The family:

* The program's kernels, in program order, are cut into **segments** of consecutive
  kernels (every cut is tried, by dynamic programming; a segment spans at most
  ``MAX_SEGMENT`` kernels). A segment's nest is searched only when moving its operands
  once could still beat the best schedule found for its last kernel: no schedule moves
  less than that, so skipping the others changes nothing but the time.
* A segment of **one kernel** is one tiled loop nest over its loop dimensions, reductions
  included (a reduction loop outside the output's innermost loop spills partial sums).
* A segment of **several kernels** tiles the loop dimensions that are free (not reduced)
  in every one of its kernels and aligned through its intermediates (a producer's output
  coordinate read at the same coordinate by one loop variable of the consumer), and the
  first kernel's reductions, whose tile loops run inside all the others (its consumers
  see only complete sums), and the last kernel's reductions of dimensions the others keep
  (nothing in the segment reads those sums: they accumulate in its output tile); every
  other dimension is held whole inside a tile. A matmul and its epilogue tile over the output;
  two chained products (attention's ``(q k^T) v``) tile over the rows they share, the
  intermediate's row tile held on chip. Intermediates produced and consumed inside a
  segment cost capacity, never traffic; a segment with no such dimension must fit whole.
* A segment without a contraction that has reuse (``_reuse``) moves its external operands
  once, whatever the capacity: maps, reductions, scans and routines are streamed by
  compilers, which recompute rather than store and rewrite multi-pass statistics into one
  pass. Only what reuse forces is charged: a contraction's re-reads, and the spill of its
  result where no fused tile holds it.
* Kernels the nest model does not describe (library routines, scatters, scans, sequential
  loops, reads at run-time positions) move their operands once, and fuse with a
  contraction only by fitting whole.
* Tensors from before a segment are read by it; tensors it produces that are used after it,
  program outputs and updated state are written. What the kernel just before a segment
  read or wrote is still on chip when the segment starts, up to the capacity: the segment
  reads it from there (a cache keeps what was touched last). An intermediate no larger than
  the buffer crosses a segment boundary on chip (not written, not read back).

The result is reported as the fused traffic plus the extra traffic of the best schedule
(its re-reads and spills) over the same accounting with an unbounded buffer: so it is never
below the fused traffic, equals it once the program fits, and never rises with capacity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ..graph.einsum import Graph
from ..ir.classify import product_factors
from ..ir.model import DRAM_ROLES, Access, Idx, Program, loop_segments, per_iteration_loops, walk
from .counts import ProgramCounts, union_elements
from .tiling import Nest, Operand, best_traffic

MAX_SEGMENT = 12


@dataclass
class Segment:
    first: int
    last: int
    bytes: float
    tiles: dict[str, int] = field(default_factory=dict)
    order: tuple[str, ...] = ()
    exact: bool = True


@dataclass
class CacheTraffic:
    capacity: int
    bytes: int                       # fused + extra
    extra: int                       # re-reads and spills over the unbounded-buffer traffic
    segments: list[Segment]
    exact: bool                      # every nest searched exhaustively
    explanation: str = ""


def _reuse(g: Graph, i: int) -> bool:
    """A contraction with reuse: it sums over a dimension and some operand does not vary
    along one of its loop dimensions (a matmul's A along n), so a finite buffer forces
    re-reads whatever the schedule (the I/O lower bounds of such products)."""
    k = g.nodes[i].kernel
    if k.reduce != "sum" or not _plain(g, i):
        return False
    factors = product_factors(k)
    if factors is None:
        return False
    loop = {v for v, e in k.dims if e > 1}

    def varies(e) -> set[str]:
        out: set[str] = set()
        for x in walk(e):
            if isinstance(x, Access):
                out.update(v for a in x.index if not isinstance(a, Access) for v in a.vars)
            elif isinstance(x, Idx):
                out.update(x.expr.vars)
        return out
    # each factor is constant along some loop dimension the other moves along
    return all(loop - varies(f) for f in factors)


def _plain(g: Graph, i: int) -> bool:
    k = g.nodes[i].kernel
    return not (k.lib or k.scatter or k.scan or k.loop is not None or k.out2 is not None
                or any(a.indirect for a in g.nodes[i].operands))


class _Find:
    def __init__(self):
        self.parent: dict = {}

    def find(self, x):
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a, b) -> None:
        self.parent[self.find(a)] = self.find(b)


class ProgramCache:
    """Segments of one program: their nests, solved once per capacity."""

    #: skip the nest search of a segment whose operands moved once already cost more than
    #: the best schedule found (off only to measure what that saves)
    prune = True

    def __init__(self, g: Graph, pc: ProgramCounts):
        self.g, self.pc = g, pc
        self.tensors = g.program.tensor_map
        self.n = len(g.nodes)
        self.plain = [_plain(g, i) for i in range(self.n)]
        self.reuse = [_reuse(g, i) for i in range(self.n)]
        # the first kernel of the run of kernels without reuse that ends at each kernel
        self.run_start = []
        for i in range(self.n):
            self.run_start.append(i if self.reuse[i] else
                                  (self.run_start[i - 1] if i and not self.reuse[i - 1] else i))
        self.loops = _loop_bodies(g)
        # a sequential loop is one segment of the program (its body is scheduled on its
        # own, below): position -> (first, last) of its loop
        self.loop_span: dict[int, tuple[int, int]] = {}
        looped = per_iteration_loops(g.program.kernels)
        i = 0
        for seg in loop_segments(g.program.kernels):
            if seg[0].loop in looped:
                for m in range(i, i + len(seg)):
                    self.loop_span[m] = (i, i + len(seg) - 1)
            i += len(seg)
        self._nests: dict[tuple[int, int], Nest | None] = {}
        self._segments: dict[tuple[int, int], tuple[dict, dict]] = {}
        self._traffic: dict[int, CacheTraffic] = {}
        self._solved: dict[tuple, object] = {}
        self._per_kernel: list | None = None
        kernels = [node.kernel for node in g.nodes]
        self._ext = [k.extents for k in kernels]
        self._cext = [k.count_extents for k in kernels]
        self._consumers: dict[str, tuple[int, int, bool]] = {}

    # --- segment structure ---------------------------------------------------------
    def _io(self, i: int, j: int) -> tuple[dict, dict]:
        """What kernels i..j read from outside the segment and what they write, computed
        once per segment: (tensor -> ([(kernel, access)], bytes of the union of its
        footprints), tensor -> (kind, [kernel], bytes)). A tensor is read from outside when
        it was produced before the segment or is a program input or state; a written tensor
        is ``out`` when used after the segment (or a program output, or DRAM state), else
        ``mid``."""
        seg = self._segments.get((i, j))
        if seg is not None:
            return seg
        if self._per_kernel is None:
            self._prepare()
        reads: dict[str, list] = {}
        keys: dict[str, dict] = {}
        produced: set[str] = set()
        for m in range(i, j + 1):
            kreads, kkeys, outs, _ = self._per_kernel[m]
            for t, lst in kreads.items():
                if t not in produced:
                    reads.setdefault(t, []).extend(lst)
                    ks = keys.get(t)
                    if ks is None:
                        keys[t] = dict(kkeys[t])
                    else:
                        for key, n in kkeys[t].items():
                            ks.setdefault(key, n)
            produced.update(outs)
        ext = {}
        for t, lst in reads.items():
            d = self.tensors[t]
            ext[t] = (lst, union_elements(keys[t].values(), d.numel) * d.itemsize)
        writes: dict[str, tuple[str, list]] = {}
        for m in range(i, j + 1):
            for t, n in self._per_kernel[m][3]:
                lo, hi, dram = self._consumers[t]
                later = hi > j or lo < i
                kind = "out" if (dram or later) else "mid"
                prev = writes.get(t)
                if prev is None:
                    writes[t] = (kind, [m], [n])
                else:
                    prev[1].append(m)
                    prev[2].append(n)
                    if kind == "out" and prev[0] != "out":
                        writes[t] = ("out", prev[1], prev[2])
        out = {}
        for t, (kind, ms, ns) in writes.items():
            d = self.tensors[t]
            out[t] = (kind, ms, union_elements(ns, d.numel) * d.itemsize)
        self._segments[(i, j)] = (ext, out)
        return ext, out

    def _prepare(self) -> None:
        """Per kernel, once: its reads as (kernel, access) pairs and distinct footprints
        by key, its outputs, its writes' footprint sizes; per tensor, the first and last
        kernel that consumes it and whether it must reach DRAM."""
        per = []
        for m in range(self.n):
            node, kc = self.g.nodes[m], self.pc.kernels[m]
            accs = {a.tensor: a for a in node.operands}
            kreads, kkeys = {}, {}
            for t, lst in kc.reads.items():
                kreads[t] = [(m, accs.get(t)) for _ in lst]
                ks: dict = {}
                for key, fp in lst:
                    ks.setdefault(key, fp.elements)
                kkeys[t] = ks
            writes = [(t, fp.elements) for t, fp in kc.writes.items()]
            per.append((kreads, kkeys, tuple(node.kernel.outputs), writes))
        self._per_kernel = per
        self._consumers = {}
        for m in range(self.n):
            for t, _ in per[m][3]:
                if t in self._consumers:
                    continue
                d = self.tensors[t]
                cs = self.g.consumers.get(t, [])
                self._consumers[t] = (min(cs, default=self.n), max(cs, default=-1),
                                      d.role == "output" or d.role in DRAM_ROLES)

    def _classes(self, i: int, j: int):
        """Loop-dimension classes of kernels i..j: (find structure, tiled class -> extent)."""
        uf = _Find()
        nodes = [self.g.nodes[m] for m in range(i, j + 1)]
        if i == j:
            k = nodes[0].kernel
            return uf, {uf.find((i, v)): n for v, n in k.dims if n > 1}
        writer: dict[str, int] = {}
        for m in range(i, j + 1):
            k = self.g.nodes[m].kernel
            for a in self.g.nodes[m].operands:
                p = writer.get(a.tensor)
                if p is None:
                    continue
                pk = self.g.nodes[p].kernel
                for e_out, e_in in zip(pk.out_index, a.index):
                    if isinstance(e_out, Access) or isinstance(e_in, Access):
                        continue
                    vp, vq = e_out.single_var(), e_in.single_var()
                    if vp and vq and self._ext[p].get(vp) == self._ext[m].get(vq):
                        uf.union((p, vp), (m, vq))
            for o in k.outputs:
                writer[o] = m
        common = None
        for m in range(i, j + 1):
            k = self.g.nodes[m].kernel
            if m not in (i, j) and all(n == 1 for _, n in k.dims):
                continue                  # a scalar in the middle (a constant) constrains nothing
            ext = self._ext[m]
            free = {uf.find((m, v)): ext[v] for v in k._out_vars if ext.get(v, 1) > 1}
            if m == j and self.plain[m]:
                # the last kernel may reduce a dimension the others keep: nothing in the
                # segment reads its sums, which accumulate in its output tile
                free.update({uf.find((m, v)): n for v, n in k.dims
                             if v not in k._out_vars and n > 1})
            common = free if common is None else {c: n for c, n in common.items()
                                                 if free.get(c) == n}
        return uf, common or {}

    def nest(self, i: int, j: int) -> Nest | None:
        """The loop nest of segment i..j (``None``: a single kernel the model does not
        describe, which moves its operands once)."""
        if (i, j) in self._nests:
            return self._nests[(i, j)]
        if i == j and not self.plain[i]:
            self._nests[(i, j)] = None
            return None
        uf, tiled = self._classes(i, j)
        inner = {}
        if i < j and self.plain[i]:
            # the first kernel's reductions, tiled inside every other loop: its consumers
            # in the segment read only complete sums
            k0 = self.g.nodes[i].kernel
            inner = {uf.find((i, v)): n for v, n in k0.dims
                     if v not in k0._out_vars and n > 1}
            tiled = {**tiled, **inner}
        names = {c: f"t{n}" for n, c in enumerate(sorted(tiled, key=str))}
        ops: list[Operand] = []
        itemsize = 1

        def coords(m: int, index) -> tuple:
            cext = self._cext[m]
            out = []
            for e in index:
                if isinstance(e, Access):
                    out.append(())
                    continue
                entry, extra = [], 0
                for v, c in e.terms:
                    cls = uf.find((m, v))
                    if cls in names and self.plain[m]:
                        entry.append((names[cls], c))
                    else:
                        extra += abs(c) * (cext.get(v, 1) - 1)
                if entry and extra:
                    entry.append(("", extra))
                out.append(tuple(entry))
            return tuple(out)

        ext, written = self._io(i, j)
        for t, (accs, nbytes) in ext.items():
            d = self.tensors[t]
            # the access that indexes the most tiled dimensions (fewest re-reads)
            cs, most, seen = (), -1, set()
            for m, a in accs:
                if a is None or (m, id(a)) in seen:
                    continue
                seen.add((m, id(a)))
                c = coords(m, a.index)
                n = len({x for e in c for x, _ in e if x})
                if n > most:
                    cs, most = c, n
            ops.append(Operand(t, nbytes, "in", cs,
                               tuple(d.shape) if len(d.shape) == len(cs) else ()))
            itemsize = max(itemsize, d.itemsize)
        for t, (kind, writers, nbytes) in written.items():
            d = self.tensors[t]
            m = writers[-1]
            cs = coords(m, self.g.nodes[m].kernel.out_index)
            ops.append(Operand(t, nbytes, kind, cs,
                               tuple(d.shape) if len(d.shape) == len(cs) else ()))
            itemsize = max(itemsize, d.itemsize)
        dims = tuple((names[c], n) for c, n in sorted(tiled.items(), key=lambda x: names[x[0]]))
        nest = Nest(dims, tuple(ops), itemsize, tuple(sorted(names[c] for c in inner)))
        self._nests[(i, j)] = nest
        return nest

    def once(self, i: int, j: int) -> int:
        """Traffic of segment i..j with an unbounded buffer: external reads and writes once."""
        ext, written = self._io(i, j)
        return sum(b for _, b in ext.values()) + \
            sum(b for kind, _, b in written.values() if kind == "out")

    def carried(self, i: int, j: int, capacity: float) -> float:
        """Bytes segment i..j reads that the kernel before it just read or wrote, up to the
        capacity: still on chip when the segment starts (a cache keeps what was touched
        last), so not read from DRAM again."""
        if i == 0:
            return 0.0
        touched = set(self.pc.kernels[i - 1].reads) | set(self.pc.kernels[i - 1].writes)
        ext, _ = self._io(i, j)
        b = sum(nbytes for t, (_, nbytes) in ext.items()
                if t in touched and not self._crosses(t, capacity))
        return float(min(capacity, b))

    def _crosses(self, t: str, capacity: float) -> bool:
        d = self.tensors[t]
        return d.role == "intermediate" and d.nbytes <= capacity

    def crossing(self, i: int, j: int, capacity: float) -> float:
        """Intermediates no larger than the buffer cross a segment boundary on chip: the
        segment neither writes those it hands to later segments nor reads those it gets
        from earlier ones (optimistic where several are live at once: the bound errs low)."""
        ext, written = self._io(i, j)
        return float(sum(b for t, (_, b) in ext.items() if self._crosses(t, capacity))
                     + sum(b for t, (kind, _, b) in written.items()
                           if kind == "out" and self._crosses(t, capacity)))

    def solve(self, i: int, j: int, capacity: float):
        if i in self.loop_span:
            # a whole loop: what crosses its boundary, once (its body's re-reads and
            # spills are charged per iteration in ``traffic``)
            return Segment(i, j, self.once(i, j))
        if not any(self.reuse[i:j + 1]):
            # maps, reductions, scans and routines: a compiler streams them in one pass
            # (recomputing what it does not keep, rewriting multi-pass statistics into one),
            # so they move their external operands once whatever the capacity
            return Segment(i, j, self.once(i, j))
        nest = self.nest(i, j)
        if nest is None:
            return Segment(i, j, self.once(i, j))
        key = (nest_key(nest), capacity)
        r = self._solved.get(key)
        if r is None:
            r = best_traffic(nest, capacity)
            self._solved[key] = r
        return Segment(i, j, r.bytes, r.tiles, r.order, r.exact)

    # --- the program ----------------------------------------------------------------------
    def traffic(self, capacity: int) -> CacheTraffic:
        fused = self.pc.fused.bytes
        if self.n == 0:
            return CacheTraffic(capacity, fused, 0, [], True, "no kernels")
        if capacity in self._traffic:
            return self._traffic[capacity]
        base = self.once(0, self.n - 1)
        best: list[tuple[float, list[Segment]]] = [(0.0, [])]
        for j in range(self.n):
            cand = (math.inf, [])
            starts = list(range(j, max(-1, j - MAX_SEGMENT), -1))
            if self.run_start[j] < j - MAX_SEGMENT + 1 and (j + 1 == self.n or self.reuse[j + 1]):
                starts.append(self.run_start[j])    # a whole run without reuse, at its end
            span = self.loop_span.get(j)
            if span is not None:       # a loop is a segment of its own, whole
                starts = [span[0]] if j == span[1] else []
            else:
                starts = [i for i in starts if i not in self.loop_span]
            for i in starts:
                saved = self.carried(i, j, capacity) + self.crossing(i, j, capacity)
                if self.prune and best[i][0] + self.once(i, j) - saved >= cand[0]:
                    # no schedule of i..j moves less than its operands once: it cannot
                    # beat the candidate, so its nest is not searched
                    continue
                seg = self.solve(i, j, capacity)
                total = best[i][0] + seg.bytes - saved
                if total < cand[0]:
                    cand = (total, best[i][1] + [seg])
            best.append(cand)
        total, segs = best[self.n]
        if total == math.inf:
            raise ValueError(f"no schedule fits in {capacity} bytes")
        extra = max(0, int(math.ceil(total - base)))
        exact = all(s.exact for s in segs)
        looped = 0
        for trip, body, carry_in in self.loops:
            t = body.traffic(capacity)
            # the value carried in from the previous iteration is read from DRAM as the
            # unrolled program reads the previous layer's output, unless it stays on chip
            carried = sum(body.tensors[c].nbytes for c in carry_in
                          if body.tensors[c].nbytes > capacity)
            looped += trip * (t.extra + carried)
            exact &= t.exact
        extra += looped
        fused_segments = sum(1 for s in segs if s.last > s.first)
        expl = (f"{len(segs)} segment(s) ({fused_segments} fusing several kernels), "
                f"{extra:,} B of re-reads and spills over the fused traffic with "
                f"{_mib(capacity)} on chip")
        if self.loops:
            expl += (f" ({looped:,} B of them in {len(self.loops)} sequential loop(s), "
                     f"their body scheduled once and charged per iteration)")
        self._traffic[capacity] = CacheTraffic(capacity, fused + extra, extra, segs, exact, expl)
        return self._traffic[capacity]

    def capacities(self, start: int = 64 << 10) -> list[int]:
        """Powers of two from ``start`` up to the first where the traffic meets the fused
        traffic (the x axis of a ski-slope curve)."""
        caps, c = [], start
        while True:
            caps.append(c)
            if self.traffic(c).extra == 0 or c >= (1 << 40):
                return caps
            c *= 2


def _loop_bodies(g: Graph) -> list[tuple[int, "ProgramCache", list[str]]]:
    """Each loop of several operators (``ir.model.per_iteration_loops``: a rerolled stack
    of layers) whose iterations all have the same footprints (its variable in no guard) as
    (trip count, the cache model of one iteration's body, the slices carried in): the body
    is scheduled like any kernels, and its re-reads and spills are paid in every
    iteration. The loop's kernels themselves move their operands once in the enclosing
    program, so nothing is charged twice."""
    from ..graph.einsum import build_graph
    from ..ir.reroll import one_iteration
    from .counts import count_program
    out = []
    looped = per_iteration_loops(g.program.kernels)
    for seg in loop_segments(g.program.kernels):
        if seg[0].loop not in looped:
            continue
        var, trip, _ = seg[0].loop
        if any(var in a.expr.vars for k in seg for a in k.guard + k.skip):
            continue
        ks, sliced = one_iteration(seg, g.program.tensor_map)
        # a slice the body writes (the carried residual, a kept cache) is used by another
        # iteration or after the loop: it leaves the body as an output does
        written = {o for k in ks for o in k.outputs}
        decls = tuple(replace(d, role="output") if d.name in written else d
                      for d in sliced.values())
        # slices of a tensor the body also writes (row l of the history it writes at l + 1)
        carry_in = [n for n in sliced if n not in written
                    and any(w.split("@")[0] == n.split("@")[0] for w in written)]
        body = Program(g.program.tensors + decls, tuple(ks))
        bg = build_graph(body)
        out.append((trip, ProgramCache(bg, count_program(bg)), carry_in))
    return out


def nest_key(nest: Nest) -> tuple:
    """A key for a nest's solution that ignores tensor names."""
    return (nest.dims, tuple((o.nbytes, o.kind, o.coords, o.spans) for o in nest.operands),
            nest.itemsize, nest.inner)


def _mib(b: float) -> str:
    return f"{b / 2**20:.4g} MiB" if b >= 2**20 else f"{b / 2**10:.4g} KiB"


__all__ = ["ProgramCache", "CacheTraffic", "Segment", "MAX_SEGMENT"]
