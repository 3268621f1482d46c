"""A JAX training step (``analyze(step, (params, opt_state, *batch), train=True)``, the
function is the step): parameters and optimizer state by position, phases from JAX's name
stacks, gradients as intermediates, counted in closed form and validated against JAX.
Counting convention as in ``tests/test_train.py``: a sum of products is MACs."""

import math

import numpy as np
import pytest

import solbound
from solbound.frontends.contract import FrontendError

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
optax = pytest.importorskip("optax")
S = jax.ShapeDtypeStruct
F32 = jnp.float32
B, DIN, DH, DOUT = 4, 8, 16, 4
P = DIN * DH + DH + DH * DOUT + DOUT


def _mlp_loss(p, b):
    x, y = b
    h = jax.nn.relu(x @ p["fc1"]["weight"].T + p["fc1"]["bias"])
    return jnp.mean((h @ p["fc2"]["weight"].T + p["fc2"]["bias"] - y) ** 2)


def _step_of(loss_fn, tx):
    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state
    return step


def _params(real=False):
    shapes = {"fc1": {"weight": (DH, DIN), "bias": (DH,)},
              "fc2": {"weight": (DOUT, DH), "bias": (DOUT,)}}
    rng = np.random.default_rng(0)
    return jax.tree_util.tree_map(
        lambda s: jnp.asarray(rng.standard_normal(s), F32) if real else S(s, F32), shapes,
        is_leaf=lambda s: isinstance(s, tuple))


BATCH = (S((B, DIN), F32), S((B, DOUT), F32))
FWD = B * DIN * DH + B * DH * DOUT + B * DOUT
BWD = DH * DOUT * B + B * DH * DOUT + DH * DIN * B + B * DOUT


def test_sgd_step_phases_gradients_traffic_and_memory():
    tx = optax.sgd(0.1)
    params = _params()
    rep = solbound.analyze(_step_of(_mlp_loss, tx), (params, tx.init(params), BATCH),
                           arch="h100-sxm", train=True, optimizer="sgd", validate=True)
    assert rep.lowered.unsupported == [] and rep.validation["status"] == "passed"
    ph = rep.training["phases"]
    # forward: two products and the squared error; backward: dW2, dX2, dW1 and fc2's
    # bias gradient (a sum of the error's products), none for x or the target
    assert (ph["forward"]["macs"], ph["backward"]["macs"], ph["optimizer"]["macs"]) == \
        (FWD, BWD, 0)
    # sgd: p - lr * g, a product and an add per parameter element
    assert ph["optimizer"]["flops_by_unit"] == {"matrix": 0, "vector": 2 * P, "special": 0}
    # fused: parameters read and the updated ones written, inputs read, the loss written;
    # the gradients never cross DRAM
    assert rep.counts.fused.bytes == 4 * (2 * P + B * DIN + B * DOUT + 1)
    assert ph["backward"]["bytes"]["fused"] == 0
    tr = rep.lowered.training
    assert tr["optimizer"] == "sgd" and tr["unused"] == [] and tr["optimizer_state"] == []
    assert sorted(tr["gradients"]) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    tm = rep.program.tensor_map
    for name, ir in tr["gradients"].items():
        *path, leaf = name.split(".")
        want = (DH, DIN) if name == "fc1.weight" else (DOUT, DH) if name == "fc2.weight" \
            else (DH,) if name == "fc1.bias" else (DOUT,)
        assert tm[ir].role == "intermediate" and math.prod(tm[ir].shape) == math.prod(want)
    mem = rep.training["memory"]
    assert mem["parameters"] == mem["gradients"] == 4 * P
    assert mem["inputs"] == 4 * (B * DIN + B * DOUT) and mem["optimizer_state"] == 0
    assert rep.training["parameters_trained"] == 4
    assert sum(p["bytes"]["fused"] for p in ph.values()) == rep.counts.fused.bytes
    assert sorted(t.role for t in rep.program.tensors if t.role in ("parameter", "input")) \
        == ["input"] * 2 + ["parameter"] * 4


