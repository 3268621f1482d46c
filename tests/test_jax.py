"""The JAX frontend: jaxprs on abstract values lowered into the same IR; twins written in
PyTorch and in JAX count the same; validation runs the function in JAX."""

import math

import pytest
import torch
import torch.nn as nn

import solbound
from solbound.ir.text import parse_program, print_program

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
S = jax.ShapeDtypeStruct
F32 = jnp.float32


def _same(t, j):
    """MACs, FLOPs by unit and fused bytes agree."""
    assert t.counts.macs == j.counts.macs
    assert t.counts.flops == j.counts.flops
    assert t.counts.fused.bytes == j.counts.fused.bytes


def test_mlp_twins_count_the_same():
    torch_mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    t = solbound.analyze(torch_mlp, (torch.randn(3, 8),))

    def mlp(p, x):
        h = jax.nn.relu(x @ p["w1"].T + p["b1"])
        return h @ p["w2"].T + p["b2"]
    params = {"w1": S((16, 8), F32), "b1": S((16,), F32), "w2": S((4, 16), F32), "b2": S((4,), F32)}
    j = solbound.analyze(mlp, (params, S((3, 8), F32)), validate=True)
    assert j.validation["status"] == "passed", j.validation
    assert j.lowered.unsupported == []
    assert j.counts.macs == 3 * 8 * 16 + 3 * 16 * 4
    _same(t, j)


class _Attention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(d, d, bias=False) for _ in range(3))
        self.d = d

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        s = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(self.d))
        e = torch.exp(s - s.amax(-1, keepdim=True))
        return (e / e.sum(-1, keepdim=True)) @ v


def test_attention_twins_count_the_same():
    n, d = 6, 8
    t = solbound.analyze(_Attention(d), (torch.randn(1, n, d),))

    def attention(p, x):
        q, k, v = x @ p["q"].T, x @ p["k"].T, x @ p["v"].T
        s = (q @ jnp.swapaxes(k, -1, -2)) * (1 / math.sqrt(d))
        e = jnp.exp(s - s.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)) @ v
    params = {k: S((d, d), F32) for k in "qkv"}
    j = solbound.analyze(attention, (params, S((1, n, d), F32)), validate=True)
    assert j.validation["status"] == "passed", j.validation
    assert j.counts.macs == 3 * n * d * d + 2 * n * n * d
    _same(t, j)


def test_views_move_no_data_and_unsupported_primitives_are_named():
    def f(x):
        y = jnp.transpose(x.reshape(4, 6), (1, 0))[::2]          # views: no kernel
        return jax.lax.lgamma(y) * 2
    rep = solbound.analyze(f, (S((24,), F32),))
    assert [u.operator for u in rep.lowered.unsupported] == ["jax.lgamma"]
    assert rep.lowered.unsupported[0].source.startswith("test_jax.py:")
    assert rep.counts.flops["vector"] == 12                      # only the product
    # what lgamma moves stays in the bound: the 12 elements of x it reads, its 12 results
    # written (DRAM: the operator is opaque), then the product's 12 results
    assert rep.counts.fused.bytes == 3 * 12 * 4


def test_jax_ir_text_round_trips():
    def f(x, w):
        return jnp.tanh(x @ w).sum(axis=0)
    rep = solbound.analyze(f, (S((5, 3), F32), S((3, 2), F32)))
    text = print_program(rep.program)
    assert print_program(parse_program(text)) == text


class _ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2)

    def forward(self, x):
        return torch.max_pool2d(torch.relu(self.c2(torch.relu(self.c1(x)))), 2)


def test_conv_net_twins_count_the_same():
    t = solbound.analyze(_ConvNet(), (torch.randn(1, 3, 8, 8),))
    conv = jax.lax.conv_general_dilated

    def net(p, x):
        y = conv(x, p["w1"], (1, 1), ((1, 1), (1, 1))) + p["b1"][None, :, None, None]
        y = jax.nn.relu(y)
        y = conv(y, p["w2"], (2, 2), ((1, 1), (1, 1)), feature_group_count=2) \
            + p["b2"][None, :, None, None]
        y = jax.nn.relu(y)
        return jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
    params = {"w1": S((8, 3, 3, 3), F32), "b1": S((8,), F32), "w2": S((8, 4, 3, 3), F32),
              "b2": S((8,), F32)}
    j = solbound.analyze(net, (params, S((1, 3, 8, 8), F32)), validate=True)
    assert j.lowered.unsupported == [], j.lowered.unsupported
    assert j.validation["status"] == "passed", j.validation
    _same(t, j)


class _LSTM(nn.Module):
    def __init__(self, k, h):
        super().__init__()
        self.rnn = nn.LSTM(k, h)

    def forward(self, x, h0, c0):
        y, (h, c) = self.rnn(x, (h0, c0))
        return y, h, c


