"""Reorder opportunities through views: contraction chains followed through dimension
splits and merges (view, reshape, flatten), transposes, contiguous copies and scalings.

Every expected MAC count is derived by hand in the comments (a pairwise contraction over
index sets I and J costs prod(extents of I | J) MACs). Each reported einsum is also checked
to be exact: the IR is run in float64 on random inputs, and the einsum over the strided
views it names (times its scale) must equal the chain's result."""

import numpy as np
import pytest
import torch
import torch.nn as nn
from numpy.lib.stride_tricks import as_strided

import solbound
from helpers import Fn
from solbound.bounds.opportunities import _chain_einsum
from solbound.ir.execute import execute
from solbound.ir.model import EXTERNAL_ROLES


def _analyze(fn_or_module, *shapes):
    m = fn_or_module if isinstance(fn_or_module, nn.Module) else Fn(fn_or_module)
    return solbound.analyze(m, tuple(torch.randn(s, device="meta") for s in shapes),
                            arch="h100-sxm")


def _reorders(rep):
    return [o for o in rep.opportunities if o["kind"] == "reorder"]


def _assert_exact(rep):
    """Each reported chain einsum, evaluated on the views it names, is the chain's result."""
    p = rep.graph.program
    rng = np.random.default_rng(0)
    arrays = execute(p, {t.name: rng.standard_normal(t.shape) for t in p.tensors
                         if t.role in EXTERNAL_ROLES}, wide=True)

    def view(d):
        flat = np.ascontiguousarray(arrays[d["tensor"]]).reshape(-1)
        return as_strided(flat[d["offset"]:], shape=d["shape"],
                          strides=[s * flat.itemsize for s in d["strides"]])
    for o in _reorders(rep):
        got = np.einsum(o["einsum"], *[view(d) for d in o["operands"]]) * o["scale"]
        for s in o["scale_by"]:
            x = arrays[s["tensor"]][tuple(s["index"])]
            got = got * x if s["op"] == "mul" else got / x
        want = view(o["result"])
        assert np.allclose(got, want, rtol=1e-9, atol=1e-9 * np.abs(want).max()), o["einsum"]


# ------------------------------------------------------------------------------------------
# MLA decode, written as DeepSeek-V2/V3 write it (before weight absorption)

B, H, DH, DV, R, T, DM = 2, 8, 16, 16, 64, 127, 128
N = T + 1                       # the cached latents and the new token's


class MLADecode(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq = nn.Linear(DM, H * DH, bias=False)
        self.wkv_a = nn.Linear(DM, R, bias=False)      # down-projection to the latent
        self.wk_b = nn.Linear(R, H * DH, bias=False)   # W_uk
        self.wv_b = nn.Linear(R, H * DV, bias=False)   # W_uv
        self.wo = nn.Linear(H * DV, DM, bias=False)
        self.scale = DH ** -0.5

    def forward(self, x, kv_cache):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, H, DH).transpose(1, 2)
        c = torch.cat([kv_cache, self.wkv_a(x)], dim=1)
        t = c.shape[1]
        k = self.wk_b(c).view(b, t, H, DH).transpose(1, 2)
        v = self.wv_b(c).view(b, t, H, DV).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        p = torch.softmax(scores, dim=-1)
        o = torch.matmul(p, v).transpose(1, 2).reshape(b, s, H * DV)
        return self.wo(o)


