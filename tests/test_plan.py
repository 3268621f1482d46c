"""Training plans at cluster scale (``solbound plan``): profiles of a traced step per TP
degree, memory per rank, the search. A small Llama with closed forms."""

import dataclasses
import json

import pytest

from solbound.cli import main
from solbound.hardware.catalog import load_spec
from solbound.planning.memory import rank_memory
from solbound.planning.search import Plan, PlanError, Search, evaluate, plans, run, stage_times

pytestmark = pytest.mark.xdist_group("plan")        # the profiles are traced once

V, D, F, L, H, KV, HD, S = 256, 64, 128, 4, 4, 2, 16, 32


def _config():
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=V, hidden_size=D, intermediate_size=F, num_hidden_layers=L,
                       num_attention_heads=H, num_key_value_heads=KV, head_dim=HD,
                       max_position_embeddings=256)


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """The TP-1 step's report (traced here) and the profiles of TP 1 and 2 (TP 2 through
    ``planning.trace.profile``, into a cache of the test's own)."""
    import os

    import torch

    from solbound.api import analyze
    from solbound.planning.profile import profile_of
    from solbound.planning.trace import _loss_model, profile
    os.environ["SOLBOUND_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    rep = analyze(_loss_model(_config(), "bfloat16"),
                  (torch.zeros(1, S, dtype=torch.long, device="meta"),), arch="h100-sxm",
                  train=True, modes=("fused",))
    return rep, {(1, 1): profile_of(rep, 1, 1, S), (2, 1): profile(_config(), 2, 1, S)}


@pytest.fixture(scope="module")
def profiles(traced):
    return traced[1]


def _layer_params(tp):
    """A layer's parameters on a rank: q, o (H/tp heads), k, v (KV/tp heads), the MLP's
    three (F/tp wide), two norms (replicated)."""
    return 2 * D * H // tp * HD + 2 * D * KV // tp * HD + 3 * D * F // tp + 2 * D


@pytest.mark.parametrize("tp", [1, 2])
def test_state_per_layer_and_outside_closed_form(profiles, tp):
    """bf16 parameters and gradients; AdamW's two moments in bf16 and a float32 step
    counter per parameter tensor (stacked over the layers: 4 B a layer each)."""
    p = profiles[(tp, 1)]
    assert p.layers == L
    layer, vocab = 2 * _layer_params(tp), 2 * V // tp * D
    assert p.state[("parameters", "loop")] == layer
    assert p.state[("gradients", "loop")] == layer
    assert p.state[("optimizer_state", "loop")] == 2 * layer + 9 * 4
    assert p.state[("parameters", "first")] == vocab                   # the embedding
    assert p.state[("parameters", "last")] == 2 * D + vocab           # norm, head
    assert p.state[("optimizer_state", "first")] == 2 * vocab + 4
    assert p.state[("optimizer_state", "last")] == 2 * (2 * D + vocab) + 2 * 4
    assert p.hidden_bytes == S * D * 2


def test_one_rank_plan_is_the_traced_step(traced):
    """TP 1, PP 1, DP 1, no ZeRO: the rank holds the step's parameters, gradients,
    optimizer state and saved activations (but attention's scores), and runs its MACs; every product of the step,
    attention's included, runs on the bf16 tensor cores (the CPU decomposition's fp32
    upcasts are not the GPU's)."""
    rep, profiles = traced
    p = profiles[(1, 1)]
    assert all(kc.dtype == "bf16" for kc in rep.counts.kernels if kc.matrix_class)
    mem = rep.training["memory"]
    m = rank_memory(p, L, True, True, 1, 0, 1, 1, "none")
    assert m["parameters"] == mem["parameters"] and m["gradients"] == mem["gradients"]
    assert m["optimizer_state"] == mem["optimizer_state"]
    # attention's probabilities (H x S x S in fp32 a layer), which the CPU decomposition
    # saves and a fused attention kernel recomputes, are left out
    assert p.saved_scores == {"loop": H * S * S * 4}
    assert m["activations"] == mem["saved_for_backward"] - L * H * S * S * 4
    assert p.model_macs == rep.counts.macs
    spec = load_spec("h100-sxm")
    r = evaluate(Plan(1, 1, 1, 1, 1), p, spec, model_flops=p.tensor_flops)
    assert 0 < r["mfu"] <= 1 and p.tensor_flops == 2 * rep.counts.macs - 2 * sum(
        kc.macs for kc in rep.counts.kernels if not kc.matrix_class)
    assert sum(s["macs"] for s in r["stages"]) == rep.counts.macs


