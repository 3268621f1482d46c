"""Training-step twins: the same model, loss and optimizer written in PyTorch
(``torch.optim.SGD``, ``--train``) and in JAX (``jax.value_and_grad`` and ``optax.sgd``, the
function is the step) count the same MACs, per phase too, and the same fused bytes.

Both steps are plain SGD at the same learning rate on fp32, with a mean squared error."""

import math

import pytest
import torch
import torch.nn as nn

import solbound

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
optax = pytest.importorskip("optax")
S = jax.ShapeDtypeStruct
F32 = jnp.float32
LR = 0.1


def _torch_step(model, inputs):
    return solbound.analyze(model, inputs, train=True,
                            optimizer=torch.optim.SGD(model.parameters(), lr=LR))


def _jax_step(loss_fn, params, batch, validate=True):
    tx = optax.sgd(LR)

    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state
    rep = solbound.analyze(step, (params, tx.init(params), batch), train=True,
                           optimizer="sgd", validate=validate)
    assert rep.lowered.unsupported == [], rep.lowered.unsupported
    if validate:
        assert rep.validation["status"] == "passed", rep.validation
    return rep


def _same(t, j):
    assert t.lowered.unsupported == [], t.lowered.unsupported
    assert t.counts.macs == j.counts.macs
    assert t.counts.fused.bytes == j.counts.fused.bytes
    tp, jp = t.training["phases"], j.training["phases"]
    for ph in ("forward", "backward", "optimizer"):
        assert tp[ph]["macs"] == jp[ph]["macs"], ph
        assert tp[ph]["bytes"]["fused"] == jp[ph]["bytes"]["fused"], ph
    assert t.training["parameters_trained"] == j.training["parameters_trained"]
    assert t.training["memory"]["parameters"] == j.training["memory"]["parameters"]
    assert t.training["memory"]["gradients"] == j.training["memory"]["gradients"]


class _MLP(nn.Module):
    def __init__(self, din, dh, dout):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(din, dh), nn.Linear(dh, dout)

    def forward(self, x, target):            # (`t` collides with AOTAutograd's names)
        return nn.functional.mse_loss(self.fc2(torch.relu(self.fc1(x))), target)


def test_mlp_step_twins():
    B, DIN, DH, DOUT = 3, 8, 16, 4
    t = _torch_step(_MLP(DIN, DH, DOUT), (torch.randn(B, DIN), torch.randn(B, DOUT)))

    def loss_fn(p, b):
        x, y = b
        h = jax.nn.relu(x @ p["fc1"]["weight"].T + p["fc1"]["bias"])
        return jnp.mean((h @ p["fc2"]["weight"].T + p["fc2"]["bias"] - y) ** 2)
    params = {"fc1": {"weight": S((DH, DIN), F32), "bias": S((DH,), F32)},
              "fc2": {"weight": S((DOUT, DH), F32), "bias": S((DOUT,), F32)}}
    j = _jax_step(loss_fn, params, (S((B, DIN), F32), S((B, DOUT), F32)))
    _same(t, j)
    P = DIN * DH + DH + DH * DOUT + DOUT
    assert j.training["phases"]["forward"]["macs"] == B * DIN * DH + B * DH * DOUT + B * DOUT
    assert j.training["phases"]["backward"]["macs"] == \
        DH * DOUT * B + B * DH * DOUT + DH * DIN * B + B * DOUT
    assert j.counts.fused.bytes == 4 * (2 * P + B * DIN + B * DOUT + 1)


class _Attention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(d, d, bias=False) for _ in range(3))
        self.d = d

    def forward(self, x, target):
        y = nn.functional.scaled_dot_product_attention(self.q(x), self.k(x), self.v(x),
                                                       is_causal=True)
        return nn.functional.mse_loss(y, target)


