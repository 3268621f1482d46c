"""Lower bounds on a serving workload: makespan, output tokens per second, TTFT and TPOT.

A workload is a list of requests (prompt tokens, output tokens, arrival time); an engine
runs it as steps (:mod:`.step`) under its limits: at most ``max_batched_tokens`` new tokens
and ``max_seqs`` sequences per step, the cache within the chip's memory, prompts chunked or
not, a share of each prompt found in the prefix cache. The arguments for why each number is
a lower bound (an upper bound for throughput) on *every* schedule under those limits are in
``docs/serving.md``; the code follows them term by term:

* a request ``r`` is its prefill piece ``q_r @ h_r`` (``h_r`` prompt tokens found cached,
  ``q_r = p_r - h_r`` computed, in ``k_r >= ceil(q_r / M)`` steps) and its ``O_r - 1``
  decode pieces ``1 @ (p_r + j)``; a prompt computed in chunks costs at least what it
  costs in one piece (checked on the model, :func:`chunking_check`);
* a step's time is at least the roofline of its work and bytes, a convex function that is
  positively homogeneous, so the steps of any schedule take at least the roofline of their
  summed work, with the shared weights read once per step and at least ``N_min`` steps;
* a request's first token waits for its own prefill steps; its decode steps follow one
  another, each reading the weights.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import sys
from dataclasses import dataclass

from ..bounds.roofline import work_bound
from ..hardware.catalog import Spec
from ..pipeline import specs_of
from .capacity import Memory, memory_of
from .step import StepError, collectives_of, monomials, region_of

SCHEMA = "solbound.serving/1"
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Request:
    """One request: ``input`` prompt tokens, ``output`` generated tokens (the first one by
    the prefill), ``arrival`` seconds after the workload starts."""
    input: int
    output: int
    arrival: float = 0.0


@dataclass(frozen=True)
class Limits:
    """An engine's limits (vLLM's names): ``max_batched_tokens`` new tokens and ``max_seqs``
    sequences per step, prompts split across steps with ``chunked_prefill``, a share
    ``prefix_hit`` of each prompt's tokens found in the prefix cache (not computed, still
    attended), ``memory_fraction`` of the chip's DRAM for weights and cache."""
    max_batched_tokens: int = 8192
    max_seqs: int = 256
    chunked_prefill: bool = True
    prefix_hit: float = 0.0
    memory_fraction: float = 0.9

    def __post_init__(self) -> None:
        if self.max_batched_tokens < 1 or self.max_seqs < 1:
            raise StepError("max_batched_tokens and max_seqs must be at least 1")
        if not 0 <= self.prefix_hit < 1:
            raise StepError(f"prefix hit rate {self.prefix_hit} is not in [0, 1)")


# ------------------------------------------------------------------------ workload files

_KEYS = {"input": ("input", "input_len", "input_tokens", "prompt_len", "prompt_tokens", "isl"),
         "output": ("output", "output_len", "output_tokens", "osl", "max_tokens"),
         "arrival": ("arrival", "arrival_time", "timestamp", "time")}


def uniform(isl: int, osl: int, count: int) -> list[Request]:
    """``count`` requests of ``isl`` prompt and ``osl`` output tokens, all at time 0."""
    if isl < 1 or osl < 1 or count < 1:
        raise StepError("--isl, --osl and --requests must be at least 1")
    return [Request(isl, osl)] * count


def _request(row: dict, where: str) -> Request:
    vals = {}
    for field, names in _KEYS.items():
        key = next((k for k in names if k in row and row[k] not in (None, "")), None)
        if key is None and field != "arrival":
            raise StepError(f"{where}: no {field} length (one of {', '.join(names)})")
        vals[field] = row[key] if key else 0.0
    try:
        r = Request(int(vals["input"]), int(vals["output"]), float(vals["arrival"]))
    except (TypeError, ValueError):
        raise StepError(f"{where}: lengths must be integers and the arrival a number") from None
    if r.input < 1 or r.output < 1 or r.arrival < 0:
        raise StepError(f"{where}: needs input >= 1, output >= 1 and arrival >= 0")
    return r