def test_stages_sum_to_the_step_and_zero_shards(profiles):
    """Pipeline stages' MACs add up to the step's; ZeRO 1, 2 and 3 divide the optimizer
    state, the gradients, the parameters by the data-parallel degree; 1F1B's first stage
    holds p microbatches' activations."""
    p, spec = profiles[(1, 1)], load_spec("h100-sxm")
    r = evaluate(Plan(1, 2, 1, 1, 4), p, spec)
    assert sum(s["macs"] for s in r["stages"]) == p.model_macs
    assert [s["peak_microbatches"] for s in r["stages"]] == [2, 1]
    first = r["stages"][0]["memory"]
    assert first["activations"] == 2 * p.saved_at(2, True, False)
    for zero, shard in ((1, {"optimizer_state"}), (2, {"optimizer_state", "gradients"}),
                        (3, {"optimizer_state", "gradients", "parameters"})):
        m = rank_memory(p, 2, True, False, 4, zero, 2, 1, "none")
        for what in ("parameters", "gradients", "optimizer_state"):
            full = p.state_at(what, 2, True, False)
            assert m[what] == (full / 4 if what in shard else full)
    full = rank_memory(p, 2, True, False, 1, 0, 2, 1, "full")["activations"]
    assert full == 2 * (2 * p.hidden_bytes + p.saved["first"]) + p.saved["loop"]


def test_tensor_parallel_all_reduces_closed_form(profiles):
    """Over a slow link the all-reduces bound each stage: two a layer in the forward plus
    the embedding's, two a layer in the backward plus the head's input gradient, each of
    a microbatch's hidden states; over two ranks an all-reduce moves 2 (n - 1) / n = 1 x
    its bytes (no reduction in the switch)."""
    spec = load_spec("h100-sxm")
    slow = dataclasses.replace(spec, links={**spec.links, "scale_up": 1e3,
                                            "in_network_reduction": False})
    p = profiles[(2, 1)]
    (st,) = stage_times(p, 1, "none", slow)
    assert st["t"]["F"] == pytest.approx((2 * L + 1) * p.hidden_bytes / 1e3)
    assert st["t"]["B"] == pytest.approx((2 * L + 1) * p.hidden_bytes / 1e3)
    rc = stage_times(p, 1, "full", slow)[0]
    assert rc["t"]["B"] == pytest.approx((4 * L + 1) * p.hidden_bytes / 1e3)


def test_search_finds_the_fitting_plans_and_their_pareto(profiles):
    spec = load_spec("h100-sxm")
    search = Search(chips=4, global_batch=8)
    cands = plans(profiles, search)
    assert {(c.tp, c.pp, c.dp) for c in cands} == {(1, 1, 4), (1, 2, 2), (1, 4, 1),
                                                   (2, 1, 2), (2, 2, 1)}
    assert all(c.chips == 4 and c.dp * c.microbatch * c.microbatches == 8 for c in cands)
    # --tp 2: the TP-1 profile gives the model's FLOPs (MFU), its plans are not searched
    only = run(profiles, spec, Search(chips=4, global_batch=8, tp=(2,)))
    assert {r["plan"]["tp"] for r in only["plans"]} == {2}
    assert only["searched"] == sum(1 for c in cands if c.tp == 2)
    doc = run(profiles, spec, search)
    assert doc["searched"] == len(cands) and doc["fitting"] == len(cands)
    secs = [r["seconds"] for r in doc["plans"]]
    assert secs == sorted(secs) and 0 < doc["plans"][0]["mfu"] <= 1
    for a in doc["pareto"]:
        assert not any(b["seconds"] < a["seconds"] and b["memory_bytes"] < a["memory_bytes"]
                       for b in doc["plans"])
    tiny = dataclasses.replace(spec, entries={**spec.entries,
                                              "dram.capacity": {"value": 1e5}})
    with pytest.raises(PlanError, match=r"no plan of 4 x h100-sxm fits: .* GiB over"):
        run(profiles, tiny, search)


