"""Masks are guards: masked score products are neither computed nor read.

Score pairs (i, j) per head, derived by hand:
* causal over s tokens: j <= i, s(s+1)/2 pairs (s = 2048: 2,098,176);
* a window of w over s tokens: i - w < j <= i, sum_i min(i+1, w) pairs
  = w(w+1)/2 + (s-w)w (w = 1024, s = 4096: 524,800 + 3,145,728 = 3,670,528).
Each pair is one MAC of q.k^T (head dim D) and one of p.v (D): 2*D MACs per pair.
"""

import math
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import solbound

PROG = os.path.join(os.path.dirname(__file__), "programs")


def causal_pairs(s):
    return s * (s + 1) // 2


def window_pairs(s, w):
    return w * (w + 1) // 2 + (s - w) * w


def test_closed_forms_match_the_issue():
    assert causal_pairs(2048) == 2_098_176
    assert window_pairs(4096, 1024) == 3_670_528
    assert window_pairs(16, 5) == sum(min(i + 1, 5) for i in range(16))


class Causal(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Window(nn.Module):
    """A sliding window built in forward from index comparisons, passed as attn_mask."""

    def __init__(self, w):
        super().__init__()
        self.w = w

    def forward(self, q, k, v):
        s = q.shape[-2]
        i = torch.arange(s, device=q.device)[:, None]
        j = torch.arange(s, device=q.device)[None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=(j <= i) & (j > i - self.w))


class WindowBias(nn.Module):
    """The same window as an additive float bias, softmax written by hand."""

    def __init__(self, w):
        super().__init__()
        self.w = w

    def forward(self, q, k, v):
        s, d = q.shape[-2], q.shape[-1]
        i = torch.arange(s, device=q.device)[:, None]
        j = torch.arange(s, device=q.device)[None, :]
        bias = torch.where((j <= i) & (j > i - self.w), 0.0, float("-inf"))
        return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d) + bias, dim=-1) @ v


class TrilBuffer(nn.Module):
    """minGPT: a tril(ones) buffer, masked_fill(== 0, -inf), softmax, @ v."""

    def __init__(self, s):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(s, s)).view(1, 1, s, s))

    def forward(self, q, k, v):
        s = q.shape[-2]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :s, :s] == 0, float("-inf"))
        return F.softmax(att, dim=-1) @ v


class CausalAndPadding(nn.Module):
    """A structural causal mask AND a run-time padding mask (an input)."""

    def forward(self, q, k, v, keep):
        s = q.shape[-2]
        causal = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal & keep[:, None, None, :])


def _qkv(b, h, s, d, dtype=torch.float32, device="cpu"):
    return tuple(torch.randn(b, h, s, d, dtype=dtype, device=device) for _ in range(3))


@pytest.mark.parametrize("module,pairs", [
    (Causal(), causal_pairs(16)),
    (TrilBuffer(16), causal_pairs(16)),
    (Window(5), window_pairs(16, 5)),
    (WindowBias(5), window_pairs(16, 5)),
])
def test_masked_attention_counts_and_validates(module, pairs):
    b, h, s, d = 2, 3, 16, 8
    rep = solbound.analyze(module, _qkv(b, h, s, d), validate=True)
    assert rep.counts.macs == b * h * pairs * 2 * d
    assert rep.lowered.unsupported == []
    assert rep.validation["status"] == "passed"


def test_causal_2048_and_window_1024_of_4096_on_meta_tensors():
    b, h, d = 1, 2, 64
    rep = solbound.analyze(Causal(), _qkv(b, h, 2048, d, torch.bfloat16, "meta"))
    assert rep.counts.macs == b * h * 2_098_176 * 2 * d
    rep = solbound.analyze(Window(1024), _qkv(b, h, 4096, d, torch.bfloat16, "meta"))
    assert rep.counts.macs == b * h * 3_670_528 * 2 * d


