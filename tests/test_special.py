"""Special functions split between the SFU and an emulation on the FMA pipes
(``bounds/special.py``): the emulation sequences the costs rest on are run here in float32
and are within bfloat16's unit roundoff with the number of FP32 issue slots charged; the
split is the closed-form balance point; a vector-bound program moves nothing; on a chip
whose transcendentals issue on the vector ALUs (MI300X) only what is cheaper moves."""

import numpy as np
import pytest
import torch

from helpers import run
from solbound.bounds.special import EMULATION, split
from solbound.hardware.catalog import load_spec

U = 2.0 ** -8          # bfloat16's unit roundoff: the accuracy the costs promise
F32 = np.float32


class Slots:
    """Float32 arithmetic that counts FP32 issue slots (add, mul, fma: one each)."""

    def __init__(self):
        self.n = 0

    def add(self, a, b):
        self.n += 1
        return F32(a) + F32(b)

    def mul(self, a, b):
        self.n += 1
        return F32(a) * F32(b)

    def fma(self, a, b, c):
        self.n += 1
        return (np.float64(a) * np.float64(b) + np.float64(c)).astype(F32)


def _fit(f, lo, hi, deg, weight):
    """A near-minimax polynomial (Lawson's iteration on weighted least squares)."""
    x = np.linspace(lo, hi, 20001)
    w = np.ones_like(x)
    for _ in range(100):
        c = np.polyfit(x, f(x), deg, w=np.sqrt(w) * weight(x))
        e = np.abs((np.polyval(c, x) - f(x)) * weight(x))
        w = w * (e + 1e-15)
        w /= w.sum()
    return c.astype(F32)          # highest degree first


def _horner(s, c, x):
    acc = F32(c[0])
    for ci in c[1:]:
        acc = s.fma(acc, x, ci)
    return acc


def exp2(s, x):
    big = F32(1.5 * 2 ** 23)
    r = s.add(x, big)               # round(x) in the low bits (FlashAttention-4 rounds down;
    k = s.add(r, -big)              # numpy rounds to nearest, so the fraction is in
    f = s.add(x, -k)                # [-0.5, 0.5] and the polynomial is fitted there)
    p = _horner(s, _EXP2_CENTERED, f)
    return np.ldexp(p, k.astype(np.int64))           # exponent bits: integer ALU


# 2**f on [-0.5, 0.5] (round to nearest puts the fraction there)
_EXP2_CENTERED = _fit(lambda f: 2.0 ** f, -0.5, 0.5, 2, lambda f: 2.0 ** -f)


def recip(s, x):
    y = (np.int32(0x7EF311C3) - x.view(np.int32)).view(F32)     # integer ALU
    t = s.fma(-x, y, 2.0)
    return s.mul(y, t)


def rsqrt(s, x):
    y = (np.int32(0x5F3759DF) - (x.view(np.int32) >> 1)).view(F32)
    h = s.mul(x, 0.5)
    t = s.mul(h, y)
    t = s.fma(-t, y, 1.5)
    return s.mul(y, t)


def log2(s, x):
    # integer ALU: the exponent and a mantissa m in [sqrt(1/2), sqrt(2))
    m, e = np.frexp(x.astype(np.float64))
    low = m < np.sqrt(0.5)
    m, e = np.where(low, 2 * m, m), np.where(low, e - 1, e)
    m = m.astype(F32)
    ef = s.add(e.astype(F32), 0.0)                   # int to float by a magic add: 1 slot
    f = s.add(m, -1.0)
    p = _horner(s, _LOG2, f)
    return s.fma(f, p, ef)


_LOG2 = _fit(lambda f: np.log2(1 + f) / np.where(f == 0, 1, f) + (f == 0) / np.log(2),
             np.sqrt(0.5) - 1, np.sqrt(2) - 1, 2, lambda f: 1.0 + 0 * f)


def sin(s, x):
    k = s.add(s.fma(x, 2 / np.pi, 1.5 * 2 ** 23), -1.5 * 2 ** 23)   # quadrant: 2 slots
    r = s.fma(-k, F32(np.pi / 2), x)
    r2 = s.mul(r, r)
    q = k.astype(np.int64) & 3                       # integer ALU: which function, which sign
    odd = (q % 2) == 1
    # per lane, the coefficients of sin(r)/r or cos(r) (a select in the integer ALU)
    c = np.where(odd, _COS[:, None], _SIN[:, None]).astype(F32)
    acc = c[0]
    for ci in c[1:]:
        acc = s.fma(acc, r2, ci)
    v = s.mul(acc, np.where(odd, F32(1), r).astype(F32))
    return np.where(q >= 2, -v, v)


_SIN = _fit(lambda t: np.sin(np.sqrt(t)) / np.sqrt(np.maximum(t, 1e-30)), 1e-12,
            (np.pi / 4) ** 2, 2, lambda t: 1.0 + 0 * t)
_COS = _fit(lambda t: np.cos(np.sqrt(t)), 0, (np.pi / 4) ** 2, 2, lambda t: 1.0 + 0 * t)


