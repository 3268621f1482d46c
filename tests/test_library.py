"""Library routines (sorts, selections, FFTs, factorizations, histograms, searches):
validated through numpy, counted by their documented conventions (ir/library.py, README),
footprints exact, the cost charged once per call."""

import math

import pytest
import torch
import torch.nn.functional as F

from helpers import Fn, totals
import solbound
from solbound.ir.text import parse_program, print_program

B4 = 4


def _run(fn, *inputs, validate=True):
    rep = solbound.analyze(Fn(fn), inputs, validate=validate)
    assert rep.lowered.unsupported == [], [(u.operator, u.reason) for u in rep.lowered.unsupported]
    if validate:
        assert rep.validation["status"] == "passed", rep.validation
    return rep


def _lib_flops(rep, unit="vector"):
    return sum(k.flops[unit] for k in rep.counts.kernels if k.kind == "library")


def test_sort_values_and_indices_share_one_cost():
    x = torch.randn(5, 12)
    rep = _run(lambda s, x: torch.sort(x, -1).values + torch.sort(x, -1).indices.float(), x)
    # one call per sort: 5 rows x 12 x ceil(log2 12) comparisons, whichever outputs are used
    assert _lib_flops(rep) == 2 * 5 * 12 * 4
    rep = _run(lambda s, x: torch.argsort(x, 0, descending=True).float(), x)
    assert _lib_flops(rep) == 12 * 5 * 3
    # reads x once, writes the indices (int64)
    assert list(rep.counts.fused.reads.values()) == [60 * B4]


def test_selection_is_linear():
    x = torch.randn(6, 9)
    rep = _run(lambda s, x: torch.kthvalue(x, 3, 1).values + torch.median(x, 1).values, x)
    assert _lib_flops(rep) == 2 * 6 * 9
    rep = _run(lambda s, x: torch.median(x) + torch.cummax(x, 0).values.sum(), x)
    assert _lib_flops(rep) == 54 + 54


@pytest.mark.parametrize("n", [16, 12, 7])
def test_fft_five_n_log2_n(n):
    x = torch.randn(3, n)
    rep = _run(lambda s, x: torch.view_as_real(torch.fft.fft(x)), x)
    assert _lib_flops(rep) == round(5 * 3 * n * math.log2(n) / 2)   # real input: r2c
    rep = _run(lambda s, x: torch.fft.ifft(torch.fft.fft(x)).real, x)
    assert _lib_flops(rep) == round(5 * 3 * n * math.log2(n) / 2) + round(5 * 3 * n * math.log2(n))
    rep = _run(lambda s, x: torch.fft.irfft(torch.fft.rfft(x), n=n), x)
    assert _lib_flops(rep) == 2 * round(5 * 3 * n * math.log2(n) / 2)


def test_fft2_one_transform_per_dimension():
    x = torch.randn(8, 4)
    rep = _run(lambda s, x: torch.fft.fft2(x.to(torch.complex64)).abs(), x)
    assert _lib_flops(rep) == round(5 * 32 * 3) + round(5 * 32 * 2)


def test_complex_arithmetic_counts_real_flops():
    a, b = torch.randn(4, 2), torch.randn(4, 2)
    rep = _run(lambda s, a, b: torch.view_as_real(torch.view_as_complex(a) * torch.view_as_complex(b)
                                                  + torch.view_as_complex(a)), a, b)
    assert totals(rep)[2] == 4 * (6 + 2)


def test_linear_algebra_lapack_counts():
    n, k = 6, 3
    a = torch.randn(n, n) + n * torch.eye(n)
    b = torch.randn(n, k)
    rep = _run(lambda s, a, b: torch.linalg.solve(a, b), a, b)
    assert rep.counts.flops["matrix"] == 2 * n ** 3 // 3 + 2 * n * n * k
    assert rep.counts.macs == rep.counts.flops["matrix"] // 2
    rep = _run(lambda s, a: torch.linalg.inv(a), a)
    assert rep.counts.flops["matrix"] == 2 * n ** 3
    rep = _run(lambda s, a: torch.linalg.cholesky(a @ a.mT), a)
    assert _lib_flops(rep, "matrix") == n ** 3 // 3
    m = torch.randn(9, 4)
    rep = _run(lambda s, m: torch.linalg.qr(m).R.abs() + 0, m)      # R only: sign-free
    assert _lib_flops(rep, "matrix") == 4 * 9 * 16 - 4 * 64 // 3
    rep = _run(lambda s, m: torch.linalg.svdvals(m), m)
    assert _lib_flops(rep, "matrix") == 4 * 9 * 16 - 4 * 64 // 3
    rep = _run(lambda s, a: torch.linalg.eigvalsh(a + a.mT), a)
    assert _lib_flops(rep, "matrix") == 4 * n ** 3 // 3


def test_histogram_and_search():
    x = torch.randn(7, 5)
    rep = _run(lambda s, x: torch.histc(x, 6, -2, 2), x)
    assert _lib_flops(rep) == 2 * 35
    seq = torch.tensor([-1.0, -0.2, 0.3, 1.5])
    rep = _run(lambda s, x: torch.searchsorted(seq, x).float()
               + torch.searchsorted(seq, x, right=True).float(), x)
    assert _lib_flops(rep) == 2 * 35 * math.ceil(math.log2(5))


