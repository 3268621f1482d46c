"""Every lowering rule, executed on random inputs at two or more awkward shapes
(distinct, non-power-of-two extents; padding and stride edge cases) and
compared with PyTorch through the validator.
"""

import os
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import Fn
from solbound.frontends.torch.capture import export_program
from solbound.frontends.torch.lower import RULES, lower
from solbound.frontends.torch.reference import validate_lowered

A, B = (3, 5), (2, 7, 3)


def pos(x):
    return x.abs() + 0.25


UNARY = {
    "abs": torch.abs, "neg": torch.neg, "exp": torch.exp, "exp2": torch.exp2,
    "expm1": torch.expm1, "log": lambda x: torch.log(pos(x)), "log2": lambda x: torch.log2(pos(x)),
    "log10": lambda x: torch.log10(pos(x)), "log1p": lambda x: torch.log1p(pos(x)),
    "sqrt": lambda x: torch.sqrt(pos(x)), "rsqrt": lambda x: torch.rsqrt(pos(x)),
    "reciprocal": lambda x: torch.reciprocal(pos(x)), "sin": torch.sin, "cos": torch.cos,
    "tanh": torch.tanh, "sigmoid": torch.sigmoid, "erf": torch.erf,
    "erfinv": lambda x: torch.erfinv(torch.tanh(x) * 0.9), "atan": torch.atan,
    "acos": lambda x: torch.acos(torch.tanh(x) * 0.99), "asin": lambda x: torch.asin(torch.tanh(x) * 0.99),
    "floor": lambda x: torch.floor(x * 3), "ceil": lambda x: torch.ceil(x * 3),
    "round": lambda x: torch.round(x * 3), "trunc": lambda x: torch.trunc(x * 3),
    "sign": torch.sign, "relu": F.relu, "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "mish": F.mish,
    "elu": lambda x: F.elu(x, alpha=0.7), "selu": F.selu, "celu": lambda x: F.celu(x, 1.3),
    "hardtanh": lambda x: F.hardtanh(x, -0.5, 0.8), "leaky_relu": lambda x: F.leaky_relu(x, 0.2),
    "softplus": lambda x: F.softplus(x, beta=2.0, threshold=1.0), "hardsigmoid": F.hardsigmoid,
    "hardswish": F.hardswish, "logsigmoid": F.logsigmoid, "softsign": F.softsign,
    "tanhshrink": F.tanhshrink, "threshold": lambda x: F.threshold(x, 0.1, -2.0),
    "relu6": F.relu6, "clamp": lambda x: torch.clamp(x, -0.3, 0.4),
    "clamp_min": lambda x: torch.clamp_min(x, -0.3), "clamp_max": lambda x: torch.clamp_max(x, 0.2),
    "clamp_tensor": lambda x: torch.clamp(x, x.mean(-1, keepdim=True), x.amax(-1, keepdim=True) * 0.5),
    "flip": lambda x: torch.flip(x, (0, -1)), "cumsum_reverse": lambda x: x.flip(-1).cumsum(-1).flip(-1),
    "logit": lambda x: torch.logit(torch.sigmoid(x)), "isnan": lambda x: torch.isnan(torch.sqrt(x)).float(),
    "square": torch.square, "pow3": lambda x: x ** 3, "pow_half": lambda x: pos(x) ** 0.5,
    "pow_neg1": lambda x: pos(x) ** -1, "pow_frac": lambda x: pos(x) ** 1.7,
    "rsub": lambda x: 1.0 - x, "to_half": lambda x: x.to(torch.float64).float(),
    "logical_not": lambda x: torch.logical_not(x > 0).float(),
}

BINARY = {
    "add": lambda a, b: a + b, "add_alpha": lambda a, b: torch.add(a, b, alpha=0.5),
    "sub": lambda a, b: a - b, "sub_alpha": lambda a, b: torch.sub(a, b, alpha=2.0),
    "mul": lambda a, b: a * b, "div": lambda a, b: a / pos(b),
    "div_floor": lambda a, b: torch.div(a, pos(b), rounding_mode="floor"),
    "div_trunc": lambda a, b: torch.div(a, pos(b), rounding_mode="trunc"),
    "remainder": lambda a, b: torch.remainder(a, pos(b)), "fmod": lambda a, b: torch.fmod(a * 3, pos(b)),
    "maximum": torch.maximum, "minimum": torch.minimum, "pow": lambda a, b: pos(a) ** b,
    "atan2": torch.atan2, "copysign": torch.copysign, "eq": lambda a, b: (a.round() == b.round()).float(),
    "ne": lambda a, b: (a.round() != b.round()).float(), "lt": lambda a, b: (a < b).float(),
    "le": lambda a, b: (a <= b).float(), "gt": lambda a, b: (a > b).float(),
    "ge": lambda a, b: (a >= b).float(),
    "logical_and": lambda a, b: torch.logical_and(a > 0, b > 0).float(),
    "logical_or": lambda a, b: torch.logical_or(a > 0, b > 0).float(),
    "logical_xor": lambda a, b: torch.logical_xor(a > 0, b > 0).float(),
    "bitwise": lambda a, b: ((a > 0) & (b > 0) | (a > 1) ^ (b < 0)).float(),
    "where": lambda a, b: torch.where(a > b, a, b * 2), "lerp": lambda a, b: torch.lerp(a, b, 0.3),
    "addcmul": lambda a, b: torch.addcmul(a, a, b, value=0.5),
    "addcdiv": lambda a, b: torch.addcdiv(a, a, pos(b), value=0.5),
    "masked_fill": lambda a, b: a.masked_fill(b > 0, -1.5),
    "scalar_ops": lambda a, b: (a * 2.5 + 1) / 3 - b,
}

