"""Serving: a step's counts from solved regions against direct traces, hand-derived closed
forms, capacity from the model's own cache, and the workload bounds' arithmetic."""

import json
import math
import random

import pytest
import torch

from solbound.bounds.roofline import work_bound
from solbound.cli import main
from solbound.hardware.catalog import load_spec
from solbound.serving import Seq, StepError, StepModel, parse_seqs
from solbound.serving.capacity import memory_of
from solbound.serving.workload import Limits, Request, read_workload, serve, uniform

pytestmark = pytest.mark.xdist_group("serving")      # the step models are built once

D, H, KV, HD, F, V, L = 64, 4, 2, 16, 128, 256, 6


def _llama(layers=L, window=None, positions=4096):
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM
    torch.manual_seed(0)
    kw = dict(vocab_size=V, hidden_size=D, intermediate_size=F, num_hidden_layers=layers,
              num_attention_heads=H, num_key_value_heads=KV, max_position_embeddings=positions)
    if window:
        return MistralForCausalLM(MistralConfig(sliding_window=window, **kw)).eval()
    return LlamaForCausalLM(LlamaConfig(**kw)).eval()


@pytest.fixture(scope="module")
def deep():
    """Six layers: a step model reads them from traces of two (the shallow path)."""
    return StepModel(_llama())


@pytest.fixture(scope="module")
def llama():
    return StepModel(_llama(layers=2))


@pytest.fixture(scope="module")
def mistral():
    return StepModel(_llama(layers=2, window=16))


def _same(sm, seqs):
    """The step's counts from its regions equal a direct trace of the composition."""
    got = sm.counts(seqs)
    rep = sm.trace(seqs, arch="h100-sxm", modes=("fused",))
    assert got.macs == rep.counts.macs
    assert got.flops == {k: v for k, v in rep.counts.flops.items() if v}
    assert got.bytes == rep.counts.fused.bytes
    fast = sm.bound(seqs, "h100-sxm")
    assert fast.seconds == pytest.approx(rep.bounds[0].seconds, rel=1e-12)
    return got


def test_parse_seqs_names_the_malformed_item():
    assert [str(s) for s in parse_seqs("512@0,1@4095x2")] == ["512@0", "1@4095", "1@4095"]
    for bad, item in [("5@", "5@"), ("1@2,x@3", "x@3"), ("0@4", "0@4"), ("3@1x0", "3@1x0")]:
        with pytest.raises(StepError, match=item.replace("@", "@")):
            parse_seqs(bad)