def read_workload(path: str) -> list[Request]:
    """Requests from a ``.json`` (a list of objects, or ``{"requests": [...]}``), ``.jsonl``
    or ``.csv`` file (columns ``input``, ``output``, optional ``arrival``; vLLM's and common
    aliases such as ``input_len``/``output_len``/``timestamp`` too)."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".json", ".jsonl", ".csv"):
        raise StepError(f"{path}: unknown workload format {ext or '(no extension)'!r}; use "
                        f".json, .jsonl or .csv")
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        raise StepError(f"{path}: {e.strerror}") from None
    try:
        if ext == ".csv":
            rows = list(csv.DictReader(io.StringIO(text)))
        elif ext == ".jsonl":
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            data = json.loads(text)
            rows = data.get("requests") if isinstance(data, dict) else data
    except json.JSONDecodeError as e:
        raise StepError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise StepError(f"{path}: expected a non-empty list of requests (objects)")
    return [_request(r, f"{path}: request {i}") for i, r in enumerate(rows)]


# ------------------------------------------------------------------------ the pieces

def _tables(sm, n: int, prefill, decode):
    """Per-request components (``name -> array``) of the prefill pieces ``prefill[i] =
    (new, ctx)`` and of the decode ranges ``decode[i] = (first ctx, last ctx)`` or None,
    each summed over a request's pieces: one matrix product per region."""
    import numpy as np
    rows: dict[tuple, tuple[list, list]] = {}
    for i, (new, ctx) in enumerate(prefill):
        key = sm.key(new, ctx)
        idx, mon = rows.setdefault(("p", key), ([], []))
        idx.append(i)
        mon.append(monomials(key, new, ctx, sm.chunk))
    for i, rng in enumerate(decode):
        if rng is None:
            continue
        for key, m in sm.decode_sums(*rng).items():
            idx, mon = rows.setdefault(("d", key), ([], []))
            idx.append(i)
            mon.append(m)
    out = {"p": {}, "d": {}}
    for (side, key), (idx, mon) in rows.items():
        names, mat = sm.region(key).matrix()
        vals = np.array(mon, dtype=float) @ mat.T
        ix = np.array(idx)
        for j, c in enumerate(names):
            arr = out[side].setdefault(c, np.zeros(n))
            np.add.at(arr, ix, vals[:, j])
    return out["p"], out["d"]


