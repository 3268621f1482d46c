"""The fastest training plans of a model on ``chips`` chips, from its profiles.

A plan is the degrees TP x PP x DP (ranks numbered tensor-parallel innermost, then data
parallel, then pipeline stages, as Megatron numbers them), the microbatch size and count
(``global_batch = dp * microbatch * microbatches`` sequences), the pipeline schedule, the
ZeRO stage and the recompute. Its step bound on a chip, from the profile traced at its TP
degree and microbatch size (``planning.profile``; nothing is traced per plan):

* each stage's F, B and W seconds a microbatch: the roofline of its layers' work and
  fused bytes (``schedules.stages.Part``) with its tensor-parallel all-reduces (Megatron's:
  two in each layer's forward, two in its backward, one for the vocabulary-parallel
  embedding's output and one for the head's input gradient, each of the microbatch's
  hidden states) at their lower-bound bytes over the group's link, overlapped with the
  compute as every bound here is; full recompute runs each layer's forward again before
  its backward;
* the schedule's makespan over those times with the hidden states sent to the next stage
  over the link between the two ranks (``schedules.pipeline``);
* the data-parallel gradient reduction (an all-reduce of the stage's gradients; a
  reduce-scatter from ZeRO 2 on; ZeRO 3 also all-gathers the parameters for the forward
  and again for the backward), overlapped with the pipeline;
* the optimizer after both, on its ZeRO shard.

``seconds = max(makespan, gradient reduction) + optimizer``. MFU at the bound is the
model's tensor-core FLOPs (those of F, B and W at TP 1, without recompute) over the chips'
dense bf16 peak times the bound: sharding never lowers the work, so it is at most 1, and
near 1 where a plan hides its bubbles and communication. Memory per rank: ``planning.memory`` (a lower bound), checked
against the chip's DRAM.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

from ..analysis.counts import Collective
from ..bounds.comm import comm_time
from ..bounds.roofline import work_bound
from ..schedules.pipeline import SCHEDULES, ScheduleError, Stage, simulate
from ..schedules.stages import Part, split_layers, stage_parts
from ..serving.capacity import dram_capacity
from .context import context_parallel, ulysses_bytes
from .memory import RECOMPUTE, ZERO, schedule_memory


class PlanError(ValueError):
    """Degrees or a search that cannot be planned (one line for the user)."""


@dataclass(frozen=True)
class Plan:
    tp: int
    pp: int
    dp: int
    microbatch: int
    microbatches: int
    schedule: str = "1f1b"
    chunks: int = 1
    zero: int = 1
    recompute: str = "none"
    cp: int = 1                # context parallel (``planning.context``)
    ulysses: bool = False      # CP as all-to-alls over heads (else: keys and values gathered)

    @property
    def chips(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    def label(self) -> str:
        """``tp8 pp4 dp2 mbs1 x16 1f1b zero1`` (``interleaved/2``: two chunks a stage;
        ``cp2`` after the TP degree when the sequences are split).

        >>> Plan(8, 4, 2, 1, 16, "interleaved", 2, 1, "full").label()
        'tp8 pp4 dp2 mbs1 x16 interleaved/2 zero1 recompute'
        >>> Plan(8, 16, 8, 1, 16, cp=16).label()
        'tp8 cp16 pp16 dp8 mbs1 x16 1f1b zero1'
        >>> Plan(1, 1, 8, 1, 1, cp=8, ulysses=True).label()
        'tp1 ulysses8 pp1 dp8 mbs1 x1 1f1b zero1'
        """
        sch = f"{self.schedule}/{self.chunks}" if self.chunks > 1 else self.schedule
        rc = " recompute" if self.recompute == "full" else ""
        cp = f" {'ulysses' if self.ulysses else 'cp'}{self.cp}" if self.cp > 1 else ""
        return (f"tp{self.tp}{cp} pp{self.pp} dp{self.dp} mbs{self.microbatch} "
                f"x{self.microbatches} {sch} zero{self.zero}{rc}")


def Comm(kind: str, members: tuple, nbytes: int, calls: int = 1, perm: tuple = ()
         ) -> Collective:
    """A collective of the plan (no kernel of a program: the rank's program is composed)."""
    return Collective(kind, int(nbytes), len(members), calls, "", "", kind, "",
                      group=tuple(members), perm=perm)


def rank_profile(profile, cp: int, memo: dict):
    """``profile`` for a rank of ``cp`` (``planning.context``), kept in ``memo`` (its
    identity keys the stage times)."""
    if cp == 1:
        return profile
    key = ("cp", id(profile), cp)
    if key not in memo:
        memo[key] = (profile, context_parallel(profile, cp))
    return memo[key][1]


def _seconds(part: Part, comms: list[Collective], spec) -> float:
    return work_bound(part.work, part.special, int(part.bytes), int(part.flops), spec,
                      "fused", collectives=[c for c in comms if c.calls]).seconds


def _stage_parts(profile, layers: int, first: bool, last: bool, recompute: str) -> dict:
    """The stage's parts (``schedules.stages.stage_parts``), full recompute adding each
    layer's forward to its backward."""
    acc = stage_parts(profile.pieces, layers, first, last)
    if recompute == "full":
        fwd = profile.pieces.get(("F", "loop"))
        if fwd is not None:
            acc["B"].add(fwd, layers)
    return acc


def stage_times(profile, pp: int, recompute: str, spec, split=None,
                ulysses: bool = False) -> list[dict]:
    """Per stage: its layers, MACs, and F, B, W, O seconds a microbatch (module doc)."""
    layers = split_layers(profile.layers, pp, split)
    tp, cp = profile.tp, profile.cp
    group = tuple(range(tp))
    ring = tuple(range(0, tp * cp, tp))               # the context-parallel group
    ar = int(profile.hidden_bytes)                    # a microbatch's hidden states
    kv = int(profile.kv_bytes)                        # a layer's keys and values, all tokens
    rows = []
    for s, n in enumerate(layers):
        first, last = s == 0, s == pp - 1
        acc = _stage_parts(profile, n, first, last, recompute)
        fwd_ar = 2 * n + (1 if first else 0)
        bwd_ar = 2 * n + (1 if last else 0) + (2 * n if recompute == "full" else 0)
        fwd, bwd = [], []
        if tp > 1:
            fwd.append(Comm("all_reduce", group, ar, fwd_ar))
            bwd.append(Comm("all_reduce", group, ar, bwd_ar))
        again = 2 if recompute == "full" else 1
        if cp > 1 and ulysses:
            # all-to-alls of a rank's queries, keys, values and attention output (each the
            # rank's 1/cp of the tokens), and of their gradients in the backward
            a2a = ulysses_bytes(profile)
            fwd.append(Comm("all_to_all", ring, a2a, n))
            bwd.append(Comm("all_to_all", ring, a2a, n * again))
        elif cp > 1:        # keys and values gathered, their gradients reduce-scattered
            fwd.append(Comm("all_gather", ring, kv, n))
            bwd += [Comm("all_gather", ring, kv, n * again),
                    Comm("reduce_scatter", ring, kv, n)]
        t = {"F": _seconds(acc["F"], fwd, spec),
             "B": _seconds(acc["B"], bwd, spec),
             "W": _seconds(acc["W"], [], spec), "O": _seconds(acc["O"], [], spec)}
        rows.append({"stage": s, "layers": n, "first": first, "last": last,
                     "macs": acc["F"].macs + acc["B"].macs + acc["W"].macs, "t": t})
    return rows


def _grad_sync(profile, plan: Plan, layers: int, first: bool, last: bool, spec) -> float:
    """Seconds of a stage's data-parallel gradient (and ZeRO-3 parameter) collectives."""
    if plan.dp * plan.cp == 1:
        return 0.0
    # the stage's ranks of one TP index: data- and context-parallel (both hold the
    # stage's weights and a part of its gradients)
    group = tuple(range(0, plan.tp * plan.cp * plan.dp, plan.tp))
    g = profile.state_at("gradients", layers, first, last)
    w = profile.state_at("parameters", layers, first, last)
    comms = [Comm("all_reduce" if plan.zero < 2 else "reduce_scatter", group, g)]
    if plan.zero >= 3:
        comms.append(Comm("all_gather", group, w, 2))
    return comm_time(comms, spec).seconds


@dataclass
class Search:
    """What a search needs beyond the profiles."""
    chips: int
    global_batch: int
    schedules: tuple = ("1f1b", "interleaved", "zb")
    zero: tuple = ZERO
    recompute: tuple = RECOMPUTE
    pp: tuple | None = None                 # pipeline degrees (default: every divisor)
    tp: tuple | None = None                 # TP degrees searched (default: the profiles')
    cp: tuple = (1,)                        # context-parallel degrees
    cp_modes: tuple = ("ring",)             # "ring" (all-gather) and/or "ulysses"
    memo: dict = field(default_factory=dict, repr=False)


def replay(plan: Plan, profile, spec, search: "Search | None" = None) -> tuple:
    """``(stage rows, schedules.pipeline.Result, p2p seconds)`` of ``plan`` (memoized in
    ``search``)."""
    memo = search.memo if search is not None else {}
    profile = rank_profile(profile, plan.cp, memo)
    key = ("times", id(profile), plan.pp, plan.recompute, spec.id, plan.ulysses)
    rows = memo.get(key)
    if rows is None:
        rows = memo[key] = stage_times(profile, plan.pp, plan.recompute, spec,
                                       ulysses=plan.ulysses)
    p2p = 0.0
    if plan.pp > 1:
        nxt = plan.tp * plan.cp * plan.dp             # the next stage's rank 0
        p2p = comm_time([Comm("permute", (0, nxt), profile.hidden_bytes, 1, ((0, 1),))],
                        spec).seconds
    times = tuple(Stage(r["t"]["F"], r["t"]["B"], r["t"]["W"]) for r in rows)
    skey = ("sim", plan.schedule, times, plan.microbatches, p2p, plan.chunks)
    sim = memo.get(skey)
    if sim is None:
        sim = memo[skey] = simulate(plan.schedule, list(times), plan.microbatches, p2p,
                                    plan.chunks)
    return rows, sim, p2p


def evaluate(plan: Plan, profile, spec, search: Search | None = None,
             model_flops: float | None = None) -> dict:
    """The bound, memory and MFU of ``plan`` on ``spec`` from ``profile`` (the one traced
    at the plan's TP degree and microbatch size)."""
    if (profile.tp, profile.microbatch) != (plan.tp, plan.microbatch):
        raise PlanError(f"{plan.label()}: the profile is of tp{profile.tp} "
                        f"mbs{profile.microbatch}")
    rows, sim, p2p = replay(plan, profile, spec, search)
    profile = rank_profile(profile, plan.cp, search.memo if search is not None else {})
    syncs = [_grad_sync(profile, plan, r["layers"], r["first"], r["last"], spec) for r in rows]
    shards = plan.dp * plan.cp                  # ZeRO shards over both (Megatron's)
    opts = [r["t"]["O"] / (shards if plan.zero >= 1 else 1) for r in rows]
    if plan.schedule == "dualpipe":             # rank r holds stages r and p - 1 - r
        syncs = [a + b for a, b in zip(syncs, syncs[::-1])]
        opts = [a + b for a, b in zip(opts, opts[::-1])]
    sync, opt = max(syncs), max(opts)
    seconds = max(sim.makespan, sync) + opt
    mems = schedule_memory(profile, [(r["layers"], r["first"], r["last"]) for r in rows],
                           shards, plan.zero, sim, plan.chunks, plan.recompute)
    cap = dram_capacity(spec)
    worst = max(m["total"] for m in mems)
    peak_rate = spec.peaks.get("tensor_bf16") or max(spec.peaks.values())
    out = {"plan": asdict(plan), "label": plan.label(), "chips": plan.chips,
           "seconds": seconds, "makespan_seconds": sim.makespan,
           "gradient_sync_seconds": sync, "optimizer_seconds": opt, "p2p_seconds": p2p,
           "bubble_fraction": sim.bubble_fraction,
           "memory_bytes": worst, "capacity_bytes": cap, "fits": worst <= cap,
           "over_bytes": max(0.0, worst - cap),
           "stages": [{"stage": r["stage"], "layers": r["layers"],
                       "macs": int(round(r["macs"])),
                       "seconds": {"forward": r["t"]["F"], "input_gradient": r["t"]["B"],
                                   "weight_gradient": r["t"]["W"],
                                   "optimizer": r["t"]["O"]},
                       "peak_microbatches": peak, "peak_memory_bytes": m["total"],
                       "memory": m}
                      for r, peak, m in zip(rows, sim.peak_inflight, mems)]}
    if model_flops:
        out["mfu"] = model_flops / (plan.chips * peak_rate * seconds)
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def plans(profiles: dict, search: Search) -> list[Plan]:
    """Every plan of ``search.chips`` the profiles (``(tp, microbatch) -> Profile``) allow."""
    out = []
    layers = next(iter(profiles.values())).layers
    for (tp, mbs), prof in sorted(profiles.items()):
        if search.tp is not None and tp not in search.tp:
            continue
        for cp, uly in [(c, u) for c in search.cp
                        for u in ((False,) if c == 1 else
                                  tuple(m == "ulysses" for m in search.cp_modes))]:
            if search.chips % (tp * cp) or prof.seq % (2 * cp):
                continue
            if uly and (not prof.heads or prof.heads % cp or prof.kv_heads % cp):
                continue                      # Ulysses splits a rank's heads over cp
            rest = search.chips // (tp * cp)
            for pp in search.pp or _divisors(rest):
                if rest % pp or pp > layers:
                    continue
                dp = rest // pp
                if search.global_batch % (dp * mbs):
                    continue
                m = search.global_batch // (dp * mbs)
                for sch in (search.schedules if pp > 1 else ("1f1b",)):
                    chunks = 1
                    if sch == "dualpipe" and (pp % 2 or m % 2 or m < 2 * pp):
                        continue                  # DualPipe's step needs them
                    if sch == "interleaved":
                        chunks = 2
                        if m % pp or layers < pp * chunks:
                            continue
                    for zero in search.zero:
                        if dp * cp == 1 and zero:
                            continue
                        for rc in search.recompute:
                            out.append(Plan(tp, pp, dp, mbs, m, sch, chunks, zero, rc, cp,
                                            uly))
    return out


def pareto(rows: list[dict]) -> list[dict]:
    """The rows no other row beats in both seconds and memory (fastest first).

    >>> [r["id"] for r in pareto([{"id": 1, "seconds": 1, "memory_bytes": 9},
    ...   {"id": 2, "seconds": 2, "memory_bytes": 5}, {"id": 3, "seconds": 3, "memory_bytes": 7}])]
    [1, 2]
    """
    out, best = [], math.inf
    for r in sorted(rows, key=lambda r: (r["seconds"], r["memory_bytes"])):
        if r["memory_bytes"] < best:
            out.append(r)
            best = r["memory_bytes"]
    return out


def run(profiles: dict, spec, search: Search, progress=None) -> dict:
    """Evaluate every plan; the fitting ones fastest first, the Pareto of time and memory,
    and how many were searched. :class:`PlanError` when none exists or none fits."""
    candidates = plans(profiles, search)
    if not candidates:
        tps = sorted({tp for tp, _ in profiles})
        raise PlanError(f"no plan of {search.chips} chips and a global batch of "
                        f"{search.global_batch}: the TP degrees {tps} with some pipeline "
                        f"and data-parallel degrees must divide the chips, and the data-"
                        f"parallel degree times the microbatch the global batch")
    ref = min(profiles.values(), key=lambda p: (p.tp, p.microbatch))
    if ref.tp != 1:
        raise PlanError("the model's FLOPs come from the TP-1 profile: include tp 1")
    model_flops = ref.tensor_flops / ref.microbatch * search.global_batch
    t0 = time.perf_counter()
    rows = []
    for i, plan in enumerate(candidates):
        try:
            rows.append(evaluate(plan, profiles[(plan.tp, plan.microbatch)], spec, search,
                                 model_flops))
        except ScheduleError:
            continue
        if progress and i % 200 == 199:
            progress(i + 1, len(candidates))
    fit = sorted((r for r in rows if r["fits"]), key=lambda r: r["seconds"])
    if not fit:
        least = min(rows, key=lambda r: r["memory_bytes"])
        raise PlanError(f"no plan of {search.chips} x {spec.id} fits: the least memory a "
                        f"rank needs is {least['memory_bytes'] / 2**30:.1f} GiB "
                        f"({least['label']}), {least['over_bytes'] / 2**30:.1f} GiB over "
                        f"its {least['capacity_bytes'] / 2**30:.1f} GiB")
    return {"arch": spec.id, "chips": search.chips, "global_batch": search.global_batch,
            "searched": len(rows), "fitting": len(fit),
            "search_seconds": time.perf_counter() - t0,
            "plans": fit, "pareto": pareto(fit)}


__all__ = ["Plan", "PlanError", "Search", "evaluate", "plans", "pareto", "run",
           "stage_times", "SCHEDULES"]