BIN_SHAPES = [((3, 5), (5,)), ((2, 7, 3), (7, 1)), ((4, 1, 6), (1, 5, 1))]

CASES: list = []


def case(name, fn, shapes_list, mods=None, make=None):
    CASES.append((name, fn, shapes_list, mods or {}, make))


for n, f in UNARY.items():
    case(f"unary-{n}", lambda s, x, f=f: f(x), [(A,), (B,)])
for n, f in BINARY.items():
    case(f"binary-{n}", lambda s, a, b, f=f: f(a, b), BIN_SHAPES)

# contractions
case("mm", lambda s, a, b: a @ b, [((3, 5), (5, 7)), ((1, 9), (9, 2))])
case("bmm", lambda s, a, b: torch.bmm(a, b), [((2, 3, 5), (2, 5, 7)), ((3, 1, 4), (3, 4, 6))])
case("matmul-bcast", lambda s, a, b: torch.matmul(a, b), [((2, 1, 3, 5), (4, 5, 6)), ((7, 3), (3,))])
case("linear", lambda s, x: s.l(x), [((3, 5),), ((2, 7, 5),)], {"l": nn.Linear(5, 6)})
case("baddbmm", lambda s, c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=1.5),
     [((2, 3, 7), (2, 3, 5), (2, 5, 7)), ((1, 1, 4), (1, 3, 2), (1, 2, 4))])
case("einsum", lambda s, a, b: torch.einsum("bij,bjk->bik", a, b) + torch.einsum("bij->bj", a).sum(),
     [((2, 3, 5), (2, 5, 4)), ((3, 2, 3), (3, 3, 5))])
for pad, stride, dil, groups in ((0, 1, 1, 1), (1, 2, 1, 2), (2, 3, 2, 1), (1, 1, 1, 4)):
    case(f"conv2d-p{pad}s{stride}d{dil}g{groups}", lambda s, x: s.c(x),
         [((2, 4, 9, 7),), ((1, 4, 6, 11),)],
         {"c": nn.Conv2d(4, 8, 3, stride=stride, padding=pad, dilation=dil, groups=groups)})
# padding given by name: exported with one value for every spatial dim ([0] for "valid")
case("conv2d-padding-valid", lambda s, x: s.c(x), [((2, 3, 8, 8),), ((1, 3, 12, 4),)],
     {"c": nn.Conv2d(3, 8, 4, stride=4, padding="valid")})
case("conv1d-padding-same", lambda s, x: s.c(x), [((2, 3, 11),), ((1, 3, 6),)],
     {"c": nn.Conv1d(3, 5, 3, padding="same")})
case("conv1d", lambda s, x: s.c(x), [((2, 3, 11),), ((1, 3, 6),)], {"c": nn.Conv1d(3, 5, 4, padding=2)})
case("conv3d", lambda s, x: s.c(x), [((1, 2, 5, 6, 7),), ((2, 2, 4, 3, 5),)],
     {"c": nn.Conv3d(2, 3, (2, 3, 2), stride=(1, 2, 1), padding=(0, 1, 1))})
for stride, pad, opad, dil, groups in ((1, 0, 0, 1, 1), (2, 1, 1, 1, 1), (3, 2, 0, 2, 2), (2, 0, 1, 1, 3)):
    case(f"convT2d-s{stride}p{pad}o{opad}d{dil}g{groups}", lambda s, x: s.c(x),
         [((1, 6, 5, 4),), ((2, 6, 3, 7),)],
         {"c": nn.ConvTranspose2d(6, 3 * groups, 3, stride=stride, padding=pad,
                                  output_padding=opad, dilation=dil, groups=groups)})
case("convT1d", lambda s, x: s.c(x), [((2, 3, 7),), ((1, 3, 4),)],
     {"c": nn.ConvTranspose1d(3, 4, 5, stride=3, padding=1)})
case("convT3d", lambda s, x: s.c(x), [((1, 2, 3, 4, 5),), ((1, 2, 2, 3, 2),)],
     {"c": nn.ConvTranspose3d(2, 3, 3, stride=2, padding=1)})

# reductions and scans
for n, f in {
    "sum": lambda x: x.sum(-1), "sum_all": lambda x: x.sum(), "sum_keep": lambda x: x.sum(0, keepdim=True),
    "mean": lambda x: x.mean((0, -1)), "mean_all": lambda x: x.mean(), "amax": lambda x: x.amax(-1),
    "amin": lambda x: x.amin(0), "max_all": lambda x: x.max(), "min_all": lambda x: x.min(),
    "max_dim": lambda x: x.max(-1).values + x.max(-1).indices, "min_dim": lambda x: x.min(0).values,
    "argmax": lambda x: torch.argmax(x, -1), "argmin": lambda x: torch.argmin(x, 0),
    "var": lambda x: x.var(-1), "var0": lambda x: torch.var(x, 0, correction=0),
    "std": lambda x: x.std(-1, keepdim=True), "var_mean": lambda x: sum(torch.var_mean(x, -1)),
    "prod": lambda x: x.prod(-1), "any": lambda x: (x > 1).any(-1).float(),
    "all": lambda x: (x > -1).all(0).float(), "cumsum": lambda x: x.cumsum(-1),
    "cumprod": lambda x: (x * 0.5).cumprod(0), "norm": lambda x: torch.linalg.vector_norm(x, dim=-1),
    "logsumexp": lambda x: torch.logsumexp(x, -1), "softmax": lambda x: torch.softmax(x, -1),
    "softmax0": lambda x: torch.softmax(x, 0), "log_softmax": lambda x: torch.log_softmax(x, -1),
}.items():
    case(f"reduce-{n}", lambda s, x, f=f: f(x), [(A,), (B,)])

