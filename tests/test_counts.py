"""Exact, hand-derived counts for every rule family (small shapes, fp32 = 4 bytes).

Each tuple is (MACs, matrix FLOPs, vector FLOPs, special FLOPs, unfused bytes, fused bytes).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import r, run, totals

B4 = 4  # bytes per fp32 element


# --- contractions ---------------------------------------------------------------

def test_mm():
    rep = run(lambda s, a, b: a @ b, r(3, 5), r(5, 7))
    # M*N*K MACs; read A and B, write C
    assert totals(rep) == (105, 210, 0, 0, (15 + 35 + 21) * B4, (15 + 35 + 21) * B4)


def test_bmm():
    rep = run(lambda s, a, b: torch.bmm(a, b), r(2, 3, 5), r(2, 5, 7))
    assert totals(rep) == (210, 420, 0, 0, (30 + 70 + 42) * B4, (30 + 70 + 42) * B4)


def test_linear_addmm():
    rep = run(lambda s, x: s.l(x), r(3, 5), l=nn.Linear(5, 7))
    # matmul 3*7*5 MACs + one bias add per output (21 vector FLOPs), one operator
    assert totals(rep) == (105, 210, 21, 0, (15 + 35 + 7 + 21) * B4, (15 + 35 + 7 + 21) * B4)


def test_matmul_broadcast_batch():
    # [2,3,5] @ [5,7]: the batch folds into M (2*3*7*5 MACs); B is read once
    rep = run(lambda s, a, b: torch.matmul(a, b), r(2, 3, 5), r(5, 7))
    assert totals(rep)[:2] == (210, 420)
    assert totals(rep)[5] == (30 + 35 + 42) * B4


def test_matmul_broadcast_both_batched():
    # [2,1,3,5] @ [4,5,6] -> [2,4,3,6]; 2*4*3*6*5 MACs
    rep = run(lambda s, a, b: torch.matmul(a, b), r(2, 1, 3, 5), r(4, 5, 6))
    assert totals(rep)[:2] == (720, 1440)


def test_baddbmm_scaled():
    rep = run(lambda s, c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=2.0),
              r(2, 3, 4), r(2, 3, 5), r(2, 5, 4))
    # 2*3*4*5 MACs; epilogue beta*c + alpha*t: 3 vector ops per output (24 outputs)
    assert totals(rep)[:4] == (120, 240, 72, 0)


def test_conv2d_padding_exact_macs():
    rep = run(lambda s, x: s.c(x), r(2, 3, 8, 8), c=nn.Conv2d(3, 4, 3, padding=1))
    # per spatial dim, valid (p, r) pairs with 0 <= p + r - 1 < 8: 6*3 + 2*2 = 22
    macs = 2 * 4 * 3 * 22 * 22
    bias = 2 * 4 * 8 * 8
    bytes_ = (2 * 3 * 64 + 4 * 3 * 9 + 4 + 2 * 4 * 64) * B4
    assert totals(rep) == (macs, 2 * macs, bias, 0, bytes_, bytes_)


def test_conv2d_stride_dilation_groups():
    conv = nn.Conv2d(4, 6, 3, stride=2, dilation=2, groups=2, bias=False)
    rep = run(lambda s, x: s.c(x), r(1, 4, 11, 11), c=conv)
    # out 4x4; no padding: every tap valid; C/g = 2 input channels per output channel
    macs = 1 * 6 * 4 * 4 * 2 * 3 * 3
    assert totals(rep)[:3] == (macs, 2 * macs, 0)


def test_conv1d_and_conv3d():
    rep = run(lambda s, x: s.c(x), r(2, 3, 10), c=nn.Conv1d(3, 5, 4, bias=False))
    assert totals(rep)[0] == 2 * 5 * 7 * 3 * 4
    rep = run(lambda s, x: s.c(x), r(1, 2, 5, 6, 7), c=nn.Conv3d(2, 3, (2, 3, 3), bias=False))
    assert totals(rep)[0] == 1 * 3 * (4 * 4 * 5) * 2 * (2 * 3 * 3)


def test_conv_transpose2d_no_wasted_macs():
    ct = nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1, bias=False)
    rep = run(lambda s, x: s.c(x), r(1, 3, 4, 4), c=ct)
    # every (input pixel, tap) pair lands inside the 8x8 output except where
    # h*2 + r - 1 falls outside [0, 8): per dim, pairs (h, r) valid: 4*3 - 1 = 11
    assert totals(rep)[0] == 1 * 2 * 3 * 11 * 11


def test_conv_transpose1d_groups():
    ct = nn.ConvTranspose1d(4, 6, 3, stride=3, groups=2, bias=False)
    rep = run(lambda s, x: s.c(x), r(2, 4, 5), c=ct)
    # stride 3 = kernel 3: taps never overlap; every (h, r) pair is one MAC
    assert totals(rep)[0] == 2 * 6 * 2 * 5 * 3


# --- elementwise ------------------------------------------------------------------

def test_elementwise_chain_unfused_vs_fused():
    rep = run(lambda s, x: torch.relu(x * 2 + 1), r(4, 10))
    # three ops of one FLOP each; unfused: three round trips of 40 elements
    assert totals(rep) == (0, 0, 120, 0, 6 * 40 * B4, 2 * 40 * B4)


def test_broadcast_binary():
    rep = run(lambda s, x, b: x + b, r(4, 10), r(10))
    assert totals(rep) == (0, 0, 40, 0, (40 + 10 + 40) * B4, (40 + 10 + 40) * B4)


def test_activations_ops_per_element():
    n = 12
    cases = {
        # (vector, special) per element
        "gelu": (lambda x: F.gelu(x), (4, 1)),
        "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), (8, 1)),
        "silu": (lambda x: F.silu(x), (1, 1)),
        "sigmoid": (lambda x: torch.sigmoid(x), (0, 1)),
        "tanh": (lambda x: torch.tanh(x), (0, 1)),
        "relu": (lambda x: F.relu(x), (1, 0)),
        "hardtanh": (lambda x: F.hardtanh(x), (2, 0)),
        "elu": (lambda x: F.elu(x), (2, 1)),   # alpha = 1 folds away
        "leaky_relu": (lambda x: F.leaky_relu(x, 0.1), (3, 0)),
    }
    for name, (fn, (vec, spec)) in cases.items():
        rep = run(lambda s, x, fn=fn: fn(x), r(3, 4))
        t = totals(rep)
        assert (t[2], t[3]) == (vec * n, spec * n), name


def test_softplus_and_mish_decomposed_ops():
    # softplus: x*beta>thr ? x : log1p(exp(x*beta))/beta with beta=1 -> gt, select, exp, log1p
    rep = run(lambda s, x: F.softplus(x), r(2, 3))
    t = totals(rep)
    assert t[2] + t[3] > 0 and t[3] == 2 * 6


# --- reductions ----------------------------------------------------------------------

def test_sum_mean_amax_var():
    x = r(3, 5)
    assert totals(run(lambda s, x: x.sum(-1), x))[2] == 15
    assert totals(run(lambda s, x: x.mean(-1), x))[2] == 15 + 3
    assert totals(run(lambda s, x: x.amax(-1), x))[2] == 15
    # var: sum 15, mean-div 3, (x-m)^2 accumulate 3*15, final div 3
    assert totals(run(lambda s, x: x.var(-1), x))[2] == 15 + 3 + 45 + 3
    assert totals(run(lambda s, x: x.sum(), x))[4] == (15 + 1) * B4


def test_max_dim_and_argmax():
    x = r(3, 5)
    rep = run(lambda s, x: x.max(dim=1).values, x)
    assert totals(rep)[2] == 15
    rep = run(lambda s, x: torch.argmax(x, 1), x)
    assert totals(rep)[2] == 15
    # argmax output is int64: 3 * 8 bytes
    assert totals(rep)[5] == 15 * B4 + 3 * 8


def test_softmax_and_log_softmax():
    x = r(3, 5)
    # max 15, sub 15, exp 15 (special), sum 15, div 15
    assert totals(run(lambda s, x: torch.softmax(x, -1), x)) == (0, 0, 60, 15, 120, 120)
    # max 15; sum(exp(x-m)): sub, accumulate (+exp); out x - m - log(s): 2 sub (+log)
    assert totals(run(lambda s, x: torch.log_softmax(x, -1), x))[2:4] == (75, 30)


def test_layer_norm():
    rep = run(lambda s, x: s.ln(x), r(3, 5), ln=nn.LayerNorm(5))
    # sum 15, div 3, ssq 45, div 3, add+rsqrt 3+3, y = (x-m)*rs*w+b: 4*15
    assert totals(rep) == (15, 0, 129, 3, (15 + 5 + 5 + 15) * B4, (15 + 5 + 5 + 15) * B4)


def test_batch_norm_eval_and_train():
    bn = nn.BatchNorm2d(2).eval()
    rep = run(lambda s, x: s.bn(x), r(2, 2, 3, 3), bn=bn)
    # rstd: add + rsqrt per channel; y: 4 ops per element (36 elements)
    assert totals(rep)[2:4] == (2 + 4 * 36, 2)
    bn = nn.BatchNorm2d(2).train()
    rep = run(lambda s, x: s.bn(x), r(2, 2, 3, 3), bn=bn)
    t = rep.to_dict()["totals"]
    # training: moments over 18 elements per channel, running-stat updates are writes
    assert t["flops_by_unit"]["special"] == 2
    assert t["flops_by_unit"]["vector"] == (36 + 2 + 3 * 36 + 2 + 2 + 4 * 36 + 3 * 2 + 3 * 2 + 1)
    # fused: x, weight, bias, running mean/var, num_batches_tracked read;
    # y, new running mean/var, num_batches_tracked written
    assert t["bytes"]["fused"] == (36 + 2 + 2 + 2 + 2) * B4 + 8 + (36 + 2 + 2) * B4 + 8


def test_group_and_instance_norm():
    rep = run(lambda s, x: s.gn(x), r(2, 4, 3), gn=nn.GroupNorm(2, 4))
    t = totals(rep)
    # per group of 6 elements: sum 6, ssq 18; per (n,g): div, div, add, rsqrt (4 groups)
    assert t[2] == 24 + 4 + 72 + 4 + 4 + 4 * 24
    assert t[3] == 4
    rep = run(lambda s, x: s.inn(x), r(2, 3, 4, 4), inn=nn.InstanceNorm2d(3))
    assert totals(rep)[3] == 6   # one rsqrt per (n, c)


# --- pooling, indexing, concatenation ----------------------------------------------------

def test_pools():
    x = r(1, 2, 4, 4)
    assert totals(run(lambda s, x: F.max_pool2d(x, 2), x))[2] == 32
    assert totals(run(lambda s, x: F.avg_pool2d(x, 2), x))[2] == 32 + 8
    # padded max pool: 3x3 windows, stride 2, pad 1 over 4x4 -> 2x2 outputs;
    # valid taps per dim: p=0: r in {1,2}; p=1: r in {0,1,2} -> 5 per dim
    assert totals(run(lambda s, x: F.max_pool2d(x, 3, 2, 1), x))[2] == 2 * 5 * 5
    assert totals(run(lambda s, x: F.adaptive_avg_pool2d(x, 1), x))[2] == 32 + 2


def test_embedding_indirect_traffic():
    emb = nn.Embedding(10, 4)
    rep = run(lambda s, i: s.e(i), torch.randint(0, 10, (2, 3)), e=emb)
    # ids 6*8 bytes; 6 rows of 4 floats gathered (assumption: distinct rows); 24 floats out
    assert totals(rep) == (0, 0, 0, 0, 48 + 24 * B4 + 24 * B4, 48 + 24 * B4 + 24 * B4)


def test_cat_writes_regions():
    rep = run(lambda s, a, b: torch.cat([a, b], 1) * 2, r(2, 3), r(2, 5))
    # cat: read 6+10, write 16; mul: read 16, write 16
    assert totals(rep) == (0, 0, 16, 0, (16 + 16 + 32) * B4, (16 + 16) * B4)


def test_views_move_nothing():
    # a view of a view: only the six elements the slice selects are read
    rep = run(lambda s, x: x.reshape(-1)[3:9].unsqueeze(0) * 1.5, r(4, 3))
    assert totals(rep) == (0, 0, 6, 0, 12 * B4, 12 * B4)


def test_reshape_of_permuted_copies():
    # reshape of a non-contiguous view is a copy (one operator); only the six elements
    # the slice reads are demanded, so the copy reads 6 (it still materializes all 12)
    rep = run(lambda s, x: x.permute(1, 0).reshape(-1)[3:9] * 1.5, r(3, 4))
    assert totals(rep) == (0, 0, 6, 0, (6 + 12 + 6 + 6) * B4, (6 + 6) * B4)


def test_misaligned_view_addresses_flat_storage():
    # the window [2, 7) of the transposed copy crosses rows of the (4, 3) copy at an
    # offset: not affine on the copy's dims, affine on its flat storage
    rep = run(lambda s, x: x.permute(1, 0).reshape(-1)[2:7] * 1.5, r(3, 4))
    assert rep.unsupported == []
    copy = [t for t in rep.program.tensors if t.role == "intermediate"]
    assert [t.shape for t in copy] == [(12,)]
    # 5 multiplies; unfused: the copy reads and writes 12 floats, the multiply reads 5
    # and writes 5; fused: x (12 floats) in, 5 out
    assert totals(rep) == (0, 0, 5, 0, 4 * (12 + 12 + 5 + 5), 4 * (12 + 5))


def test_sdpa_counts():
    q = r(1, 2, 4, 8)
    rep = run(lambda s, q, k, v: F.scaled_dot_product_attention(q, k, v), q, r(1, 2, 4, 8),
              r(1, 2, 4, 8))
    assert totals(rep)[0] == 2 * (1 * 2 * 4 * 4 * 8)
    d = rep.to_dict()
    assert {k["matrix_class"] for k in d["kernels"] if k["kind"] == "contraction"} == {"attention"}
    # one framework operator: unfused traffic = q, k, v in, output out
    assert d["totals"]["bytes"]["unfused"] == 4 * 64 * B4


def test_cumsum_is_a_scan():
    rep = run(lambda s, x: torch.cumsum(x, 1), r(3, 50))
    # n ops per row, not a triangular product
    assert totals(rep)[2] == 150


# --- one definition of a MAC -------------------------------------------------------

def test_a_mac_is_a_multiply_add_of_a_sum_of_products_however_written():
    # 4*8*3 = 96 squares summed: 96 MACs whether the product and the sum are one
    # kernel (x*x summed, norm) or an elementwise square summed by the next kernel
    x = r(4, 8, 3)
    forms = [lambda s, x: (x * x).sum(), lambda s, x: x.pow(2).sum(),
             lambda s, x: torch.norm(x, p="fro"), lambda s, x: (x ** 2).mean(dim=1),
             lambda s, x: torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + 1e-5)]
    assert [totals(run(f, x))[0] for f in forms] == [96] * 5
    # a sum of one factor has no product: no MAC
    assert totals(run(lambda s, x: x.exp().sum(), x))[0] == 0