def test_lstm_twin_against_a_scan_counts_the_same():
    T, B, K, H = 7, 2, 5, 6
    t = solbound.analyze(_LSTM(K, H), (torch.randn(T, B, K), torch.randn(1, B, H),
                                      torch.randn(1, B, H)))

    def lstm(p, xs, h0, c0):
        xg = xs @ p["w_ih"].T + p["b_ih"] + p["b_hh"]

        def step(carry, x):
            h, c = carry
            i, f, g, o = jnp.split(x + h @ p["w_hh"].T, 4, axis=-1)
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
            return (h, c), h
        (h, c), ys = jax.lax.scan(step, (h0, c0), xg)
        return ys, h, c
    params = {"w_ih": S((4 * H, K), F32), "w_hh": S((4 * H, H), F32),
              "b_ih": S((4 * H,), F32), "b_hh": S((4 * H,), F32)}
    j = solbound.analyze(lstm, (params, S((T, B, K), F32), S((B, H), F32), S((B, H), F32)),
                         validate=True)
    assert j.lowered.unsupported == [], j.lowered.unsupported
    assert j.validation["status"] == "passed", j.validation
    assert j.counts.macs == T * B * 4 * H * (K + H)
    _same(t, j)


class _Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def test_a_sum_of_squares_is_one_mac_per_element_however_written_in_either_frontend():
    # x ** 2, pow(x, 2), square(x) and x * x, summed or averaged over the last axis of a
    # 4x6 tensor: each element is one multiply-add (24 MACs: a multiply and an add, 48
    # vector FLOPs), and the mean divides each of the 4 sums once more (52)
    B, D = 4, 6
    jax_forms = {"x ** 2": lambda x: x ** 2,                     # integer_pow
                 "pow(x, 2)": lambda x: jax.lax.pow(x, 2),       # pow, as keras' ops.power
                 "x ** 2.0": lambda x: x ** 2.0,                 # pow
                 "square(x)": jnp.square,                        # square
                 "x * x": lambda x: x * x}
    torch_forms = {"x ** 2": lambda x: x ** 2, "pow(x, 2)": lambda x: torch.pow(x, 2),
                   "square(x)": torch.square, "x * x": lambda x: x * x}
    for reduce, vector in (("sum", 2 * B * D), ("mean", 2 * B * D + B)):
        got = {}
        for name, sq in jax_forms.items():
            red = getattr(jnp, reduce)
            rep = solbound.analyze(lambda x, sq=sq, red=red: red(sq(x), axis=-1),
                                   (S((B, D), F32),), validate=True)
            assert rep.validation["status"] == "passed", (name, rep.validation)
            got[f"jax {name}"] = (rep.counts.macs, rep.counts.flops)
        for name, sq in torch_forms.items():
            rep = solbound.analyze(_Fn(lambda x, sq=sq: getattr(sq(x), reduce)(-1)),
                                   (torch.randn(B, D),))
            got[f"torch {name}"] = (rep.counts.macs, rep.counts.flops)
        want = (B * D, {"matrix": 0, "vector": vector, "special": 0})
        assert got == {k: want for k in got}, reduce


def test_rmsnorm_twins_count_the_same_with_pow_and_with_a_product():
    # keras-hub's Llama/Mistral RMSNorm (ops.power(x, 2), then mean) against PyTorch's
    # x.pow(2).mean(-1); per row of D: D squares summed (D MACs), the mean's division, the
    # epsilon, one rsqrt, then x * r and * w (2D products)
    B, D = 4, 6

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(D))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w
    t = solbound.analyze(RMSNorm(), (torch.randn(B, D),))

    def rmsnorm(w, x):
        return x * jax.lax.rsqrt(jnp.mean(jax.lax.pow(x, 2), -1, keepdims=True) + 1e-6) * w
    j = solbound.analyze(rmsnorm, (S((D,), F32), S((B, D), F32)), validate=True)
    assert j.validation["status"] == "passed", j.validation
    assert j.counts.macs == B * D
    assert j.counts.flops == {"matrix": 0, "vector": 2 * B * D + 2 * B + 2 * B * D,
                              "special": B}
    _same(t, j)


def test_gather_dynamic_slices_and_sort():
    def f(E, ids, cache, k):
        x = E[ids] * 2                                              # an embedding lookup
        c = jax.lax.dynamic_update_slice(cache, k, (0, 3, 0))       # a cache row written
        s = jax.lax.dynamic_slice(c, (0, 2, 0), (2, 2, 4)).sum()
        return x, s, jnp.sort(E, axis=-1), jnp.argsort(E, axis=0)
    ids = jnp.array([[1, 2, 3], [4, 5, 9]], dtype=jnp.int32)
    rep = solbound.analyze(f, (S((10, 4), F32), ids, S((2, 8, 4), F32), S((2, 1, 4), F32)),
                           validate=True)
    assert rep.lowered.unsupported == []
    assert rep.validation["status"] == "passed", rep.validation
    sorts = [k.flops["vector"] for k in rep.counts.kernels if k.kind == "library"]
    assert sorts == [10 * 4 * 2, 4 * 10 * 4]                        # n ceil(log2 n) per row


