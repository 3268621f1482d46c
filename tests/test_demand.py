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


def test_a_guard_over_the_digits_of_a_flattened_coordinate_reaches_its_writer():
    """Grouped-query attention as JAX writes it (gemma's ``BTKGS`` scores reshaped to
    ``BTNS``, N = K*G): the scores are copied to flat storage ``t*32 + k*16 + g*8 + s``
    and read as ``t*32 + n*8 + s`` under the causal guard ``s <= t``. The writer's digits
    at coefficients 32 and 1 are the reader's (same radix), so the guard reaches it; the
    middle digits differ (n = 2k + g) and stay whole."""
    from solbound.ir.affine import Aff, Atom
    from solbound.ir.demand import restrict_to_demand
    from solbound.ir.model import Access, Kernel
    t, k, g, s, n = (Aff.var(v) for v in "tkgsn")
    copy = Kernel("copy", (("t", 8), ("k", 2), ("g", 2), ("s", 8)), "flat",
                  (t * 32 + k * 16 + g * 8 + s,), Access("scores", (k, s, t, g)))
    causal = (Atom(s - t, None, 1),)
    read = Kernel("mask", (("t", 8), ("n", 4), ("s", 8)), "out", (t, n, s),
                  Access("flat", (t * 32 + n * 8 + s,)), guard=causal)
    got = restrict_to_demand([copy, read], {"flat"})[0]
    assert [str(a) for a in got.guard] == ["s - t < 1"]
    # a reader whose middle digit has another radix (n*16 over 0..1, s over 0..15) shares
    # no digit with the writer's coefficient-8 digit: only matching digits carry atoms
    wide = Kernel("mask", (("t", 8), ("n", 2), ("s", 16)), "out", (t, n, s),
                  Access("flat", (t * 32 + n * 16 + s,)), guard=(Atom(s - t, None, 1),))
    assert restrict_to_demand([copy, wide], {"flat"})[0].guard == ()


def test_grouped_query_attention_through_a_reshape_counts_the_causal_pairs():
    """The same through JAX: q (B,T,K,G,H) against k (B,S,K,H), scores reshaped to
    (B,T,K*G,S), causal softmax, reshaped back for the weighted sum."""
    import pytest
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    B, T, K, G, H = 1, 8, 2, 2, 4

    def attn(q, k, v):
        logits = jnp.einsum("BTKGH,BSKH->BTKGS", q, k).reshape(B, T, K * G, T)
        mask = jnp.tril(jnp.ones((T, T), bool))
        p = jax.nn.softmax(jnp.where(mask[None, :, None, :], logits, -1e30), -1)
        return jnp.einsum("BTKGS,BSKH->BTKGH", p.reshape(B, T, K, G, T), v)
    S = jax.ShapeDtypeStruct
    rep = solbound.analyze(attn, (S((B, T, K, G, H), jnp.float32), S((B, T, K, H), jnp.float32),
                                  S((B, T, K, H), jnp.float32)), validate=True)
    assert rep.validation["status"] == "passed", rep.validation
    # scores and weighted sum over the T(T+1)/2 causal pairs of each of the K*G heads
    assert rep.counts.macs == 2 * K * G * H * T * (T + 1) // 2 == 1152


DENSITY = """# solbound IR v1
x = input(f32[64, 4])
d2 = intermediate(f32[64, 64])
out = output(f32[64])

@kernel(i=64, j=64, k=4)
def dist():
    d2[i, j] = sum((x[i, k] - x[j, k]) * (x[i, k] - x[j, k]))

@kernel(i=64, j=64)
def density():
    out[i] = sum(exp(0.0 - d2[i, j]))
"""

# a guard that means something: t's rows 3.. hold -inf, and y's first rows read them
MEANT = """# solbound IR v1
x = input(f32[8, 8])
t = intermediate(f32[8, 8])
y = output(f32[8, 8])

@kernel(i=8, j=8)
def part():
    t[i, j] = x[i, j] if (i < 3) else -inf

@kernel(i=8, j=8)
def shift():
    y[i, j] = t[7 - i, j] + x[i, j]
"""


def _run_rows(p, feeds, rows):
    import numpy as np
    from solbound.ir.execute import execute
    with np.errstate(all="ignore"):
        arrays = execute(p, feeds)
    return {t.name: arrays[t.name][:rows] for t in p.tensors if t.role == "output"}


def test_a_slice_held_as_its_region_computes_the_same_rows():
    """shrink_to_demand after a slice: loops cut to the guard, intermediates declared as
    the rows read; the first rows equal the whole program's, for a guard that confines
    (demand) and one that means something (-inf past row 3, read by the rows kept)."""
    import numpy as np
    from solbound.frontends.agent.translate import compacted, sliced
    from solbound.ir.text import parse_program
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 4)).astype(np.float32) * 0.3
    p = parse_program(DENSITY)
    q = compacted(sliced(p, {"out"}, 4), {"out": 16})
    assert [t.shape for t in q.tensors] == [(64, 4), (16, 64), (64,)]
    assert [k.dims for k in q.kernels] == [(("i", 16), ("j", 64), ("k", 4)),
                                           (("i", 16), ("j", 64))]
    whole, part = _run_rows(p, {"x": x}, 16), _run_rows(q, {"x": x}, 16)
    np.testing.assert_allclose(part["out"], whole["out"], rtol=1e-6)
    m = parse_program(MEANT)
    xm = rng.standard_normal((8, 8)).astype(np.float32)
    qm = compacted(sliced(m, {"y"}, 2), {"y": 4})
    # y's rows 0..3 read t's rows 7..4: part keeps all 8 rows, t stays whole
    assert [t.shape for t in qm.tensors] == [(8, 8), (8, 8), (8, 8)]
    assert qm.kernels[0].dims == (("i", 8), ("j", 8))
    np.testing.assert_array_equal(_run_rows(qm, {"x": xm}, 4)["y"],
                                  _run_rows(m, {"x": xm}, 4)["y"])


def test_shrinking_keeps_an_outputs_own_guard_and_an_arg_max_whole():
    """Found by review: an output's meaningful guard (-inf past column 5) must not be cut
    (only its compared rows are), a second output's readers count, and an arg-max's
    reductions stay whole (its index counts every reduction point)."""
    import numpy as np
    from solbound.frontends.agent.translate import compacted, sliced
    from solbound.ir.text import parse_program
    out_guard = parse_program("""# solbound IR v1
x = input(f32[8, 8])
y = output(f32[8, 8])

@kernel(i=8, j=8)
def g():
    y[i, j] = x[i, j] if (j < 5) else -inf
""")
    q = compacted(sliced(out_guard, {"y"}, 2), {"y": 4})
    assert dict(q.kernels[0].dims)["j"] == 8            # the -inf columns are compared
    x = np.random.default_rng(1).standard_normal((8, 8)).astype(np.float32)
    np.testing.assert_array_equal(_run_rows(q, {"x": x}, 4)["y"],
                                  _run_rows(out_guard, {"x": x}, 4)["y"])
    am = parse_program("""# solbound IR v1
x = input(f32[4, 8, 8])
t = intermediate(i64[4])
v = intermediate(f32[4])
y = output(f32[4])

@kernel(i=4, a=8, b=8)
def am():
    t[i], v[i] = argmax(x[i, a, b], where=(b < 3))

@kernel(i=4)
def use():
    y[i] = v[i] + t[i]
""")
    ks, _ = __import__("solbound.ir.demand", fromlist=["x"]).shrink_to_demand(
        list(am.kernels), list(am.tensors), {"y": 4})
    assert ks[0].dims == (("i", 4), ("a", 8), ("b", 8))
