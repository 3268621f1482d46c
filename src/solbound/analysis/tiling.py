"""Tiled loop nests with a finite on-chip buffer: the DRAM traffic of one nest, minimized
over its tile sizes and the order of its tile loops (pure functions over plain data).

A nest has loop dimensions (name, extent) and operands. Tile sizes ``t_d`` (not necessarily
dividing the extent) cut dimension ``d`` into ``q_d = ceil(n_d / t_d)`` tiles; the tile
loops run in some order (outermost first). With every operand's current tile held on chip
at once (their sizes add up to at most the capacity), an operand

* read (``kind="in"``) is fetched once per tile of its own dimensions, and again for every
  iteration of a tile loop that does not index it but runs outside one of its own loops
  that has more than one trip (its tile changed underneath): ``bytes x prod(q_d over those
  loops)``;
* written (``"out"``) likewise; the extra passes are partial sums (a reduction loop
  outside): written back each time and read back all but the first;
* held on chip only (``"mid"``: an intermediate of a fused segment) costs capacity, not
  traffic.

Traffic depends on the tile sizes only through the trip counts, and the capacity grows
with the tiles, so for a given trip count the smallest tile (``ceil(n / q)``) is best:
the candidates are the distinct values of ``ceil(n / t)``. Where a dimension has too many
(more than ``EXACT_LIMIT``), a geometric subset is searched as *intervals*: traffic at the
lowest trip count of each interval, capacity at its highest (the smallest tile). Every trip
count in an interval is dominated by that relaxation, so the minimum found is a lower bound on the
nest's optimum, and exact where the candidates are complete.

>>> mm = Nest((("m", 4), ("n", 4), ("k", 4)), (
...     Operand("A", 64, "in", ((("m", 1),), (("k", 1),))),
...     Operand("B", 64, "in", ((("k", 1),), (("n", 1),))),
...     Operand("C", 64, "out", ((("m", 1),), (("n", 1),))), ), itemsize=4)
>>> best_traffic(mm, 192).bytes        # everything fits: each matrix once
192
>>> r = best_traffic(mm, 4 * (2 * 2 + 2 * 1 + 2 * 1))   # 2x2 output tiles, k tiles of 1
>>> r.bytes, sorted(r.tiles.items())
(320.0, [('k', 1), ('m', 2), ('n', 2)])
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

EXACT_LIMIT = 24         # dimensions with at most this many distinct trip counts: all of them
GRID_LIMIT = 60_000      # candidate tilings per order (the geometric step widens to fit)
MAX_TILED = 4            # tile loops per nest (the largest dimensions; the others whole)


@dataclass(frozen=True)
class Operand:
    """A tensor of a nest: ``nbytes`` moved by one pass over it, its ``kind`` (in, out,
    mid) and, per coordinate, the loop dimensions of its index with their coefficients
    (``()`` for a coordinate no loop dimension of the nest moves, extent ``span``; an
    entry ``("", w)`` adds ``w`` elements that dimensions held whole span)."""

    name: str
    nbytes: int
    kind: str
    coords: tuple[tuple[tuple[str, int], ...], ...]
    spans: tuple[int, ...] = ()           # extent of each coordinate (0: from the dims)

    def dims(self) -> set[str]:
        return {d for c in self.coords for d, _ in c if d}


@dataclass(frozen=True)
class Nest:
    dims: tuple[tuple[str, int], ...]
    operands: tuple[Operand, ...]
    itemsize: int = 4                     # bytes per element for the capacity of tiles
    # dimensions whose tile loops must run inside all the others (a producer's reduction
    # in a fused segment: its consumers see only complete sums)
    inner: tuple[str, ...] = ()


@dataclass
class Result:
    bytes: float
    tiles: dict[str, int] = field(default_factory=dict)
    order: tuple[str, ...] = ()
    exact: bool = True                   # every candidate searched: the optimum itself
    feasible: bool = True


def _trip_candidates(n: int, ratio: float) -> tuple[list[int], bool]:
    """Trip counts to try for a dimension of extent ``n`` and whether they are all of them."""
    every = sorted({-(-n // t) for t in range(1, n + 1)}) if n <= 4096 else None
    if every is not None and len(every) <= EXACT_LIMIT:
        return every, True
    qs, q = [1], 1.0
    while qs[-1] < n:
        q = max(q * ratio, qs[-1] + 1)
        qs.append(min(n, int(math.floor(q))))
    return sorted(set(qs)), False


def _coord_tile(coord, span: int, tile: dict, ext: dict):
    """Elements of one coordinate a tile covers: ``1 + sum |c| (t - 1)``, at most ``span``."""
    if not coord:
        return span
    e = 1
    for d, c in coord:
        if not d:
            e = e + c
        else:
            e = e + abs(c) * (tile[d] - 1) if d in tile else e + abs(c) * (ext[d] - 1)
    return np.minimum(e, span)


def best_traffic(nest: Nest, capacity: float) -> Result:
    """The least traffic of ``nest`` over tile sizes and tile-loop orders with every
    current tile within ``capacity`` bytes (see the module doc)."""
    ext = dict(nest.dims)
    ops = nest.operands
    spans = []
    for o in ops:
        sp = list(o.spans) or [0] * len(o.coords)
        spans.append([s or 1 + sum(abs(c) * (ext[d] - 1) if d else c for d, c in coord)
                      for s, coord in zip(sp, o.coords)])
    full_elems = [min(math.prod(s), o.nbytes // nest.itemsize if o.nbytes else math.prod(s))
                  for o, s in zip(ops, spans)]
    once = sum(o.nbytes for o in ops if o.kind != "mid")
    if sum(full_elems) * nest.itemsize <= capacity:
        return Result(once, {d: n for d, n in nest.dims}, ())
    tiled = [d for d, n in sorted(nest.dims, key=lambda x: (x[0] in nest.inner, -x[1]))
             if n > 1][:MAX_TILED]
    if not tiled:
        return Result(math.inf, feasible=False)

    def footprint(tile):
        """Bytes of every operand's current tile (tiles given per tiled dimension; scalars
        or broadcasting arrays)."""
        cap = 0
        for o, sp, fe in zip(ops, spans, full_elems):
            elems = 1
            for coord, s_ in zip(o.coords, sp):
                elems = elems * _coord_tile(coord, s_, tile, ext)
            cap = cap + np.minimum(elems, fe) * nest.itemsize
        return cap
    # the smallest tiles (1 along every tiled dimension) need the least capacity: when even
    # they do not fit, no tiling does (checked before any candidate grid is built)
    if footprint({d: 1 for d in tiled}) > capacity:
        return Result(math.inf, feasible=False)
    # the largest dimension's tile is solved for (the largest that fits, by bisection);
    # the others are enumerated
    last, others = tiled[0], tiled[1:]
    ratio = 1.1
    while True:
        cands = [_trip_candidates(ext[d], ratio) for d in others]
        if math.prod(len(c) for c, _ in cands) <= GRID_LIMIT or ratio > 64:
            break
        ratio = ratio ** 1.5
    k = len(others)
    lo_q, hi_t = {}, {}
    for i, (d, (qs, complete)) in enumerate(zip(others, cands)):
        q = np.array(qs, dtype=np.float64)
        # the interval [q_i, q_{i+1} - 1]: traffic at its lowest trip count, capacity at
        # its highest (the smallest tile)
        nxt = q if complete else np.maximum(np.append(q[1:] - 1, q[-1]), q)
        shape = [1] * k
        shape[i] = len(qs)
        lo_q[d] = q.reshape(shape)
        hi_t[d] = np.ceil(ext[d] / nxt).reshape(shape)
    exact = all(c for _, c in cands)
    grid = tuple(len(c) for c, _ in cands)

    def capacity_at(t_last):
        return np.broadcast_to(footprint({**hi_t, last: t_last}), grid)
    lo = np.ones(grid)
    ok = capacity_at(lo) <= capacity
    if not ok.any():
        return Result(math.inf, feasible=False, exact=exact)
    hi = np.full(grid, float(ext[last]))
    fits = capacity_at(hi) <= capacity
    lo = np.where(fits, hi, lo)
    while True:                       # the largest tile of ``last`` that fits, per point
        open_ = ok & (hi - lo > 1) & ~fits      # lo fits, hi does not
        if not open_.any():
            break
        mid = np.floor((lo + hi) / 2)
        good = capacity_at(mid) <= capacity
        lo = np.where(open_ & good, mid, lo)
        hi = np.where(open_ & ~good, mid, hi)
    lo_q[last] = np.ceil(ext[last] / lo)
    best = (math.inf, None, None)
    last_loops = set(nest.inner)
    for order in itertools.permutations(tiled):
        if any(a in last_loops and b not in last_loops for a, b in zip(order, order[1:])):
            continue
        total = 0
        for o in ops:
            if o.kind == "mid" or not o.nbytes:
                continue
            # a loop that does not index the operand multiplies its passes when it runs
            # outside one of the operand's own loops that has more than one trip
            own = o.dims()
            factor, active = 1, False
            for d in reversed(order):
                if d in own:
                    active = active | (lo_q[d] > 1)
                else:
                    factor = factor * np.where(active, lo_q[d], 1)
            moved = o.nbytes * factor
            total = total + (2 * moved - o.nbytes if o.kind == "out" else moved)
        total = np.where(ok, np.broadcast_to(total, grid), np.inf)
        i = int(np.argmin(total))
        if total.flat[i] < best[0]:
            best = (float(total.flat[i]), order, np.unravel_index(i, grid) if grid else ())
    val, order, at = best
    tiles = {d: int(hi_t[d].flat[j]) for d, j in zip(others, at)}
    tiles[last] = int(lo.flat[np.ravel_multi_index(at, grid)] if grid else lo.flat[0])
    return Result(val, tiles, order, exact)


def io_lower_bound_matmul(m: int, n: int, k: int, words: float) -> float:
    """The I/O lower bound of an ``m x k`` by ``k x n`` product with a fast memory of
    ``words`` elements (Hong and Kung; Smith et al. 2019): ``2mnk / sqrt(S) + mn``
    words."""
    return 2 * m * n * k / math.sqrt(words) + m * n


__all__ = ["Operand", "Nest", "Result", "best_traffic", "io_lower_bound_matmul"]