def test_cli_rejects_a_malformed_item_before_loading(capsys):
    assert main(["step", "no-such-model", "--seqs", "4@1,7@"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "7@" in err[0]


def test_shallow_llama_step_equals_direct_traces(deep, llama):
    """Prefills of a 6-layer Llama, read from traces of its first and second layers (the
    decode region under the slow marker); the 2-layer model (traced whole) over every main
    region."""
    assert deep._depths()[0][0] is not None and llama._depths() == [(None, 1)]
    _same(deep, [Seq(23, 0), Seq(7, 0)])
    _same(llama, [Seq(1, 0), Seq(23, 0), Seq(1, 140), Seq(9, 31)])


@pytest.mark.slow
def test_small_classes_equal_direct_traces(deep):
    """Random compositions with the small classes (2@0, 1@1, 1@2, n@1, 2@c), where a pass
    may special-case a tiny extent (a two-row arange's row 0 is known zero)."""
    rng = random.Random(7)
    _same(deep, [Seq(23, 0), Seq(1, 140)])
    fixed = [Seq(2, 0), Seq(1, 1), Seq(1, 2), Seq(5, 1), Seq(2, 9), Seq(4, 2)]
    for half in (fixed[:3], fixed[3:]):
        _same(deep, half + [Seq(rng.randint(3, 60), rng.choice([0, rng.randint(3, 90)]))
                             for _ in range(2)] + [Seq(1, rng.randint(3, 200))])


def _macs(seqs, layers=L, h=H, kv_heads=KV, f=F, v=V):
    """MACs derived by hand. Per layer: the q, k, v, o and MLP projections of the new
    tokens, the causal pairs of attention (``new * ctx + new (new + 1) / 2``, for q.k and
    p.v) and a MAC per element of each RMSNorm's mean; but only the last token's logits are
    kept, so of the last layer only the k and v projections (the cache rows) and its input
    norm cover every new token: its query, attention, output, MLP and the final norm serve
    the last token alone. Then one row of logits."""
    proj = D * h * HD + h * HD * D + 3 * D * f       # q, o, MLP
    kv = 2 * D * kv_heads * HD
    total = 0
    for s in seqs:
        pairs = s.new * s.ctx + s.new * (s.new + 1) // 2
        total += (layers - 1) * (s.new * (proj + kv + 2 * D) + 2 * h * HD * pairs)
        total += s.new * (D + kv) + proj + D + 2 * h * HD * (s.ctx + s.new)
        total += D + D * v
    return total


def test_llama_macs_closed_form(llama):
    seqs = [Seq(37, 0), Seq(1, 500), Seq(12, 40)]
    assert llama.counts(seqs).macs == _macs(seqs, layers=2)


def test_a_step_validates_against_the_model(llama):
    rep = llama.trace([Seq(3, 0), Seq(1, 6)], arch="h100-sxm", validate=True,
                      modes=("fused",))
    assert rep.validation["status"] == "passed", rep.validation


@pytest.mark.slow          # 20 s; fast: the window model's CLI step (test_cli_step_and_serve_json)
@pytest.mark.xdist_group("serving_window")
def test_window_regions_equal_direct_traces(mistral):
    """A sliding window of 16: a prompt across it, a decode past it (the cache keeps 15
    rows, the mask 16 keys)."""
    assert mistral.windows == (16,)
    _same(mistral, [Seq(20, 0), Seq(1, 30)])


@pytest.mark.slow
def test_every_window_region_equals_direct_traces(mistral):
    _same(mistral, [Seq(5, 0), Seq(4, 3), Seq(1, 30), Seq(9, 10), Seq(20, 0), Seq(3, 40),
                    Seq(1, 4)])


def test_capacity_from_the_cache_kept(mistral):
    """A window layer keeps ``window - 1`` rows: bytes per token per layer 2 * KV * HD * 4."""
    mem = memory_of(mistral, load_spec("h100-sxm"), 0.5)
    row = 2 * KV * HD * 4
    assert mem.kv_bytes(5) == 2 * 5 * row and mem.kv_bytes(1000) == 2 * 15 * row
    assert mem.free == 40e9 - sum(p.numel() * 4 for p in mistral.model.parameters())
    assert mem.max_sequences(1000) == math.floor(mem.free / (2 * 15 * row))


def test_no_cache_interface_and_positions_are_one_line_errors():
    with pytest.raises(StepError, match="no cache interface"):
        StepModel(torch.nn.Linear(4, 4))
    sm = StepModel(_llama(layers=1, positions=64))
    with pytest.raises(StepError, match="beyond LlamaForCausalLM's 64 positions"):
        sm.counts([Seq(10, 60)])
    with pytest.raises(StepError, match="request 1 .* beyond"):
        serve(sm, [Request(10, 5), Request(40, 30)], "h100-sxm")


def test_one_request_bounds_are_its_own_steps(llama):
    """TTFT: the prefill alone; TPOT: the roofline of its two decode steps (the weights
    read in each) over 2; the makespan: the request's chain."""
    spec = load_spec("h100-sxm")
    P = 50
    doc = serve(llama, [Request(P, 3)], "h100-sxm")
    e = doc["serving"][0]

    def step(seqs_list):
        cs = [llama.counts(s) for s in seqs_list]
        work = {}
        for c in cs:
            for k, v in c.work.items():
                work[k] = work.get(k, 0) + v
        special = {}
        for c in cs:
            for k, v in c.special.items():
                special[k] = special.get(k, 0) + v
        return work_bound(work, special, sum(c.bytes for c in cs), 0, spec, "fused").seconds

    ttft = step([[Seq(P, 0)]])
    tpot = step([[Seq(1, P)], [Seq(1, P + 1)]]) / 2
    assert e["ttft_seconds"]["p50"] == pytest.approx(ttft, rel=1e-9)
    assert e["tpot_seconds"]["p99"] == pytest.approx(tpot, rel=1e-9)
    assert e["makespan_seconds"] == pytest.approx(ttft + 2 * tpot, rel=1e-9)
    assert e["min_steps"] == 3 and doc["notes"] == []       # chunking never lowers the counts
    assert e["output_tokens_per_second"] == pytest.approx(3 / e["makespan_seconds"])


def test_least_steps_under_the_limits(llama):
    """10 requests of 4 + 5 tokens, 2 sequences a step: each is in 1 prefill and 4 decode
    steps, so at least ceil(10 * 5 / 2) = 25 steps; 3 tokens a step chunk each prompt in 2
    (TTFT grows) and bound the steps by ceil(10 * (4 + 4) / 3) = 27."""
    reqs = uniform(4, 5, 10)
    e = serve(llama, reqs, "h100-sxm", Limits(max_seqs=2))["serving"][0]
    assert e["min_steps"] == 25 and e["max_concurrent_sequences"] == 2
    f = serve(llama, reqs, "h100-sxm", Limits(max_batched_tokens=3))["serving"][0]
    assert f["min_steps"] == 27
    assert f["ttft_seconds"]["p50"] > e["ttft_seconds"]["p50"]
    with pytest.raises(StepError, match="more than max_batched_tokens=3"):
        serve(llama, reqs, "h100-sxm", Limits(max_batched_tokens=3, chunked_prefill=False))


def test_offline_ttft_is_an_order_statistic(llama):
    """All at time 0: the k-th first token waits for k prefills, so the TTFT percentiles of
    many equal requests grow with the rank; arrivals spread far apart leave each alone."""
    e = serve(llama, uniform(40, 2, 100), "h100-sxm")["serving"][0]
    t = e["ttft_seconds"]
    assert t["p50"] < t["p90"] < t["p99"]
    spread = [Request(40, 2, arrival=float(i)) for i in range(100)]
    s = serve(llama, spread, "h100-sxm")["serving"][0]["ttft_seconds"]
    assert s["p50"] == s["p99"] < t["p50"]


def test_prefix_hits_make_the_prefill_an_extend(llama):
    """Half of a 60-token prompt found cached: the first token costs the step 30@30."""
    doc = serve(llama, uniform(60, 2, 1), "h100-sxm", Limits(prefix_hit=0.5))
    assert doc["workload"]["prefill_tokens_computed"] == 30
    assert doc["serving"][0]["ttft_seconds"]["p50"] == pytest.approx(
        llama.bound([Seq(30, 30)], "h100-sxm").seconds, rel=1e-12)


def test_workload_files(tmp_path):
    rows = [{"input_len": 10, "output_len": 3, "timestamp": 0.5}, {"input": 7, "output": 1}]
    (tmp_path / "w.json").write_text(json.dumps({"requests": rows}))
    (tmp_path / "w.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (tmp_path / "w.csv").write_text("input,output,arrival\n10,3,0.5\n7,1,\n")
    want = [Request(10, 3, 0.5), Request(7, 1, 0.0)]
    for ext in ("json", "jsonl", "csv"):
        assert read_workload(str(tmp_path / f"w.{ext}")) == want
    (tmp_path / "w.txt").write_text("10 3")
    with pytest.raises(StepError, match="unknown workload format '.txt'"):
        read_workload(str(tmp_path / "w.txt"))
    (tmp_path / "bad.csv").write_text("input,output\n10,\n")
    with pytest.raises(StepError, match="request 0: no output length"):
        read_workload(str(tmp_path / "bad.csv"))


@pytest.mark.xdist_group("serving_window")
def test_cli_step_and_serve_json(tmp_path, capsys):
    """The CLI on a config file: ``step``'s JSON is the report schema with the step's exact
    totals; ``serve`` writes solbound.serving/1."""
    cfg = _llama(layers=2).config
    cfg.save_pretrained(tmp_path / "tiny")
    out = tmp_path / "step.json"
    assert main(["step", str(tmp_path / "tiny"), "--seqs", "6@0,5@0x2", "--arch", "h100-sxm",
                 "--json", str(out), "-q", "--dtype", "float32", "--price", "h100-sxm=3"]) == 0
    doc = json.loads(out.read_text())
    assert doc["bounds"][0]["usd"] == pytest.approx(doc["bounds"][0]["seconds"] * 3 / 3600)
    assert doc["totals"]["macs"] == _macs([Seq(6, 0), Seq(5, 0), Seq(5, 0)], layers=2)
    assert doc["bounds"][0]["arch"] == "h100-sxm"
    out = tmp_path / "serve.json"
    assert main(["serve", str(tmp_path / "tiny"), "--isl", "6", "--osl", "1", "--requests",
                 "4", "--arch", "h100-sxm,b200", "--json", str(out), "-q", "--dtype",
                 "float32", "--price", "2", "--no-chunked-prefill"]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == "solbound.serving/1" and [e["arch"] for e in doc["serving"]] == \
        ["h100-sxm", "b200"]
    for e in doc["serving"]:
        assert set(e["ttft_seconds"]) >= {"p50", "p90", "p99"} and e["ttft_seconds"]["p50"] > 0
        assert e["tpot_seconds"]["p50"] is None             # one output token: no decode
        assert e["memory"]["state_bytes_per_sequence"] == 0  # key/value rows only
        assert e["usd_per_million_output_tokens"] == pytest.approx(
            2 / 3600 / e["output_tokens_per_second"] * 1e6)
    capsys.readouterr()
    (tmp_path / "w.yaml").write_text("")
    assert main(["serve", str(tmp_path / "tiny"), "--workload", str(tmp_path / "w.yaml")]) == 2
    assert "unknown workload format" in capsys.readouterr().err
    assert main(["serve", str(tmp_path / "tiny"), "--isl", "4", "--osl", "2", "--arch",
                 "h100-sxm", "--price", "b200=3"]) == 2
    assert "'b200' is not a chip" in capsys.readouterr().err


def test_measured_runs_headroom(tmp_path, llama):
    """A vLLM --save-result --save-detailed file and an SGLang JSONL (two runs, the last
    read) whose latencies are set from the bounds: 2x the bound reads 2.0, a request
    faster than its bound is named."""
    from solbound.serving.measured import headroom, read_run
    reqs = [Request(30 + 3 * i, 2 + i % 4) for i in range(8)]
    base = serve(llama, reqs, "h100-sxm", order_statistics=False, per_request=True)
    lb = base["serving"][0]["requests"]
    ttfts = [2 * t for t in lb["ttft_seconds"]]
    ttfts[3] = 0.5 * lb["ttft_seconds"][3]
    itls = [[3 * lb["tpot_seconds"][i]] * (r.output - 1) for i, r in enumerate(reqs)]
    run = {"request_rate": 4.0, "max_concurrency": None, "output_throughput": 10.0,
           "median_ttft_ms": 1e3 * 2 * base["serving"][0]["ttft_seconds"]["p50"],
           "input_lens": [r.input for r in reqs], "output_lens": [r.output for r in reqs],
           "ttfts": ttfts, "itls": itls, "errors": [""] * len(reqs)}
    (tmp_path / "vllm.json").write_text(json.dumps(run))
    (tmp_path / "sglang.jsonl").write_text(json.dumps({"output_throughput": 1.0}) + "\n"
                                           + json.dumps(run) + "\n")
    for name in ("vllm.json", "sglang.jsonl"):
        r = read_run(str(tmp_path / name))
        assert r.detailed and not r.all_at_once and r.requests == reqs
        doc = serve(llama, r.requests, "h100-sxm", order_statistics=False, per_request=True)
        h = headroom(r, doc)[0]
        assert h["ttft_seconds"]["per_request"]["broken"] == [3]
        assert h["ttft_seconds"]["per_request"]["max"] == pytest.approx(2.0)
        assert h["ttft_seconds"]["p50"]["headroom"] == pytest.approx(2.0)
        assert h["tpot_seconds"]["per_request"]["min"] == pytest.approx(3.0)
        assert h["output_tokens_per_second"]["headroom"] == pytest.approx(
            doc["serving"][0]["output_tokens_per_second"] / 10.0)
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(StepError, match="no serving metrics"):
        read_run(str(tmp_path / "x.json"))


# --- tensor parallelism: one rank of the model's own plan -------------------------------

@pytest.fixture(scope="module")
def llama_tp2():
    return StepModel(_llama(layers=2), tp=2)


@pytest.mark.xdist_group("serving_tp")
def test_tensor_parallel_step_equals_rank_traces(llama_tp2):
    """At TP 2 (transformers' own plan, rank 0 under a fake process group) the step's counts
    and collectives from its regions equal a direct trace of rank 0's program. By hand: the
    rank's MACs are the one-chip step's with half the heads, key/value heads, FFN and
    vocabulary (the norms whole), the last layer serving the last token only as at TP 1
    (demand passes through its all-reduces); the payloads (fp32: 4 bytes) an all-reduce of
    the vocabulary-parallel embedding's rows and of each layer's row-wise o_proj and
    down_proj over every new token (the last layer's over the last token), and an
    all-gather of the last token's logits."""
    sm = llama_tp2
    seqs = [Seq(5, 0), Seq(1, 7), Seq(4, 9)]
    got = sm.counts(seqs)
    rep = sm.trace(seqs, arch="h100-sxm", modes=("fused",))
    assert got.macs == rep.counts.macs == _macs(seqs, 2, H // 2, KV // 2, F // 2, V // 2)
    assert got.bytes == rep.counts.fused.bytes
    want_comm = {}
    for c in rep.counts.collectives:
        key = f"{c.kind}:{c.ranks}"
        want_comm[key] = want_comm.get(key, 0) + c.bytes * c.calls
    assert got.comm == want_comm == {
        "all_reduce:2": sum((1 + 2 * (2 - 1)) * s.new * D * 4 + 2 * D * 4 for s in seqs),
        "all_gather:2": len(seqs) * V * 4}
    fast = sm.bound(seqs, "h100-sxm")
    direct = next(b for b in rep.bounds if b.mode == "fused")
    assert fast.seconds == pytest.approx(direct.seconds, rel=1e-12)
    assert direct.comm_seconds > 0
    assert fast.comm_seconds == pytest.approx(direct.comm_seconds, rel=1e-12)
    # the rank's KV heads and weights: KV/2 heads; every projection, the embedding and the
    # LM head halved, the norms whole
    assert sm.layout[0].key == (KV // 2, HD)
    layer = D * H * HD * 2 + 2 * D * KV * HD + 3 * D * F
    assert sm.weights_bytes() == 4 * (2 * (layer // 2 + 2 * D) + D + 2 * V * D // 2)
    with pytest.raises(StepError, match="tensor-parallel"):
        sm.trace(seqs, validate=True)


@pytest.mark.xdist_group("serving_tp")
@pytest.mark.slow
def test_tensor_parallel_serving_is_per_replica(llama_tp2, llama):
    """A workload at TP 2: throughput per replica and per chip, a replica's price twice a
    chip's, the per-rank weights in memory; a head count that does not split is one line."""
    doc = serve(llama_tp2, uniform(12, 4, 6), "h100-sxm", Limits(), price=2.0)
    e = doc["serving"][0]
    assert e["tp"] == 2 and e["output_tokens_per_second_per_chip"] == pytest.approx(
        e["output_tokens_per_second"] / 2)
    assert e["price_per_hour"] == 4.0
    assert e["memory"]["weights_bytes"] == llama_tp2.weights_bytes()
    assert e["work_seconds"]["communication"] > 0
    with pytest.raises(StepError, match="does not split over 3"):
        StepModel(_llama(layers=2), tp=3)


# --- speculative decoding -----------------------------------------------------------------

@pytest.mark.xdist_group("serving_fp8")
@pytest.mark.slow
def test_verify_step_keeps_every_tokens_logits():
    """The target's verify step (every new token's logits) from its regions equals a direct
    trace, and its MACs the hand-derived count: every layer and the LM head over all new
    tokens."""
    sm = StepModel(_llama(layers=2), logits="all")
    seqs = [Seq(4, 9), Seq(3, 5), Seq(2, 30)]
    _same(sm, seqs)
    proj, kv = D * H * HD + H * HD * D + 3 * D * F, 2 * D * KV * HD
    want = sum(2 * (s.new * (proj + kv + 2 * D)
                    + 2 * H * HD * (s.new * s.ctx + s.new * (s.new + 1) // 2))
               + s.new * (D + D * V) for s in seqs)
    assert sm.counts(seqs).macs == want


def test_speculation_rounds_and_best_k(llama):
    """A round is the draft's K decode steps plus the target's verify of K + 1 tokens; with
    nothing accepted plain decoding (K = 0) wins."""
    from solbound.serving.speculative import Speculation, expected_tokens, head_model
    target = _llama(layers=2)
    sp = Speculation(llama, StepModel(target, logits="all"),
                     StepModel(head_model(target, 1)))
    spec = load_spec("h100-sxm")
    r = sp.round(4, 40, 3, spec)
    draft = sum(sp.draft.bound([Seq(1, 40 + i)] * 4, spec).seconds for i in range(3))
    verify = sp.verify.bound([Seq(4, 40)] * 4, spec).seconds
    assert r["seconds"] == pytest.approx(draft + verify, rel=1e-12)
    assert sp.best(4, 40, (0.0,), [1, 2, 3], spec)["best_k"] == 0
    one = sp.best(4, 40, (1.0,), [3], spec)
    assert one["rounds"][1]["tokens_per_round"] == 4 == expected_tokens((1.0,), 3)
    assert one["rounds"][1]["seconds_per_token"] == pytest.approx(
        one["rounds"][1]["seconds"] / 4)


@pytest.mark.slow
def test_cli_speculate_json(tmp_path):
    """The CLI writes solbound.speculative/1 (it builds its three step models from a config
    directory: the slow marker keeps the suite's time)."""
    cfg = _llama(layers=2).config
    cfg.save_pretrained(tmp_path / "tiny")
    out = tmp_path / "spec.json"
    assert main(["speculate", str(tmp_path / "tiny"), "--draft", "layers:1", "--acceptance",
                 "0.9,0.5", "--k", "1-3", "--batch", "1,4", "--ctx", "40", "--arch",
                 "h100-sxm", "--json", str(out), "-q", "--dtype", "float32"]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == "solbound.speculative/1" and doc["k"] == [0, 1, 2, 3]
    rows = doc["speculative"][0]["batches"]
    assert [r["batch"] for r in rows] == [1, 4]
    assert rows[0]["rounds"][2]["tokens_per_round"] == pytest.approx(1 + 0.9 + 0.45)
    assert main(["speculate", str(tmp_path / "tiny"), "--draft", "layers:1",
                 "--acceptance", "1.5"]) == 2


# --- many chips: frontier, provisioning, disaggregation, report ---------------------------

def test_frontier_and_breakdown(llama):
    """Each frontier point is the decode step of b sequences at the mean decode context;
    a step's breakdown: the MACs that grow with the context are attention's, derived by
    hand (q.k and p.v over ctx cached keys in both layers)."""
    from solbound.serving.fleet import breakdown, decode_context, frontier
    spec = load_spec("h100-sxm")
    rows = frontier(llama, spec, 40, 21, Limits(max_seqs=24))
    ctx = decode_context(40, 21)
    assert ctx == 49 and [r["batch"] for r in rows] == [1, 2, 4, 8, 16, 24]
    for r in rows:
        t = llama.bound([Seq(1, ctx)] * r["batch"], spec).seconds
        assert r["step_seconds"] == t and r["tokens_per_second_per_user"] == 1 / t
        assert r["output_tokens_per_second_per_chip"] == r["batch"] / t
    bd = breakdown(llama, [Seq(1, ctx)] * 3)
    assert bd["attention_macs"] == pytest.approx(3 * 2 * 2 * H * HD * ctx, rel=1e-12)
    assert bd["macs"] == _macs([Seq(1, ctx)] * 3, layers=2)
    assert bd["expert_bytes"] == 0 and bd["collective_bytes"] == 0


def test_provision_and_disaggregation(llama):
    """Provisioning: the replica's throughput is at most the offline bound and (b + 1) / T
    under a TPOT target T; replicas = ceil(target / that); a TTFT target below a lone
    request's bound is infeasible. Disaggregation: each request's cache is its prompt's rows
    on both layers (closed form), sent at least at the link's bandwidth."""
    from solbound.serving.fleet import _largest_batch, disaggregate, provision
    spec = load_spec("h100-sxm")
    lim = Limits(max_seqs=32)
    one = llama.bound([Seq(1, 49)], spec).seconds
    target = 1.5 * one
    rows = provision({1: llama, 2: "cannot shard"}, 40, 21, spec, throughput=1e6,
                     tpot=target, limits=lim, requests=50)
    r = rows[0]
    b = _largest_batch(llama, spec, 49, 32, target)
    assert 1 <= b < 32 and llama.bound([Seq(1, 49)] * (b + 1), spec).seconds > target
    cap = min(r["offline_output_tokens_per_second"], (b + 1) / target)
    assert r["feasible"] and r["replica_output_tokens_per_second"] == cap
    assert r["replicas"] == math.ceil(1e6 / cap) and r["chips"] == r["replicas"]
    assert r["fewest_chips"] and rows[1] == {"arch": "h100-sxm", "tp": 2, "feasible": False,
                                             "reason": "cannot shard"}
    late = provision({1: llama}, 40, 21, spec, throughput=1e3, ttft=1e-9, limits=lim)
    assert not late[0]["feasible"] and "first token" in late[0]["reason"]
    d, = disaggregate(llama, uniform(40, 21, 10), spec, lim)
    per_token = 2 * 2 * KV * HD * 4                     # both layers' K and V rows, fp32
    assert d["kv_bytes_per_request"] == {"mean": 40 * per_token, "max": 40 * per_token}
    assert d["transfer_seconds_per_request"]["scale_up"] == \
        40 * per_token / spec.links["scale_up"]
    assert d["prefill_to_decode_replicas"] == d["prefill_seconds"] / d["decode_seconds"]


@pytest.mark.slow
def test_cli_fleet_report(tmp_path, capsys):
    cfg = _llama(layers=2).config
    cfg.save_pretrained(tmp_path / "tiny")
    page, out = tmp_path / "fleet.html", tmp_path / "fleet.json"
    assert main(["fleet", str(tmp_path / "tiny"), "--isl", "30", "--osl", "9", "--tp", "1,3",
                 "--arch", "h100-sxm", "--throughput", "5000", "--tpot", "1ms",
                 "--disaggregate", "--dtype", "float32", "--html", str(page), "--json",
                 str(out), "-q", "--requests", "20", "--max-seqs", "16"]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == "solbound.fleet/1"
    assert [(p["tp"], p["feasible"]) for p in doc["provision"]] == [(1, True), (3, False)]
    assert "does not split over 3" in doc["provision"][1]["reason"]
    assert doc["frontier"][0]["rows"][-1]["batch"] == 16
    text = page.read_text()
    assert "plotly" in text and "Provision" in text and "prefill:decode" in text
    with pytest.raises(SystemExit) as e:
        main(["fleet", str(tmp_path / "tiny"), "--isl", "3", "--osl", "2", "--tpot", "soon"])
    assert e.value.code == 2 and "a time like 20ms" in capsys.readouterr().err


# --- FP8 linears and cache ----------------------------------------------------------------

def _fp8_step():
    with torch.device("meta"):
        m = _llama(layers=2).to("meta").to(torch.bfloat16)
    return StepModel(m, weights="fp8", kv_dtype="fp8")


def test_fp8_weights_and_cache_are_held_at_one_byte():
    """FP8 linears (e4m3 weights with a scale per row) and an FP8 cache: the weights and the
    cache rows are held at one byte (closed forms); validating it is refused by name."""
    sm = _fp8_step()
    assert sm.layout[0].key_dtype == "float8_e4m3fn" and sm.layout[0].bytes_per_token() == \
        2 * KV * HD
    layer = D * H * HD * 2 + 2 * D * KV * HD + 3 * D * F
    rows = H * HD + 2 * KV * HD + D + 2 * F + D          # q, k, v, o, gate, up, down
    assert sm.weights_bytes() == 2 * (layer + 4 * rows + 2 * 2 * D) + 2 * D + 2 * 2 * V * D
    with pytest.raises(StepError, match="CUDA only"):
        sm.trace([Seq(1, 7)], validate=True)


@pytest.mark.xdist_group("serving_fp8")
def test_fp8_step_equals_direct_trace():
    """FP8 linears (activations quantized per token, ``_scaled_mm``) and an FP8 cache: the
    step's counts from its regions equal a direct trace; the projections run on the FP8
    tensor cores (the LM head and attention in BF16)."""
    sm = _fp8_step()
    # a decode and an extend (two regions: the regions' exactness over every kind of
    # sequence is the BF16 tests', here the FP8 kernels')
    seqs = [Seq(1, 7), Seq(4, 9)]
    got = _same(sm, seqs)
    assert got.macs == _macs(seqs, layers=2)
    assert got.work["tensor_fp8"] > 0
    lm = D * V * len(seqs)                     # the LM head: one row per sequence, BF16
    # attention (q.k and p.v): every causal pair in the first layer, the last token's
    # ctx + new keys in the last
    attn = sum(2 * H * HD * (s.new * s.ctx + s.new * (s.new + 1) // 2 + s.ctx + s.new)
               for s in seqs)
    assert got.work["tensor_bf16"] == 2 * (lm + attn)


# ------------------------------------------------------------- state layers (SSM, hybrid)

def _mamba2(chunk=8):
    """Mamba 2: every layer an SSM whose prefill is computed in chunks of ``chunk`` tokens
    (the last one padded), a causal convolution of 4 taps, a recurrent state per head."""
    from transformers import Mamba2Config, Mamba2ForCausalLM
    torch.manual_seed(0)
    cfg = Mamba2Config(vocab_size=256, hidden_size=32, num_hidden_layers=2, num_heads=4,
                       head_dim=16, state_size=8, n_groups=1, chunk_size=chunk, expand=2,
                       conv_kernel=4)
    return Mamba2ForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def mamba2():
    return StepModel(_mamba2())


@pytest.mark.xdist_group("serving_state")
def test_state_layers_are_read_from_the_cache(mamba2):
    """Each layer keeps the convolution's last 4 inputs of its 2 * 32 inner channels and
    2 * 8 B/C channels, and a 4 x 16 x 8 state per head, fp32: 1,280 + 2,048 bytes a
    sequence whatever its length; no key/value rows."""
    conv, rec = ("conv", 0, (80, 4), "float32"), ("recurrent", 0, (4, 16, 8), "float32")
    assert [(L.kind, L.states) for L in mamba2.layout] == [("state", (conv, rec))] * 2
    assert (mamba2.chunk, mamba2.small) == (8, 4)
    mem = memory_of(mamba2, load_spec("h100-sxm"), 0.5)
    assert mem.state_bytes() == 2 * (80 * 4 + 4 * 16 * 8) * 4 == 6656
    assert mem.kv_bytes(1) == mem.kv_bytes(100_000) == 6656
    assert mem.max_sequences(100_000) == math.floor(mem.free / 6656)


@pytest.mark.slow        # 30-40 s; fast: the chunk sides and monomials (doctests), the
@pytest.mark.xdist_group("serving_state")   # state layout, the FP8 cache's steps
def test_chunked_state_layers_equal_direct_traces(mamba2):
    """Prefills over several chunks (the last padded: polynomials in new and the chunks)
    and a one-token decode against a state: exact against a direct trace of the
    composition, which validates against the model."""
    from solbound.serving.step import chunk_side
    assert [chunk_side(n, 8) for n in (5, 8, 13, 24)] == ["part", "one", "chunks", "whole"]
    seqs = "13@0,1@5"
    got = mamba2.counts(seqs)
    rep = mamba2.trace(seqs, arch="h100-sxm", modes=("fused",), validate=True)
    assert rep.validation["status"] == "passed"
    assert (got.macs, got.bytes) == (rep.counts.macs, rep.counts.fused.bytes)
    assert got.flops == {k: v for k, v in rep.counts.flops.items() if v}


def test_hybrid_cache_layout_and_capacity():
    """A Jamba-style hybrid (one Mamba layer, one attention layer): a state layer and a
    key/value layer in one cache; a sequence holds the state and its rows."""
    sm = StepModel(_jamba())
    assert [L.kind for L in sm.layout] == ["state", "full"]
    mem = memory_of(sm, load_spec("h100-sxm"), 0.5)
    # Mamba layer: conv (64, 4) and state (64, 8), fp32; attention layer: 2 x 2 x 8 fp32
    assert mem.state_bytes() == (64 * 4 + 64 * 8) * 4
    assert mem.kv_bytes(10) == mem.state_bytes() + 10 * 2 * 2 * 8 * 4


def _jamba():
    from transformers import JambaConfig, JambaForCausalLM
    torch.manual_seed(0)
    cfg = JambaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, attn_layer_period=2,
                      attn_layer_offset=1, expert_layer_period=4, expert_layer_offset=3,
                      mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4,
                      max_position_embeddings=1024)
    return JambaForCausalLM(cfg).eval()


@pytest.mark.slow           # 24 s; fast: the layout above, the Mamba 2 steps below
@pytest.mark.xdist_group("serving_state")
def test_hybrid_attention_and_state_layers_serve(tmp_path, capsys):
    """A Jamba-style hybrid (one attention layer, one Mamba layer): the step program fills
    both caches, a decode is exact against a direct trace, and ``serve`` charges each
    sequence its state next to its key/value rows."""
    sm = StepModel(_jamba())
    assert [L.kind for L in sm.layout] == ["state", "full"]
    _same(sm, "1@7,1@40")
    res = serve(sm, uniform(2, 4, 3), "h100-sxm")     # 2-token prompts: one class
    mem = res["serving"][0]["memory"]
    # Mamba layer: conv (64, 4) and state (64, 8), fp32; attention layer: 2 x 2 x 8 fp32
    assert mem["state_bytes_per_sequence"] == (64 * 4 + 64 * 8) * 4
    assert mem["kv_bytes_per_token"] == {"full": 2 * 2 * 8 * 4}


@pytest.mark.xdist_group("serving_state")
def test_a_config_file_its_own_class_reads(tmp_path, mamba2):
    """Mamba 2's config writes ``time_step_limit`` with an infinite float its own reader
    decodes, and computes ``layer_types`` from the layer count (no setter): a step reads
    the file, and the shallow traces keep a layer without setting it. Eight layers count
    as the traces of one and two say: the second layer's counts six times more."""
    from transformers import Mamba2Config
    from solbound.serving.models import load_model
    cfg = Mamba2Config(vocab_size=256, hidden_size=32, num_hidden_layers=8, num_heads=4,
                       head_dim=16, state_size=8, n_groups=1, chunk_size=8, expand=2)
    path = tmp_path / "mamba2.json"
    cfg.to_json_file(str(path))
    assert "Infinity" in path.read_text()
    sm = StepModel(load_model(str(path), dtype="float32"))
    assert sm._depths()[0][0] == [0] and len(sm.layout) == 8
    deep = mamba2                        # two layers, traced whole
    assert sm.counts("1@2").macs == deep.counts("1@2").macs + 6 * (
        deep.counts("1@2").macs - StepModel(_mamba2_layers(1)).counts("1@2").macs)


def _mamba2_layers(n):
    from transformers import Mamba2Config, Mamba2ForCausalLM
    return Mamba2ForCausalLM(Mamba2Config(vocab_size=256, hidden_size=32, num_hidden_layers=n,
                                          num_heads=4, head_dim=16, state_size=8, n_groups=1,
                                          chunk_size=8, expand=2)).eval()


@pytest.mark.xdist_group("serving_state")
def test_transformers_quantized_fp8_cache(tmp_path):
    """transformers' own ``QuantizedCache(backend="fp8")``: e4m3 rows (one byte an element)
    and a float32 scale per tensor, a key and a value scale a layer a sequence; a step's
    counts from its regions equal a direct trace, which validates."""
    sm = StepModel(_llama(layers=2), kv_dtype="quantized-fp8")
    scales = (("scale", 0, (), "float32"), ("scale", 1, (), "float32"))
    assert [(L.key, L.key_dtype, L.states) for L in sm.layout] == \
        [((KV, HD), "float8_e4m3fn", scales)] * 2
    mem = memory_of(sm, load_spec("h100-sxm"), 0.5)
    assert mem.kv_bytes(100) == 2 * (2 * KV * HD * 100 + 8)
    got = sm.counts("1@1,1@2")
    rep = sm.trace("1@1,1@2", arch="h100-sxm", modes=("fused",), validate=True)
    assert rep.validation["status"] == "passed"
    assert (got.macs, got.bytes) == (rep.counts.macs, rep.counts.fused.bytes)
    # Mistral's window layers are refused by transformers' own class, in one line
    with pytest.raises(StepError, match="QuantizedCache.*only supported .* full attention"):
        StepModel(_llama(layers=1, window=16), kv_dtype="quantized-fp8")


def _jamba16():
    from transformers import JambaConfig, JambaForCausalLM
    torch.manual_seed(0)
    cfg = JambaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=16,
                      num_attention_heads=4, num_key_value_heads=2, attn_layer_period=4,
                      attn_layer_offset=2, expert_layer_period=32, expert_layer_offset=31,
                      mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4)
    return JambaForCausalLM(cfg).eval()


def test_a_shallow_copy_keeps_the_layer_kinds_its_config_derives():
    """Jamba derives its layer kinds from an attention period and offset: the shallow
    copy of its first Mamba layer and first attention layer (0 and 2 of 16) builds a cache
    of one state layer and one key/value layer, and the config is restored after."""
    from transformers import DynamicCache
    from solbound.serving.step import _keep_layers
    sm = StepModel(_jamba16())
    keep = sm._depths()[0][0]
    assert keep == [0, 2]
    with _keep_layers(sm.model, sm._stack, keep):
        kinds = [type(l).__name__ for l in DynamicCache(config=sm.model.config).layers]
        assert sm.model.config.layers_block_type == ["mamba", "attention"]
    assert kinds == ["LinearAttentionLayer", "DynamicLayer"]
    assert len(sm.model.config.layers_block_type) == 16


@pytest.mark.slow        # 25 s; fast: the shallow copy's cache above
@pytest.mark.xdist_group("serving_state")
def test_shallow_traces_of_a_hybrid_whose_config_derives_its_layer_kinds():
    """Jamba derives its layer kinds from an attention period and offset: a shallow copy
    keeps its layers' own kinds (transformers' default Jamba, 32 layers, failed here: the
    cache of the first two layers held no attention layer). Sixteen layers, attention
    every fourth from the third: the decode from shallow traces equals a direct trace."""
    sm = StepModel(_jamba16())
    assert sm._depths()[0][0] is not None            # traced shallow
    got = sm.counts("1@2")
    rep = sm.trace("1@2", arch="h100-sxm", modes=("fused",))
    assert (got.macs, got.bytes) == (rep.counts.macs, rep.counts.fused.bytes)
    assert sm.model.config.layers_block_type[2] == "attention"      # restored