def test_scores_outside_the_mask_are_not_read():
    # fused traffic is q, k, v and the output whatever the mask; unfused, each operator
    # still writes its whole score matrix, but softmax and p @ v read only the triangle
    b, h, s, d = 1, 1, 16, 8
    full = solbound.analyze(Dense(), _qkv(b, h, s, d))
    causal = solbound.analyze(TrilBuffer(s), _qkv(b, h, s, d))
    assert causal.counts.fused.bytes == full.counts.fused.bytes == 4 * 4 * b * h * s * d
    reads = {g.opname: sum(g.traffic.reads.values()) for g in causal.counts.groups}
    assert reads["aten.softmax.int"] == 4 * causal_pairs(s)
    pv = [g for g in causal.counts.groups if g.opname == "aten.matmul"][-1]
    assert pv.traffic.reads == {"softmax": 4 * causal_pairs(s), "v": 4 * s * d}


class Dense(nn.Module):
    def forward(self, q, k, v):
        return F.softmax(q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1])), dim=-1) @ v


def test_structural_part_of_a_mixed_mask_is_kept():
    b, h, s, d = 2, 2, 12, 4
    q, k, v = _qkv(b, h, s, d)
    keep = torch.rand(b, s) > 0.3
    keep[:, 0] = True
    rep = solbound.analyze(CausalAndPadding(), (q, k, v, keep), validate=True)
    # the padding part is known only at run time: dense within the causal triangle
    assert rep.counts.macs == b * h * causal_pairs(s) * 2 * d
    assert rep.validation["status"] == "passed"
    assert any("run time" in n for n in rep.lowered.program.notes)


def test_tril_buffer_built_on_meta_device_from_a_file():
    from programs import causal_mingpt as m
    rep = solbound.analyze_source(os.path.join(PROG, "causal_mingpt.py"))
    bsz, t, c, nh = m.batch_size, m.seq_len, m.n_embd, m.n_head
    proj = bsz * t * c * 3 * c + bsz * t * c * c
    attn = bsz * nh * causal_pairs(t) * 2 * (c // nh)
    assert rep.counts.macs == proj + attn
    assert any("bias is lower triangular of ones" in n for n in rep.lowered.program.notes)
    rep = solbound.analyze_source(os.path.join(PROG, "causal_mingpt.py"), validate=True)
    assert rep.validation["status"] == "passed"


def test_what_is_counted_dense_is_said_and_nothing_else():
    b, h, s, d = 1, 2, 16, 8
    q, k, v = _qkv(b, h, s, d)

    class Docs(nn.Module):
        """Block-diagonal documents of 4 tokens: exact (block-index guards)."""

        def forward(self, q, k, v):
            doc = torch.arange(q.shape[-2], device=q.device) // 4
            return F.scaled_dot_product_attention(q, k, v, attn_mask=doc[:, None] == doc[None, :])

    class Stripes(nn.Module):
        """Every other key: known before the run, not an affine region."""

        def forward(self, q, k, v):
            i = torch.arange(q.shape[-2], device=q.device)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=(i[:, None] + i[None, :]) % 2 == 0)

    class Bias(nn.Module):
        def forward(self, q, k, v, bias):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    rep = solbound.analyze(Docs(), (q, k, v), validate=True)
    assert rep.counts.macs == b * h * (s // 4) * 4 * 4 * 2 * d
    assert rep.validation["status"] == "passed"
    assert not [n for n in rep.lowered.program.notes if "counted dense" in n]
    rep = solbound.analyze(Stripes(), (q, k, v), validate=True)
    assert rep.counts.macs == b * h * s * s * 2 * d and rep.validation["status"] == "passed"
    notes = [n for n in rep.lowered.program.notes if "counted dense" in n]
    assert len(notes) == 1 and "not an affine region" in notes[0]
    rep = solbound.analyze(Bias(), (q, k, v, torch.randn(s, s)))
    notes = [n for n in rep.lowered.program.notes if "counted dense" in n]
    # the additive bias is named; q, k and v are not masks
    assert len(notes) == 1 and "known only at run time" in notes[0]
    assert notes[0] in rep.to_dict()["assumptions"]