def test_adam_step_state_is_buffers_and_a_jitted_step_keeps_its_phases():
    tx = optax.adam(1e-3)
    params = _params(real=True)
    state = tx.init(params)
    step = _step_of(_mlp_loss, tx)
    rep = solbound.analyze(step, (params, state, BATCH), train=True, validate=True)
    assert rep.lowered.unsupported == [] and rep.validation["status"] == "passed", \
        rep.validation
    tr = rep.lowered.training
    assert "ScaleByAdamState" in tr["optimizer"]
    # optax's adam state: mu and nu (2P) and an int32 step count
    assert rep.training["memory"]["optimizer_state"] == 4 * (2 * P + 1)
    assert {rep.program.tensor_map[t].role for t in tr["optimizer_state"]} == {"buffer"}
    ph = rep.training["phases"]
    assert (ph["forward"]["macs"], ph["backward"]["macs"]) == (FWD, BWD)
    # state read and written once, as the parameters
    assert rep.counts.fused.bytes == 4 * (2 * P + 2 * (2 * P + 1) + B * DIN + B * DOUT + 1)
    # one sqrt per parameter element on the special-function unit (and optax's bias
    # corrections, two powers of the step count)
    assert ph["optimizer"]["flops_by_unit"]["special"] >= P
    jitted = solbound.analyze(jax.jit(step), (params, state, BATCH), train=True)
    assert jitted.training["phases"] == rep.training["phases"]
    assert jitted.counts.fused.bytes == rep.counts.fused.bytes


@jax.custom_vjp
def _square(x):
    return x * x


_square.defvjp(lambda x: (x * x, x), lambda x, g: (2 * x * g,))


