"""Models as their users call them: whatever forward returns is flattened to its tensors,
non-strict export falls back to strict, and a harness failure is skipped (no verdict)."""

import pytest
import torch

import solbound
from solbound.frontends.contract import FrontendError

D, H, KV, HD, F, V, L, T = 64, 4, 2, 16, 128, 128, 2, 16


def causal(n):
    return n * (n + 1) // 2


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                      num_key_value_heads=KV, intermediate_size=F, vocab_size=V)
    return LlamaForCausalLM(cfg).eval()


def test_a_decoder_called_with_its_defaults_returns_logits_and_its_cache():
    """use_cache=True is the config's default: the forward returns a
    CausalLMOutputWithPast holding a DynamicCache. Every tensor leaf is an output: the
    logits and each layer's keys and values, written once (exactly the rows written)."""
    m = _llama()
    ids = torch.randint(0, V, (1, T))
    rep = solbound.analyze(m, (ids,), arch="h100-sxm", validate=True)
    assert rep.unsupported == []
    per_layer = (T * D * H * HD + 2 * T * D * KV * HD + T * H * HD * D + 3 * T * D * F
                 + 2 * H * HD * causal(T) + 2 * T * D)
    assert rep.counts.macs == L * per_layer + T * D + T * D * V
    outs = rep.to_dict()["outputs"]
    assert [o["shape"] for o in outs] == [[1, T, V]] + [[1, KV, T, HD]] * (2 * L)
    assert outs[0]["path"] == "logits"
    assert all(o["path"].startswith(outs[1]["path"].split("[")[0]) for o in outs[1:])
    # fused: embedding rows looked up, every other parameter, the rotary inv_freq buffer,
    # the ids, the logits and the cache rows written, each once (fp32)
    params = (L * (D * H * HD + 2 * D * KV * HD + H * HD * D + 3 * D * F + 2 * D)
              + D + D * V)
    fused = 4 * (T * D + params + HD // 2) + 8 * T + 4 * (T * V + 2 * L * KV * T * HD)
    assert rep.counts.fused.bytes == fused
    assert rep.validation["status"] == "passed", rep.validation


class Held:
    """A plain object holding tensors (no pytree registration)."""

    def __init__(self, a, b):
        self.a, self.b, self.tag = a, b, "held"


class Nested(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        return {"y": y, "more": (torch.relu(y), Held(y * 2, [x + 1, None]))}


def test_nested_dicts_tuples_and_plain_objects_are_flattened_to_their_tensors():
    x = torch.randn(3, 8)
    rep = solbound.analyze(Nested(), (x,), arch="h100-sxm", validate=True)
    outs = rep.to_dict()["outputs"]
    assert len(outs) == 4 and [o["shape"] for o in outs] == [[3, 8]] * 4
    assert outs[0]["path"] == "y" and outs[1]["path"] == "more[0]"
    assert rep.counts.macs == 3 * 8 * 8
    # every output is written once: 4 outputs of 3x8 fp32, plus x and the linear's weights
    assert rep.counts.fused.bytes == 4 * (4 * 24 + 24 + 64 + 8)
    assert rep.validation["status"] == "passed", rep.validation


class Slotted:
    __slots__ = ("t",)

    def __init__(self, t):
        self.t = t


class ReturnsSlotted(torch.nn.Module):
    def forward(self, x):
        return Slotted(x + 1)


def test_an_output_type_nothing_can_flatten_is_named_in_one_line():
    with pytest.raises(FrontendError) as e:
        solbound.analyze(ReturnsSlotted(), (torch.randn(2),), arch="h100-sxm")
    msg = str(e.value)
    assert "Slotted" in msg and "\n" not in msg


def test_transformers_executorch_wrapper_traces_through_the_strict_retry():
    """TorchExportableModuleWithStaticCache fails non-strict export ("expected
    compiled_fn to be GraphModule"); strict export traces it. The position is an input
    known only at run time: attention over the whole 32-row cache, stated."""
    from transformers import GenerationConfig
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache
    m = _llama()
    m.generation_config = GenerationConfig(use_cache=True, cache_implementation="static",
                                           cache_config={"batch_size": 1, "max_cache_len": 32})
    w = TorchExportableModuleWithStaticCache(m)
    rep = solbound.analyze(w, (torch.tensor([[3]]), None, torch.tensor([20])), arch="h100-sxm",
                           validate=True)
    assert rep.unsupported == []
    per_layer = D * H * HD + 2 * D * KV * HD + H * HD * D + 3 * D * F + 2 * H * HD * 32 + 2 * D
    assert rep.counts.macs == L * per_layer + D + D * V
    assert any("cache_position" in n and "dense" in n for n in rep.to_dict()["notes"])
    assert rep.validation["status"] == "passed", rep.validation


class RunsOnlyWhenTraced(torch.nn.Module):
    def forward(self, x):
        if not torch.compiler.is_exporting():
            raise RuntimeError("this model refuses to run eagerly")
        return x * 2


def test_a_reference_that_cannot_run_is_skipped_not_failed():
    """No verdict on the IR: inconclusive is kept for outputs constant or not finite
    whatever the harness draws."""
    rep = solbound.analyze(RunsOnlyWhenTraced(), (torch.randn(4),), arch="h100-sxm",
                           validate=True)
    assert rep.validation["status"] == "skipped"
    assert "running the model on real inputs failed" in rep.validation["reason"]
    assert "refuses" in rep.validation["reason"]
