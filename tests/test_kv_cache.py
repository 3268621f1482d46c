"""KV caches: in-place writes into buffers, and a decode step's exact fused traffic."""

import os

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