def test_every_primitive_a_real_step_transposes_to_is_lowered_and_validates():
    conv = jax.lax.conv_general_dilated

    def embed_cumsum(p, b):                  # a gather (scatter-add back), a cumsum
        ids, y = b
        return jnp.mean((jnp.cumsum(p["E"][ids], axis=1) - y) ** 2)

    def custom_and_remat(p, b):              # a custom_vjp backward rule, jax.checkpoint
        x, y = b
        h = jax.checkpoint(lambda h: jnp.tanh(h @ p["w"]))(x)
        return jnp.mean((_square(h) - y) ** 2)

    def heads(p, b):                         # dot_general with batch dimensions
        x, y = b
        q = jnp.einsum("bnd,hde->bhne", x, p["q"])
        k = jnp.einsum("bnd,hde->bhne", x, p["k"])
        s = jnp.einsum("bhne,bhme->bhnm", q, k)
        s = jnp.where(jnp.tril(jnp.ones(s.shape[-2:], bool)), s, -jnp.inf)
        return jnp.mean((jnp.einsum("bhnm,bhme->bhne", jax.nn.softmax(s), q) - y) ** 2)

    def cross_entropy(p, b):                 # log-softmax, take_along_axis, is_finite
        x, labels = b
        logits = jax.nn.gelu(x @ p["w"]) @ p["w2"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    def strided(p, b):                       # rows no window reads, avg pool, slices
        x, y = b
        h = conv(x, p["w"], (2, 2), "VALID")
        h = conv(h, p["w2"], (1, 1), ((2, 2), (2, 2)), rhs_dilation=(2, 2))
        h = jax.lax.reduce_window(h, 0., jax.lax.add, (1, 1, 3, 3), (1, 1, 2, 2), "VALID")
        return jnp.mean((h[:, :, ::2, 1:] / 9 - y) ** 2)
    cases = [
        (embed_cumsum, {"E": S((10, 4), F32)}, (S((2, 5), jnp.int32), S((2, 5, 4), F32))),
        (custom_and_remat, {"w": S((4, 4), F32)}, (S((3, 4), F32), S((3, 4), F32))),
        (heads, {"q": S((2, 8, 4), F32), "k": S((2, 8, 4), F32)},
         (S((2, 6, 8), F32), S((2, 2, 6, 4), F32))),
        (cross_entropy, {"w": S((8, 16), F32), "w2": S((16, 10), F32)},
         (S((4, 8), F32), S((4,), jnp.int32))),
        (strided, {"w": S((4, 3, 2, 2), F32), "w2": S((4, 4, 3, 3), F32)},
         (S((2, 3, 11, 11), F32), S((2, 4, 1, 1), F32))),
    ]
    tx = optax.sgd(0.1)
    for loss_fn, params, batch in cases:
        rep = solbound.analyze(_step_of(loss_fn, tx), (params, tx.init(params), batch),
                               train=True, validate=True)
        assert rep.lowered.unsupported == [], (loss_fn.__name__, rep.lowered.unsupported)
        assert rep.validation["status"] == "passed", (loss_fn.__name__, rep.validation)
        assert rep.lowered.training["unused"] == [], loss_fn.__name__
        assert rep.training["phases"]["backward"]["operators"] > 0
    # the checkpointed tanh is computed again in the backward (its recompute is counted
    # there): the forward's product once, again in the backward, plus the two gradients
    rep = solbound.analyze(_step_of(custom_and_remat, tx),
                           (cases[1][1], tx.init(cases[1][1]), cases[1][2]),
                           train=True)
    ph = rep.training["phases"]
    assert ph["forward"]["macs"] == 3 * 4 * 4 + 3 * 4
    assert ph["backward"]["macs"] == 3 * 4 * 4 + 4 * 4 * 3


def test_a_step_without_gradient_and_a_parameter_without_one():
    with pytest.raises(FrontendError, match="no gradient"):
        solbound.analyze(lambda p, s, x: (p * x, s), (S((3,), F32), S((3,), F32),
                                                    S((3,), F32)), train=True)
    with pytest.raises(FrontendError, match="step\\(params, opt_state"):
        solbound.analyze(lambda p: p, (S((3,), F32),), train=True)

    def loss_fn(p, x):                       # "b" is not used by the loss
        return jnp.sum(x @ p["w"])
    tx = optax.sgd(0.1)
    params = {"w": S((3, 2), F32), "b": S((2,), F32)}
    rep = solbound.analyze(_step_of(loss_fn, tx), (params, tx.init(params), S((4, 3), F32)),
                           train=True)
    tr = rep.lowered.training
    assert list(tr["gradients"]) == ["w"] and tr["unused"] == ["b"]
    assert any("does not depend on b" in n for n in rep.program.notes)
    # the cotangent seed (a broadcast of 1.0 that carries no name) is the backward's
    assert [g["phase"] for g in rep.lowered.groups.values()] == \
        ["forward"] * 2 + ["backward"] * 3 + ["optimizer"] * 5


STEP_FILE = '''
import jax, jax.numpy as jnp, optax
S = jax.ShapeDtypeStruct
tx = optax.sgd(0.1)
def loss_fn(p, b):
    x, y = b
    return jnp.mean((x @ p["w"] - y) ** 2)
def step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    return loss, optax.apply_updates(params, updates), opt_state
def example():
    params = {"w": S((8, 4), jnp.float32)}
    return step, (params, tx.init(params), (S((3, 8), jnp.float32), S((3, 4), jnp.float32)))
'''


def test_a_file_whose_example_is_a_step_analyzes_with_train(tmp_path):
    f = tmp_path / "step.py"
    f.write_text(STEP_FILE)
    rep = solbound.analyze_source(str(f), train=True)
    d = rep.to_dict()
    # forward: x @ w and the squared error; backward: dW = x^T g
    assert {k: v["macs"] for k, v in d["phases"].items()} == \
        {"forward": 3 * 8 * 4 + 3 * 4, "backward": 8 * 4 * 3, "optimizer": 0}
    assert d["memory"]["parameters"] == d["memory"]["gradients"] == 4 * 32
