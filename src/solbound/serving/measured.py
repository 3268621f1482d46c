"""Measured serving runs divided by the bounds: ``vllm bench serve --save-result`` JSON
(per request with ``--save-detailed``) and SGLang ``bench_serving --output-file`` JSONL
(per request with ``--output-details``; the last line is the latest run).

Headroom is measured / bound for the latencies and bound / measured for the throughput:
how many times faster the run could be. Below 1 the bound is broken, which says the run or
the model the bound was computed for is not the one measured (``broken`` lists them)."""

from __future__ import annotations

import json
import os

from .step import StepError
from .workload import Request

#: the latency keys both tools write, in milliseconds
_AGG = {"ttft": ("mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms"),
        "tpot": ("mean_tpot_ms", "median_tpot_ms", "p90_tpot_ms", "p99_tpot_ms")}


class Run:
    """One measured run: per-request lengths and latencies where the file has them, its
    aggregate metrics, and whether its requests were all sent at once."""

    def __init__(self, data: dict, path: str):
        self.path = path
        self.data = data
        ins, outs = data.get("input_lens"), data.get("output_lens")
        ttfts, itls = data.get("ttfts"), data.get("itls")
        errors = data.get("errors") or [""] * len(ins or [])
        self.requests: list[Request] = []
        self.ttft: list[float] = []
        self.tpot: list[float | None] = []
        if ins and outs and ttfts:
            for i, (a, b, t) in enumerate(zip(ins, outs, ttfts)):
                if (i < len(errors) and errors[i]) or not b or not t:
                    continue        # a failed request (vLLM writes 0 tokens and no TTFT)
                self.requests.append(Request(int(a), int(b)))
                self.ttft.append(float(t))
                gaps = itls[i] if itls and i < len(itls) else None
                self.tpot.append(sum(gaps) / (b - 1) if gaps and b > 1 else None)
        rate = data.get("request_rate", "inf")
        self.all_at_once = (str(rate).lower() in ("inf", "none") and
                            data.get("max_concurrency") in (None, "None"))

    @property
    def detailed(self) -> bool:
        return bool(self.requests)

    def metric(self, key: str) -> float | None:
        v = self.data.get(key)
        return float(v) if isinstance(v, (int, float)) else None


def read_run(path: str) -> Run:
    """A vLLM or SGLang serving benchmark result (one line each error)."""
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        raise StepError(f"{path}: {e.strerror}") from None
    lines = [x for x in text.splitlines() if x.strip()]
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        try:                                   # SGLang appends one JSON object per run
            data = json.loads(lines[-1])
        except (json.JSONDecodeError, IndexError):
            raise StepError(f"{path}: not a vLLM --save-result JSON nor SGLang bench_serving "
                            f"JSONL") from None
    if not isinstance(data, dict) or not ({"output_throughput", "ttfts"} & set(data)):
        raise StepError(f"{path}: no serving metrics (output_throughput, ttfts): not a vLLM "
                        f"--save-result JSON nor SGLang bench_serving output")
    return Run(data, os.path.basename(path))


def headroom(run: Run, doc: dict) -> list[dict]:
    """Per chip of ``doc`` (``serve(..., per_request=True)`` of ``run.requests``): the
    headroom of throughput, of each latency percentile, and per request."""
    import numpy as np
    out = []
    for e in doc["serving"]:
        h: dict = {"arch": e["arch"]}
        tput = run.metric("output_throughput")
        if tput:
            h["output_tokens_per_second"] = {"measured": tput,
                                             "bound": e["output_tokens_per_second"],
                                             "headroom": e["output_tokens_per_second"] / tput}
        for name in ("ttft", "tpot"):
            bound = e[f"{name}_seconds"]
            rows = {}
            for key, pct in zip(_AGG[name], ("mean", "p50", "p90", "p99")):
                v = run.metric(key)
                if v is not None and bound.get(pct):
                    rows[pct] = {"measured": v / 1e3, "bound": bound[pct],
                                 "headroom": v / 1e3 / bound[pct]}
            if run.detailed and "requests" in e:
                meas = np.array([x if x is not None else np.nan
                                 for x in (run.ttft if name == "ttft" else run.tpot)], float)
                lb = np.array([x if x is not None else np.nan
                               for x in e["requests"][f"{name}_seconds"]], float)
                ok = ~np.isnan(meas) & ~np.isnan(lb) & (lb > 0)
                ratio = meas[ok] / lb[ok]
                if ratio.size:
                    rows["per_request"] = {
                        "min": float(ratio.min()), "p50": float(np.percentile(ratio, 50)),
                        "max": float(ratio.max()),
                        "broken": [int(i) for i in np.flatnonzero(ok)[ratio < 1]][:20]}
            h[f"{name}_seconds"] = rows
        out.append(h)
    return out