# normalization
case("layer_norm", lambda s, x: s.n(x), [((3, 5),), ((2, 7, 5),)], {"n": nn.LayerNorm(5)})
case("layer_norm_2d", lambda s, x: F.layer_norm(x, (7, 3)), [((2, 7, 3),), ((1, 7, 3),)])
case("batch_norm2d_train", lambda s, x: s.n(x), [((3, 4, 5, 3),), ((2, 4, 1, 7),)], {"n": nn.BatchNorm2d(4)})
case("batch_norm1d_train", lambda s, x: s.n(x), [((3, 4, 5),), ((5, 4),)], {"n": nn.BatchNorm1d(4)})
case("batch_norm_eval", lambda s, x: s.n(x), [((3, 4, 5, 3),), ((2, 4, 1, 7),)],
     {"n": nn.BatchNorm2d(4).eval()})
case("group_norm", lambda s, x: s.n(x), [((2, 6, 5),), ((3, 6, 2, 3),)], {"n": nn.GroupNorm(3, 6)})
case("instance_norm", lambda s, x: s.n(x), [((2, 3, 5, 4),), ((1, 3, 7, 3),)], {"n": nn.InstanceNorm2d(3)})

# pooling
for n, f in {
    "max2d": lambda x: F.max_pool2d(x, 2), "max2d_pad": lambda x: F.max_pool2d(x, 3, 2, 1),
    "max2d_dil": lambda x: F.max_pool2d(x, 2, 1, 0, 2), "max2d_ceil": lambda x: F.max_pool2d(x, 2, ceil_mode=True),
    "avg2d": lambda x: F.avg_pool2d(x, 2), "avg2d_pad": lambda x: F.avg_pool2d(x, 3, 2, 1),
    "avg2d_nopad": lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
    "avg2d_ceil": lambda x: F.avg_pool2d(x, 2, ceil_mode=True),
    "adaptive_avg1": lambda x: F.adaptive_avg_pool2d(x, 1),
    "adaptive_avg3": lambda x: F.adaptive_avg_pool2d(x, (3, 2)),
    "adaptive_max": lambda x: F.adaptive_max_pool2d(x, 1),
    "max1d": lambda x: F.max_pool1d(x.flatten(2), 3, 2), "avg1d": lambda x: F.avg_pool1d(x.flatten(2), 2),
}.items():
    case(f"pool-{n}", lambda s, x, f=f: f(x), [((2, 3, 7, 5),), ((1, 2, 6, 9),)])
case("pool-max3d", lambda s, x: F.max_pool3d(x, 2, 1, 1), [((1, 2, 5, 4, 3),), ((2, 1, 3, 5, 4),)])
case("pool-avg3d", lambda s, x: F.avg_pool3d(x, 2), [((1, 2, 5, 4, 3),), ((2, 1, 3, 5, 4),)])
case("pool-adaptive-avg3d", lambda s, x: F.adaptive_avg_pool3d(x, 1), [((1, 2, 5, 4, 3),), ((2, 1, 3, 5, 4),)])


# indexing, concatenation, constructors, views
def ints(high):
    return lambda shape: torch.randint(0, high, shape)


# bits of integer tensors: packed 4-bit weights unpacked with shifts and masks (int8 and
# uint8 storage: a right shift of a negative int8 is arithmetic, as in PyTorch)
for _dt in (torch.uint8, torch.int8, torch.int32):
    case(f"bits-{str(_dt).split('.')[-1]}",
         lambda s, a, b: (((a >> 4) & 0xF) | ((b << 2) ^ a) | torch.bitwise_right_shift(b, 1)
                          | torch.bitwise_left_shift(a & 0x3, b & 0x3) | ~a).float()
         + torch.bitwise_xor(a, b).float(),
         [((3, 5), (5,)), ((2, 4, 3), (4, 1))],
         make=lambda sh, _dt=_dt: torch.randint(-128 if _dt.is_signed else 0,
                                                128 if _dt.is_signed else 256, sh, dtype=_dt))
# quantized products: fp8 x fp8 scaled per tensor and per row (with a bias); int8
# weights with one scale per output, the product in the activations' dtype
def _fp8(sh):
    return (torch.randn(*sh) * 4).to(torch.float8_e4m3fn)


case("scaled_mm-tensorwise",
     lambda s, a, b: torch._scaled_mm(a, b.t(), torch.tensor(0.5), torch.tensor(2.0),
                                      out_dtype=torch.float32),
     [((5, 16), (8, 16)), ((16, 32), (16, 32))], make=_fp8)
case("scaled_mm-rowwise",
     lambda s, a, b: torch._scaled_mm(a, b.t(), s.sa, s.sb, bias=s.bias,
                                      out_dtype=torch.float32),
     [((4, 16), (8, 16))], {"sa": torch.rand(4, 1) + 0.5, "sb": torch.rand(1, 8) + 0.5,
                            "bias": torch.randn(8)}, make=_fp8)
# PyTorch's CPU int4 weights packed in the forward and multiplied: 80 outputs are one
# block of 64 and a tail of 16 (the two layouts of rules/int4pack.py), groups of 32
case("int4pack-cpu",
     lambda s, x: torch._weight_int4pack_mm_for_cpu(
         x, torch._convert_weight_to_int4pack_for_cpu(s.q, 1), 32, s.sz),
     [((4, 64),), ((1, 64),)],
     {"q": torch.randint(0, 16, (80, 64), dtype=torch.int32),
      "sz": torch.stack([torch.rand(2, 80) * 0.1, torch.randn(2, 80) * 0.1], -1)
      .to(torch.bfloat16)},
     make=lambda sh: torch.randn(*sh).to(torch.bfloat16))


def _out_dtype_mm(s, a, b):
    from torch._higher_order_ops.out_dtype import out_dtype
    return out_dtype(torch.ops.aten.mm.default, torch.int32, a, b).float()


