"""Many chips: the throughput-interactivity frontier, the fewest chips for targets, and
disaggregated prefill and decode.

**Frontier.** A steady state decodes ``b`` sequences a step at the workload's mean decode
context ``c`` (the floor of ``p + (O - 2) / 2``: the decode counts are affine in the context,
so the mean stands for the sum). Its step bound ``f(b)`` gives each sequence at most
``1 / f(b)`` tokens per second (interactivity) and the replica ``b / f(b)`` (throughput, per
chip: over ``tp``). ``f`` is convex and increasing in ``b`` and ``f(b) / b`` decreasing, so no
mix of batch sizes whose token-weighted mean step time is ``T`` beats the single batch with
``f(b) = T`` (a Lagrangian argument: ``b`` minimises ``f(b) / b + lam f(b)``): the curve is
the frontier at that context. The prefills of the requests also take time; leaving them out
only raises the curve.

**Provision** (``provision``). For each tensor-parallel degree: the request's own TTFT and
TPOT bounds (one request alone on a replica; load only adds) must meet the targets, else the
degree is infeasible; under the TPOT target ``T`` a replica's throughput is at most
``min(X, (b_T + 1) / T)`` with ``X`` the offline workload's throughput bound and ``b_T`` the
largest batch with ``f(b) <= T`` (the frontier above, between integers). The fewest replicas
for a throughput is the target over that, so the chips are a **lower bound** on what any
engine needs; the cost per million output tokens is the replica's price over its
throughput bound.

**Disaggregation** (``disaggregate``). Prefill and decode on separate replicas: each
phase's work for the whole workload is bounded as the makespan is (``workload.phase_bound``:
the prefills in at least ``ceil(sum q / M)`` steps, the decodes in at least the most of a
request's decode steps, the sequence budget and the cache's memory), and the ratio of the
two is the prefill:decode replica ratio that balances them (the phases' speeds of light,
not a bound on an engine's ratio). Each request's cache leaves the prefill replica: its
prompt's rows on every layer (``Memory.kv_bytes``), each rank its shard over its own link
(scale-up inside an NVLink domain, scale-out between nodes), at least bytes / bandwidth.
"""

from __future__ import annotations

import math

from ..pipeline import specs_of
from .capacity import memory_of
from .step import Seq, StepError, StepModel
from .workload import Limits, bounds_on, phase_bound, plan, price_of, uniform

SCHEMA = "solbound.fleet/1"


def decode_context(isl: int, osl: int) -> int:
    """The mean context of a request's decode steps, rounded down (``1@p .. 1@p+O-2``).

    >>> decode_context(1000, 1000)
    1499
    """
    return isl + max(osl - 2, 0) // 2


def batch_grid(most: int) -> list[int]:
    """Powers of two up to ``most``, and ``most``.

    >>> batch_grid(100)
    [1, 2, 4, 8, 16, 32, 64, 100]
    """
    out = [1 << i for i in range(max(most, 1).bit_length()) if 1 << i <= most]
    return out + ([most] if most not in out else [])


def breakdown(sm: StepModel, seqs) -> dict:
    """A step's bytes and MACs by what they are: weights read (experts apart), the cache and
    activations, the MACs that grow with the context (attention over the cache) and the
    rest, and the collectives' payload."""
    import numpy as np
    seqs = sm.check(seqs)
    c = sm.fast_counts(seqs)
    sizes = sm.sizes()
    reads: dict[str, float] = {}
    attention = 0.0
    for key, m in sm._sums(seqs).items():
        r = sm.region(key)
        names, mat = r.matrix()
        vals = dict(zip(names, mat @ np.array(m, dtype=float)))
        for n, v in vals.items():
            if n.startswith("read:"):
                reads[n[5:]] = reads.get(n[5:], 0.0) + v
        if key[0] == "decode" and "macs" in r.coef:   # the terms in ctx: attention
            a = [float(x) for x in r.coef["macs"]]
            attention += a[1] * m[1] + a[2] * m[2]
    weights = {t: min(v, sizes[t]) for t, v in reads.items()}
    experts = sum(v for t, v in weights.items() if "expert" in t)
    return {"weights_bytes": sum(weights.values()) - experts, "expert_bytes": experts,
            "cache_and_activation_bytes": c.bytes - sum(weights.values()),
            "macs": c.macs, "attention_macs": attention,
            "collective_bytes": sum(c.comm.values())}