def test_logcumsumexp_as_max_exp_scan_log():
    x = torch.randn(3, 8)
    rep = _run(lambda s, x: torch.logcumsumexp(x, 1), x)
    # row max (8 per row), exp(x - m) (2 each, one special), running sum (1), m + log (2)
    assert rep.counts.flops["special"] == 2 * 24
    assert rep.counts.flops["vector"] == 24 + 24 + 24 + 24


def test_library_kernel_round_trips_through_the_text_form():
    x = torch.randn(4, 6)
    rep = _run(lambda s, x: torch.sort(x, 1).values * 2, x, validate=False)
    text = print_program(rep.program)
    assert "@library(name=\"sort\"" in text
    assert print_program(parse_program(text)) == text


def test_interpolate_reads_the_input_once():
    x = torch.randn(1, 3, 8, 8)
    for mode in ("nearest", "bilinear"):
        rep = _run(lambda s, x, m=mode: F.interpolate(x, scale_factor=2, mode=m), x)
        assert rep.counts.fused.bytes == (3 * 64 + 3 * 256) * B4


def test_embedding_bag_reads_each_looked_up_row_once():
    w = torch.nn.Parameter(torch.randn(100, 8))
    idx, off = torch.tensor([3, 7, 7, 50, 9, 1]), torch.tensor([0, 2, 5])

    class Bag(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = w

        def forward(self, i, o):
            return F.embedding_bag(i, self.w, o, mode="sum")
    rep = solbound.analyze(Bag(), (idx, off), validate=True)
    assert rep.validation["status"] == "passed", rep.validation
    # 6 lookups (rows assumed distinct, stated), the ids, the offsets after the first
    # (the first bag starts at 0 whatever it says), 3 bags written
    assert rep.counts.fused.bytes == 6 * 8 * B4 + 6 * 8 + 2 * 8 + 3 * 8 * B4
    # one add per looked-up element into its bag
    assert rep.counts.flops["vector"] >= 6 * 8


def test_data_movement_ops_move_each_element_once():
    x = torch.randn(2, 4, 6, 8)
    n = x.numel()
    for fn in (lambda s, x: F.pixel_unshuffle(x, 2), lambda s, x: torch.roll(x, (1, -3), (2, 3)),
               lambda s, x: F.pixel_shuffle(x, 2)):
        rep = _run(fn, x)
        assert rep.counts.flops == {"matrix": 0, "vector": 0, "special": 0}
        assert rep.counts.fused.bytes == 2 * n * B4            # read once, written once
    rep = _run(lambda s, x: x.tile(1, 1, 2, 3), x)
    assert rep.counts.fused.bytes == (n + 6 * n) * B4


def test_scatter_family_counts():
    x, src = torch.randn(5, 4), torch.randn(5, 3)
    idx = torch.tensor([[0, 1, 1], [3, 2, 0], [1, 1, 1], [0, 3, 2], [2, 2, 0]])
    # one addition per source element, written in place into x (15 elements)
    rep = _run(lambda s, x, i, v: x.scatter_add(1, i, v) * 1, x, idx, src)
    assert rep.counts.flops["vector"] == 15 + 20
    assert rep.counts.fused.writes["xs_0"] == 15 * B4
    # index_add: every row of x is added to, so all of x is read once (not "read back")
    rep = _run(lambda s, x, i, v: x.index_add(0, i[:, 0] * 0 + torch.arange(5), v[:, :1].expand(5, 4)
                                             .contiguous()) * 1, x, idx, src)
    assert rep.counts.fused.reads["xs_0"] == 20 * B4
    # scatter_reduce amax without the old values: the positions hit start from -inf
    rep = _run(lambda s, x, i, v: x.scatter_reduce(1, i, v, "amax", include_self=False) * 1,
               x, idx, src)
    assert rep.counts.flops["vector"] == 15 + 20        # 15 maxima, 20 products


def test_scatter_views_and_im2col_move_each_element_once():
    x, d = torch.randn(4, 5), torch.randn(4)
    # the diagonal written into a copy of x: x read once, y written once, the diagonal read
    rep = _run(lambda s, x, d: torch.diagonal_scatter(x * 1, d) + 0, x, d)
    assert rep.counts.fused.bytes == (20 + 4 + 20) * B4
    rep = _run(lambda s, x, d: torch.select_scatter(x * 1, d[:1].expand(5).contiguous(), 0, 2),
               x, d)
    assert rep.counts.fused.bytes == (20 + 1 + 20) * B4
    # im2col of a 2x5x6 map, 3x3 windows with padding 1: 18 rows of 30 positions written
    rep = _run(lambda s, x: F.unfold(x, 3, padding=1), torch.randn(1, 2, 5, 6))
    assert rep.counts.fused.bytes == (60 + 18 * 30) * B4
    assert rep.counts.flops["matrix"] == 0


def test_bucketize_is_a_search_and_grid_sample_reads_its_input_once():
    x = torch.randn(7, 5)
    bounds = torch.tensor([-1.0, -0.2, 0.3, 1.5])
    rep = _run(lambda s, x: torch.bucketize(x, bounds).float(), x)
    assert _lib_flops(rep) == 35 * math.ceil(math.log2(5))
    img, grid = torch.randn(1, 2, 4, 5), torch.rand(1, 3, 3, 2) * 2 - 1
    rep = _run(lambda s, x, g: F.grid_sample(x, g, align_corners=False), img, grid)
    # the 4 corners of 9 points per channel reach all 20 pixels: each read once
    assert rep.counts.fused.reads[rep.lowered.inputs[0]["ir"]] == 2 * 20 * B4
    assert rep.counts.fused.bytes == (2 * 20 + 18 + 2 * 9) * B4