def test_attention_step_twins():
    # PyTorch's side is SDPA with is_causal (its training step keeps the mask in all four
    # backward products; a hand-written masked_fill(~tril, -inf) does too, see
    # tests/test_train.py::test_masked_fill_attention_backward_keeps_the_mask)
    B, N, D = 2, 6, 8
    t = _torch_step(_Attention(D), (torch.randn(B, N, D), torch.randn(B, N, D)))

    def loss_fn(p, b):
        x, y = b
        q, k, v = x @ p["q"]["weight"].T, x @ p["k"]["weight"].T, x @ p["v"]["weight"].T
        s = (q @ jnp.swapaxes(k, -1, -2)) * (1 / math.sqrt(D))
        s = jnp.where(jnp.tril(jnp.ones((N, N), bool)), s, -jnp.inf)
        return jnp.mean((jax.nn.softmax(s, axis=-1) @ v - y) ** 2)
    params = {n: {"weight": S((D, D), F32)} for n in "qkv"}
    j = _jax_step(loss_fn, params, (S((B, N, D), F32), S((B, N, D), F32)))
    _same(t, j)
    tri = N * (N + 1) // 2                     # the (query, key) pairs the mask keeps
    # forward: three projections, scores and P @ V on the triangle, the squared error
    assert j.training["phases"]["forward"]["macs"] == 3 * B * N * D * D + 2 * B * tri * D \
        + B * N * D
    # backward: dV, dP, dQ, dK on the triangle (JAX's select_n transposes to a select
    # that keeps the mask's zeros), softmax's row sums of P * dP, three weight gradients
    assert j.training["phases"]["backward"]["macs"] == 4 * B * tri * D + B * tri \
        + 3 * B * N * D * D


class _ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2)

    def forward(self, x, target):
        y = torch.max_pool2d(torch.relu(self.c2(torch.relu(self.c1(x)))), 2)
        return nn.functional.mse_loss(y, target)


def _conv_loss(p, b):
    x, y = b
    conv = jax.lax.conv_general_dilated
    h = conv(x, p["c1"]["weight"], (1, 1), ((1, 1), (1, 1))) + p["c1"]["bias"][None, :, None, None]
    h = jax.nn.relu(h)
    h = conv(h, p["c2"]["weight"], (2, 2), ((1, 1), (1, 1)), feature_group_count=2) \
        + p["c2"]["bias"][None, :, None, None]
    h = jax.nn.relu(h)
    h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
    return jnp.mean((h - y) ** 2)


CONV_PARAMS = {"c1": {"weight": S((8, 3, 3, 3), F32), "bias": S((8,), F32)},
               "c2": {"weight": S((8, 4, 3, 3), F32), "bias": S((8,), F32)}}


CONV_BATCH = (S((1, 3, 8, 8), F32), S((1, 8, 2, 2), F32))


def test_conv_net_step_in_jax_counts_in_closed_form():
    j = _jax_step(_conv_loss, CONV_PARAMS, CONV_BATCH)
    # valid (output, tap) pairs per spatial dimension: c1 (8 outputs, pad 1, kernel 3)
    # 2 + 6*3 + 2 = 22; c2 (stride 2: 4 outputs) 2 + 3 + 3 + 3 = 11
    c1 = 8 * 3 * 22 * 22
    c2 = 8 * 4 * 11 * 11
    pooled = 8 * 2 * 2
    assert j.training["phases"]["forward"]["macs"] == c1 + c2 + pooled
    # backward: the pool's gradient (the squared error's gradient, a product, added into
    # the selected elements: select_and_scatter_add), c2's input and kernel gradients (each
    # the forward's valid pairs; the kernel gradient of the grouped c2 is a convolution
    # with batch groups), c1's kernel gradient (x is an input: no gradient)
    assert j.training["phases"]["backward"]["macs"] == pooled + 2 * c2 + c1
    P = 8 * 27 + 8 + 8 * 36 + 8
    assert j.counts.fused.bytes == 4 * (2 * P + 3 * 64 + pooled + 1)


def test_conv_net_step_twins():
    t = _torch_step(_ConvNet(), (torch.randn(1, 3, 8, 8), torch.randn(1, 8, 2, 2)))
    j = _jax_step(_conv_loss, CONV_PARAMS, CONV_BATCH, validate=False)
    _same(t, j)