def frontier(sm: StepModel, spec, isl: int, osl: int, limits: Limits) -> list[dict]:
    """The frontier rows on one chip (see the module doc)."""
    mem = memory_of(sm, spec, limits.memory_fraction)
    most = min(limits.max_seqs, mem.max_sequences(isl + osl - 1))
    if most < 1:
        raise StepError(f"{sm.name}: no sequence of {isl + osl - 1} tokens fits {spec.id}'s "
                        f"memory next to the weights")
    ctx = decode_context(isl, osl)
    rows = []
    for b in batch_grid(most):
        t = sm.bound([Seq(1, ctx)] * b, spec)
        rows.append({"batch": b, "ctx": ctx, "step_seconds": t.seconds, "bound": t.bound,
                     "tokens_per_second_per_user": 1 / t.seconds,
                     "output_tokens_per_second": b / t.seconds,
                     "output_tokens_per_second_per_chip": b / t.seconds / sm.tp})
    return rows


def _largest_batch(sm: StepModel, spec, ctx: int, most: int, target: float) -> int:
    """The largest ``b <= most`` whose decode step ``b x 1@ctx`` takes at most ``target``
    (0 if none): the step time grows with ``b``."""
    def f(b):
        return sm.bound([Seq(1, ctx)] * b, spec).seconds
    if f(1) > target:
        return 0
    lo, hi = 1, most
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if f(mid) <= target:
            lo = mid
        else:
            hi = mid - 1
    return lo


def provision(models: dict[int, StepModel | str], isl: int, osl: int, arch, *,
              throughput: float, ttft: float | None = None, tpot: float | None = None,
              limits: Limits | None = None, requests: int = 1000,
              price: float | dict[str, float] | None = None) -> list[dict]:
    """Rows per chip and degree (``models``: degree -> its :class:`StepModel`, or the
    reason it cannot be built): feasibility under the targets, the replica's throughput
    bound, the fewest replicas and chips, the cost."""
    limits = limits or Limits()
    reqs = uniform(isl, osl, requests)
    ctx = decode_context(isl, osl)
    plans = {tp: plan(sm, reqs, limits) for tp, sm in models.items() if not isinstance(sm, str)}
    rows = []
    for spec in specs_of(arch):
        usd = price_of(price, spec)
        for tp, sm in sorted(models.items()):
            row = {"arch": spec.id, "tp": tp, "feasible": False}
            rows.append(row)
            if isinstance(sm, str):
                row["reason"] = sm
                continue
            try:
                mem = memory_of(sm, spec, limits.memory_fraction)
                # the workload's bounds, and each request's own (alone on a replica)
                off = bounds_on(plans[tp], spec, mem, limits, True, True)
            except StepError as e:
                row["reason"] = str(e)
                continue
            t_first = off["requests"]["ttft_seconds"][0]
            t_tok = off["requests"]["tpot_seconds"][0]
            row.update(ttft_seconds=t_first, tpot_seconds=t_tok,
                       offline_output_tokens_per_second=off["output_tokens_per_second"])
            if ttft is not None and t_first > ttft:
                row["reason"] = f"a request alone takes {t_first * 1e3:.4g} ms to its first token"
                continue
            if tpot is not None and t_tok is not None and t_tok > tpot:
                row["reason"] = f"a request alone takes {t_tok * 1e3:.4g} ms a token"
                continue
            cap = off["output_tokens_per_second"]
            most = min(limits.max_seqs, mem.max_sequences(isl + osl - 1))
            if tpot is not None and osl > 1:
                b = _largest_batch(sm, spec, ctx, most, tpot)
                row["batch_at_tpot"] = b
                cap = min(cap, (b + 1) / tpot) if b < most else min(cap, most / tpot)
            replicas = math.ceil(throughput / cap)
            row.update(feasible=True, replica_output_tokens_per_second=cap,
                       replicas=replicas, chips=replicas * tp,
                       price_per_hour=replicas * tp * usd if usd else None,
                       usd_per_million_output_tokens=(tp * usd / 3600 / cap * 1e6
                                                      if usd else None))
    for spec in specs_of(arch):
        ok = [r for r in rows if r["arch"] == spec.id and r["feasible"]]
        if ok:
            min(ok, key=lambda r: (r["chips"], r["tp"]))["fewest_chips"] = True
    return rows