def test_tile_top_k_and_ffts_validate_and_count():
    # tile (a primitive since JAX 0.10): one copy, out[r * n + v] = x[v]; the product
    # after it is one multiply per element of the 4 x 3 x 15 result
    rep = solbound.analyze(lambda x: jnp.tile(x, (2, 1, 3)) * 2.0, (S((2, 3, 5), F32),),
                           validate=True)
    assert rep.lowered.unsupported == [] and rep.validation["status"] == "passed"
    assert rep.counts.flops["vector"] == 4 * 3 * 15
    assert rep.counts.fused.bytes == 4 * (2 * 3 * 5 + 4 * 3 * 15)      # x in, the product out

    # top_k: k arg-max passes over a row of n, pass i also testing the i indices taken
    # (eq, or, select): 4 rows x 7, k = 3; ties go to the lower index, as in JAX
    x = jnp.array([[1., 3., 3., 0., 3., 2., 1.], [5., 5., 1., 5., 0., 0., 2.],
                   [0., 1., 2., 3., 4., 5., 6.], [6., 6., 6., 6., 6., 6., 6.]])
    rep = solbound.analyze(lambda x: jax.lax.top_k(x, 3), (x,), validate=True)
    assert rep.lowered.unsupported == [] and rep.validation["status"] == "passed"
    n = 4 * 7
    assert rep.counts.flops["vector"] == 3 * n + (n + n) + (2 * n + n + n)
    rep = solbound.analyze(lambda x: jax.lax.top_k(x, 2), (S((3, 5, 6), F32),), validate=True)
    assert rep.validation["status"] == "passed"

    # complex numbers and the FFT library routine (5 N log2 N per complex transform, half
    # for a real input or output), each transform type and JAX's 1/n on the inverses
    def f(x):
        y = jnp.fft.fft2(jax.lax.complex(x, 2 * x))
        r = jnp.fft.rfft(x, axis=-1)
        return jnp.real(y), jnp.imag(jnp.fft.ifft(y, axis=-1)), jnp.abs(r), \
            jnp.fft.irfft(r, n=8, axis=-1)
    rep = solbound.analyze(f, (S((3, 4, 8), F32),), validate=True)
    assert rep.lowered.unsupported == [] and rep.validation["status"] == "passed"
    ffts = [k.flops["vector"] for k in rep.counts.kernels if k.kind == "library"]
    N = 3 * 4 * 8
    assert sorted(ffts) == sorted([5 * N * (2 + 3), 5 * N * 3, 5 * N * 3 // 2, 5 * N * 3 // 2])


def test_transposed_convolutions_multiply_only_input_elements():
    # conv_transpose is conv_general_dilated with an input dilation D (the stride): the
    # zeros between input elements are not work. Stride 2, explicit padding on the dilated
    # input: rows n=5 dilated to 9, padded (1, 1), kernel 3: 9 outputs; a (output y, tap k)
    # pair reads dilated position m = y + k - 1, work when m is even: m = 0 and m = 8 keep
    # 2 taps, m = 2, 4, 6 keep 3: 13 pairs. Columns n=6 dilated to 11, padded (2, 0): 11
    # outputs, m = y + k - 2: m = 0 keeps 3 taps, 2..8 keep 3, m = 10 keeps 1: 16 pairs.
    # 13 * 16 pairs times 3 in x 4 out channels
    def f(x, w):
        return jax.lax.conv_transpose(x, w, (2, 2), ((1, 1), (2, 0)),
                                      dimension_numbers=("NHWC", "HWIO", "NHWC"))
    rep = solbound.analyze(f, (S((1, 5, 6, 3), F32), S((3, 3, 3, 4), F32)), validate=True)
    assert rep.lowered.unsupported == [] and rep.validation["status"] == "passed"
    assert rep.counts.macs == 13 * 16 * 3 * 4
    # VALID: every input element meets every tap (30 elements x 9 taps x 12)
    rep = solbound.analyze(lambda x, w: jax.lax.conv_transpose(
        x, w, (2, 2), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")),
        (S((1, 5, 6, 3), F32), S((3, 3, 3, 4), F32)), validate=True)
    assert rep.validation["status"] == "passed" and rep.counts.macs == 30 * 9 * 12
    # strides 3 and 2 with SAME, kernels 2 and 4 (classes with no tap are zeros), NCHW
    for strides, k in (((3, 2), 2), ((2, 2), 4)):
        rep = solbound.analyze(lambda x, w: jax.lax.conv_transpose(
            x, w, strides, "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW")),
            (S((2, 3, 5, 6), F32), S((4, 3, k, k), F32)), validate=True)
        assert rep.lowered.unsupported == [] and rep.validation["status"] == "passed"


def test_flax_transformer_block_counts_in_closed_form():
    linen = pytest.importorskip("flax.linen")

    class Block(linen.Module):
        @linen.compact
        def __call__(self, x):
            x = x + linen.SelfAttention(num_heads=2, qkv_features=16,
                                        deterministic=True)(linen.LayerNorm()(x))
            h = linen.Dense(32)(linen.LayerNorm()(x))
            return x + linen.Dense(16)(linen.gelu(h))
    m = Block()
    x = S((2, 5, 16), F32)
    params = jax.eval_shape(m.init, jax.random.key(0), x)
    rep = solbound.analyze(lambda p, x: m.apply(p, x), (params, x), validate=True)
    assert rep.lowered.unsupported == []
    assert rep.validation["status"] == "passed", rep.validation
    t, d, f, heads, hd = 10, 16, 32, 2, 8
    norms = 2 * t * d                                   # sums of squares
    attention = 4 * t * d * d + 2 * 2 * heads * 5 * 5 * hd
    assert rep.counts.macs == norms + attention + 2 * t * d * f


def test_flax_cnn_validates():
    linen = pytest.importorskip("flax.linen")

    class CNN(linen.Module):
        @linen.compact
        def __call__(self, x):
            x = linen.relu(linen.BatchNorm(use_running_average=True)(linen.Conv(8, (3, 3))(x)))
            x = linen.avg_pool(x, (2, 2), strides=(2, 2))
            return linen.Dense(10)(x.reshape((x.shape[0], -1)))
    c, x = CNN(), S((1, 8, 8, 3), F32)
    # real variables: drawn ones would give the batch norm a negative variance (NaN out)
    v = c.init(jax.random.key(0), jnp.zeros((1, 8, 8, 3)))
    rep = solbound.analyze(lambda v, x: c.apply(v, x), (v, x), validate=True)
    assert rep.lowered.unsupported == [] and rep.validation["status"] == "passed"
    # SAME 3x3 conv on 8x8: taps on the padding are not work; the dense layer over 4*4*8
    valid = sum(min(y + 1, 7) - max(y - 1, 0) + 1 for y in range(8)) ** 2   # (pos, tap) pairs
    assert rep.counts.macs == valid * 3 * 8 + 128 * 10


def test_file_convention_and_the_torch_path_never_imports_jax(tmp_path):
    import os
    import subprocess
    import sys
    from solbound.cli import main
    ex = os.path.join(os.path.dirname(__file__), "..", "examples", "jax_mlp.py")
    assert main(["analyze", ex, "-q", "--validate"]) == 0
    code = ("import sys, torch, solbound; "
            "solbound.analyze(torch.nn.Linear(4, 3), (torch.randn(2, 4),)); "
            "print('jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_default_precision_is_xla_tf32_and_highest_is_fp32():
    def f(a, b):
        return a @ b, jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST)
    rep = solbound.analyze(f, (S((64, 64), F32), S((64, 64), F32)), arch="h100-sxm")
    kinds = sorted((k.matrix_class, k.flops["matrix"], k.flops["vector"])
                   for k in rep.counts.kernels if k.macs)
    assert kinds == [("", 0, 2 * 64 ** 3), ("matmul", 2 * 64 ** 3, 0)]
    assert "TF32 tensor cores" in rep.policy.describe()


def test_cond_takes_the_cheapest_branch_and_says_so():
    def f(p, x):
        return jax.lax.cond(p > 0, lambda x: (x @ x.T).sum(), lambda x: (x * 2.0).sum(), x)
    rep = solbound.analyze(f, (S((), F32), S((3, 4), F32)), validate=True)
    assert rep.counts.macs == 0 and rep.counts.flops["vector"] == 12 + 12
    assert any("branch 0 of 2, the cheapest" in a for a in rep.to_dict()["assumptions"])
    assert rep.validation["status"] == "skipped"
    # a branch the program knows is simply taken, and validates
    rep = solbound.analyze(lambda x: jax.lax.switch(1, [lambda x: (x * 2.0)[:, :3],
                                                        lambda x: x @ x.T], x),
                           (S((3, 4), F32),), validate=True)
    assert rep.counts.macs == 36 and rep.validation["status"] == "passed"


def test_fori_loop_is_a_sequential_loop_and_scatters_add_in_place():
    def f(x, v, ids):
        y = jax.lax.fori_loop(0, 5, lambda i, c: jnp.tanh(c @ x) + i, v[:2])
        return y, x.at[ids].add(v), jax.ops.segment_sum(v, ids, num_segments=4)
    ids = jnp.array([0, 3, 3, 1, 2], dtype=jnp.int32)
    rep = solbound.analyze(f, (S((4, 4), F32), S((5, 4), F32), ids), validate=True)
    assert rep.lowered.unsupported == []
    assert rep.validation["status"] == "passed", rep.validation
    assert rep.counts.macs == 5 * 2 * 4 * 4                     # the body, times 5


def test_flax_nnx_module_parameters_are_inputs():
    nnx = pytest.importorskip("flax.nnx")

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.l1 = nnx.Linear(8, 16, rngs=rngs)
            self.l2 = nnx.Linear(16, 4, rngs=rngs)

        def __call__(self, x):
            return self.l2(nnx.relu(self.l1(x)))
    model = nnx.eval_shape(lambda: MLP(nnx.Rngs(0)))           # nothing allocated
    rep = solbound.analyze(model, (S((3, 8), F32),))
    assert rep.lowered.unsupported == []
    assert rep.counts.macs == 3 * 8 * 16 + 3 * 16 * 4
    # every weight and bias read once, the input and the output
    assert rep.counts.fused.bytes == 4 * (8 * 16 + 16 + 16 * 4 + 4 + 3 * 8 + 3 * 4)
    real = MLP(nnx.Rngs(0))
    assert solbound.analyze(real, (S((3, 8), F32),), validate=True).validation["status"] == "passed"


def test_kv_cache_row_at_a_run_time_position_is_written_in_place():
    def decode(cache, k, q, pos):
        cache = jax.lax.dynamic_update_slice(cache, k, (0, pos, 0))
        return cache, jnp.einsum("bd,bnd->bn", q, cache)
    rep = solbound.analyze(decode, (S((2, 16, 8), F32), S((2, 1, 8), F32), S((2, 8), F32),
                                    jnp.int32(5)), validate=True)
    assert rep.validation["status"] == "passed", rep.validation
    cache = rep.lowered.inputs[0]["ir"]
    assert rep.counts.fused.writes[cache] == 2 * 8 * 4          # one row per batch, in place
    assert rep.counts.fused.reads[cache] == 2 * 15 * 8 * 4      # the row just written: on chip


def test_factory_convention_for_jax(tmp_path, monkeypatch):
    (tmp_path / "jfactory.py").write_text(
        "import jax\nimport jax.numpy as jnp\n\n\ndef make():\n"
        "    s = jax.ShapeDtypeStruct\n"
        "    return (lambda x, w: jnp.tanh(x @ w)), (s((4, 8), jnp.float32), s((8, 2), jnp.float32))\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    rep = solbound.analyze_source("jfactory:make", validate=True)
    assert rep.counts.macs == 64 and rep.validation["status"] == "passed"


def test_flax_module_with_a_split_writes_its_json_report(tmp_path):
    # jnp.split gives the split primitive its sizes as numpy integers: they reached kernel
    # extents and the counts ("Object of type int64 is not JSON serializable")
    pytest.importorskip("flax.linen")
    import json
    import numpy as np
    from solbound.cli import main
    from solbound.report.report import dumps
    (tmp_path / "vae_encoder.py").write_text(
        "import jax\nimport jax.numpy as jnp\nimport flax.linen as nn\n\n\n"
        "class Encoder(nn.Module):\n"
        "    @nn.compact\n"
        "    def __call__(self, x):\n"
        "        h = nn.relu(nn.Dense(16)(x))\n"
        "        mean, logvar = jnp.split(nn.Dense(8)(h), 2, axis=-1)\n"
        "        return mean, logvar\n\n\n"
        "def example():\n"
        "    model, x = Encoder(), jax.ShapeDtypeStruct((3, 8), jnp.float32)\n"
        "    params = jax.eval_shape(model.init, jax.random.key(0), x)\n"
        "    return (lambda p, x: model.apply(p, x)), (params, x)\n")
    out = tmp_path / "report.json"
    assert main(["analyze", str(tmp_path / "vae_encoder.py"), "--json", str(out), "-q",
                 "--validate"]) == 0
    doc = json.loads(out.read_text())
    assert doc["validation"]["status"] == "passed", doc["validation"]
    assert doc["totals"]["macs"] == 3 * 8 * 16 + 3 * 16 * 8
    # every extent a Python int, and each output half a 3x4 copy of the projection
    copies = [k for k in doc["kernels"] if k["extents"] == {"d0": 3, "d1": 4}]
    assert len(copies) == 2
    # the writer itself converts numpy scalars, should one slip through again
    assert json.loads(dumps({"n": np.int64(3), "x": np.float32(0.5), "b": np.bool_(True),
                             "a": np.arange(2)})) == {"n": 3, "x": 0.5, "b": True, "a": [0, 1]}


def test_over_budget_jax_program_validates_at_reduced_shapes():
    def mlp(w1, w2, x):
        return jax.nn.relu(x @ w1) @ w2
    rep = solbound.analyze(mlp, (S((256, 512), F32), S((512, 64), F32), S((128, 256), F32)),
                           validate=True, max_bytes=400_000)
    v = rep.validation
    assert v["status"] == "passed" and v["reduced"], v
    assert "halved" in v["reduced_by"]


def test_a_reference_that_is_not_finite_proves_nothing():
    # a variance reaches a square root: it is drawn non-negative, and the verdict is real
    rep = solbound.analyze(lambda var, x: x / jnp.sqrt(var), (S((8,), F32), S((8,), F32)),
                           validate=True)
    assert rep.validation["status"] == "passed", rep.validation
    # a logarithm of a negative number whatever is drawn: NaN for every draw, inconclusive
    rep = solbound.analyze(lambda x: jnp.log(-jnp.abs(x) - 1.0), (S((8,), F32),),
                           validate=True)
    v = rep.validation
    assert v["status"] == "inconclusive" and "not finite" in v["reason"]
    assert "each of 3 draws" in v["reason"] and len(v["redraws"]) == 3


def test_a_wrong_rule_is_named_with_its_equation_and_line(monkeypatch):
    from solbound.frontends.jax import rules
    from solbound.frontends.jax.lower import RULES
    monkeypatch.setitem(RULES, "tanh", rules._unary("sin"))      # a deliberately wrong rule

    def f(x, w):
        return jnp.tanh(x @ w) * 2
    rep = solbound.analyze(f, (S((3, 4), F32), S((4, 5), F32)), validate=True)
    fd = rep.validation["first_divergence"]
    assert rep.validation["status"] == "failed"
    assert fd["primitive"] == "tanh" and fd["source"].startswith("test_jax.py:")


def test_random_draws_are_counted_and_replayed():
    key = jax.random.key(0)
    # one draw (one vector op) per 32-bit word: 4 * 8 of them
    rep = solbound.analyze(lambda k: jax.random.bits(k, (4, 8)), (key,), validate=True)
    assert rep.counts.flops == {"matrix": 0, "vector": 32, "special": 0}
    assert rep.validation["status"] == "passed", rep.validation

    def f(key, x):
        k1, k2 = jax.random.split(key)
        keep = jax.random.bernoulli(k1, 0.9, x.shape)
        noise = jax.random.normal(k2, x.shape)
        return jnp.where(keep, x / 0.9, 0.0) + noise, jax.random.uniform(jax.random.fold_in(key, 3), (5,))
    for k in (key, S((), key.dtype), jax.random.PRNGKey(3)):      # typed, abstract, raw keys
        rep = solbound.analyze(f, (k, S((4, 8), F32)), validate=True)
        assert rep.lowered.unsupported == []
        assert rep.validation["status"] == "passed", rep.validation
    # split: 2 keys of 2 words; three random_bits of 32, 32 and 5 words; fold_in: 2 words
    draws = rep.lowered.random_draws
    assert sorted(rep.program.tensor_map[t].numel for t in draws) == [2, 4, 5, 32, 32]


def test_a_draw_inside_a_loop_is_counted_but_not_replayed():
    def f(key, xs):
        def step(c, x):
            return c + jax.random.normal(jax.random.fold_in(key, 1), x.shape) * x, None
        return jax.lax.scan(step, jnp.zeros(4), xs)[0]
    rep = solbound.analyze(f, (jax.random.key(0), S((6, 4), F32)), validate=True)
    assert rep.lowered.unsupported == []
    assert rep.validation["status"] == "skipped"
    assert "cannot be replayed" in rep.validation["reason"]


def test_while_loops_shaped_as_fori_loop_count_their_trips():
    w = S((4, 4), F32)
    # bounds given as arrays: JAX emits a while, not a scan
    rep = solbound.analyze(lambda x, w: jax.lax.fori_loop(
        jnp.int32(2), jnp.int32(7), lambda i, c: jnp.tanh(c @ w) + i, x), (S((2, 4), F32), w),
        validate=True)
    assert rep.validation["status"] == "passed", rep.validation
    assert rep.counts.macs == 5 * 2 * 4 * 4
    # a trip count known only at run time is named, with what to write instead
    rep = solbound.analyze(lambda x: jax.lax.while_loop(lambda c: c.sum() < 10, lambda c: c + 1, x),
                           (S((3,), F32),))
    (u,) = rep.lowered.unsupported
    assert u.operator == "jax.while" and "known only at run time" in u.reason and u.source


def test_reversed_and_nested_scans():
    rep = solbound.analyze(lambda x: jax.lax.scan(lambda c, xi: (c + xi, c * xi), 0.0, x,
                                                  reverse=True), (S((6,), F32),), validate=True)
    assert rep.validation["status"] == "passed", rep.validation
    assert rep.counts.flops["vector"] == 12

    def nested(xs, w):
        def outer(c, x):
            def inner(ci, xi):
                h = jnp.tanh(ci @ w + xi)
                return h, h.sum()
            return jax.lax.scan(inner, c, x, reverse=True)
        return jax.lax.scan(outer, jnp.zeros((2, 4)), xs)
    rep = solbound.analyze(nested, (S((5, 3, 2, 4), F32), S((4, 4), F32)), validate=True)
    assert rep.validation["status"] == "passed", rep.validation
    assert rep.counts.macs == 5 * 3 * 2 * 4 * 4          # outer x inner x (2x4 @ 4x4)


def test_a_boolean_padding_mask_keeps_the_causal_structure():
    # min(int(padding), causal) as keras-hub writes it: a boolean is 0 or 1, so wherever
    # the causal mask is 0 the minimum is 0, whatever the padding holds
    T, D = 8, 4

    def jf(q, k, pad):
        i = jnp.arange(T)
        mask = jnp.minimum(pad.astype(jnp.int32)[None, :], (i[:, None] >= i[None, :]).astype(jnp.int32))
        s = jnp.where(mask > 0, q @ k.T, -jnp.inf)
        return jax.nn.softmax(s, axis=-1)

    def tf(s, q, k, pad):
        i = torch.arange(T)
        mask = torch.minimum(pad.int()[None, :], (i[:, None] >= i[None, :]).int())
        return torch.softmax(torch.where(mask > 0, q @ k.T, float("-inf")), -1)
    from helpers import Fn
    t = solbound.analyze(Fn(tf), (torch.randn(T, D), torch.randn(T, D), torch.ones(T, dtype=torch.bool)),
                         validate=True)
    j = solbound.analyze(jf, (S((T, D), F32), S((T, D), F32), S((T,), jnp.bool_)), validate=True)
    assert t.validation["status"] == j.validation["status"] == "passed"
    assert t.counts.macs == j.counts.macs == T * (T + 1) // 2 * D


def test_an_integer_padding_mask_used_only_as_a_mask_keeps_the_causal_structure():
    # keras-hub's padding_mask is int32 and reaches attention as min(padding, causal) != 0:
    # an integer used only as a mask is taken to hold 0 or 1 (stated), so the causal
    # triangle is kept, and validation draws it as ones (a mask that keeps everything)
    T, D = 8, 4

    def jf(q, k, pad):
        i = jnp.arange(T)
        mask = jnp.minimum(pad[None, :], (i[:, None] >= i[None, :]).astype(jnp.int32))
        s = jnp.where(mask.astype(bool), 0.5 * (q @ k.T), -0.7 * jnp.finfo(F32).max)
        return jax.nn.softmax(s, axis=-1)
    rep = solbound.analyze(jf, (S((T, D), F32), S((T, D), F32), S((T,), jnp.int32)),
                           validate=True)
    assert rep.validation["status"] == "passed", rep.validation
    assert rep.counts.macs == T * (T + 1) // 2 * D
    pad = rep.lowered.inputs[-1]["ir"]
    notes = rep.to_dict()["assumptions"]
    assert any(n.startswith(f"assumption: integer input {pad} is used only as a mask")
               for n in notes)
    # the padding itself is still data: what it masks is counted, and the notes say so
    assert any(n.startswith(f"assumption: input {pad} is known only at run time and a mask")
               for n in notes)

    # used otherwise too (its values added to the scores), it could hold anything: dense
    def jf2(q, k, pad):
        s = jf(q, k, pad)
        return s + pad[None, :]
    rep = solbound.analyze(jf2, (S((T, D), F32), S((T, D), F32), S((T,), jnp.int32)))
    assert rep.counts.macs == T * T * D
    notes = rep.to_dict()["assumptions"]
    assert not any("used only as a mask" in n for n in notes)
    assert any(n.startswith(f"assumption: input {pad} is known only at run time and a mask")
               for n in notes)
    # made a boolean directly, nothing needs assuming: its values are only zero or not
    rep = solbound.analyze(
        lambda q, k, pad: jnp.where(pad[None, :] != 0, q @ k.T, -jnp.inf),
        (S((T, D), F32), S((T, D), F32), S((T,), jnp.int32)))
    assert not any("used only as a mask" in n for n in rep.to_dict()["assumptions"])


def test_a_prefill_chunk_at_a_run_time_position():
    # four rows written into the cache at a position known only at run time, then read
    # back as a window (JAX clamps the start so that the window fits)
    def prefill(cache, k, q, pos):
        cache = jax.lax.dynamic_update_slice(cache, k, (0, pos, 0))
        win = jax.lax.dynamic_slice(cache, (0, pos, 0), (2, 4, 8))
        return cache, jnp.einsum("btd,bsd->bts", q, win)
    for pos in (3, 14, -2):
        rep = solbound.analyze(prefill, (S((2, 16, 8), F32), S((2, 4, 8), F32), S((2, 4, 8), F32),
                                         jnp.int32(pos)), validate=True)
        assert rep.lowered.unsupported == []
        assert rep.validation["status"] == "passed", rep.validation
    assert rep.counts.macs == 2 * 4 * 4 * 8
    cache = rep.lowered.inputs[0]["ir"]
    assert rep.counts.fused.writes[cache] == 2 * 4 * 8 * 4        # in place, the chunk only
    assert rep.counts.fused.reads.get(cache, 0) == 0              # the window just written


def test_batched_gathers_and_windows_at_run_time_starts():
    # take_along_axis: a gather with batching dimensions (one element per index)
    idx = jnp.array([[0, 7, 3], [1, 1, 2], [5, 6, 7], [0, 0, 0]], jnp.int32)
    rep = solbound.analyze(lambda x, i: jnp.take_along_axis(x, i, axis=1) * 2.0,
                           (S((4, 8), F32), idx), validate=True)
    assert rep.lowered.unsupported == [] and rep.validation["status"] == "passed"
    # the product, and take_along_axis's wrap of negative indices (lt, add, select)
    assert rep.counts.flops["vector"] == 12 + 3 * 12
    # a vmapped dynamic slice: a window of 3 from each row's own start (clamped by JAX)
    rows = jax.vmap(lambda row, s: jax.lax.dynamic_slice_in_dim(row, s, 3))
    for starts in ([0, 2, 5, 7], [6, 1, 0, 3]):
        rep = solbound.analyze(rows, (S((4, 8), F32), jnp.array(starts, jnp.int32)),
                               validate=True)
        assert rep.lowered.unsupported == [] and rep.validation["status"] == "passed"
    x = rep.lowered.inputs[0]["ir"]
    assert rep.counts.fused.reads[x] <= 4 * 8 * 4


def test_batched_scatters_vmapped_cache_writes_and_put_along_axis():
    """Scatters with operand batching dimensions, as ``vmap`` and ``put_along_axis`` emit
    them: a per-sequence KV-cache write (a vmapped ``dynamic_update_slice``: a window at a
    run-time start per batch element, clamped as JAX clamps it), a vmapped ``.at[].add``
    and ``put_along_axis`` (indices with their batch positions)."""
    def write(cache, rows, pos):
        return jax.vmap(lambda c, r, p: jax.lax.dynamic_update_slice(c, r, (p, 0)))(
            cache, rows, pos)
    # positions chosen so that one window is clamped (14 + 4 > 16 starts at 12)
    pos = jnp.array([0, 5, 14], dtype=jnp.int32)
    rep = solbound.analyze(write, (S((3, 16, 8), F32), S((3, 4, 8), F32), pos), validate=True)
    assert rep.lowered.unsupported == [] and rep.validation["status"] == "passed"
    # updated in place: the rows and positions are read, 3 x 4 x 8 elements written
    assert rep.counts.fused.bytes == 4 * (3 * 16 * 8 + 3 * 4 * 8 + 3) + 4 * 3 * 16 * 8

    def add(x, i, v):
        return jax.vmap(lambda a, j, w: a.at[j].add(w))(x, i, v)
    ids = jnp.array([[0, 3, 3], [1, 1, 9], [2, 0, 5], [4, 4, 4]], dtype=jnp.int32)
    rep = solbound.analyze(add, (S((4, 10, 2), F32), ids, S((4, 3, 2), F32)), validate=True)
    assert rep.lowered.unsupported == [] and rep.validation["status"] == "passed"
    # one add per update element, and jnp's wrap of negative indices (lt, add, select) on
    # each of the 4 x 3 indices
    assert rep.counts.flops["vector"] == 4 * 3 * 2 + 3 * 4 * 3

    rep = solbound.analyze(lambda x, i, v: jnp.put_along_axis(x, i, v, axis=1, inplace=False),
                           (S((4, 10), F32), ids, S((4, 3), F32)), validate=True)
    assert rep.lowered.unsupported == [] and rep.validation["status"] == "passed"


def test_fixed_width_integers_wrap_and_shift_as_jax_does():
    """u32 and i32 arithmetic held in int64 wraps to its width when written: products and
    differences that overflow, left shifts, arithmetic right shifts of negative values.
    Validation is exact (tolerance 0 for integers)."""
    import numpy as np
    rng = np.random.default_rng(0)
    a = jnp.array(rng.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32))

    def f(x, b):
        y = x.astype(jnp.int32)                          # wraps to negative values
        return ((x * b) >> 16) + (x - b) + (b << 7), (y * 3) >> 2, (y << 3) - y * 1000003
    rep = solbound.analyze(f, (a, a[::-1]), validate=True)
    assert rep.lowered.unsupported == []
    assert rep.validation["status"] == "passed" and rep.validation["tolerance"] == 0.0
    # 11 elementwise operations on 64 elements (the conversion is not arithmetic)
    assert rep.counts.flops["vector"] == 11 * 64
    # a logical right shift of a signed integer is named, not guessed
    rep = solbound.analyze(lambda y: jax.lax.shift_right_logical(y, jnp.int32(3)),
                           (S((8,), jnp.int32),))
    assert [u.operator for u in rep.lowered.unsupported] == ["jax.shift_right_logical"]


def test_packed_documents_in_jax_count_each_documents_triangle_and_validate():
    """jnp's integer ``//`` (a truncating division plus a sign correction, which a loop
    variable never needs) and ``%`` of an ``arange`` are its block index and offset: four
    documents of 64 tokens packed in 256, causal within each, count four triangles."""
    import numpy as np

    def attn(q, k, v):
        i = jnp.arange(q.shape[0])
        doc = i // 64
        keep = (doc[:, None] == doc[None, :]) & (i[None, :] <= i[:, None])
        return jax.nn.softmax(jnp.where(keep, q @ k.T, -jnp.inf), -1) @ v

    n, d = 256, 16
    rng = np.random.default_rng(0)
    xs = tuple(rng.standard_normal((n, d)).astype(np.float32) for _ in range(3))
    from solbound.frontends.jax.frontend import analyze_function
    rep = analyze_function(attn, xs, arch="h100-sxm", validate=True)
    assert rep.counts.macs == 2 * d * (n // 64) * (64 * 65 // 2)
    assert not [a for a in rep.to_dict()["assumptions"] if "mask" in a]
    assert rep.validation["status"] == "passed", rep.validation
