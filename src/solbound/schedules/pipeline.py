"""Pipeline schedules as pure functions of per-stage times.

A pipeline of ``p`` stages runs ``m`` microbatches. Stage ``s`` spends ``f[s]`` on a
microbatch's forward, ``b[s]`` on its input gradient and ``w[s]`` on its weight gradient
(``B`` and ``W``: zero-bubble schedules run them apart, the others as one backward).
A forward needs the previous stage's forward of the same microbatch (plus ``p2p`` seconds
of activation transfer), an input gradient the next stage's (the last stage: its own
forward), a weight gradient its own input gradient. Each stage runs one operation at a
time, in the schedule's order; the makespan is the step's time.

* ``gpipe``: all forwards, then all backwards;
* ``1f1b``: ``p - s - 1`` forwards to warm up, then one forward and one backward in turn
  (PipeDream-Flush, Megatron's default);
* ``interleaved``: 1F1B over ``v`` chunks of layers per stage (Megatron's virtual
  pipeline: microbatches in groups of ``p``; ``m`` a multiple of ``p``);
* ``zb``: zero bubble (Qi et al. 2024): B and W apart, each stage runs a ready B first,
  else a forward while fewer than ``p - s`` microbatches wait for their B (1F1B's limit),
  else a deferred W, which fills the bubbles. The W's are deferred without a memory cap, so
  its makespan is at most ZB-H1's hand-made order's (``m (F + B + W) + (p - 1)(F + B - W)``
  for equal stages, which it meets at ``F = B = W``) and ``peak_inflight``, microbatches
  whose W is pending included, is this order's (above ZB-H1's, which holds 1F1B's peak).
  ZB-H1's own order is not modelled yet;
* ``dualpipe``: DeepSeek-V3's bidirectional pipeline (deepseek-ai/DualPipe's ``step``,
  replayed operation for operation): rank ``r`` holds stage ``r`` of one direction and
  stage ``p - 1 - r`` of the other (the parameters twice), half the microbatches enter at
  rank 0 and half at rank ``p - 1``; its eight phases (forwards to warm up, forward and
  backward chunks paired, zero-bubble weight gradients deferred where the reference defers
  them). ``p`` even, ``m`` even and at least ``2 p``. ``busy`` and ``peak_inflight`` are
  per rank (both of its stages); ``peak_pair[r]``: the microbatches of each of its two
  stages at that peak. The reference overlaps a paired forward and backward's
  communication with compute; the bound grants every transfer's overlap anyway.

Equal stages without transfers give GPipe's and 1F1B's bubble ``(p - 1) / (m + p - 1)``:

>>> r = simulate("1f1b", [Stage(1.0, 1.0, 1.0)] * 4, 8)
>>> r.makespan, round(r.bubble_fraction, 6), round(3 / 11, 6)
(33.0, 0.272727, 0.272727)
>>> simulate("gpipe", [Stage(1.0, 1.0, 1.0)] * 4, 8).peak_inflight
[8, 8, 8, 8]
>>> simulate("1f1b", [Stage(1.0, 1.0, 1.0)] * 4, 8).peak_inflight
[4, 3, 2, 1]
>>> simulate("zb", [Stage(1.0, 1.0, 1.0)] * 4, 8).makespan   # 8 * 3 + 3 * (1 + 1 - 1)
27.0

DualPipe holds ``p + 1`` microbatches' activations a rank (its paper's table: ``PP + 1``),
against 1F1B's ``p`` on the first stage; with F = B = W = 1 on 4 ranks and 8 microbatches
(24 of work a rank either way) it idles 1 where 1F1B idles 9:

>>> r = simulate("dualpipe", [Stage(1.0, 1.0, 1.0)] * 4, 8)
>>> r.makespan, r.peak_inflight, r.peak_pair[0]
(25.0, [5, 5, 5, 5], (4, 1))
"""

from __future__ import annotations

import heapq

from dataclasses import dataclass, field

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb", "dualpipe")


class ScheduleError(ValueError):
    """A schedule the degrees do not allow."""


@dataclass(frozen=True)
class Stage:
    """One stage's seconds per microbatch: forward, input gradient, weight gradient."""
    f: float
    b: float
    w: float