def disaggregate(sm: StepModel, requests, arch, limits: Limits | None = None) -> list[dict]:
    """Prefill and decode on separate replicas of ``sm``, one row per chip of ``arch`` that
    holds the weights (see the module doc)."""
    import numpy as np
    limits = limits or Limits()
    pl = plan(sm, requests, limits)
    steps = np.maximum(pl.out - 1, 0)
    pre_steps = int(math.ceil(int(pl.q.sum()) / limits.max_batched_tokens))
    out = []
    for spec in specs_of(arch):
        try:
            mem = memory_of(sm, spec, limits.memory_fraction)
        except StepError:
            continue                  # the weights do not fit: said by the frontier
        kv = sum(mem.kv_steps(int(a) + 1, int(o) - 1) for a, o in zip(pl.q, pl.out) if o > 1)
        dec_steps = int(max(steps.max(), math.ceil(int(steps.sum()) / limits.max_seqs),
                            math.ceil(kv / mem.free)))
        pre = phase_bound(pl, spec, (pl.pre,), pre_steps)
        dec = phase_bound(pl, spec, (pl.dec,), dec_steps) if dec_steps else None
        per_rank = [mem.kv_bytes(int(p)) for p in pl.p]
        links = {k: float(v) for k, v in spec.links.items()
                 if k in ("scale_up", "scale_out") and v}
        out.append({"arch": spec.id, "tp": sm.tp,
                    "prefill_seconds": pre.seconds,
                    "decode_seconds": dec.seconds if dec else 0.0,
                    "prefill_bound": pre.bound, "decode_bound": dec.bound if dec else None,
                    "prefill_to_decode_replicas": pre.seconds / dec.seconds if dec else None,
                    "kv_bytes_per_request": {"mean": sum(per_rank) * sm.tp / len(pl.p),
                                             "max": max(per_rank) * sm.tp},
                    "transfer_seconds_per_request": {k: max(per_rank) / bw
                                                     for k, bw in links.items()}})
    return out


def fleet_html(doc: dict) -> str:
    """One self-contained page (plotly inlined): throughput per chip against tokens per
    second per user for each chip and degree, the provisioning table, a decode step's
    breakdown."""
    import html

    import plotly.graph_objects as go
    import plotly.io as pio
    fig = go.Figure()
    for curve in doc["frontier"]:
        fig.add_trace(go.Scatter(
            x=[r["tokens_per_second_per_user"] for r in curve["rows"]],
            y=[r["output_tokens_per_second_per_chip"] for r in curve["rows"]],
            mode="lines+markers", name=f"{curve['arch']} TP {curve['tp']}",
            text=[f"batch {r['batch']}" for r in curve["rows"]]))
    fig.update_layout(title="speed of light: throughput per chip against interactivity "
                            f"(decode at {doc['frontier'][0]['rows'][0]['ctx']} cached tokens)"
                      if doc["frontier"] else "no frontier",
                      xaxis_title="output tokens per second per user",
                      yaxis_title="output tokens per second per chip",
                      xaxis_type="log", yaxis_type="log")
    figs = [fig]
    if doc.get("breakdown"):
        bd = go.Figure()
        keys = ["weights_bytes", "expert_bytes", "cache_and_activation_bytes",
                "collective_bytes"]
        for k in keys:
            bd.add_trace(go.Bar(name=k.replace("_", " "),
                                x=[f"{b['arch']} TP {b['tp']} batch {b['batch']}"
                                   for b in doc["breakdown"]],
                                y=[b[k] for b in doc["breakdown"]]))
        bd.update_layout(barmode="stack", title="a decode step's bytes (one rank)",
                         yaxis_title="bytes")
        figs.append(bd)
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in (
            r["arch"], r["tp"], "yes" if r["feasible"] else "no",
            r.get("replicas", ""), r.get("chips", ""),
            f"{r['replica_output_tokens_per_second']:,.0f}"
            if r.get("replica_output_tokens_per_second") else "",
            f"{r['usd_per_million_output_tokens']:.3g}"
            if r.get("usd_per_million_output_tokens") else "",
            r.get("reason", "fewest chips" if r.get("fewest_chips") else ""))) + "</tr>"
        for r in doc.get("provision", []))
    t = doc.get("targets", {})
    parts = [f"<h1>solbound fleet: {html.escape(doc['model'])}</h1>",
             f"<p>{doc['workload']['isl']} prompt and {doc['workload']['osl']} output tokens a "
             f"request; targets: {html.escape(str(t))}. Every number is a speed of light: "
             f"throughputs are upper bounds, chips a lower bound (docs/serving.md).</p>"]
    for i, f in enumerate(figs):
        parts.append(pio.to_html(f, full_html=False,
                                 include_plotlyjs="inline" if i == 0 else False,
                                 div_id=f"plot{i}"))
    if rows:
        parts.append("<h2>Provision</h2><table border=1 cellpadding=4><tr><th>chip</th>"
                     "<th>TP</th><th>feasible</th><th>replicas</th><th>chips</th>"
                     "<th>tok/s per replica (at most)</th><th>USD per M tokens (at least)"
                     "</th><th>note</th></tr>" + rows + "</table>")
    for d in doc.get("disaggregated", []):
        parts.append(f"<p>disaggregated on {d['arch']} TP {d['tp']}: prefill:decode replicas "
                     f"{d['prefill_to_decode_replicas']:.3g}; "
                     f"{d['kv_bytes_per_request']['mean'] / 1e6:.4g} MB of cache a request</p>")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>solbound fleet</title>"
            "</head><body style='font-family:sans-serif;max-width:1100px;margin:auto'>"
            + "".join(parts) + "</body></html>")
