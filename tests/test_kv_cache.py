"""KV caches: in-place writes into buffers, and a decode step's exact fused traffic."""

import os

import torch

import solbound
from programs import llama_decode as m

PROG = os.path.join(os.path.dirname(__file__), "programs", "llama_decode.py")
B4 = 4


def test_decode_step_counts_and_fused_traffic_exactly():
    rep = solbound.analyze_source(PROG, validate=True)
    assert rep.lowered.unsupported == []
    assert rep.validation["status"] == "passed", rep.validation
    b, d, h, kv, hd, f, ctx, pos = (m.batch, m.dim, m.heads, m.kv_heads, m.head_dim, m.ffn,
                                    m.ctx, m.pos)
    weights = d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * f + 2 * d
    rows = pos + 1                                   # attention reads rows 0..pos
    macs = b * (weights - 2 * d) + b * 2 * h * hd * rows + 2 * b * d   # + two norms' squares
    assert rep.counts.macs == macs
    # fused: weights once, the input and output token, the rotary row at pos (cos, sin),
    # the cache rows written before (0..pos-1) read, the new row (pos) written, not read back
    fused = (weights + 2 * b * d + 2 * hd
             + 2 * b * kv * pos * hd        # old k and v rows read
             + 2 * b * kv * 1 * hd) * B4    # new k and v rows written
    assert rep.counts.fused.bytes == fused
    assert rep.counts.fused.writes["b_k_cache"] == rep.counts.fused.writes["b_v_cache"] == b * kv * hd * B4


def test_cache_is_updated_in_place_not_copied():
    rep = solbound.analyze_source(PROG)
    written = [k for k in rep.lowered.program.kernels if k.out in ("b_k_cache", "b_v_cache")]
    # one kernel each, writing one row per (batch, kv head, head dim): no whole-cache copy
    assert len(written) == 2
    assert all(dict(k.dims) == {"d0": m.batch, "d1": m.kv_heads, "d3": m.head_dim} for k in written)


class _RuntimePositionCache(torch.nn.Module):
    """A decode step whose cache position is an input: ``index_copy_`` at a position known
    only at run time, attention over the cache masked by ``arange <= pos``."""

    def __init__(self, n=16, d=8):
        super().__init__()
        self.register_buffer("k_cache", torch.randn(1, n, d))
        self.register_buffer("v_cache", torch.randn(1, n, d))

    def forward(self, q, k, v, pos):
        self.k_cache.index_copy_(1, pos, k)
        self.v_cache.index_copy_(1, pos, v)
        keep = torch.arange(self.k_cache.shape[1]) <= pos
        s = (q @ self.k_cache.transpose(1, 2)).masked_fill(~keep, float("-inf"))
        return s.softmax(-1) @ self.v_cache


def test_cache_written_at_a_run_time_position_in_place():
    torch.manual_seed(0)
    n, d = 16, 8
    m = _RuntimePositionCache(n, d)
    inputs = (torch.randn(1, 1, d), torch.randn(1, 1, d), torch.randn(1, 1, d), torch.tensor([5]))
    rep = solbound.analyze(m, inputs, validate=True)
    assert rep.lowered.unsupported == []
    assert rep.validation["status"] == "passed", rep.validation
    # one row written per cache (a scatter at pos, in place: no copy of the cache)
    assert rep.counts.fused.writes == {"b_k_cache": d * B4, "b_v_cache": d * B4, "bmm_1": d * B4}
    # the mask is known only at run time: both products over all n rows (stated)
    assert rep.counts.macs == 2 * n * d
    assert any("input pos is known only at run time" in a for a in rep.to_dict()["assumptions"])
    # the cache is read whole, except the row just written (read back from chip)
    assert rep.counts.fused.reads["b_k_cache"] == (n - 1) * d * B4
