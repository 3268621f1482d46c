"""Lowering rules for the primitives JAX's transposition emits (``jax.value_and_grad`` of
real steps): each validated against JAX, with its FLOPs or MACs counted by hand."""

import numpy as np
import pytest

import solbound
from solbound.ir.text import parse_program, print_program

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
S = jax.ShapeDtypeStruct
F32 = jnp.float32


def _ok(rep):
    assert rep.lowered.unsupported == [], rep.lowered.unsupported
    assert rep.validation["status"] == "passed", rep.validation
    text = print_program(rep.program)
    assert print_program(parse_program(text)) == text


def test_add_any_is_one_add_per_element():
    # add_any sums two cotangents of a value read twice (a residual connection's backward)
    from jax._src.ad_util import add_jaxvals_p
    rep = solbound.analyze(lambda x, y: add_jaxvals_p.bind(x, y), (S((3, 5), F32),) * 2,
                           validate=True)
    _ok(rep)
    assert rep.counts.flops == {"matrix": 0, "vector": 15, "special": 0}


def test_is_finite_is_abs_below_infinity():
    x = np.array([[1., np.inf, -np.inf], [np.nan, 0., -2.]], np.float32)
    rep = solbound.analyze(lambda x: jnp.isfinite(x), (x,), validate=True)
    _ok(rep)
    assert rep.counts.flops["vector"] == 2 * 6                 # abs, lt per element


def test_reversed_cumulative_ops_scan_from_the_end():
    # the transposition of a cumsum is a reversed cumsum: the same one op per element as
    # the forward scan, read and written backwards (views), nothing copied
    fwd = solbound.analyze(lambda x: jnp.cumsum(x, 1), (S((3, 5), F32),))
    for f in (lambda x: jax.lax.cumsum(x, 1, reverse=True),
              lambda x: jax.lax.cumprod(x, 0, reverse=True),
              lambda x: jax.lax.cummax(x, 1, reverse=True)):
        rep = solbound.analyze(f, (S((3, 5), F32),), validate=True)
        _ok(rep)
        assert rep.counts.flops == fwd.counts.flops == {"matrix": 0, "vector": 15, "special": 0}
        assert rep.counts.fused.bytes == 4 * (15 + 15)


def test_pad_with_negative_padding_crops():
    # dim 0: 4 rows, interior 1 (7 dilated), lo -1 (row 0, at -1, dropped), hi 2: 8 rows,
    # rows 1..3 at 2v - 1 = 1, 3, 5;
    # dim 1: 6 columns, lo 2, hi -3 (the last 3 dropped): columns 0..2 at 2..4 of 5
    def f(x):
        return jax.lax.pad(x, 0.5, ((-1, 2, 1), (2, -3, 0)))
    rep = solbound.analyze(f, (S((4, 6), F32),), validate=True)
    _ok(rep)
    assert rep.program.tensor_map[rep.program.kernels[-1].out].shape == (8, 5)
    copied = [k for k in rep.counts.kernels if k.kind == "map"]
    # the fill writes 40 elements, the copy 3 x 3 of the operand: fused reads only those
    assert rep.counts.fused.bytes == 4 * (3 * 3 + 8 * 5)
    assert len(copied) == 2
    # a pad that only crops is a view: the product reads the kept 2 x 3 window
    rep = solbound.analyze(lambda x: jax.lax.pad(x, 0., ((-1, -1, 0), (0, -3, 0))) * 2,
                           (S((4, 6), F32),), validate=True)
    _ok(rep)
    assert len(rep.program.kernels) == 1 and rep.counts.flops["vector"] == 6
    assert rep.counts.fused.bytes == 4 * (6 + 6)


def test_reshape_with_dimensions_transposes_first():
    rep = solbound.analyze(lambda x: jax.lax.reshape(x, (6, 4), dimensions=(1, 0)) * 2,
                           (S((4, 6), F32),), validate=True)
    _ok(rep)
    assert rep.counts.flops["vector"] == 24


def test_convolution_with_batch_groups():
    # the kernel gradient of a grouped convolution: batch 4 in 2 groups, 6 output features
    # (3 per group) over all 3 input features, width 5, kernel 2 (4 outputs):
    # out batch 2 x 6 x 4 outputs x 3 channels x 2 taps
    def f(x, w):
        return jax.lax.conv_general_dilated(x, w, (1,), "VALID", batch_group_count=2)
    rep = solbound.analyze(f, (S((4, 3, 5), F32), S((6, 3, 2), F32)), validate=True)
    _ok(rep)
    assert rep.counts.macs == 2 * 6 * 4 * 3 * 2
    # 2-d, padded, strided, in the layout JAX's transposition uses for a grouped conv's
    # weight gradient
    def g(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)),
                                            batch_group_count=2)
    rep = solbound.analyze(g, (S((2, 2, 5, 5), F32), S((4, 2, 3, 3), F32)), validate=True)
    _ok(rep)
    # per output row/column the taps on the input: 2 + 3 + 3 + 3 + 2 = 13 of 15
    assert rep.counts.macs == 1 * 4 * 2 * 13 * 13


def test_select_and_scatter_add_is_the_max_pool_gradient():
    from jax._src.lax.windowed_reductions import _select_and_scatter_add

    # windows 3x3, stride 2, padding (1, 1) rows and (1, 0) columns over a 7 x 6 operand:
    # 4 x 3 windows per channel. Taps on the operand: rows 2 + 3 + 3 + 2 = 10, columns
    # 2 + 3 + 3 = 8, so 2 * 10 * 8 = 160 comparisons (the arg-max); per source element
    # (24) the selected row (floordiv, add) and column (mod, add): 4 * 24; the
    # scatter-add: one add per source element
    def f(s, x):
        return _select_and_scatter_add(s, x, jax.lax.ge_p, (1, 3, 3), (1, 2, 2),
                                       ((0, 0), (1, 1), (1, 0)))
    rep = solbound.analyze(f, (S((2, 4, 3), F32), S((2, 7, 6), F32)), validate=True)
    _ok(rep)
    assert rep.counts.flops == {"matrix": 0, "vector": 160 + 4 * 24 + 24, "special": 0}
    # as jax.grad of a max pool emits it, ties included (the first maximum is chosen)
    x = np.zeros((1, 1, 4, 4), np.float32)
    x[0, 0, 1, 2] = 1.0

    def pool(x):
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2),
                                     "VALID")
    rep = solbound.analyze(lambda x, c: jax.vjp(pool, x)[1](c)[0],
                           (x, np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)),
                           validate=True)
    _ok(rep)
    # min pooling's gradient selects with le (an arg-min)
    rep = solbound.analyze(lambda s, x: _select_and_scatter_add(
        s, x, jax.lax.le_p, (2, 2), (1, 1), ((0, 0), (0, 0))),
        (S((3, 4), F32), S((4, 5), F32)), validate=True)
    _ok(rep)
    assert rep.counts.flops["vector"] == 12 * 4 + 4 * 12 + 12
