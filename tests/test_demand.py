"""Demanded-region restriction: producers compute only what their consumers read."""

import os

import torch

import solbound
from helpers import Fn, r, totals
from programs.triangular_matmul import Model

PROG = os.path.join(os.path.dirname(__file__), "programs")

A, B = r(7, 6), r(6, 7)


def _macs_and_status(fn):
    rep = solbound.analyze(Fn(fn), (A, B), validate=True)
    return totals(rep)[0], rep.validation["status"]


def test_tril_of_a_product_computes_the_triangle():
    # 7x7 product, 6 terms each; tril keeps j <= i: 28 elements
    assert _macs_and_status(lambda s, a, b: torch.tril(a @ b)) == (28 * 6, "passed")
    # triu(., 2) keeps j - i >= 2: 5 + 4 + 3 + 2 + 1 = 15 elements
    assert _macs_and_status(lambda s, a, b: torch.triu(a @ b, 2)) == (15 * 6, "passed")


def test_a_slice_of_a_product_computes_the_slice():
    assert _macs_and_status(lambda s, a, b: (a @ b)[:, :3] * 2) == (7 * 3 * 6, "passed")


def test_union_of_demands_is_the_hull_and_shared_atoms():
    def two(s, a, b):
        p = a @ b
        return p[:, :3].sum() + p[:, 2:5].sum()
    assert _macs_and_status(two) == (7 * 5 * 6, "passed")
    # a consumer reading everything: no restriction
    def whole(s, a, b):
        p = a @ b
        return torch.tril(p) + p.sum()
    assert _macs_and_status(whole) == (7 * 7 * 6, "passed")
    # both consumers under the same triangle: it is shared
    def tri(s, a, b):
        p = a @ b
        return torch.tril(p) * 2 + torch.tril(p).sum()
    assert _macs_and_status(tri)[0] == 28 * 6


def test_triangular_inputs_stated_by_get_inputs():
    rep = solbound.analyze_source(os.path.join(PROG, "triangular_matmul.py"), validate=True)
    n = 12
    # C[i, j] = sum_{i <= k <= j} A[i, k] B[k, j]: N(N+1)(N+2)/6 multiply-adds (trmm)
    assert totals(rep)[0] == n * (n + 1) * (n + 2) // 6
    # fused: the two triangles in, the whole (triangular, zero-filled) result out
    assert totals(rep)[5] == (2 * n * (n + 1) // 2 + n * n) * 4
    assert rep.validation["status"] == "passed"
    assert sum("upper triangular" in note for note in rep.program.notes) == 2
    # the same module on plain inputs: only the output triangle is demanded
    plain = solbound.analyze(Model(), (torch.rand(n, n), torch.rand(n, n)))
    assert totals(plain)[0] == n * (n + 1) // 2 * n


class _ClsToken(torch.nn.Module):
    """ViT-style: a class token concatenated to embedded patches, an encoder layer over a
    (S, N, E) tensor (batch_first=False: attention mixes along S, N is the batch), and the
    output x[:, 0]: only batch column 0 is needed, through flattened (s, n) linears, the
    attention, the norms and the concatenation (the patch embedding is not needed at all)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(12, 8)
        self.cls = torch.nn.Parameter(torch.randn(2, 1, 8))
        self.layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0)

    def forward(self, patches):
        x = torch.cat([self.cls, self.embed(patches)], dim=1)
        return self.layer(x)[:, 0]


def test_demand_through_flattened_dims_attention_and_concatenation():
    s, e, ff, heads = 2, 8, 16, 2
    # in-projection (s x e x 3e), q.k^T and p.v (s*s pairs x head dim, per head),
    # out-projection, two layer norms' sums of squares, the feed-forward pair
    expect = s * e * 3 * e + 2 * heads * s * s * (e // heads) + s * e * e + 2 * s * e \
        + 2 * s * e * ff
    rep = solbound.analyze(_ClsToken().eval(), (torch.randn(2, 4, 12),), validate=True)
    assert totals(rep)[0] == expect
    assert rep.validation["status"] == "passed"
