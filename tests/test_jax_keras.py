"""Keras 3 models nobody here wrote (keras.applications), on the JAX backend: their
``stateless_call`` is a JAX function of the variables and the input."""

import os

import pytest

os.environ.setdefault("KERAS_BACKEND", "jax")
keras = pytest.importorskip("keras")
jax = pytest.importorskip("jax")
if keras.backend.backend() != "jax":
    pytest.skip("keras runs another backend here", allow_module_level=True)

import jax.numpy as jnp  # noqa: E402

import solbound  # noqa: E402


def _taps(n_in, k, s, padding):
    """(output position, tap) pairs along one dimension that do not land on padding."""
    n_out = (n_in + s - 1) // s if padding == "same" else (n_in - k) // s + 1
    lo = max((n_out - 1) * s + k - n_in, 0) // 2 if padding == "same" else 0
    return sum(1 for o in range(n_out) for t in range(k) if 0 <= o * s + t - lo < n_in)


def _naive_macs(model):
    """Every convolution's valid (position, tap) pairs times its channels, every dense layer."""
    macs = 0
    for layer in model.layers:
        if isinstance(layer, keras.layers.Conv2D):
            kh, kw, cin, cout = layer.kernel.shape
            h, w = layer.input.shape[1:3]
            (sh, sw), pad = layer.strides, layer.padding
            macs += _taps(h, kh, sh, pad) * _taps(w, kw, sw, pad) * cin * cout
        elif isinstance(layer, keras.layers.Dense):
            macs += layer.kernel.shape[0] * layer.kernel.shape[1]
    return macs


def _analyze(model, size):
    def fn(tv, ntv, x):
        return model.stateless_call(tv, ntv, x, training=False)[0]
    args = ([v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables],
            jax.ShapeDtypeStruct((1, size, size, 3), jnp.float32))
    return solbound.analyze(fn, args, validate=True)


def test_keras_vgg16_counts_every_conv_and_dense_layer():
    m = keras.applications.VGG16(weights=None, input_shape=(32, 32, 3), classes=10)
    rep = _analyze(m, 32)
    assert rep.lowered.unsupported == []
    assert rep.validation["status"] == "passed", rep.validation
    assert rep.counts.macs == _naive_macs(m)


@pytest.mark.slow   # 15-28 s; keras' VGG16 test keeps a whole keras convnet in CI (the suite's 10-minute budget)
def test_keras_resnet50_needs_less_than_every_layer_whole():
    # ResNet50 v1 downsamples with stride-2 1x1 convolutions: they read the even positions
    # of the previous block's output, so that block's last convolution is confined to the
    # box those reads span (15 of 16 rows and columns; the demand pass works in boxes)
    m = keras.applications.ResNet50(weights=None, input_shape=(64, 64, 3), classes=10)
    rep = _analyze(m, 64)
    assert rep.lowered.unsupported == []
    assert rep.validation["status"] == "passed", rep.validation
    assert 0.9 * _naive_macs(m) < rep.counts.macs < _naive_macs(m)