@dataclass
class Result:
    schedule: str
    stages: int
    microbatches: int
    makespan: float
    busy: list[float]                    # seconds each stage computes
    peak_inflight: list[int]             # most microbatches holding activations, per stage
    order: list[list[tuple]] = field(default_factory=list, repr=False)   # per stage
    # DualPipe: per rank, the microbatches of its stage r and of its stage p - 1 - r held at
    # its peak (the other schedules: one stage a rank, (peak, 0))
    peak_pair: list[tuple[int, int]] = field(default_factory=list)

    @property
    def bubble_fraction(self) -> float:
        """The share of the stages' time spent idle: ``1 - sum(busy) / (p * makespan)``."""
        return 1 - sum(self.busy) / (self.stages * self.makespan) if self.makespan else 0.0


def _fixed_order(schedule: str, p: int, m: int, v: int) -> list[list[tuple]]:
    """Per stage, its operations in order: ``(kind, microbatch, chunk)`` with kind ``F`` or
    ``BW`` (input and weight gradient together)."""
    orders = []
    for s in range(p):
        if schedule == "gpipe":
            orders.append([("F", i, 0) for i in range(m)] + [("BW", i, 0) for i in range(m)])
            continue
        if schedule == "1f1b":
            fs = [("F", i, 0) for i in range(m)]
            bs = [("BW", i, 0) for i in range(m)]
            warm = min(p - s - 1, m)
        else:                                         # interleaved, Megatron's order
            def mb(k):
                return (k // (p * v)) * p + k % p
            fs = [("F", mb(k), (k // p) % v) for k in range(m * v)]
            bs = [("BW", mb(k), v - 1 - (k // p) % v) for k in range(m * v)]
            warm = min((p - s - 1) * 2 + (v - 1) * p, m * v)
        order = fs[:warm]
        fi, bi = warm, 0
        while fi < len(fs):
            order += [fs[fi], bs[bi]]
            fi, bi = fi + 1, bi + 1
        orders.append(order + bs[bi:])
    return orders


def dualpipe_order(p: int, m: int) -> list[list[tuple]]:
    """Per rank, DualPipe's operations in order, as deepseek-ai/DualPipe's ``step`` issues
    them: ``(kind, direction, microbatch)``, kind ``F``, ``BW`` (input and weight gradient),
    ``B`` (input gradient, its weight gradient deferred) or ``W`` (the oldest deferred
    weight gradient; direction and microbatch None). Direction 0 enters at rank 0; ranks
    of the second half call it their phase 1.

    >>> [op[0] for op in dualpipe_order(2, 4)[0]]
    ['F', 'F', 'F', 'BW', 'F', 'BW', 'BW', 'B', 'W']
    """
    half = p // 2
    orders = []
    for r in range(p):
        second, hr = int(r >= half), min(r, p - 1 - r)
        nf, nb, ops = [0, 0], [0, 0], []

        def f(phase):
            d = phase ^ second
            ops.append(("F", d, nf[d]))
            nf[d] += 1

        def b(phase, zb=False):
            d = phase ^ second
            ops.append(("B" if zb else "BW", d, nb[d]))
            nb[d] += 1

        def w():
            ops.append(("W", None, None))
        for _ in range((half - hr - 1) * 2):          # 1: forwards of phase 0
            f(0)
        for _ in range(hr + 1):                       # 2: both phases' forwards
            f(0)
            f(1)
        for _ in range(half - hr - 1):                # 3: B1 W1 F1, zero bubble
            b(1, True)
            w()
            f(1)
        for _ in range(m // 2 - p + hr + 1):          # 4: F0 B1 F1 B0, paired
            f(0)
            b(1)
            f(1)
            b(0)
        for _ in range(half - hr - 1):                # 5: B1 F1 B0
            b(1)
            f(1)
            b(0)
        zb, n6 = False, hr + 1                        # 6: B1 B0, the second half deferred
        for i in range(n6):
            if i == n6 // 2 and hr % 2 == 1:
                zb = True
            b(1, zb)
            if i == n6 // 2 and hr % 2 == 0:
                zb = True
            b(0, zb)
        for _ in range(half - hr - 1):                # 7: W B0
            w()
            b(0, True)
        for _ in range(hr + 1):                       # 8: the deferred W's
            w()
        orders.append(ops)
    return orders


def _dualpipe(stages: list[Stage], m: int, p2p: float) -> Result:
    """DualPipe's replay (see :func:`dualpipe_order`): an operation starts when its rank is
    free and its input is there (the previous stage's forward of its direction, the next
    stage's input gradient, its own input gradient for a W)."""
    p = len(stages)
    orders = dualpipe_order(p, m)
    done: dict[tuple, float] = {}
    free, busy = [0.0] * p, [0.0] * p
    held = [[0, 0] for _ in range(p)]
    peak, pair = [0] * p, [(0, 0)] * p
    deferred: list[list[tuple]] = [[] for _ in range(p)]
    log: list[list[tuple]] = [[] for _ in range(p)]
    pos, left = [0] * p, sum(len(o) for o in orders)
    while left:
        moved = False
        for r in range(p):
            while pos[r] < len(orders[r]):
                kind, d, i = orders[r][pos[r]]
                if kind == "W":
                    d, i = deferred[r][0]
                s = r if d == 0 else p - 1 - r        # the stage it runs
                if kind == "F":
                    prev = done.get(("F", d, i, s - 1))
                    ready = 0.0 if s == 0 else None if prev is None else prev + p2p
                elif kind == "W":
                    ready = done.get(("B", d, i, s))
                elif s == p - 1:
                    ready = done.get(("F", d, i, s))
                else:
                    nxt = done.get(("B", d, i, s + 1))
                    ready = None if nxt is None else nxt + p2p
                if ready is None:
                    break
                st = stages[s]
                cost = {"F": st.f, "B": st.b, "BW": st.b + st.w, "W": st.w}[kind]
                start = max(free[r], ready)
                end = free[r] = start + cost
                busy[r] += cost
                if kind == "F":
                    done[("F", d, i, s)] = end
                    held[r][d] += 1
                    if sum(held[r]) > peak[r]:        # (stage r's, stage p - 1 - r's)
                        peak[r], pair[r] = sum(held[r]), (held[r][0], held[r][1])
                elif kind == "W":
                    deferred[r].pop(0)
                    held[r][d] -= 1
                else:
                    done[("B", d, i, s)] = end
                    if kind == "B":
                        deferred[r].append((d, i))
                    else:
                        held[r][d] -= 1
                log[r].append((kind, i, d, start, end))
                pos[r] += 1
                left -= 1
                moved = True
        if not moved:
            raise ScheduleError("dualpipe: the order deadlocks")           # pragma: no cover
    return Result("dualpipe", p, m, max(free), busy, peak, log, pair)


def simulate(schedule: str, stages: list[Stage], microbatches: int, p2p: float = 0.0,
             chunks: int = 1) -> Result:
    """The makespan of ``schedule`` over these stage times (see the module doc); ``p2p``:
    seconds to send one microbatch's activations (or their gradient) to the next stage;
    ``chunks``: virtual stages per stage (``interleaved`` only; each chunk takes
    ``1/chunks`` of its stage's times)."""
    p, m, v = len(stages), microbatches, chunks
    if schedule not in SCHEDULES:
        raise ScheduleError(f"unknown schedule {schedule!r}: one of {', '.join(SCHEDULES)}")
    if p < 1 or m < 1:
        raise ScheduleError(f"{p} stages, {m} microbatches: at least one of each")
    if schedule == "interleaved":
        if v < 2:
            raise ScheduleError("interleaved needs at least 2 chunks (virtual stages) a stage")
        if m % p:
            raise ScheduleError(f"interleaved: {m} microbatches are not a multiple of the "
                                f"{p} stages (Megatron's virtual pipeline needs it)")
    elif v != 1:
        raise ScheduleError(f"{schedule} runs one chunk a stage, not {v}")
    if schedule == "dualpipe":
        if p % 2 or m % 2 or m < 2 * p:
            raise ScheduleError(f"dualpipe: {p} ranks and {m} microbatches; it needs an even "
                                f"number of ranks and an even number of microbatches, at "
                                f"least twice the ranks (deepseek-ai/DualPipe's step)")
        return _dualpipe(stages, m, p2p)
    last = p * v - 1                                  # the last virtual stage
    done: dict[tuple, float] = {}                     # (kind, mb, virtual stage) -> finish

    def vstage(s, c):
        return c * p + s

    def ready(kind, i, s, c):
        """When the operation's input is there (None: not yet computed)."""
        vs = vstage(s, c)
        if kind == "F":
            if vs == 0:
                return 0.0
            prev = done.get(("F", i, vs - 1))
            return None if prev is None else prev + p2p
        if kind in ("B", "BW"):
            if vs == last:
                return done.get(("F", i, vs))
            nxt = done.get(("B", i, vs + 1))
            return None if nxt is None else nxt + p2p
        return done.get(("B", i, vs))                 # W after its own B

    def cost(kind, s):
        st = stages[s]
        return {"F": st.f, "B": st.b, "W": st.w, "BW": st.b + st.w}[kind] / v

    free = [0.0] * p
    busy = [0.0] * p
    held = [0] * p            # microbatches holding activations (forward done, W not yet)
    waiting = [0] * p         # microbatches whose input gradient is not done yet
    peak = [0] * p
    log: list[list[tuple]] = [[] for _ in range(p)]

    def run(s, op, start):
        kind, i, c = op
        end = start + cost(kind, s)
        free[s] = end
        busy[s] += end - start
        vs = vstage(s, c)
        done[(kind, i, vs)] = end
        if kind == "BW":
            done[("B", i, vs)] = end
        if kind == "F":
            held[s] += 1
            waiting[s] += 1
            peak[s] = max(peak[s], held[s])
        if kind in ("BW", "W"):
            held[s] -= 1
        if kind in ("BW", "B"):
            waiting[s] -= 1
        log[s].append((kind, i, c, start, end))

    if schedule != "zb":
        # each stage runs its order; an operation starts when its stage is free and its
        # input is there, so the times do not depend on which stage is advanced first
        orders = _fixed_order(schedule, p, m, v)
        pos = [0] * p
        left = sum(len(o) for o in orders)
        while left:
            moved = False
            for s in range(p):
                while pos[s] < len(orders[s]):
                    kind, i, c = orders[s][pos[s]]
                    r = ready(kind, i, s, c)
                    if r is None:
                        break
                    run(s, orders[s][pos[s]], max(free[s], r))
                    pos[s] += 1
                    left -= 1
                    moved = True
            if not moved:
                raise ScheduleError(f"{schedule}: the order deadlocks")   # pragma: no cover
    else:
        # each kind runs in microbatch order on a stage (its inputs arrive in that order),
        # so the candidates are each kind's next microbatch
        nxt = [{"F": 0, "B": 0, "W": 0} for _ in range(p)]
        order = ("B", "F", "W")          # among operations ready together, B first

        def decide(s):
            """Stage ``s``'s next operation and its start (None: nothing is ready): it
            starts at the earliest a candidate is ready (or the stage is free), and of the
            candidates ready then, the first in ``rank`` order runs."""
            nx, cands, lo = nxt[s], [], None
            for kind in order:
                i = nx[kind]
                if i >= m or (kind == "F" and waiting[s] >= p - s):
                    continue                          # 1F1B's in-flight limit
                r = ready(kind, i, s, 0)
                if r is not None:
                    cands.append((r, kind, i))
                    if lo is None or r < lo:
                        lo = r
            if lo is None:
                return None
            t = free[s] if free[s] > lo else lo
            return next((t, (kind, i, 0)) for r, kind, i in cands if r <= t)

        # a stage's choice changes only when it runs something or a neighbour readies its
        # input; the earliest choice (the lowest stage among equals) runs next, from a heap
        # whose stale entries (a stage's choice since replaced) are skipped
        choice = [decide(s) for s in range(p)]
        version = [0] * p
        heap = [(c[0], s, 0) for s, c in enumerate(choice) if c is not None]
        heapq.heapify(heap)

        def renew(s):
            choice[s] = decide(s)
            version[s] += 1
            if choice[s] is not None:
                heapq.heappush(heap, (choice[s][0], s, version[s]))
        left = 3 * m * p
        while left:
            while heap and heap[0][2] != version[heap[0][1]]:
                heapq.heappop(heap)
            if not heap:
                raise ScheduleError("zb: the schedule deadlocks")        # pragma: no cover
            t, s, _ = heapq.heappop(heap)
            op = choice[s][1]
            nxt[s][op[0]] += 1
            left -= 1
            run(s, op, t)
            renew(s)
            # a forward readies the next stage's, an input gradient the previous stage's
            n = s + 1 if op[0] == "F" else s - 1 if op[0] == "B" else -1
            if 0 <= n < p:
                renew(n)
    return Result(schedule, p, m, max(free), busy, peak, log, [(k, 0) for k in peak])


def closed_form_bubble(stages: int, microbatches: int) -> float:
    """GPipe's and 1F1B's bubble with equal stages and no transfers.

    >>> closed_form_bubble(4, 8)
    0.2727272727272727
    """
    return (stages - 1) / (microbatches + stages - 1)
