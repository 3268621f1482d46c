"""Sliding windows in the mask forms libraries build: GPT-Neo's local layers (a band of
ones, ``bitwise_xor(tril(ones), tril(ones, -window))``, applied with ``torch.where`` and
a ``torch.tensor(finfo.min)`` mask value, then transformers' causal mask added)."""

import contextlib

import pytest
import torch

import solbound

D, H, L, T, W, V = 64, 4, 2, 16, 4, 128


def pairs_causal(n):
    return n * (n + 1) // 2


def pairs_window(n, w):
    """Query i attends keys i-w+1 .. i: min(i+1, w) each."""
    return sum(min(i + 1, w) for i in range(n))


def _neo(device):
    """On the meta device a buffer has no values: the band is known from how it is built,
    which the CLI's file and factory loaders watch (``_input_structure_mode``)."""
    from transformers import GPTNeoConfig, GPTNeoForCausalLM
    from solbound.frontends.torch.capture import _input_structure_mode
    cfg = GPTNeoConfig(hidden_size=D, num_layers=L, num_heads=H, window_size=W,
                       attention_types=[[["global", "local"], 1]], vocab_size=V,
                       max_position_embeddings=64, intermediate_size=128)
    torch.manual_seed(0)
    with torch.device(device), (_input_structure_mode() if device == "meta"
                                else contextlib.nullcontext()):
        return GPTNeoForCausalLM(cfg).eval()


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_gpt_neo_local_layers_count_their_window(device):
    m = _neo(device)
    ids = torch.randint(0, V, (1, T)).to(device)
    rep = solbound.analyze(m, (ids,), arch="h100-sxm", validate=device == "cpu")
    attn = {x["module"]: x["macs"] for x in rep.to_dict()["modules"]
            if x["module"].endswith("attn.attention")}
    hd = D // H
    # scores and probabilities x values: 2 * heads * head_dim per attended pair
    assert attn["transformer.h.0.attn.attention"] == 2 * H * hd * pairs_causal(T)
    assert attn["transformer.h.1.attn.attention"] == 2 * H * hd * pairs_window(T, W)
    assert pairs_window(T, W) == 58
    assert any("band of ones" in n and f"{-(W - 1)} <= col - row < 1" in n
               for n in rep.to_dict()["notes"])
    if device == "cpu":
        assert rep.validation["status"] == "passed", rep.validation


def test_a_band_built_from_triangles_is_recognized_by_how_it_is_built_and_by_value():
    from solbound.frontends.torch.capture import _input_structure_mode, _triangular_by_value
    with _input_structure_mode():
        tri = torch.tril(torch.ones(8, 8, dtype=torch.bool))
        band = torch.bitwise_xor(tri, torch.tril(tri, -3))
        inter = torch.tril(torch.ones(8, 8)) * torch.triu(torch.ones(8, 8), -2)
    assert band._solbound_structure == ("band", (-2, 1), 1)
    assert inter._solbound_structure == ("band", (-2, 1), 1)
    assert _triangular_by_value(band) == ("band", (-2, 1), 1)
    assert _triangular_by_value(tri) == ("tril", 0, 1)
    # not ones inside: only the triangle is stated
    assert _triangular_by_value(band.float() * 3) == ("tril", 0, None)
