"""Masks at any length (issue 39, item 1, in part): a causal or windowed attention is
counted exactly at 131,072 tokens, in about the time it takes at 1,024, and a mask the
analysis cannot read past its size limit is named in the assumptions, never silent."""

import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import solbound

D = 64


class Causal(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Window(nn.Module):
    """A sliding window written by hand from ``arange`` comparisons."""

    def __init__(self, w: int):
        super().__init__()
        self.w = w

    def forward(self, q, k, v):
        i = torch.arange(q.shape[2], device=q.device)
        mask = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < self.w)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class Documents(nn.Module):
    """Packed documents of 64 tokens: a block-diagonal mask (not an affine region)."""

    def forward(self, q, k, v):
        i = torch.arange(q.shape[2], device=q.device)
        doc = i // 64
        mask = (doc[:, None] == doc[None, :]) & (i[:, None] >= i[None, :])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _macs(model, s: int) -> tuple[int, list[str], float]:
    x = torch.empty(1, 1, s, D, device="meta")
    t0 = time.perf_counter()
    rep = solbound.analyze(model, (x, x, x), arch="h100-sxm")
    return rep.totals["macs"], rep.to_dict()["assumptions"], time.perf_counter() - t0


def test_causal_attention_at_128k_tokens_is_exact():
    """Two products over the S(S+1)/2 pairs a causal mask keeps. It was counted dense from
    8,192 tokens on (1.5x), with no note: the check that every masked row keeps a key
    enumerated rows times keys up to 2^25 points; each row's keys are an interval now."""
    for s in (1024, 8192, 131072):
        macs, assumptions, _ = _macs(Causal(), s)
        assert macs == 2 * D * s * (s + 1) // 2, s
        assert not [a for a in assumptions if "mask" in a]


def test_sliding_window_at_128k_tokens_is_exact_and_as_fast_as_at_1k():
    w = 8192
    times = {}
    for s in (1024, 131072):
        macs, assumptions, times[s] = _macs(Window(w), s)
        pairs = sum(min(r + 1, w) for r in range(s))
        assert macs == 2 * D * pairs, s
        assert not [a for a in assumptions if "mask" in a]
    assert times[131072] < 3 * times[1024] + 5


def test_a_mask_past_the_fold_limit_is_named_in_the_assumptions():
    """Block-diagonal documents are counted as their causal triangle (the document part is
    not an affine region) at any length; past the fold limit (2^24 elements) the mask is
    named as such among the assumptions, at 256 tokens as not affine."""
    s = 8192
    macs, assumptions, _ = _macs(Documents(), s)
    assert macs == 2 * D * s * (s + 1) // 2
    (note,) = [a for a in assumptions if "limit of folding masks" in a]
    assert "bitwise_and" in note and "16,777,216" in note
    macs, assumptions, _ = _macs(Documents(), 256)
    assert macs == 2 * D * 256 * 257 // 2
    assert any("not an affine region" in a for a in assumptions)


class Prefix(nn.Module):
    """A prefix-LM: every query sees the prefix, and the keys before it (causal or prefix:
    what it keeps is a union of two regions, what it masks is one)."""

    def __init__(self, p: int):
        super().__init__()
        self.p = p

    def forward(self, q, k, v):
        i = torch.arange(q.shape[2], device=q.device)
        keep = (i[None, :] <= i[:, None]) | (i[None, :] < self.p)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


class Strided(nn.Module):
    """Any affine guard: key j kept where 2j <= i + 7 (a coefficient of 2, which the fold's
    coordinate-difference atoms do not describe but the symbolic pass does)."""

    def forward(self, q, k, v):
        i = torch.arange(q.shape[2], device=q.device)
        keep = 2 * i[None, :] <= i[:, None] + 7
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


def test_an_affine_guard_with_a_coefficient_is_exact_at_128k_with_no_note():
    for s in (256, 131072):
        macs, assumptions, _ = _macs(Strided(), s)
        pairs = sum(min(s, (r + 7) // 2 + 1) for r in range(s))
        assert macs == 2 * D * pairs, s
        # it was named "not an affine region" at 256 tokens, though counted exactly
        assert not [a for a in assumptions if "mask" in a], assumptions


def test_a_prefix_lm_mask_is_named_never_silent():
    """What a prefix-LM keeps is a union (causal or in the prefix): no conjunction of atoms
    guards it, so its work is counted dense, and the report says so at every length (it was
    silent below the fold limit)."""
    p = 64
    for s in (256, 131072):
        macs, assumptions, _ = _macs(Prefix(p), s)
        exact = 2 * D * (p * p + s * (s + 1) // 2 - p * (p + 1) // 2)
        assert macs == 2 * D * s * s and macs > exact
        assert any("keeps a union of regions" in a or "limit of folding masks" in a
                   for a in assumptions), assumptions
    _, assumptions, _ = _macs(Prefix(p), 256)
    assert any("keeps a union of regions" in a and "test_long_context.py" in a
               for a in assumptions)