def test_mla_decode_with_the_usual_head_split_reports_both_chains():
    rep = _analyze(MLADecode().to("meta"), (B, 1, DM), (B, T, R))
    # the program as written: q = x W_q, the new latent x W_dkv, k = c W_uk and v = c W_uv
    # over all N positions, scores q k^T, p v, and the output projection
    assert rep.to_dict()["totals"]["macs"] == (B * DM * H * DH + B * DM * R
                                               + B * N * R * H * DH + B * N * R * H * DV
                                               + B * H * N * DH + B * H * N * DV
                                               + B * H * DV * DM)
    by_first = {o["kernels"][0]: o for o in _reorders(rep)}
    assert len(by_first) == 2
    k_chain, v_chain = sorted(by_first.values(), key=lambda o: len(o["kernels"]))
    # q . (c W_uk)^T, per batch and head: the program builds k (B*N*R*H*DH), then the scores
    # (B*H*N*DH); absorbed: q W_uk^T (B*H*DH*R), then against the latents (B*H*R*N)
    assert k_chain["macs_before"] == B * N * R * H * DH + B * H * N * DH == 2129920
    assert k_chain["macs_after"] == B * H * DH * R + B * H * R * N == 147456
    assert k_chain["saving"] == 2129920 / 147456
    # p . (c W_uv), then W_o: the program builds v (B*N*R*H*DV), then p v (B*H*N*DV) and the
    # output projection (B*H*DV*DM); absorbed: p c (B*H*N*R), then W_uv (B*H*R*DV), then W_o
    assert len(v_chain["kernels"]) == 3
    assert v_chain["macs_before"] == B * N * R * H * DV + B * H * N * DV + B * H * DV * DM \
        == 2162688
    assert v_chain["macs_after"] == B * H * N * R + B * H * R * DV + B * H * DV * DM == 180224
    assert v_chain["saving"] == 12.0
    # the chains are found through the head split (k and v copied to a contiguous
    # per-head layout for the batched products); the softmax scale comes after the first
    # chain's last product, so no scale is part of either
    assert k_chain["through"] and v_chain["through"]
    assert k_chain["scale"] == v_chain["scale"] == 1.0
    # the operands, as strided views: the latents c (B, N, R), W_uk split per head (nn.Linear
    # keeps it as H*DH x R), q split per head; then p (B, H, N), W_uv, W_o split per head
    assert sorted(d["shape"] for d in k_chain["operands"]) == sorted(
        [[B, N, R], [H, DH, R], [B, H, DH]])
    assert sorted(d["shape"] for d in v_chain["operands"]) == sorted(
        [[B, N, R], [H, DV, R], [B, H, N], [DM, H, DV]])
    assert k_chain["result"]["shape"] == [B, H, N] and v_chain["result"]["shape"] == [B, DM]
    # the absorbed order: q W_uk^T first (the latents last); p c first (the latents first)
    shapes = [d["shape"] for d in k_chain["operands"]]
    assert sorted(shapes[i] for i in k_chain["order_after"][0]) == sorted([[H, DH, R], [B, H, DH]])
    shapes = [d["shape"] for d in v_chain["operands"]]
    assert sorted(shapes[i] for i in v_chain["order_after"][0]) == sorted([[B, N, R], [B, H, N]])
    assert len(k_chain["einsum_after"]) == 2 and len(v_chain["einsum_after"]) == 3
    _assert_exact(rep)
    fused = rep.bound("h100-sxm", "fused").seconds
    assert all(o["fused_seconds_after"]["h100-sxm"] <= fused for o in _reorders(rep))


def test_mla_decode_in_jax_reports_the_same_chains():
    # the same step in JAX (reshape and transpose of the projections' results; every
    # jaxpr variable a view of an IR base): the same MACs as derived above
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def mla(x, cache, wq, wdkv, wuk, wuv, wo):
        b, s, _ = x.shape
        q = (x @ wq).reshape(b, s, H, DH).transpose(0, 2, 1, 3)
        c = jnp.concatenate([cache, x @ wdkv], axis=1)
        t = c.shape[1]
        k = (c @ wuk).reshape(b, t, H, DH).transpose(0, 2, 1, 3)
        v = (c @ wuv).reshape(b, t, H, DV).transpose(0, 2, 1, 3)
        p = jax.nn.softmax((q @ jnp.swapaxes(k, -1, -2)) * DH ** -0.5, axis=-1)
        return (p @ v).transpose(0, 2, 1, 3).reshape(b, s, H * DV) @ wo
    shapes = ((B, 1, DM), (B, T, R), (DM, H * DH), (DM, R), (R, H * DH), (R, H * DV),
              (H * DV, DM))
    rep = solbound.analyze(mla, tuple(jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes),
                           arch="h100-sxm")
    assert sorted((o["macs_before"], o["macs_after"]) for o in _reorders(rep)) == [
        (2129920, 147456), (2162688, 180224)]
    _assert_exact(rep)


# ------------------------------------------------------------------------------------------
# plain chains through one kind of view each

def test_a_chain_through_flatten_and_reshape():
    # flatten (a merge): (A B).flatten(1) C, A 4x16x64, B 64x64, C 1024x2. As written:
    # 4*16*64*64 + 4*1024*2; better B C first (C as 16x64x2): 64*16*64*2, then A: 4*16*64*2
    rep = _analyze(lambda s, a, b, c: (a @ b).flatten(1) @ c, (4, 16, 64), (64, 64), (1024, 2))
    (o,) = _reorders(rep)
    assert (o["macs_before"], o["macs_after"]) == (4 * 16 * 64 * 64 + 4 * 1024 * 2,
                                                   64 * 16 * 64 * 2 + 4 * 16 * 64 * 2)
    _assert_exact(rep)
    # reshape (a split): (A B).reshape(64, 64) C, A 16x8, B 8x256, C 64x8: 16*256*8 + 64*64*8
    # as written; B (as 8x4x64) C first: 8*4*64*8, then A: 16*8*4*8
    rep = _analyze(lambda s, a, b, c: (a @ b).reshape(64, 64) @ c, (16, 8), (8, 256), (64, 8))
    (o,) = _reorders(rep)
    assert (o["macs_before"], o["macs_after"]) == (16 * 256 * 8 + 64 * 64 * 8,
                                                   8 * 4 * 64 * 8 + 16 * 8 * 4 * 8)
    _assert_exact(rep)
    # a patchify: (A B) as C x 8 x 8 cut into 2x2 patches, each row a patch (C*2*2 values;
    # a contiguous copy whose index interleaves the digits of one flattened coordinate),
    # times w. A 3x64, B 64x64, w 12x1. As written: 3*64*64 + 16*12*1; better A w first
    # (3*64*2*2), then B (64*64)
    C, P = 3, 2

    def patchify(s, a, b, w):
        img = (a @ b).view(C, 8, 8).unfold(1, P, P).unfold(2, P, P)
        return img.permute(1, 2, 0, 3, 4).reshape(16, C * P * P) @ w
    rep = _analyze(patchify, (C, 64), (64, 64), (C * P * P, 1))
    (o,) = _reorders(rep)
    assert o["through"]
    assert (o["macs_before"], o["macs_after"]) == (C * 64 * 64 + 16 * 12, C * 64 * P * P + 64 * 64)
    _assert_exact(rep)