def test_cli_plan(tmp_path, capsys, profiles):
    _config().save_pretrained(tmp_path / "tiny")
    out = tmp_path / "plan.json"
    base = ["plan", str(tmp_path / "tiny"), "--chips", "4", "--arch", "h100-sxm",
            "--global-batch", "8", "--seq", str(S), "--tp", "1,2"]
    assert main(base + ["--train", "--json", str(out), "--top", "3", "--chakra",
                        str(tmp_path / "et" / "best")]) == 0
    doc = json.loads(out.read_text())
    assert doc["chakra"]["files"] == 4 and (tmp_path / "et" / "best.3.et").exists()
    assert doc["schema"] == "solbound.plan/1" and len(doc["plans"]) == 3
    r = doc["plans"][0]
    assert {"tp", "pp", "dp", "microbatch", "microbatches", "schedule", "zero",
            "recompute"} <= set(r["plan"])
    assert r["seconds"] > 0 and r["memory_bytes"] > 0 and r["stages"][0]["peak_memory_bytes"]
    text = capsys.readouterr().out
    assert "plans searched" in text and "Pareto" in text
    assert main(base) == 2
    assert "add --train" in capsys.readouterr().err
    assert main(base[:-1] + ["3", "--train"]) == 2
    assert "--tp 3 does not divide 4 chips" in capsys.readouterr().err
    assert main(base + ["--train", "--pp", "8"]) == 2
    assert "--pp 8 does not divide 4 chips" in capsys.readouterr().err
    assert main(base[:2] + ["--chips", "16", "--arch", "h100-sxm", "--global-batch", "8",
                            "--seq", str(S), "--tp", "1", "--pp", "16", "--train"]) == 2
    assert "more stages than the model's 4 layers" in capsys.readouterr().err


def test_chakra_traces_of_a_plan(profiles, tmp_path):
    """One Chakra execution trace a rank: the stage's forwards, input and weight gradients
    in the schedule's order with their FLOPs, the activations sent and received between
    stages, the data-parallel gradient all-reduce; Chakra's field numbers on the wire."""
    from solbound.planning.chakra import (ALL_REDUCE, COMM_COLL_NODE, COMM_RECV_NODE,
                                          COMM_SEND_NODE, COMP_NODE, attrs, export,
                                          messages, read)
    _, Node, _ = messages()
    assert Node(id=3, type=COMP_NODE).SerializeToString() == b"\x08\x03\x18\x04"
    p, spec = profiles[(1, 1)], load_spec("h100-sxm")
    plan = Plan(1, 2, 2, 1, 4)
    paths = export(plan, p, spec, str(tmp_path / "et" / "step"))
    assert [x.rsplit("/", 1)[1] for x in paths] == [f"step.{r}.et" for r in range(4)]
    rows = stage_times(p, 2, "none", spec)
    for rank, path in enumerate(paths):
        meta, nodes = read(path)
        assert meta.version == "1.0.2-chakra.1.0.0"
        s = rank // 2
        comp = [n for n in nodes if n.type == COMP_NODE and n.name != "optimizer"]
        assert len(comp) == 3 * 4                       # F, B, W of 4 microbatches
        from solbound.planning.search import _stage_parts
        parts = _stage_parts(p, 2, s == 0, s == 1, "none")
        assert sum(attrs(n)["num_ops"] for n in comp) == sum(
            4 * int(parts[k].flops) for k in "FBW")
        sends = [attrs(n) for n in nodes if n.type == COMM_SEND_NODE]
        recvs = [attrs(n) for n in nodes if n.type == COMM_RECV_NODE]
        assert len(sends) == len(recvs) == 4
        peer = rank + 2 if s == 0 else rank - 2
        assert {a["comm_dst"] for a in sends} == {peer} == {a["comm_src"] for a in recvs}
        assert all(a["comm_size"] == p.hidden_bytes for a in sends + recvs)
        (dp,) = [attrs(n) for n in nodes if n.type == COMM_COLL_NODE]
        assert dp["comm_type"] == ALL_REDUCE
        assert dp["comm_size"] == p.state_at("gradients", 2, s == 0, s == 1)
        assert all(n.data_deps[0] < n.id for n in nodes if n.data_deps)
    assert rows[0]["layers"] == 2