case("out_dtype-mm", _out_dtype_mm, [((4, 16), (16, 8)), ((1, 32), (32, 3))],
     make=lambda sh: torch.randint(-128, 127, sh, dtype=torch.int8))
case("weight_int8pack_mm",
     lambda s, x: torch._weight_int8pack_mm(x, s.w, s.sc),
     [((3, 16),), ((1, 16),)], {"w": torch.randint(-128, 127, (8, 16), dtype=torch.int8),
                                "sc": torch.rand(8)})
case("embedding", lambda s, i: s.e(i), [((2, 3),), ((5,),)], {"e": nn.Embedding(11, 4)}, make=ints(11))
case("gather", lambda s, x: torch.gather(x, 1, (x.abs() * 3).long().clamp(max=x.shape[1] - 1)),
     [((3, 5),), ((2, 7, 3),)])
case("index_select", lambda s, x, i: torch.index_select(x, 1, i) + x[:, i],
     [((3, 5), (4,)), ((2, 5, 3), (7,))], make=lambda sh: torch.randn(*sh) if len(sh) > 1 else torch.randint(0, 5, sh))
case("cat", lambda s, a, b: torch.cat([a, b * 2, a], -1), [((3, 5), (3, 2)), ((2, 7, 3), (2, 7, 1))])
case("cat0", lambda s, a, b: torch.cat([a, b], 0), [((3, 5), (2, 5)), ((1, 7, 3), (2, 7, 3))])
case("stack", lambda s, a, b: torch.stack([a, b], 1), [((3, 5), (3, 5)), ((2, 7, 3), (2, 7, 3))])
case("pad", lambda s, x: F.pad(x, (1, 2, 0, 3), value=0.5), [((3, 5),), ((2, 7, 3),)])
case("pad-crop", lambda s, x: F.pad(x, (-1, 2)), [((3, 5),), ((2, 7, 3),)])
case("constructors", lambda s, x: x + torch.ones_like(x) * 2 + torch.zeros(x.shape[-1]) +
     torch.full((x.shape[-1],), 1.5) + torch.arange(x.shape[-1]), [((3, 5),), ((2, 7, 3),)])
# .item() of a one-element tensor used as a number (an optimizer's step size from its
# step counter): the tensor read as a broadcast operand
case("item-scale", lambda s, x: x * (x.sum() * 0.1 + 1.0).item(), [((3, 5),), ((2, 7, 3),)])
case("arange-float", lambda s, x: x * torch.arange(0.5, x.shape[-1] * 0.5 + 0.5, 0.5), [((3, 5),), ((2, 7, 3),)])
case("tril-triu", lambda s, x: torch.tril(x, -1) + torch.triu(x, 1), [((5, 5),), ((2, 4, 6),)])
def _views(x):
    y = x.transpose(0, 1).contiguous()
    n = y[0].numel()
    return y.view(-1)[n:3 * n].reshape(2, -1)[1:] * 2


case("views", lambda s, x: _views(x), [((3, 5),), ((2, 7, 3),)])
# ViT's patchify: reshaping unfolded patches to rows whose length (C*p*p) is not a
# multiple of the inner sizes interleaves dimensions at non-aligned offsets: the base
# is addressed as flat storage
case("patchify-interleave", lambda s, x: x.unfold(2, 2, 2).unfold(3, 2, 2)
     .reshape(x.shape[0], -1, 4 * x.shape[1]) @ s.w, [((2, 3, 4, 4),), ((1, 3, 2, 10),)],
     mods={"w": nn.Parameter(torch.randn(12, 5))})
case("reshape-interleave-offset", lambda s, x: (x.t() + 1).reshape(-1)[3:].reshape(-1, 5).sum(0),
     [((4, 7),), ((6, 3),)])
case("argmax-flat-window", lambda s, x: torch.max(x, -1)[1].reshape(-1)[2:9].float() * 2
     + torch.max(x, -1)[0].reshape(-1)[1:8], [((4, 5, 3),), ((3, 3, 2),)])
# a window at an offset within a row, whose terms each fit the row but together carry
# into the next one: only the flat storage is affine (it was read past the row's end)
case("window-carries-into-next-row", lambda s, x: x.reshape(-1)[6:22].view(2, 8) * 2,
     [((2, 16),), ((4, 8),)])

# an output that is a window of an empty tensor (DeepSeek-V4's empty state at prefill):
# nothing to read, nothing that can carry past a row
case("empty-window-output", lambda s, x: (x * 2, (x[:, :0] * 2).view(x.shape[0], 0, x.shape[2])[..., :2]),
     [((2, 3, 4),), ((1, 5, 6),)])


