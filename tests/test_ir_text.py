"""The IR text form: print -> parse -> print is the identity; errors carry line numbers."""

import math

import pytest
import torch.nn as nn
import torch.nn.functional as F

from helpers import r, run
from solbound.ir.affine import Aff, Atom
from solbound.ir.model import Access, Call, Const, Idx, Kernel, Program, TensorDecl
from solbound.ir.text import IRSyntaxError, parse_program, print_program

SOFTMAX = """# solbound IR v1
x = input(f32[4, 8])
m = intermediate(f32[4])
e = intermediate(f32[4, 8])
s = intermediate(f32[4])
y = output(f32[4, 8])

@kernel(b=4, n=8)
def row_max():
    m[b] = max(x[b, n])

@kernel(b=4, n=8)
def shifted_exp():
    e[b, n] = exp(x[b, n] - m[b])

@kernel(b=4, n=8)
def row_sum():
    s[b] = sum(e[b, n])

@kernel(b=4, n=8)
def normalize():
    y[b, n] = e[b, n] / s[b]
"""


def test_hand_written_text_round_trips():
    p = parse_program(SOFTMAX)
    assert print_program(p) == SOFTMAX
    assert [k.reduce for k in p.kernels] == ["max", None, "sum", None]
    assert p.kernels[0].reduce_vars == ("n",)


def test_all_forms_round_trip():
    text = """# solbound IR v1
note("an assumption")
x = input(f32[2, 3, 9, 9])
w = parameter(f32[4, 3, 3, 3])
ids = input(i64[5])
t = parameter(bf16[10, 6])
y = output(f32[2, 4, 9, 9])
pd = output(f32[2, 3, 11, 11])
g = output(bf16[5, 6])
cs = output(f32[2, 3])
a = output(i64[2])
v = output(f32[2])
z = output(f32[()])

@kernel(n=2, k=4, p=9, q=9, c=3, r=3, s=3)
@origin(op="conv", name="aten.convolution", src="model.py:3", unit="conv")
def conv():
    y[n, k, p, q] = sum(x[n, c, p + r - 1, q + s - 1] * w[k, c, r, s], where=(0 <= p + r - 1 < 9) & (0 <= q + s - 1 < 9))

@kernel(n=2, c=3, h=11, q=11)
def pad():
    pd[n, c, h, q] = x[n, c, h - 1, q - 1] if (1 <= h < 10) & (1 <= q < 10) else -inf

@kernel(i=5, d=6)
def gather():
    g[i, d] = t[ids[i], d]

@kernel(n=2, c=3)
def scan():
    cs[n, c] = cumsum(x[n, c, 0, 0] * 2.5, over=c)

@kernel(n=2, h=9)
def am():
    a[n], v[n] = argmax(x[n, 0, h, 0])

@kernel(i=2, j=2)
def tri():
    z[()] = sum(select(i - j < 1, -x[i, j, 0, 0] ** 2.0, 0.0), where=(0 <= i - j))
"""
    p = parse_program(text)
    assert print_program(p) == text
    assert p.notes == ("an assumption",)
    assert p.kernels[1].fill == -math.inf
    assert p.kernels[2].body.index[0] == Access("ids", (Aff.var("i"),))
    assert p.kernels[4].out2 == "v"


@pytest.mark.parametrize("build", [
    lambda: run(lambda s, x: s.c(x), r(1, 2, 6, 6), c=nn.Conv2d(2, 3, 3, stride=2, padding=1)),
    lambda: run(lambda s, x: s.ln(F.gelu(x)).softmax(-1), r(3, 5), ln=nn.LayerNorm(5)),
    lambda: run(lambda s, x: F.max_pool2d(x, 3, 2, 1).flatten(1).sum(1), r(2, 3, 7, 7)),
    lambda: run(lambda s, x: s.bn(x), r(2, 3, 4, 4), bn=nn.BatchNorm2d(3)),
    lambda: run(lambda s, x: s.c(x), r(1, 3, 4, 4), c=nn.ConvTranspose2d(3, 2, 3, stride=2)),
])
def test_lowered_programs_round_trip(build):
    p = build().program
    text = print_program(p)
    q = parse_program(text)
    assert q == p
    assert print_program(q) == text


@pytest.mark.parametrize("text,line,msg", [
    ("x = input(f32[2])\ny = output(f32[2])\n@kernel(i=2)\ndef k():\n    y[j] = x[i]\n", 5,
     "not a loop dimension"),
    ("x = input(f32[2])\ny = output(f32[2])\n@kernel(i=2)\ndef k():\n    y[i] = foo(x[i])\n", 5,
     "not a scalar op"),
    ("x = input(f32[2])\ny = output(f32[-1])\n", 2, "non-negative integers"),
    ("x = input(q32[2])\n", 1, "unknown dtype"),
    ("x = input(f32[2])\ny = output(f32[2])\n@kernel(i=2, j=2)\ndef k():\n    y[i] = x[j]\n", 5,
     "do not appear in the output index"),
    ("x = input(f32[2])\ny = output(f32[2])\n@kernel(i=2)\ndef k():\n    y[i] = x[i, i]\n", 5,
     "rank 1"),
    ("x = input(f32[2])\ny = output(f32[2])\n@kernel(i=2)\ndef k():\n    y[i] = x[i * i]\n", 5,
     "multiply a loop variable by an integer"),
    ("x = input(f32[2])\n\n\ny = output(f32[2]\n", 4, "not valid IR syntax"),
])
def test_errors_name_the_line(text, line, msg):
    with pytest.raises(IRSyntaxError) as ei:
        parse_program(text)
    assert ei.value.line == line
    assert msg in str(ei.value)


def test_model_objects_compare_structurally():
    k = Kernel("k", (("i", 3),), "y", (Aff.var("i"),),
               Call("add", (Access("x", (Aff.var("i"),)), Const(1.0))))
    p = Program((TensorDecl("x", (3,), "f32", "input"), TensorDecl("y", (3,), "f32", "output")), (k,))
    assert parse_program(print_program(p)) == p
    assert str(Atom(Aff.var("i") - Aff.var("j"), 0, None)) == "0 <= i - j"
    assert Idx(Aff.var("i") * 2 + 1).expr.bounds({"i": 4}) == (1, 7)
