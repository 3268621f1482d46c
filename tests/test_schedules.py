"""Pipeline schedules as pure functions of per-stage times: closed forms."""

import pytest

from solbound.schedules.pipeline import (ScheduleError, Stage, closed_form_bubble,
                                         simulate)


@pytest.mark.parametrize("p,m", [(2, 1), (4, 8), (8, 16), (3, 7), (8, 64)])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_gpipe_and_1f1b_bubble_closed_form(schedule, p, m):
    """Equal stages, no transfers: the makespan is (m + p - 1)(F + B + W) and the bubble
    (p - 1) / (m + p - 1)."""
    f, b, w = 1.5, 2.0, 1.25
    r = simulate(schedule, [Stage(f, b, w)] * p, m)
    assert r.makespan == pytest.approx((m + p - 1) * (f + b + w))
    assert r.bubble_fraction == pytest.approx(closed_form_bubble(p, m))
    assert sum(r.busy) == pytest.approx(p * m * (f + b + w))


def test_memory_under_each_schedule():
    """Microbatches holding activations: GPipe all of them, 1F1B p - s on stage s."""
    assert simulate("gpipe", [Stage(1, 1, 1)] * 4, 6).peak_inflight == [6] * 4
    assert simulate("1f1b", [Stage(1, 1, 1)] * 4, 6).peak_inflight == [4, 3, 2, 1]
    assert simulate("1f1b", [Stage(1, 1, 1)] * 4, 2).peak_inflight == [2, 2, 2, 1]


@pytest.mark.parametrize("f,b,w", [(1, 1, 1), (1, 2, 1), (2, 1, 1), (1, 1, 0.5)])
@pytest.mark.parametrize("p,m", [(4, 8), (8, 16), (2, 3), (8, 64)])
def test_zero_bubble(f, b, w, p, m):
    """W deferred into the bubbles: never above ZB-H1's m (F + B + W) + (p - 1)(F + B - W)
    (Qi et al. 2024, equal stages), equal to it at F = B = W, and never below the busiest
    stage's work plus the first forward's and last backward's chains."""
    r = simulate("zb", [Stage(f, b, w)] * p, m)
    zb_h1 = m * (f + b + w) + (p - 1) * (f + b - w)
    assert r.makespan <= zb_h1 + 1e-9
    if f == b == w:
        assert r.makespan == pytest.approx(zb_h1)
    assert r.makespan >= m * (f + b + w) + (p - 1) * (f + b) / 2 - 1e-9 or p == 1


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 16, 4), (2, 6, 3)])
def test_interleaved_bubble(p, m, v):
    """Megatron's interleaved 1F1B: the warm-up and cool-down shrink by the chunks,
    m (F + B) + (p - 1)(F + B) / v."""
    r = simulate("interleaved", [Stage(1.0, 1.5, 0.5)] * p, m, chunks=v)
    assert r.makespan == pytest.approx(m * 3.0 + (p - 1) * 3.0 / v)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 20), (6, 12), (8, 16), (8, 64)])
