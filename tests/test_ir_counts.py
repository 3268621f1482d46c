"""Counting from IR text alone: no frontend, so these hold for every frontend. Each program
is written in the IR's text form and its counts are derived by hand."""

import math

import numpy as np

from solbound.analysis.counts import count_program
from solbound.graph.einsum import build_graph
from solbound.ir.execute import execute
from solbound.ir.text import parse_program

B4 = 4


def counts(text: str):
    p = parse_program(text)
    return p, count_program(build_graph(p))


def test_linear_with_bias():
    _, c = counts('''# solbound IR v1
w = parameter(f32[4, 8])
b = parameter(f32[4])
x = input(f32[3, 8])
y = output(f32[3, 4])
mm = intermediate(f32[3, 4])

@kernel(i=3, n=4, k=8)
@origin(op="linear", unit="matmul")
def k_mm():
    mm[i, n] = sum(x[i, k] * w[n, k])

@kernel(i=3, n=4)
@origin(op="linear")
def k_bias():
    y[i, n] = b[n] + mm[i, n]
''')
    assert c.macs == 3 * 4 * 8
    assert c.flops == {"matrix": 2 * 96, "vector": 12, "special": 0}
    # one operator: x, w, b read, y written (mm stays inside it)
    assert c.unfused.bytes == c.fused.bytes == (24 + 32 + 4 + 12) * B4


def test_padding_taps_are_not_work():
    # a 1-d convolution of 6 points with a 3-tap filter, padding 1: 16 valid (position, tap)
    _, c = counts('''# solbound IR v1
x = input(f32[6])
w = parameter(f32[3])
y = output(f32[6])

@kernel(o=6, t=3)
@origin(op="conv", unit="conv")
def k_conv():
    y[o] = sum(x[o + t - 1] * w[t], where=(0 <= o + t - 1 < 6))
''')
    assert c.macs == 6 * 3 - 2
    assert c.fused.bytes == (6 + 3 + 6) * B4


def test_causal_pairs_and_a_guarded_reduction():
    # s x s causal scores for 2 heads of width 4: s(s+1)/2 pairs per head
    s = 5
    _, c = counts(f'''# solbound IR v1
q = input(f32[2, {s}, 4])
k = input(f32[2, {s}, 4])
m = output(f32[2, {s}])
sc = intermediate(f32[2, {s}, {s}])

@kernel(h=2, i={s}, j={s}, d=4)
@origin(op="qk", unit="attention")
def k_qk():
    sc[h, i, j] = sum(q[h, i, d] * k[h, j, d], where=(j - i < 1))

@kernel(h=2, i={s}, j={s})
@origin(op="max")
def k_max():
    m[h, i] = max(sc[h, i, j], where=(j - i < 1))
''')
    pairs = s * (s + 1) // 2
    assert c.macs == 2 * pairs * 4
    assert c.flops["vector"] == 2 * pairs               # one comparison per kept point


def test_scan_and_sequential_loop_multiply_by_the_trip_count():
    p, c = counts('''# solbound IR v1
x = input(f32[8, 3])
w = parameter(f32[3, 3])
h = intermediate(f32[9, 3])
y = output(f32[8, 3])

@kernel(j=3)
@origin(op="init")
def k_init():
    h[0, j] = 0.0

for ts in range(8):
    @kernel(j=3, k=3)
    @origin(op="step", unit="matmul")
    def k_step():
        h[ts + 1, j] = sum(h[ts, k] * w[j, k])

@kernel(t=8, j=3)
@origin(op="out")
def k_out():
    y[t, j] = tanh(h[t + 1, j] + x[t, j])
''')
    assert c.macs == 8 * 3 * 3
    assert c.flops["special"] == 24 and c.flops["vector"] == 24
    # h stays 0 (W = I from h = 0), so every output is tanh(x)
    arrays = execute(p, {"x": np.ones((8, 3)), "w": np.eye(3)})
    assert np.allclose(arrays["y"], math.tanh(1.0))


def test_scatter_add_and_library_sort():
    _, c = counts('''# solbound IR v1
x = input(f32[4, 6])
idx = input(i64[5])
src = input(f32[5, 6])
acc = output(f32[4, 6])
srt = output(f32[4, 6])

@kernel(i=4, j=6)
@origin(op="copy")
def k_copy():
    acc[i, j] = x[i, j]

@kernel(n=5, j=6)
@origin(op="index_add")
def k_add():
    acc[idx[n], j] = sum(src[n, j])

@kernel(d0=4, d1=6, a0=4, a1=6)
@library(name="sort", dim=1, descending=False, output=0, cost=True)
@origin(op="sort")
def k_sort():
    srt[d0, d1] = x[a0, a1]
''')
    assert c.flops["vector"] == 30 + 4 * 6 * 3           # 30 additions; 4 rows x 6 x ceil(log2 6)
    assert c.macs == 0
    # x read once (copy and sort share it), src and the ids, both outputs written
    assert c.fused.bytes == (24 + 30 + 24 + 24) * B4 + 5 * 8


def test_skipped_points_are_not_work_and_change_no_value():
    """``@skip(...)``: a prefix-LM's masked keys (j > i and j >= 2 of 5 rows and keys) add
    the identity of the sum, so they are not work: per row max(i + 1, 2) keys, 2 + 2 + 3 +
    4 + 5 = 16 of 25. Running the IR ignores the skip (the values are the same), and the
    text form prints and parses it back."""
    from solbound.ir.text import print_program
    text = '''# solbound IR v1
p = input(f32[5, 5])
v = input(f32[5, 3])
o = output(f32[5, 3])

@kernel(i=5, d=3, j=5)
@origin(op="pv", unit="attention")
@skip((j - i >= 1) & (j >= 2))
def k_pv():
    o[i, d] = sum(p[i, j] * v[j, d])
'''
    prog, c = counts(text)
    assert c.macs == 16 * 3
    assert print_program(parse_program(print_program(prog))) == print_program(prog)
    rng = np.random.default_rng(0)
    pv = rng.standard_normal((5, 5)).astype(np.float32)
    vv = rng.standard_normal((5, 3)).astype(np.float32)
    got = execute(prog, {"p": pv, "v": vv})["o"]
    assert np.allclose(got, pv @ vv, rtol=1e-5)
