"""Every contraction rule agrees with torch.utils.flop_counter (2 FLOPs per MAC).

flop_counter counts padded taps of a convolution as work; solbound counts only
the taps inside the input, so padded cases compare against the exact count.
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from helpers import Fn, r, run

CASES = [
    ("mm", lambda s, a, b: a @ b, (r(6, 7), r(7, 5)), {}),
    ("bmm", lambda s, a, b: torch.bmm(a, b), (r(3, 6, 7), r(3, 7, 5)), {}),
    ("matmul-bcast", lambda s, a, b: torch.matmul(a, b), (r(2, 1, 6, 7), r(3, 7, 5)), {}),
    ("linear", lambda s, x: s.l(x), (r(4, 9, 7),), {"l": nn.Linear(7, 5)}),
    ("baddbmm", lambda s, c, a, b: torch.baddbmm(c, a, b), (r(3, 6, 5), r(3, 6, 7), r(3, 7, 5)), {}),
    ("conv1d", lambda s, x: s.c(x), (r(2, 3, 11),), {"c": nn.Conv1d(3, 4, 3, stride=2)}),
    ("conv2d-groups", lambda s, x: s.c(x), (r(2, 4, 9, 7),), {"c": nn.Conv2d(4, 6, 3, groups=2)}),
    ("conv3d", lambda s, x: s.c(x), (r(1, 2, 5, 6, 7),), {"c": nn.Conv3d(2, 3, 2, dilation=2)}),
    ("convT2d", lambda s, x: s.c(x), (r(1, 3, 5, 4),), {"c": nn.ConvTranspose2d(3, 2, 2, stride=2)}),
]


@pytest.mark.parametrize("name,fn,inputs,mods", CASES, ids=[c[0] for c in CASES])
def test_contractions_match_flop_counter(name, fn, inputs, mods):
    m = Fn(fn, **mods)
    with FlopCounterMode(display=False) as fc:
        m(*inputs)
    rep = run(m, *inputs)
    matrix = rep.to_dict()["totals"]["flops_by_unit"]["matrix"]
    assert matrix == fc.get_total_flops()


def test_padded_conv_is_flop_counter_minus_padding():
    m = Fn(lambda s, x: s.c(x), c=nn.Conv2d(3, 4, 3, padding=1, bias=False))
    x = r(2, 3, 8, 8)
    with FlopCounterMode(display=False) as fc:
        m(x)
    rep = run(m, x)
    # flop_counter: 2*N*K*C*P*Q*R*S with every tap; exact: 22 valid (p, r) pairs per dim of 24
    assert fc.get_total_flops() == 2 * 2 * 4 * 3 * 64 * 9
    assert rep.to_dict()["totals"]["flops_by_unit"]["matrix"] == 2 * 2 * 4 * 3 * 22 * 22


def test_sdpa_matches_flop_counter_formula():
    # FlopCounterMode does not see the CPU SDPA kernel; use its own SDPA formula
    from torch.utils.flop_counter import sdpa_flop_count
    q, k, v = r(2, 3, 5, 4), r(2, 3, 6, 4), r(2, 3, 6, 4)
    rep = run(lambda s, q, k, v: F.scaled_dot_product_attention(q, k, v), q, k, v)
    matrix = rep.to_dict()["totals"]["flops_by_unit"]["matrix"]
    assert matrix == sdpa_flop_count(q.shape, k.shape, v.shape)