def test_chakra_traces_of_a_context_parallel_plan(profiles, tmp_path):
    """CP 2 x PP 2: ranks numbered TP, CP, DP, stages (the next stage 2 ranks on); after
    each forward a layer's keys and values all-gathered over the CP pair, after each input
    gradient again with the reduce-scatter of their gradients (a bf16 row of KV heads x
    HD each, every token); the gradients reduced over the CP pair."""
    import dataclasses as dc

    from solbound.planning.chakra import (ALL_GATHER, COMM_COLL_NODE, COMM_SEND_NODE,
                                          REDUCE_SCATTER, attrs, export, read)
    kv = 2 * KV * HD * S * 2
    p, spec = dc.replace(profiles[(1, 1)], kv_bytes=kv), load_spec("h100-sxm")
    paths = export(Plan(1, 2, 1, 1, 4, cp=2), p, spec, str(tmp_path / "cp" / "step"))
    assert len(paths) == 4
    for rank, path in enumerate(paths):
        _, nodes = read(path)
        s = rank // 2
        colls = [(n.name, attrs(n)) for n in nodes if n.type == COMM_COLL_NODE]
        gathers = [a for name, a in colls if name.startswith("cp_all_gather_kv_F")]
        back = [a for name, a in colls if name.startswith("cp_all_gather_kv_B")]
        scatters = [a for name, a in colls if name.startswith("cp_reduce_scatter_dkv_B")]
        assert len(gathers) == len(back) == len(scatters) == 4          # a microbatch each
        assert all(a["comm_type"] == ALL_GATHER and a["comm_size"] == 2 * kv
                   for a in gathers + back)                              # 2 layers a stage
        assert all(a["comm_type"] == REDUCE_SCATTER and a["comm_size"] == 2 * kv
                   for a in scatters)
        (grads,) = [a for name, a in colls if name == "dp_gradients"]
        assert grads["pg_name"] == f"dp_cp_stage{s}_tp0"
        sends = [attrs(n) for n in nodes if n.type == COMM_SEND_NODE]
        assert {a["comm_dst"] for a in sends} == {rank + 2 if s == 0 else rank - 2}