def _heads_at_offset(x):
    """JetMoE's attention experts: rows gathered back by a data-dependent ``index_add``,
    then viewed as heads of 4 several to a row, each head's second half at an offset."""
    t, d = x.shape
    idx = torch.argsort(torch.cat([x[:, 0], x[:, 1]]))      # a permutation of 2t rows
    z = torch.zeros(2 * t, d).index_add(0, idx, torch.cat([x, 2 * x]))
    q = z.view(t, 2 * d // 4, 4)
    return q[..., 2:] * q[..., :2]


case("heads-at-an-offset-of-rows-scattered-by-index", lambda s, x: _heads_at_offset(x),
     [((4, 8),), ((5, 12),)])
case("flatten-slice-merge", lambda s, x: x[:, 1:].flatten() * 3, [((3, 5),), ((4, 7, 3),)])
case("expand-select-chunk", lambda s, x: sum(c.sum() for c in x[..., None].expand(*x.shape, 2).chunk(2, 0)),
     [((4, 5),), ((2, 7, 3),)])
case("unbind-split", lambda s, x: x.split([1, x.shape[0] - 1])[1].sum(0) + x.unbind(0)[0],
     [((3, 5),), ((2, 7, 3),)])
case("diagonal", lambda s, x: torch.diagonal(x, 0, -2, -1) * 2, [((5, 5),), ((2, 4, 4),)])
case("dropout-train-p0", lambda s, x: s.d(x), [(A,), (B,)], {"d": nn.Dropout(0.0).train()})


class _State(nn.Module):
    """State kept in a tensor attribute, overwritten in place from an input (aten.copy)."""

    def __init__(self):
        super().__init__()
        self.h = torch.zeros(5)

    def forward(self, x, h0):
        self.h.copy_(h0)
        self.h = self.h * 0.5 + x.sum()
        return x * 2 + self.h


case("copy-into-buffer", None, [((3, 5), (5,)), ((2, 7, 5), (5,))], {"module": _State})
case("dropout-eval", lambda s, x: F.dropout(x, 0.5, training=False) + F.dropout(x, 0.0), [(A,), (B,)])
case("sdpa", lambda s, q, k, v: F.scaled_dot_product_attention(q, k, v),
     [((2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 4)), ((1, 2, 7, 3), (1, 2, 7, 3), (1, 2, 7, 3))])
case("sdpa-causal", lambda s, q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
     [((2, 3, 5, 4), (2, 3, 5, 4), (2, 3, 5, 4)), ((1, 2, 7, 3), (1, 2, 7, 3), (1, 2, 7, 3))])
case("mha", lambda s, x: s.m(x, x, x)[0], [((2, 5, 6),), ((1, 7, 6),)],
     {"m": nn.MultiheadAttention(6, 2, batch_first=True)})



class _Cache(nn.Module):
    """A KV-cache write (slice assignment into a buffer), then a read of the cache."""

    def __init__(self, n=9, pos=4):
        super().__init__()
        self.pos = pos
        self.register_buffer("cache", torch.randn(2, n, 5))

    def forward(self, x):
        self.cache[:, self.pos:self.pos + x.shape[1]] = x
        return self.cache[:, :self.pos + x.shape[1]].sum(1)


case("topk", lambda s, x: torch.topk(x, 3, -1).values * 2 + torch.topk(x, 2, 0).indices.sum()
     + torch.topk(x, 2, -1, largest=False).values.sum(), [((4, 7),), ((2, 5, 6),)])
case("scatter", lambda s, x: x.scatter(1, torch.topk(x, 2, 1).indices, 1.5)
     + x.scatter(0, torch.topk(x[:2], 1, 0).indices, x[:1] * 3) + torch.empty_like(x).fill_(1),
     [((4, 7),), ((3, 5),)])
case("repeat", lambda s, x: x.repeat(2, 1, 3) * 1 + x.repeat(1, 1, 1).sum(),
     [((3, 5),), ((1, 4, 2),)])
class _IndexCache(nn.Module):
    """KV-cache writes at known positions: index_copy_ with a constant index, and
    advanced-index assignment at arange positions (both lower to index_put)."""

    def __init__(self, n=9, pos=4):
        super().__init__()
        self.pos = pos
        self.register_buffer("k", torch.randn(2, n, 5))
        self.register_buffer("v", torch.randn(2, n, 5))

    def forward(self, x):
        t = x.shape[1]
        self.k.index_copy_(1, torch.tensor(list(range(self.pos, self.pos + t))), x)
        self.v[:, torch.arange(self.pos, self.pos + 2 * t, 2)] = x * 2
        return self.k[:, :self.pos + t].sum(1) + self.v.sum(1)


def _ix(x, n, *shape):
    """Indices in [0, n) computed from data (repeats included): known only at run time."""
    return (x.abs() * 7).long().reshape(-1)[:math.prod(shape)].reshape(shape) % n


class _RuntimeCache(nn.Module):
    """A KV cache written at a position the caller passes (index_copy_ at run time)."""

    def __init__(self, n=9):
        super().__init__()
        self.register_buffer("k", torch.randn(2, n, 5))

    def forward(self, x):
        pos = _ix(x, self.k.shape[1], 1)
        self.k.index_copy_(1, pos, x[:, :1])
        return self.k.sum(1)


# scatters: positions read from a tensor at run time (repeated positions accumulate)
case("index_add", lambda s, x, y: x.index_add(0, _ix(y, x.shape[0], y.shape[0]), y)
     + x.index_add(1, _ix(y, x.shape[1], x.shape[1]), x, alpha=0.5),
     [((5, 4), (7, 4)), ((3, 6), (2, 6))])
case("scatter_add", lambda s, x, y: x.scatter_add(1, _ix(y, x.shape[1], *y.shape), y),
     [((5, 4), (5, 3)), ((3, 6), (2, 6))])
for _r in ("sum", "prod", "amax", "amin"):
    case(f"scatter_reduce-{_r}", lambda s, x, y, r=_r: x.scatter_reduce(
        1, _ix(y, x.shape[1], *y.shape), y, r) + x.scatter_reduce(
        0, _ix(x, y.shape[0], *y.shape), y, r, include_self=False),
        [((5, 4), (5, 3)), ((3, 6), (2, 6))])
def _put_runtime(s, x, y):
    c = x * 1
    c[_ix(y, x.shape[0], 3), :, _ix(x, x.shape[2], 3)] = \
        y.reshape(-1)[:3 * x.shape[1]].reshape(3, x.shape[1])
    return c + torch.index_put(x, (_ix(y, x.shape[0], 2),), y[:2, :1, :1] * 2, accumulate=True)


case("index_put-runtime", _put_runtime, [((4, 3, 5), (2, 3, 5)), ((3, 2, 4), (3, 2, 4))])
case("index_put-mask", lambda s, x: torch.index_put(x, (x > 0.3,), torch.tensor(2.0))
     + torch.index_put(x, (x[:, 0] > 0,), torch.tensor(-1.0), accumulate=True),
     [((4, 3),), ((2, 5),)])
# one row written into every selected element, as T5Gemma 2 writes its end-of-image
# embedding at every position of that token: the same values whatever the mask selects
case("index_put-mask-row", lambda s, x: torch.index_put(x, (x[..., 0] > 0,), s.row)
     + torch.index_put(x, (x[..., 1] > 0,), s.col[:, :1] * 3, accumulate=True),
     [((2, 3, 4),), ((5, 4),)],
     {"row": nn.Parameter(torch.randn(4)), "col": nn.Parameter(torch.randn(1, 4))})
# one value of any shape (1, 1, 1): a masked fill, as PyTorch takes it
case("index_put-mask-one-value-more-dims", lambda s, x: torch.index_put(x, (x[:, 0] > 0,), s.v),
     [((4, 3),), ((5, 2),)], {"v": nn.Parameter(torch.randn(1, 1, 1))})
case("index_copy-runtime-position", None, [((2, 1, 5),), ((2, 3, 5),)],
     {"module": _RuntimeCache})
# operators PyTorch keeps whole but decomposes (capture.EXTRA_DECOMPOSITIONS)
for _m, _ac in (("nearest", None), ("bilinear", False), ("bilinear", True)):
    case(f"interpolate-{_m}-{_ac}", lambda s, x, m=_m, ac=_ac: F.interpolate(
        x, size=(7, 5), mode=m, align_corners=ac) + F.interpolate(x, scale_factor=2, mode=m,
                                                                  align_corners=ac).mean(),
         [((1, 2, 4, 3),), ((2, 1, 5, 6),)])
case("grid_sample", lambda s, x, g: F.grid_sample(x, torch.tanh(g), align_corners=False)
     + F.grid_sample(x, torch.tanh(g), mode="nearest", align_corners=True),
     [((1, 2, 4, 5), (1, 3, 2, 2)), ((2, 1, 3, 3), (2, 2, 4, 2))])
case("bucketize", lambda s, x: torch.bucketize(x, torch.tensor([-1.0, 0.0, 0.5, 1.0])).float()
     + torch.bucketize(x, torch.tensor([-0.5, 0.5]), right=True).float(), [(A,), (B,)])
case("diagonal_scatter", lambda s, x, y: torch.diagonal_scatter(
    x, y[..., :min(x.shape[-2:])], 0, -2, -1)
     + torch.diagonal_scatter(x * 1, y[..., :min(x.shape[-2], x.shape[-1] - 1)], 1, -2, -1),
     [((4, 5), (5,)), ((2, 3, 3), (2, 3))])
# library routines (ir/library.py), run through numpy
def _spd(x):
    return x @ x.mT + x.shape[-1] * torch.eye(x.shape[-1])


case("sort", lambda s, x: torch.sort(x, -1).values + torch.sort(x, 0, descending=True).indices,
     [(A,), (B,)])
case("kthvalue-median", lambda s, x: torch.kthvalue(x, 2, -1).values + torch.median(x, -1).values
     + torch.median(x) + torch.kthvalue(x, 1, 0, keepdim=True).indices.sum(), [(A,), (B,)])
case("cummax-cummin", lambda s, x: torch.cummax(x, -1).values + torch.cummin(x, 0).indices,
     [(A,), (B,)])
case("fft", lambda s, x: torch.view_as_real(torch.fft.fft(x)).sum(-1)
     + torch.fft.irfft(torch.fft.rfft(x, norm="ortho"), n=x.shape[-1], norm="ortho")
     + torch.fft.ifft2(torch.fft.fft2(x.to(torch.complex64), norm="forward")).real,
     [(A,), (B,)])
case("complex", lambda s, x, y: torch.view_as_real(
    torch.view_as_complex(x) * torch.view_as_complex(y) - torch.view_as_complex(y)),
     [((3, 2), (3, 2)), ((2, 4, 2), (2, 4, 2))])
case("polar", lambda s, r, t: torch.view_as_real(torch.polar(pos(r), t)),
     [(A, A), (B, B)])
case("linalg", lambda s, a, b: torch.linalg.solve(_spd(a), b).sum() + torch.linalg.inv(_spd(a))
     + torch.linalg.cholesky(_spd(a)) + torch.linalg.eigvalsh(_spd(a)).sum()
     + torch.linalg.svdvals(a).sum() + torch.linalg.qr(a).R.abs(),
     [((4, 4), (4, 2)), ((2, 3, 3), (2, 3, 1))])
case("histc-searchsorted", lambda s, x: torch.histc(x, 5, -1, 1).sum()
     + torch.searchsorted(torch.tensor([-1.0, 0.0, 0.7]), x).float()
     + torch.searchsorted(torch.tensor([-0.5, 0.5]), x, right=True).float(), [(A,), (B,)])
def _repeat_by_counts(s, x):
    """``repeat_interleave`` by counts read from data, its total fixed (``output_size``: a
    grouped dispatch's), and a running total over a flattened view (a scan whose dimension
    spans two of its base's)."""
    n = x.shape[-1]
    c = (x > 0).long().sum(-1).reshape(-1)
    reps = torch.stack([c, n - c], -1).reshape(-1)
    idx = torch.arange(reps.numel()).repeat_interleave(reps, output_size=x.numel())
    return x.reshape(-1)[idx] + torch.cumsum(reps, 0)[idx].float()


case("repeat_interleave-counts", _repeat_by_counts, [(A,), (B,)])
case("logcumsumexp", lambda s, x: torch.logcumsumexp(x, -1) + torch.logcumsumexp(x, 0),
     [(A,), (B,)])
class _Bags(nn.Module):
    """embedding_bag in every mode, bags from run-time offsets (one empty) and fixed-size
    bags from 2-d indices, with per-sample weights."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(9, 5))

    def forward(self, x):
        idx = _ix(x, 9, 7)
        off = torch.tensor([0, 2, 2, 5])
        out = sum(F.embedding_bag(idx, self.w, off, mode=m).sum() for m in ("sum", "mean", "max"))
        return out + F.embedding_bag(idx[:6].view(2, 3), self.w, mode="mean") \
            + F.embedding_bag(idx, self.w, off, mode="sum", per_sample_weights=x.reshape(-1)[:7])[:2]


case("embedding_bag", None, [((3, 5),), ((2, 7),)], {"module": _Bags})
# data movement and image ops that decompose into views, gathers and index arithmetic
case("tile-roll", lambda s, x: x.tile(2, 3).sum() + torch.roll(x, 2, -1)
     + torch.roll(x, (1, -2), (0, 1)), [(A,), ((4, 6),)])
case("pixel-shuffle", lambda s, x: F.pixel_shuffle(F.pixel_unshuffle(x, 2) * 2, 2),
     [((1, 2, 4, 6),), ((2, 3, 6, 4),)])
case("unfold-fold", lambda s, x: F.fold(F.unfold(x, 3, padding=1, stride=2), x.shape[-2:], 3,
                                         padding=1, stride=2), [((1, 2, 5, 6),), ((2, 1, 7, 4),)])
case("select_scatter", lambda s, x, y: torch.select_scatter(x, y, 0, 1)
     + torch.select_scatter(x * 1, y * 2, 0, -1), [((3, 5), (5,)), ((2, 4, 3), (4, 3))])
for _m, _ac in (("bicubic", False), ("bicubic", True), ("area", None)):
    case(f"interpolate-{_m}-{_ac}", lambda s, x, m=_m, ac=_ac: F.interpolate(
        x, size=(7, 5) if m != "area" else (2, 3), mode=m, align_corners=ac),
         [((1, 2, 4, 6),), ((2, 1, 6, 9),)])
case("index_put-known-positions", None, [((2, 1, 5),), ((2, 2, 5),)], {"module": _IndexCache})
case("slice_scatter-in-place", None, [((2, 1, 5),), ((2, 3, 5),)], {"module": _Cache})
# the old value is read afterwards: a fresh tensor, copied and overwritten
case("slice_scatter-functional", lambda s, x, y: torch.slice_scatter(x, y, 1, 1, 3) + x,
     [((3, 5), (3, 2)), ((2, 4, 3), (2, 2, 3))])
case("slice_scatter-step", lambda s, x, y: torch.slice_scatter(x * 1, y, 0, 1, None, 2),
     [((5, 3), (2, 3)), ((7, 2), (3, 2))])

# recurrent layers: a loop over time steps, never unrolled
class _RNN(nn.Module):
    def __init__(self, cls, **kw):
        super().__init__()
        self.rnn = cls(**kw)

    def forward(self, x, *h):
        out = self.rnn(x, *h) if h else self.rnn(x)
        y, hn = out
        hn = hn if isinstance(hn, torch.Tensor) else hn[0] + hn[1]
        return y.sum() + hn.sum() * 0 + y * 1, hn


for _n, _cls, _kw in (
    ("lstm", nn.LSTM, dict(input_size=5, hidden_size=7)),
    ("lstm-2layer-bidir-bf", nn.LSTM, dict(input_size=5, hidden_size=6, num_layers=2,
                                           bidirectional=True, batch_first=True)),
    ("gru", nn.GRU, dict(input_size=5, hidden_size=7)),
    ("gru-bidir-nobias", nn.GRU, dict(input_size=5, hidden_size=3, bidirectional=True, bias=False)),
    ("rnn-tanh", nn.RNN, dict(input_size=5, hidden_size=4, num_layers=2)),
    ("rnn-relu", nn.RNN, dict(input_size=5, hidden_size=4, nonlinearity="relu", batch_first=True)),
):
    case(f"recurrent-{_n}", None, [((6, 3, 5),), ((3, 1, 5),)],
         {"module": (lambda cls=_cls, kw=_kw: _RNN(cls, **kw))})


class _CellStateOnly(nn.Module):
    """Only c_n is used: the last layer's hidden-state updates are live only through the
    loop-carried recurrence (KernelBench 37_LSTMCn)."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(5, 6, num_layers=2, batch_first=True)

    def forward(self, x):
        return self.rnn(x)[1][1]


case("recurrent-lstm-cell-state-only", None, [((3, 6, 5),), ((1, 4, 5),)],
     {"module": _CellStateOnly})


def _scan_two_carries(s, x, h):
    """torch's scan called directly: two carries (one a pytree of two), outputs of two
    shapes, a weight closed over (an additional input), forward and reversed."""
    from torch._higher_order_ops.scan import scan

    def body(c, xt):
        h, (m, k) = c
        h = torch.tanh(xt @ s.w + h)
        m = torch.maximum(m, h)
        k = k * 0.5 + h.sum(-1, keepdim=True)
        return [h, (m, k)], (h * 2, k.squeeze(-1) + 1)
    init = [h, (h * 0 - 1, h[:, :1] * 0)]
    (hf, (mf, kf)), (ys, ks) = scan(body, init, x.movedim(1, 0))
    (hr, _), (yr, _) = scan(body, init, x.movedim(1, 0), reverse=True)
    return hf + mf, kf, ys.movedim(0, 1), ks, hr, yr


case("scan", _scan_two_carries, [((2, 5, 4), (2, 3)), ((3, 2, 4), (3, 3))],
     {"w": nn.Parameter(torch.randn(4, 3))})


def _flex(s, q, k, v):
    """FlexAttention: a sliding-window causal mask_mod and a tanh soft-cap with a
    per-head bias as score_mod (the head's bias a closed-over tensor), grouped-query heads
    where k has fewer, at lengths no block size divides."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def mask(b, h, qi, ki):
        return (qi >= ki) & (qi - ki < 9)

    def score(x, b, h, qi, ki):
        return 5 * torch.tanh(x / 5) + s.bias[h]
    bm = create_block_mask(mask, None, None, q.shape[2], k.shape[2], device=q.device)
    return flex_attention(q, k, v, block_mask=bm, score_mod=score,
                          enable_gqa=q.shape[1] != k.shape[1])


case("flex_attention", _flex, [((2, 4, 40, 8), (2, 4, 40, 8), (2, 4, 40, 8)),
                               ((1, 4, 33, 6), (1, 2, 33, 6), (1, 2, 33, 6))],
     {"bias": nn.Parameter(torch.randn(4))})


def _masked_scatter(s, x, src):
    """A VLM's features put at its image tokens: rows where a condition holds take the
    source's rows in order (``masked_scatter``: a running count and a gather)."""
    mask = (x[..., :1] > 0).expand_as(x)
    return x.masked_scatter(mask, src) * 2


case("masked_scatter", _masked_scatter, [((3, 5, 4), (60,)), ((2, 7), (14,))])


def make_inputs(shapes, make):
    return [make(s) if make else torch.randn(*s) for s in shapes]


_CACHE: dict = {}
# every test of this file on one xdist worker (``--dist loadgroup``, pyproject's addopts):
# the last one reuses the lowerings the others cached instead of lowering every case again
pytestmark = pytest.mark.xdist_group("rules_differential")


def lowered_for(name, fn, shapes, mods, make):
    key = (name, shapes)
    if key not in _CACHE:
        _CACHE[key] = _lowered_for(name, fn, shapes, mods, make)
    return _CACHE[key]


def _lowered_for(name, fn, shapes, mods, make):
    torch.manual_seed(sum(map(ord, name)))
    m = mods["module"]() if "module" in mods else Fn(fn, **mods)
    inputs = make_inputs(shapes, make)
    ep = export_program(m, tuple(inputs), name)
    return m, inputs, ep, lower(ep)


@pytest.mark.parametrize("name,fn,shapes_list,mods,make", CASES, ids=[c[0] for c in CASES])
def test_rule_matches_pytorch(name, fn, shapes_list, mods, make):
    for shapes in shapes_list:
        m, inputs, ep, low = lowered_for(name, fn, shapes, mods, make)
        assert not low.unsupported, [(u.operator, u.reason) for u in low.unsupported]
        res = validate_lowered(low, ep, m, tuple(inputs))
        assert res["status"] == "passed", (shapes, res)


def test_every_rule_is_differentially_tested():
    used = set()
    for name, fn, shapes_list, mods, make in CASES:
        for shapes in shapes_list:
            used |= lowered_for(name, fn, shapes, mods, make)[3].rules_used
    used |= lower(export_program(RANDOM, (torch.randn(3, 5),), "rand")).rules_used
    # backward operators of a training step: validated against PyTorch's own step in
    # tests/test_train.py (test_conv_pool_step_closed_form_and_validation)
    from solbound.frontends.torch.train import export_train_step
    from test_train import conv_step_inputs
    m, inp = conv_step_inputs()
    used |= lower(export_train_step(m, inp, "conv", optimizer_name="SGD")).rules_used
    # FlexAttention's backward: validated against PyTorch's own step in tests/test_flex.py
    # (test_a_training_step_through_flex_attention_is_exact_and_validates)
    from test_flex import FlexStep
    used |= lower(export_train_step(FlexStep(), (torch.randn(2, 128, 16),), "flex",
                                    optimizer_name="SGD")).rules_used
    # collectives: validated on 4 ranks at once against PyTorch's threaded process group
    # (real collectives) in tests/test_parallel.py (test_every_collective_kind_per_rank...)
    from solbound.frontends.torch.capture import load_problem
    from solbound.frontends.torch.distributed import fake_world
    with fake_world(4):
        m, inp, _ = load_problem(os.path.join(os.path.dirname(__file__), "programs",
                                              "collectives_rank.py")).build_for_capture()
        used |= lower(export_program(m, tuple(inp), "rank")).rules_used
    all_rules = {f.rule_id for f in RULES.values()}
    assert all_rules - used == set()



RANDOM = Fn(lambda s, x: s.d(x) + torch.randn(x.shape) + torch.rand_like(x), d=nn.Dropout(0.3))


def test_random_ops_validate_by_replaying_the_draws(monkeypatch):
    x = torch.randn(30, 50)
    ep = export_program(RANDOM, (x,), "rand")
    low = lower(ep)
    assert not low.unsupported
    assert {"aten.native_dropout", "aten.randn"} <= low.rules_used
    # one replayed draw per random node: dropout's mask, randn's and rand_like's values
    assert sorted(str(i) for _, i in low.random_draws.values()) == ["1", "None", "None"]
    res = validate_lowered(low, ep, RANDOM, (x,))
    assert res["status"] == "passed", res
    assert "replayed" in res["reference"]
    # a dropout that forgets the 1/(1-p) scale is caught even though the mask is replayed
    from solbound.frontends.torch.rules import misc
    real_mul = misc.mul
    monkeypatch.setattr(misc, "mul", lambda a, b: real_mul(a, misc.C(1.0)))
    low_bad = lower(ep)
    assert validate_lowered(low_bad, ep, RANDOM, (x,))["status"] == "failed"
