"""Regressions for the known-value, in-place and counting passes: programs where a
rewrite once changed the values (each found by a review and fixed). Every program must
either validate against PyTorch or name what it does not support; none may be silently
wrong."""

import pytest
import torch
import torch.nn as nn

import solbound
from helpers import Fn


def _ok(fn, *inputs, **mods):
    rep = solbound.analyze(Fn(fn, **mods), inputs, validate=True)
    assert rep.lowered.unsupported or rep.validation["status"] == "passed", rep.validation
    return rep


def test_a_large_negative_constant_is_not_a_mask_by_itself():
    # x*100 - 20000 is data, not the constant -20000
    rep = _ok(lambda s, x: x * 100 + (-20000.0), torch.randn(8))
    assert rep.validation["status"] == "passed"


def test_fully_masked_rows_keep_their_softmax():
    # row 0 has no unmasked element: finfo.min masking gives a uniform row in PyTorch
    def f(s, q, k):
        sc = q @ k.T
        i = torch.arange(8)
        return torch.softmax(sc.masked_fill(~(i[None, :] < i[:, None]), torch.finfo(sc.dtype).min), -1)
    _ok(f, torch.randn(8, 4), torch.randn(8, 4))


def test_a_triangular_buffer_written_in_place_loses_its_structure():
    class B(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("m", torch.tril(torch.ones(8, 8)))

        def forward(self, x, v):
            self.m[:, 7:8] = v
            return x * self.m
    rep = solbound.analyze(B(), (torch.randn(8, 8), torch.randn(8, 1)), validate=True)
    assert rep.validation["status"] == "passed"


def test_a_folded_tensor_read_between_its_writers():
    def f(s, x):
        m = torch.ones(8, 8)
        r = x * m
        m[:, 0:4] = torch.zeros(8, 4)
        return r + m.sum()
    _ok(f, torch.randn(8, 8))


@pytest.mark.parametrize("fn", [
    lambda s, x: (x.long() | 1).float(),
    lambda s, x: x + (torch.full((4,), 6) & 3),
    lambda s, x: x + ~torch.full((4,), 6),
])
def test_integer_bitwise_ops_are_bitwise(fn):
    _ok(fn, torch.randn(4) * 10)


@pytest.mark.parametrize("fn,n", [
    (lambda s, x, v: x.index_put((torch.arange(-2, 0),), v), 2),
    (lambda s, x, v: x.index_put((torch.arange(4, 1, -1),), v), 3),
    (lambda s, x, v: x.index_put((torch.tensor([False, True, False, False, True, False]),), v), 2),
    (lambda s, x, v: x.index_put((torch.arange(3).cumsum(0),), v), 3),
])
def test_index_put_at_positions_that_are_not_a_plain_progression(fn, n):
    _ok(fn, torch.randn(6, 3), torch.randn(n, 3))


def test_scatter_with_a_narrower_index_is_reported_not_misread():
    _ok(lambda s, x: x.scatter(1, torch.tensor([[0, 2], [1, 3]]), 2.0), torch.randn(4, 6))


def test_strided_in_place_writes_do_not_hide_reads():
    class C(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("cache", torch.zeros(16, 4))

        def forward(self, v):
            self.cache[torch.arange(0, 16, 2)] = v
            return self.cache.sum(0)
    rep = solbound.analyze(C(), (torch.randn(8, 4),), validate=True)
    assert rep.validation["status"] == "passed"
    # the odd rows were never written: they are read from DRAM (at least 8 rows x 4 x 4 B)
    assert rep.counts.fused.reads["b_cache"] >= 8 * 4 * 4


def _three_sums(s, a, b):
    p = a * b
    return p.sum(0), p.sum(1), p.sum()


def test_one_product_summed_three_ways_is_one_set_of_macs():
    rep = _ok(_three_sums, torch.randn(64, 32), torch.randn(64, 32))
    assert rep.counts.macs == 64 * 32
