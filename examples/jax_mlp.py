"""A JAX program in solbound's convention: ``example()`` returns ``(function, args)``, the
arguments as ``jax.ShapeDtypeStruct`` pytrees (nothing is allocated).

    solbound analyze examples/jax_mlp.py --validate
"""
import jax
import jax.numpy as jnp

D, F, T = 512, 2048, 128


def mlp(params, x):
    h = jax.nn.gelu(x @ params["w_in"] + params["b_in"], approximate=False)
    return x + h @ params["w_out"]


def example():
    s = jax.ShapeDtypeStruct
    params = {"w_in": s((D, F), jnp.float32), "b_in": s((F,), jnp.float32),
              "w_out": s((F, D), jnp.float32)}
    return mlp, (params, s((T, D), jnp.float32))