@pytest.mark.parametrize("f,b,w", [(1, 1, 1), (1, 2, 1), (1.5, 2, 0.5)])
def test_dualpipe(p, m, f, b, w):
    """DeepSeek's DualPipe, replayed from its reference order: every rank runs m forwards,
    input and weight gradients (half the microbatches through each of its two stages), holds
    p + 1 microbatches' activations at its peak (the paper's table: PP + 1) and idles less
    than 1F1B over the same stages."""
    from solbound.schedules.pipeline import dualpipe_order
    r = simulate("dualpipe", [Stage(f, b, w)] * p, m)
    for ops in dualpipe_order(p, m):
        kinds = [k for k, _, _ in ops]
        assert kinds.count("F") == m and kinds.count("BW") + kinds.count("B") == m
        assert kinds.count("W") == kinds.count("B")
        assert sorted(i for k, d, i in ops if k == "F" and d == 0) == list(range(m // 2))
    assert r.busy == pytest.approx([m * (f + b + w)] * p)
    assert r.peak_inflight == [p + 1] * p
    assert [sum(x) for x in r.peak_pair] == r.peak_inflight
    one = simulate("1f1b", [Stage(f, b, w)] * p, m)
    assert max(r.busy) <= r.makespan < one.makespan
    if f == b == w:      # the replay idles (p / 2 - 1) F a rank (1F1B: (p - 1)(F + B + W))
        assert r.makespan == m * 3 * f + (p // 2 - 1) * f


def test_transfers_and_unequal_stages():
    """One microbatch over two stages: F0, send, F1, B1+W1, send, B0+W0; the slowest stage
    sets the steady state."""
    r = simulate("1f1b", [Stage(1, 1, 1), Stage(1, 1, 1)], 1, p2p=0.25)
    assert r.makespan == pytest.approx(1 + 0.25 + 1 + 2 + 0.25 + 2)
    slow = simulate("1f1b", [Stage(1, 1, 0), Stage(3, 3, 0)], 50)
    assert slow.makespan == pytest.approx(50 * 6 + 1 + 1)


def test_bad_schedules_are_one_line():
    with pytest.raises(ScheduleError, match="unknown schedule 'dualpipe2'"):
        simulate("dualpipe2", [Stage(1, 1, 1)] * 2, 4)
    with pytest.raises(ScheduleError, match="dualpipe: 4 ranks and 6 microbatches"):
        simulate("dualpipe", [Stage(1, 1, 1)] * 4, 6)
    with pytest.raises(ScheduleError, match="dualpipe: 3 ranks"):
        simulate("dualpipe", [Stage(1, 1, 1)] * 3, 6)
    with pytest.raises(ScheduleError, match="not a multiple of the 4 stages"):
        simulate("interleaved", [Stage(1, 1, 1)] * 4, 6, chunks=2)
    with pytest.raises(ScheduleError, match="at least 2 chunks"):
        simulate("interleaved", [Stage(1, 1, 1)] * 4, 8)


# --- the stages of a traced training step ---------------------------------------------------

PP_MODEL = '''
import torch, torch.nn as nn, transformers
cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                               num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.m = transformers.LlamaForCausalLM(cfg)
    def forward(self, ids, labels):
        return self.m(input_ids=ids, labels=labels)
def get_inputs():
    ids = torch.randint(0, 64, (1, 16))
    return [ids, ids]
def get_init_inputs():
    return []
'''


@pytest.mark.slow
def test_training_step_pipelined(tmp_path, capsys):
    """A 4-layer Llama step over 2 stages: the stages' MACs add up to the step's; each
    layer's weight gradients (W) are dW = dY^T X of every linear plus the norms' weight
    gradients (hand-derived); the makespan is the schedule's over the stage times; the
    activations sent between stages are one microbatch's hidden states."""
    import json
    from solbound.cli import main
    from solbound.hardware.catalog import load_spec
    from solbound.schedules.stages import parts
    import solbound
    path = tmp_path / "pp_model.py"
    path.write_text(PP_MODEL)
    out = tmp_path / "pp.json"
    assert main(["analyze", str(path), "--train", "--pp", "2", "--microbatches", "8",
                 "--arch", "h100-sxm", "-q", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    pl = doc["pipeline"][0]
    fwd_bwd = doc["phases"]["forward"]["macs"] + doc["phases"]["backward"]["macs"]
    assert sum(s["macs"] for s in pl["stages"]) == fwd_bwd
    assert [s["layers"] for s in pl["stages"]] == [2, 2]
    T, D, H, KV, hd, F = 16, 32, 4, 2, 8, 64
    assert pl["p2p_bytes"] == T * D * 4
    rep = solbound.analyze_source(str(path), arch="h100-sxm", train=True)
    phase_of = {op: g.get("phase", "forward") for op, g in rep.lowered.groups.items()}
    pc = parts(rep.program, rep.counts, phase_of, rep.lowered.training["gradients"],
               rep.policy)
    assert pc[("W", "loop")].macs == T * (D * H * hd + 2 * D * KV * hd + H * hd * D
                                          + 3 * D * F) + 2 * T * D
    spec = load_spec("h100-sxm")
    stages = [Stage(s["seconds"]["forward"], s["seconds"]["input_gradient"],
                    s["seconds"]["weight_gradient"]) for s in pl["stages"]]
    link = spec.links["scale_up"]
    r = simulate("1f1b", stages, 8, p2p=T * D * 4 / link)
    assert pl["makespan_seconds"] == pytest.approx(r.makespan)
    assert pl["seconds"] == pytest.approx(r.makespan + pl["optimizer_seconds"])
    # each stage holds its layers' state and 1F1B's peak of microbatches' activations;
    # the stages' state adds up to the step's (no tied embeddings)
    mem = rep.training["memory"]
    for what, key in (("parameters", "parameters"), ("gradients", "gradients"),
                      ("optimizer_state", "optimizer_state")):
        assert sum(s["memory"][what] for s in pl["stages"]) == mem[key]
    assert [s["peak_microbatches"] for s in pl["stages"]] == [2, 1]
    acts = [s["memory"]["activations"] for s in pl["stages"]]
    assert acts[0] / 2 + acts[1] == mem["saved_for_backward"]
    assert all(s["peak_memory_bytes"] == s["memory"]["total"] for s in pl["stages"])
    capsys.readouterr()
    assert main(["analyze", str(path), "--pp", "2", "-q"]) == 2
    assert "add --train" in capsys.readouterr().err
    assert main(["analyze", str(path), "--train", "--pp", "2", "--stage-split", "1,2",
                 "-q"]) == 2
    assert "holding all 4 layers" in capsys.readouterr().err