def test_a_chain_through_a_transpose():
    # (A B)^T C, A 64x8, B 8x4096, C 64x8: 64*4096*8 + 4096*64*8 as written; A^T C first
    # (8x8, 64*8*8 MACs), then B against it (8*4096*8)
    before, after = 2 * 64 * 4096 * 8, 64 * 8 * 8 + 8 * 4096 * 8
    shapes = ((64, 8), (8, 4096), (64, 8))
    rep = _analyze(lambda s, a, b, c: (a @ b).t() @ c, *shapes)           # a permuted access
    (o,) = _reorders(rep)
    assert (o["macs_before"], o["macs_after"], o["through"]) == (before, after, [])
    _assert_exact(rep)
    rep = _analyze(lambda s, a, b, c: (a @ b).transpose(0, 1).contiguous() @ c, *shapes)
    (o,) = _reorders(rep)                                                 # a copy kernel
    assert (o["macs_before"], o["macs_after"]) == (before, after)
    assert len(o["through"]) == 1
    _assert_exact(rep)


def test_a_chain_through_scalings():
    # the same chain as the transpose's, scaled in the middle: by constants (0.5, then -1/3:
    # the einsum's scale is their product) and by a 0-d tensor (a run-time scalar)
    before, after = 2 * 64 * 4096 * 8, 64 * 8 * 8 + 8 * 4096 * 8
    shapes = ((64, 8), (8, 4096), (64, 8))
    rep = _analyze(lambda s, a, b, c: (-(((a @ b) * 0.5) / 3.0)).t() @ c, *shapes)
    (o,) = _reorders(rep)
    assert (o["macs_before"], o["macs_after"]) == (before, after)
    assert o["scale"] == -0.5 / 3.0 and o["scale_by"] == [] and o["through"]
    _assert_exact(rep)
    rep = _analyze(lambda s, a, b, c, t: ((a @ b) / t).t() @ c, *shapes, ())
    (o,) = _reorders(rep)
    assert (o["macs_before"], o["macs_after"], o["scale"]) == (before, after, 1.0)
    assert [(x["op"], x["index"]) for x in o["scale_by"]] == [("div", [])]
    _assert_exact(rep)


def test_a_nonlinearity_or_a_misaligned_reshape_is_not_a_chain():
    # A 8x64, B 64x4096, C 4096x64: A (B C) is reordered ((A B) C is cheaper), but not
    # across a relu or a softmax
    shapes = ((8, 64), (64, 4096), (4096, 64))
    (o,) = _reorders(_analyze(lambda s, a, b, c: a @ (b @ c), *shapes))
    assert (o["macs_before"], o["macs_after"]) == (64 * 4096 * 64 + 8 * 64 * 64,
                                                   2 * 8 * 64 * 4096)
    assert _reorders(_analyze(lambda s, a, b, c: a @ torch.relu(b @ c), *shapes)) == []
    assert _reorders(_analyze(lambda s, a, b, c: a @ torch.softmax(b @ c, -1), *shapes)) == []
    # MLA with the softmax: the scores are never contracted with W_o's chain
    rep = _analyze(MLADecode().to("meta"), (B, 1, DM), (B, T, R))
    assert all("k__softmax" not in " ".join(o["kernels"] + o["through"]) for o in _reorders(rep))
    # a reshape of 6x10 to 4x15 mixes the two coordinates (10 does not divide 15): the
    # product's flat result is read at place values 1, 15 and written at 1, 10, so no
    # einsum index is common to both: the two products are not one einsum
    rep = _analyze(lambda s, a, b, c: (a @ b).reshape(4, 15) @ c, (6, 2), (2, 10), (15, 64))
    assert [n.kind for n in rep.graph.nodes] == ["contraction", "contraction"]
    assert _chain_einsum(rep.graph, [0, 1]) is None and _reorders(rep) == []