def test_context_parallel_rank_is_the_sequence_over_cp(profiles):
    """A rank of CP 2 (the sequence in 4 chunks, causally balanced: every rank holds the
    same causal pairs, ``planning.context.rank_pairs``): its F, B and W work is the whole
    sequence's over 2, the weights it reads stay whole (a layer's bf16 parameters, read
    first by the forward), its saved activations and hidden states halve; per layer it
    all-gathers the keys and values of every token (a bf16 row of KV heads x HD each) in
    the forward, and again with a reduce-scatter of their gradients in the backward."""
    import dataclasses as dc

    from solbound.planning.context import context_parallel, rank_pairs
    assert {rank_pairs(S, 2, r) for r in range(2)} == {S * (S + 1) // 4}
    base = dc.replace(profiles[(1, 1)], kv_bytes=2 * KV * HD * S * 2)
    half = context_parallel(base, 2)
    for k in ("F", "B", "W"):
        a, b = base.pieces[(k, "loop")], half.pieces[(k, "loop")]
        assert b.macs == a.macs / 2 and b.work == {u: v / 2 for u, v in a.work.items()}
        assert b.fixed_bytes == a.fixed_bytes
        assert b.bytes == a.fixed_bytes + (a.bytes - a.fixed_bytes) / 2
    assert base.pieces[("F", "loop")].fixed_bytes == 2 * _layer_params(1)
    assert half.pieces[("O", "loop")] is base.pieces[("O", "loop")]
    assert half.saved == {w: b / 2 for w, b in base.saved.items()}
    assert half.hidden_bytes == base.hidden_bytes / 2 and half.state == base.state
    spec = load_spec("h100-sxm")
    plan = Plan(1, 2, 1, 1, 8, cp=2)
    assert plan.chips == 4 and plan.label() == "tp1 cp2 pp2 dp1 mbs1 x8 1f1b zero1"
    r = evaluate(plan, base, spec)
    # the collectives slow the stages down: the same plan without them is faster
    quiet = evaluate(plan, dc.replace(base, kv_bytes=0.0), spec)
    assert r["seconds"] > quiet["seconds"]
    assert r["gradient_sync_seconds"] > 0           # the CP ranks' gradients are reduced
    search = Search(chips=4, global_batch=8, cp=(1, 2))
    found = plans({(1, 1): base}, search)
    assert {(c.cp, c.pp, c.dp) for c in found if c.cp == 2} == {(2, 1, 2), (2, 2, 1)}
    with pytest.raises(ValueError, match="do not split into 2 x 3"):
        context_parallel(base, 3)


def test_sequence_parallel_splits_the_replicated_activations(traced):
    """At TP > 1 the activations of the model's width (the residual stream, the norms'
    inputs and outputs: the same on every rank of a Megatron TP group) are held sequence
    parallel, ``1 / tp`` of each a rank; the sharded ones (heads, MLP width) stay."""
    from solbound.analysis.training import saved_for_backward
    from solbound.planning.profile import saved_by_where
    rep = traced[0]
    phase_of = {op: g.get("phase", "forward") for op, g in (rep.lowered.groups or {}).items()}
    whole, _ = saved_by_where(rep.program, phase_of, S)
    sp, _ = saved_by_where(rep.program, phase_of, S, width=D, tp=2)
    tm = rep.program.tensor_map
    trip = next(k.loop[1] for k in rep.program.kernels if k.loop is not None)
    looped = {o for k in rep.program.kernels if k.loop is not None for o in k.outputs}
    wide = sum(b for t, b in saved_for_backward(rep.program, phase_of).items()
               if t in looped and tm[t].shape[-1] == D and list(tm[t].shape).count(S) < 2)
    assert wide > 0 and sp["loop"] == whole["loop"] - wide / trip / 2


def test_ulysses_context_parallel_is_all_to_alls_over_heads(profiles, tmp_path):
    """Ulysses: the same rank work as the ring's (``1 / cp`` of the tokens and pairs), with
    per layer all-to-alls of the rank's queries, keys, values and output (their gradients
    in the backward) instead of the keys' and values' all-gather; only where a rank's heads
    split over the CP group (KV = 2 key/value heads: CP 2, not 4)."""
    import dataclasses as dc

    from solbound.planning.chakra import ALL_TO_ALL, COMM_COLL_NODE, attrs, export, read
    kv, q = 2 * KV * HD * S * 2, H * HD * S * 2
    base = dc.replace(profiles[(1, 1)], kv_bytes=kv, q_bytes=q, heads=H, kv_heads=KV)
    found = plans({(1, 1): base}, Search(chips=4, global_batch=8, cp=(2, 4),
                                         cp_modes=("ring", "ulysses")))
    assert {(c.cp, c.ulysses) for c in found} == {(2, False), (2, True), (4, False)}
    spec = load_spec("h100-sxm")
    ring = evaluate(Plan(1, 1, 2, 1, 4, cp=2), base, spec)
    uly = evaluate(Plan(1, 1, 2, 1, 4, cp=2, ulysses=True), base, spec)
    assert uly["label"] == "tp1 ulysses2 pp1 dp2 mbs1 x4 1f1b zero1"
    assert uly["memory_bytes"] == ring["memory_bytes"]
    assert uly["stages"][0]["macs"] == ring["stages"][0]["macs"]
    paths = export(Plan(1, 1, 2, 1, 4, cp=2, ulysses=True), base, spec,
                   str(tmp_path / "u" / "step"))
    _, nodes = read(paths[0])
    a2a = [attrs(n) for n in nodes if n.type == COMM_COLL_NODE and "all_to_all" in n.name]
    assert len(a2a) == 2 * 4                       # a forward and a backward a microbatch
    assert all(a["comm_type"] == ALL_TO_ALL and a["comm_size"] == L * (2 * q + kv) // 2
               for a in a2a)


def test_dualpipe_rank_holds_two_stages(profiles):
    """Under DualPipe rank r holds stages r and p - 1 - r: both stages' parameters (twice
    the model's over two ranks), p + 1 microbatches' activations, gradients reduced and the
    optimizer run for both; its bubble is below 1F1B's."""
    p, spec = profiles[(1, 1)], load_spec("h100-sxm")
    dual = evaluate(Plan(1, 2, 1, 1, 4, "dualpipe"), p, spec)
    one = evaluate(Plan(1, 2, 1, 1, 4), p, spec)
    assert sum(s["macs"] for s in dual["stages"]) == p.model_macs
    (a, b) = [(s["layers"], s["stage"] == 0, s["stage"] == 1) for s in dual["stages"]]
    both = p.state_at("parameters", *a) + p.state_at("parameters", *b)
    assert [s["memory"]["parameters"] for s in dual["stages"]] == [both, both]
    assert [s["peak_microbatches"] for s in dual["stages"]] == [3, 3]
    assert dual["bubble_fraction"] < one["bubble_fraction"]
    assert dual["optimizer_seconds"] == pytest.approx(
        sum(s["seconds"]["optimizer"] for s in one["stages"]))
    assert "dualpipe" not in {c.schedule for c in plans(profiles, Search(4, 8))}
    assert "dualpipe" in {c.schedule for c in plans(profiles, Search(4, 8, ("dualpipe",)))}