@pytest.mark.parametrize("name,fn,ref,lo,hi", [
    ("exp2", exp2, np.exp2, -60, 60),
    ("recip", recip, lambda x: 1 / x, 1e-6, 1e6),
    ("rsqrt", rsqrt, lambda x: 1 / np.sqrt(x), 1e-6, 1e6),
    ("log2", log2, np.log2, 1e-6, 1e6),
    ("sin", sin, np.sin, -50, 50),
])
def test_each_emulation_is_bf16_faithful_with_the_slots_charged(name, fn, ref, lo, hi):
    if lo > 0:
        x = np.geomspace(lo, hi, 200001).astype(F32)
    else:
        x = np.linspace(lo, hi, 200001).astype(F32)
    s = Slots()
    y = fn(s, x)
    want = ref(x.astype(np.float64))
    if name == "log2":      # relative near log2(1) = 0 is what the m-1 factor keeps
        err = np.abs(y - want) / np.maximum(np.abs(want), 1e-30)
    elif name == "sin":     # absolute: a quadrant's reduction is exact only to float32
        err = np.abs(y - want)
    else:
        err = np.abs(y / want - 1)
    assert err.max() <= U, (name, err.max())
    assert s.n == EMULATION[name][0], (name, s.n)


def test_composites_cost_their_parts():
    c = {f: EMULATION[f][0] for f in EMULATION}
    assert c["exp"] == c["exp2"] and c["sqrt"] == c["rsqrt"] + 1
    assert c["sigmoid"] == c["exp"] + 1 + c["recip"]
    assert c["tanh"] == c["exp"] + 1 + c["recip"] + 1
    assert c["pow"] == c["log2"] + 1 + c["exp2"]


def test_the_split_is_the_balance_point():
    """n exponentials and nothing else: moving x of them balances (n - x)/S = 5x/R, so the
    time is n / (S + R/5)."""
    moved, t_s, t_v = split({"exp": 1e9}, sfu_rate=4e12, slot_rate=3e13, vector_seconds=0.0)
    assert t_s == pytest.approx(1e9 / (4e12 + 3e13 / 5), rel=1e-12)
    assert t_v == pytest.approx(t_s, rel=1e-12)
    assert moved["exp"] == pytest.approx(1e9 / (1 + 5 * 4e12 / 3e13), rel=1e-12)
    # the cheapest function moves first: all the reciprocals before any exponential
    moved, t_s, t_v = split({"exp": 1e9, "recip": 1e8}, 4e12, 3e13, 0.0)
    assert moved["recip"] == 1e8 and 0 < moved["exp"] < 1e9
    assert t_s == pytest.approx(t_v, rel=1e-12)
    assert t_v == pytest.approx((1.1e9 - 1e8 - moved["exp"]) / 4e12, rel=1e-12)


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, device="meta", dtype=dtype)


def test_exponentials_of_a_program_are_split_on_h100():
    n = 1 << 20
    rep = run(lambda s, x: torch.exp(x), meta(n), arch="h100-sxm")
    b = rep.bound("h100-sxm", "fused")
    sfu, slots = 16 * 132 * 1.98e9, 66.9e12 / 2
    assert b.compute_seconds == pytest.approx(n / (sfu + slots / 5), rel=1e-9)
    assert b.pipe_seconds["sfu"] == pytest.approx(b.pipe_seconds["vector_fp32"], rel=1e-9)
    assert b.emulated["exp"] == pytest.approx(n / (1 + 5 * sfu / slots), rel=1e-9)
    assert any("of exp emulated on the FMA pipes" in x and x.startswith("h100-sxm:")
               for x in b.notes)
    assert rep.to_dict()["bounds"][0]["emulated"]


def test_a_vector_bound_program_moves_nothing():
    """exp(x) followed by 40 multiply-adds per element: the FMA pipes are the busier unit,
    so every exponential stays on the SFU."""
    def f(s, x):
        y = torch.exp(x)
        for _ in range(20):
            y = y * 1.5 + 0.5
        return y
    rep = run(f, meta(1 << 16), arch="h100-sxm")
    b = rep.bound("h100-sxm", "fused")
    assert b.emulated == {} and not any("emulated" in x for x in b.notes)
    assert b.pipe_seconds["sfu"] == pytest.approx((1 << 16) / (16 * 132 * 1.98e9), rel=1e-9)


def test_on_mi300x_only_what_is_cheaper_than_the_vector_alus_transcendental_moves():
    spec = load_spec("mi300x")
    assert spec.unit_of("sfu") == spec.unit_of("vector_fp32") == "vector"
    slot_per_sfu = (spec.peak("vector_fp32") / 2) / spec.peak("sfu")
    n = 1 << 16
    rep = run(lambda s, x: torch.exp(x) + torch.reciprocal(x), meta(n), arch="mi300x")
    b = rep.bound("mi300x", "fused")
    expect = {f for f in ("exp", "recip") if EMULATION[f][0] < slot_per_sfu}
    assert set(b.emulated) == expect
