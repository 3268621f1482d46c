"""A JAX program that calls opaque Python (pure_callback); the agent writes its IR."""

import jax
import jax.numpy as jnp
import numpy as np


def host_softplus(x):
    return np.log1p(np.exp(x))


def f(x, w):
    h = x @ w
    y = jax.pure_callback(host_softplus, jax.ShapeDtypeStruct(h.shape, h.dtype), h)
    return y * 2.0


def example():
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    return f, (jax.random.normal(k1, (4, 8)), jax.random.normal(k2, (8, 16)))