def chunking_check(sm, prompts: list[tuple[int, int]], budget: int) -> list[str]:
    """Checks on the model, exactly, that a prompt computed in two chunks costs at least
    what it costs in one piece, for each ``(new, ctx)`` in ``prompts`` cut in half and at
    the step budget: the premise of the workload bounds (a causal attention attends the
    same query and key pairs however the prompt is cut; each further chunk adds its own
    cache reads and logits). Returns where it fails (a model whose counted work falls with
    chunking, such as an attention computed dense under a mask)."""
    def piece(new, ctx):
        return sm.region(sm.key(new, ctx)).at(new, ctx)
    bad = []
    for new, ctx in prompts:
        for cut in sorted({new // 2, min(budget, new - 1)}):
            if cut < 1 or cut >= new:
                continue
            one, a, b = piece(new, ctx), piece(cut, ctx), piece(new - cut, ctx + cut)
            for c in sorted(set(one) | set(a) | set(b)):
                if c.startswith(("macs", "work:", "bytes", "read:")) and \
                        a.get(c, 0) + b.get(c, 0) < one.get(c, 0):
                    bad.append(f"{c} of {new}@{ctx} falls from {float(one.get(c, 0)):.4g} to "
                               f"{float(a.get(c, 0) + b.get(c, 0)):.4g} in chunks of {cut} "
                               f"and {new - cut}")
    return bad


def _percentiles(values) -> dict[str, float | None]:
    import numpy as np
    if len(values) == 0:
        return {f"p{p}": None for p in PERCENTILES} | {"mean": None}
    v = np.asarray(values, dtype=float)
    return {f"p{p}": float(np.percentile(v, p)) for p in PERCENTILES} | {"mean": float(v.mean())}


# ------------------------------------------------------------------------ the bounds

@dataclass
class _Plan:
    """The workload as pieces, independent of the chip."""
    p: object           # prompt tokens per request (array)
    q: object           # computed prompt tokens
    out: object         # output tokens
    arrival: object
    k: object           # least prefill steps per request
    budget: int         # new tokens per step at most
    pre: dict           # prefill components per request
    dec: dict           # decode components per request (summed over its decode steps)
    shared: int         # bytes every step reads whole
    partial: dict       # other shared tensors: name -> (size, least read of a step)
    notes: list
    tp: int = 1         # chips per replica (tensor parallelism): the counts are one rank's


def plan(sm, requests: list[Request], limits: Limits) -> _Plan:
    """The chip-independent part of :func:`serve`: each request's pieces and their counts."""
    import numpy as np
    if not requests:
        raise StepError("a workload needs at least one request")
    p = np.array([r.input for r in requests], dtype=np.int64)
    out = np.array([r.output for r in requests], dtype=np.int64)
    if sm.max_positions:
        last = p + out - 1
        i = int(np.argmax(last))
        if last[i] > sm.max_positions:
            raise StepError(f"request {i} ({p[i]} prompt + {out[i]} output tokens) goes beyond "
                            f"{sm.name}'s {sm.max_positions} positions (max_position_embeddings)")
    hit = np.minimum(np.floor(limits.prefix_hit * p).astype(np.int64), p - 1)
    q = p - hit
    M = limits.max_batched_tokens
    if not limits.chunked_prefill and int(q.max()) > M:
        i = int(np.argmax(q))
        raise StepError(f"request {i} computes {q[i]} prompt tokens, more than "
                        f"max_batched_tokens={M} without chunked prefill")
    k = -(-q // M)
    prefill = list(zip(q.tolist(), hit.tolist()))
    decode = [(int(a), int(a + o - 2)) if o >= 2 else None for a, o in zip(p, out)]
    pre, dec = _tables(sm, len(requests), prefill, decode)
    sizes = sm.sizes()
    whole = sm.whole_reads()
    one = {t: float(v) for t, v in sm.least_reads().items()}
    partial = {t: (s, min(one.get(t, 0.0), s)) for t, s in sizes.items() if t not in whole}
    notes = []
    if limits.chunked_prefill:
        longest = sorted(set(prefill), key=lambda x: -x[0])[:2]
        for line in chunking_check(sm, [x for x in longest if x[0] > 1], M):
            notes.append(f"not a bound under chunked prefill: {line}")
    return _Plan(p, q, out, np.array([r.arrival for r in requests], dtype=float), k, M, pre, dec,
                 sum(sizes[t] for t in whole), partial, notes, getattr(sm, "tp", 1))


def _row(tab: dict, i: int, prefix: str) -> dict[str, float]:
    return {c[len(prefix):]: float(v[i]) for c, v in tab.items()
            if c.startswith(prefix) and v[i]}


def _bytes(pl: _Plan, tab: dict, steps):
    """Per request: the bytes of its pieces but the shared tensors, plus the shared tensors
    over ``steps`` steps (whole ones each step, partial ones at least what the pieces read,
    at most their size each step)."""
    import numpy as np
    n = len(pl.p)
    b = tab.get("bytes", np.zeros(n)) + steps * pl.shared
    for t, (size, _) in pl.partial.items():
        r = tab.get(f"read:{t}")
        if r is not None:
            b = b + np.minimum(r, steps * size)
    return b


def bounds_on(pl: _Plan, spec: Spec, memory: Memory, limits: Limits,
              order_statistics: bool = True, per_request: bool = False) -> dict:
    """The workload's lower bounds on one chip (one entry of the ``serving`` list).
    ``order_statistics``: all requests arrive together, so the k-th first token waits
    for k prefills (off for a run whose requests were released over time: a rate or a
    concurrency cap). ``per_request``: add each request's own TTFT and TPOT bounds."""
    import numpy as np
    n = len(pl.p)
    M, S = limits.max_batched_tokens, limits.max_seqs
    final = pl.p + pl.out - 1
    longest = int(final.max())
    if memory.kv_bytes(longest) > memory.free:
        i = int(np.argmax(final))
        raise StepError(f"request {i} holds {memory.kv_bytes(longest) / 1e9:.2f} GB of cache at "
                        f"its last token, more than the {memory.free / 1e9:.2f} GB left on "
                        f"{spec.id} next to the weights")
    # per request: its prefill alone (TTFT) and its decode steps alone (TPOT)
    pre_bytes = _bytes(pl, pl.pre, pl.k)
    steps = np.maximum(pl.out - 1, 0)
    dec_bytes = _bytes(pl, pl.dec, steps)
    ttft, tpot, pre_units = np.zeros(n), np.full(n, np.nan), []
    for i in range(n):
        b = work_bound(_row(pl.pre, i, "work:"), _row(pl.pre, i, "special:"),
                       pre_bytes[i], 0, spec, "fused",
                       collectives=collectives_of(_row(pl.pre, i, "comm:")))
        ttft[i] = b.seconds
        pre_units.append(b.unit_seconds)
        if steps[i]:
            tpot[i] = work_bound(_row(pl.dec, i, "work:"), _row(pl.dec, i, "special:"),
                                 dec_bytes[i], 0, spec, "fused",
                                 collectives=collectives_of(_row(pl.dec, i, "comm:"))
                                 ).seconds / steps[i]
    chain = ttft + np.nan_to_num(tpot) * steps
    offline = order_statistics and bool(np.all(pl.arrival == pl.arrival[0]))
    ttft_sorted = np.sort(ttft)
    if offline:     # the k-th first token waits for the k cheapest prefills (docs/serving.md)
        ttft_sorted = np.maximum(ttft_sorted, _order_bound(pl, spec, pre_units))
    # the least number of steps of any schedule
    kv_time = sum(memory.kv_steps(int(a), int(o)) for a, o in zip(pl.q, pl.out))
    n_min = int(max((pl.k + steps).max(), math.ceil(int((pl.q + steps).sum()) / M),
                    math.ceil(int((pl.k + steps).sum()) / S), math.ceil(kv_time / memory.free)))
    whole = phase_bound(pl, spec, (pl.pre, pl.dec), n_min)
    start = pl.arrival - pl.arrival.min()
    finish = start + chain
    makespan = max(whole.seconds, float(finish.max()))
    out_tokens = int(pl.out.sum())
    price = spec.price_per_hour * pl.tp if spec.price_per_hour else None
    tps = out_tokens / makespan
    entry = {
        "arch": spec.id, "tp": pl.tp, "makespan_seconds": makespan,
        "output_tokens_per_second": tps,
        "output_tokens_per_second_per_chip": tps / pl.tp,
        "total_tokens_per_second": (out_tokens + int(pl.p.sum())) / makespan,
        "ttft_seconds": _percentiles(ttft_sorted),
        "tpot_seconds": _percentiles(tpot[steps > 0]),
        "max_concurrent_sequences": min(S, memory.max_sequences(longest)),
        "min_steps": n_min,
        "bound": ("a request's own steps" if finish.max() > whole.seconds
                  else f"{whole.bound} ({whole.binding_unit or 'DRAM'})"
                  if whole.bound == "compute" else whole.bound),
        "work_seconds": {"compute": whole.compute_seconds, "memory": whole.memory_seconds,
                         "communication": whole.comm_seconds},
        "memory": {"capacity_bytes": memory.capacity, "fraction": memory.fraction,
                   "weights_bytes": memory.weights, "kv_free_bytes": memory.free,
                   "kv_bytes_per_token": memory.bytes_per_token(),
                   "state_bytes_per_sequence": memory.state_bytes(),
                   "fits_sequences_of_longest": memory.max_sequences(longest),
                   "longest_tokens": longest},
        "price_per_hour": price,        # the replica's: tp chips
        "usd_per_million_output_tokens": price / 3600 / tps * 1e6 if price else None,
    }
    if per_request:
        entry["requests"] = {"ttft_seconds": ttft.tolist(),
                             "tpot_seconds": [None if np.isnan(x) else float(x) for x in tpot]}
    return entry


def phase_bound(pl: _Plan, spec: Spec, tabs: tuple, steps: int):
    """The roofline of every piece in ``tabs`` (request tables of the plan: prefills,
    decodes or both) done in ``steps`` steps at least: their summed work, collectives and
    own bytes, the tensors every step reads whole ``steps`` times, and of the others at
    least ``max(min(total reads, size), steps * least read of a step)``. Step time is
    convex and positively homogeneous (docs/serving.md), so no schedule of these pieces in
    ``steps`` or more steps is faster."""
    import numpy as np
    n = len(pl.p)
    work, special, comm = {}, {}, {}
    for tab in tabs:
        for c, v in tab.items():
            for prefix, acc in (("work:", work), ("special:", special), ("comm:", comm)):
                if c.startswith(prefix):
                    acc[c[len(prefix):]] = acc.get(c[len(prefix):], 0.0) + float(v.sum())
    total_bytes = float(sum(tab.get("bytes", np.zeros(n)).sum() for tab in tabs)
                        + steps * pl.shared)
    for t, (size, least) in pl.partial.items():
        read = float(sum(tab[f"read:{t}"].sum() for tab in tabs if f"read:{t}" in tab))
        total_bytes += max(min(read, size), steps * least)
    flops = float(sum(v.sum() for tab in tabs for c, v in tab.items()
                      if c.startswith("flops:")))
    return work_bound(work, special, total_bytes, flops, spec, "fused",
                      collectives=collectives_of(comm))


def _order_bound(pl: _Plan, spec: Spec, units: list[dict]):
    """``L[k-1]``: no schedule gives ``k`` requests their first token before the ``k``
    cheapest prefills' summed bytes (with the weights once per least step) or summed time on
    any unit whose time is linear in the work (all but the SFU and the pipes it may move to)
    are done."""
    import numpy as np
    n = len(pl.p)
    own = _bytes(pl, pl.pre, 0)
    q_cum = np.cumsum(np.sort(pl.q))
    steps = np.ceil(q_cum / pl.budget)
    mem = (np.cumsum(np.sort(own)) + steps * pl.shared) / spec.bandwidth
    best = mem
    skip = {spec.unit_of("sfu"), spec.unit_of("vector_fp32")} if any(
        c.startswith("special:") for c in pl.pre) else set()
    for u in {u for d in units for u in d} - skip:
        t = np.sort(np.array([d.get(u, 0.0) for d in units]))
        best = np.maximum(best, np.cumsum(t))
    return best[:n]


def price_of(price: float | dict[str, float] | None, spec: Spec,
             catalog: bool = True) -> float | None:
    """USD per chip-hour on ``spec``: one price for every chip or per chip id, else (with
    ``catalog``) the chip's ``[cost] price_per_hour``."""
    usd = price.get(spec.id) if isinstance(price, dict) else price
    return usd if usd is not None or not catalog else spec.price_per_hour


def serve(sm, requests: list[Request], arch=None, limits: Limits | None = None,
          price: float | dict[str, float] | None = None, order_statistics: bool = True,
          per_request: bool = False) -> dict:
    """The workload's lower bounds on each chip of ``arch`` (schema ``solbound.serving/1``).
    ``price``: USD per chip-hour, one for every chip or per chip id (default: the catalog's
    ``[cost] price_per_hour``), for the cost per million output tokens."""
    import time

    import numpy as np
    limits = limits or Limits()
    t0 = time.perf_counter()
    pl = plan(sm, requests, limits)
    if getattr(sm, "progress", False):
        print(f"  {len(requests)} requests as pieces ({time.perf_counter() - t0:.1f} s)",
              file=sys.stderr, flush=True)
    serving = []
    for spec in specs_of(arch):
        t0 = time.perf_counter()
        entry = bounds_on(pl, spec, memory_of(sm, spec, limits.memory_fraction), limits,
                          order_statistics, per_request)
        if getattr(sm, "progress", False):
            print(f"  bounds on {spec.id} ({time.perf_counter() - t0:.1f} s)",
                  file=sys.stderr, flush=True)
        usd = price_of(price, spec, catalog=False)
        if usd is not None:                      # per chip-hour; a replica is tp chips
            usd *= pl.tp
            entry["price_per_hour"] = usd
            entry["usd_per_million_output_tokens"] = (usd / 3600
                                                      / entry["output_tokens_per_second"] * 1e6)
        serving.append(entry)
    return {"schema": SCHEMA, "model": sm.name,
            "workload": {"requests": len(requests), "input_tokens": int(pl.p.sum()),
                         "output_tokens": int(pl.out.sum()),
                         "offline": bool(np.all(pl.arrival == pl.arrival[0])),
                         "prefill_tokens_computed": int(pl.q.sum())},
            "limits": {"max_batched_tokens": limits.max_batched_tokens,
                       "max_seqs": limits.max_seqs, "chunked_prefill": limits.chunked_prefill,
                       "prefix_hit": limits.prefix_hit,
                       "memory_fraction": limits.memory_fraction},
            "precision_policy": sm.policy.describe(),
            "serving": serving, "notes": pl.notes}
