"""Hand-written mixture-of-experts dispatches: sizes that follow the routing are traced
under a stated routing assumption, counted as T*k expert evaluations, and validated
against the model running under the same assumption."""

import json
import os

import pytest
import torch

import solbound
from solbound.frontends.torch.capture import FrontendError
from solbound.frontends.torch.routing import choices
from programs import moe_dispatch as m

B4 = 4
T, D, FF, E, K = m.T, m.D, m.FF, m.E, m.K
EXPERT = 2 * D * FF                      # one expert's weights (two projections)
ROUTER = T * D * E


def routed_macs(dispatch: str, t: int = T) -> int:
    """Router (t x D x E), each (token, chosen expert) pair's two projections, and the
    weighted combine where it is a sum of products (the sorted dispatch sums over k)."""
    if dispatch == "mask":                                  # top-1, argmax
        return t * D * E + t * EXPERT
    combine = t * K * D                                     # index_add_ of w * y, or sum_k
    return t * D * E + t * K * EXPERT + combine


def fused_bytes(experts_touched: int, t: int = T) -> int:
    """Input and output once, the router, and the weights of the experts that get tokens;
    the routing's own index tensors are computed on chip."""
    return (2 * t * D + E * D + experts_touched * EXPERT) * B4


def _run(dispatch, routing=None, t=T, validate=True):
    torch.manual_seed(0)
    return solbound.analyze(m.Model(dispatch), (torch.randn(t, D),), routing=routing,
                            validate=validate)


@pytest.mark.parametrize("dispatch", ["where", "sort", "mask"])
def test_balanced_routing_counts_t_times_k_expert_evaluations(dispatch):
    rep = _run(dispatch)
    assert rep.lowered.unsupported == []
    assert rep.validation["status"] == "passed", rep.validation
    assert rep.counts.macs == routed_macs(dispatch)
    assert rep.counts.fused.bytes == fused_bytes(E)          # T*k >= E: every expert works
    stated = [a for a in rep.to_dict()["assumptions"] if a.startswith("assumption: routing")]
    assert len(stated) == 1 and "balanced" in stated[0]


@pytest.mark.parametrize("dispatch,touched", [("where", K), ("sort", K), ("mask", 1)])
def test_concentrated_routing_reads_only_the_chosen_experts(dispatch, touched):
    rep = _run(dispatch, routing="concentrated")
    assert rep.validation["status"] == "passed", rep.validation
    assert rep.counts.macs == routed_macs(dispatch)         # the same T*k evaluations
    assert rep.counts.fused.bytes == fused_bytes(touched)


def test_one_token_touches_only_its_k_experts():
    # a decode step: T*k < E, so the balanced routing reaches k experts, not all E
    rep = _run("where", t=1)
    assert rep.counts.macs == routed_macs("where", t=1)
    assert rep.counts.fused.bytes == fused_bytes(K, t=1)


def test_balanced_choices_give_each_expert_t_k_over_e_pairs():
    for rows, n, k in [(24, 4, 2), (7, 8, 2), (100, 6, 3), (5, 5, 5)]:
        c = choices(rows, n, k, "balanced")
        per = torch.bincount(c.reshape(-1), minlength=n)
        assert per.sum() == rows * k and per.max() - per.min() <= 1
        assert all(len(set(r)) == k for r in c.tolist())    # k distinct experts per token


def test_non_routing_data_dependence_is_still_one_line(tmp_path):
    f = tmp_path / "branchy.py"
    f.write_text("import torch\nclass Model(torch.nn.Module):\n"
                 "    def forward(self, x):\n        if x.sum() > 0:\n            return x\n"
                 "        return -x\n"
                 "def get_inputs():\n    return [torch.randn(3)]\n"
                 "def get_init_inputs():\n    return []\n")
    with pytest.raises(FrontendError) as e:
        solbound.analyze_source(str(f))
    assert "branchy.py:4" in str(e.value) and "routing decision" in str(e.value)


def test_cli_routing_flag_and_json_assumption(tmp_path):
    from solbound.cli import main
    prog = os.path.join(os.path.dirname(__file__), "programs", "moe_dispatch.py")
    out = tmp_path / "r.json"
    assert main(["analyze", prog, "--routing", "concentrated", "--json", str(out), "-q"]) == 0
    doc = json.loads(out.read_text())
    assert any("routing is concentrated" in a for a in doc["assumptions"])
    assert doc["totals"]["bytes"]["fused"] == fused_bytes(K)


def test_selection_sizes_follow_the_stated_fraction():
    from helpers import Fn
    x = torch.randn(8, 8)
    f = lambda s, x: (x[x > 0] * 3).sum()                               # noqa: E731
    with pytest.raises(FrontendError, match="--select-fraction"):
        solbound.analyze(Fn(f), (x,))
    rep = solbound.analyze(Fn(f), (x,), select_fraction=0.25, validate=True)
    # 16 of 64 elements selected: 16 products, 16 additions; 16 elements read
    assert rep.counts.flops["vector"] == 32
    assert rep.counts.fused.bytes == 16 * B4 + B4
    stated = [a for a in rep.to_dict()["assumptions"] if "fraction 0.25" in a]
    assert stated and "16 of 64" in stated[0]
    assert rep.validation["status"] == "skipped" and "select-fraction" in rep.validation["reason"]


def test_bincount_with_minlength_is_a_scatter_add_under_a_stated_bound():
    from helpers import Fn
    x = torch.tensor([0, 3, 3, 7, 1, 3])
    rep = solbound.analyze(Fn(lambda s, x: torch.bincount(x, minlength=8).float() * 2), (x,),
                           validate=True)
    assert rep.validation["status"] == "passed", rep.validation
    assert any("values below minlength=8" in a for a in rep.to_dict()["assumptions"])
    # one increment per value, one product per bin
    assert rep.counts.flops["vector"] == 6 + 8


def test_an_eager_expert_loop_under_the_routing_assumption_is_rerolled_and_validates():
    """Mixtral's eager expert loop traced under the balanced routing makes its routing
    constants per layer, lifted with a running counter (``layers.0.mlp.gate.lifted_tensor_0``,
    ``layers.1.mlp.gate.lifted_tensor_18``): no progression names the other layers', and
    the stack was traced whole (Mixtral-8x7B's 2048-token prefill: 80 s instead of 38). Equal
    in the two traced layers, every layer takes them; rerolled, and validated."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    import solbound
    cfg = MixtralConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                        num_key_value_heads=1, intermediate_size=64, vocab_size=64,
                        num_local_experts=4, num_experts_per_tok=2,
                        experts_implementation="eager")
    from programs.hf import LM
    torch.manual_seed(0)
    rep = solbound.analyze(LM(MixtralForCausalLM(cfg).eval()),
                           (torch.randint(0, 64, (1, 16)),), validate=True,
                           keep_experts_dispatch=True)
    assert [r["trip"] for r in rep.to_dict()["rerolled"]] == [4]
    assert rep.validation["status"] == "passed"
