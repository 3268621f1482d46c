"""The tensor-parallel MLP of tp_mlp.py in JAX: one shard_map over a mesh of 8 devices
(an AbstractMesh: no devices needed to analyze it), the hidden layer split by columns,
the output layer by rows, one psum.

    solbound analyze examples/parallel/jax_tp_mlp.py --arch h100-sxm
"""

import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh, PartitionSpec as P

TOKENS, HIDDEN, FFN, DEVICES = 16, 4096, 16384, 8


def example():
    mesh = AbstractMesh((DEVICES,), ("tp",))

    def mlp(x, up, down):
        def rank(x, up, down):                       # one device's program
            return jax.lax.psum(jax.nn.gelu(x @ up) @ down, "tp")
        return jax.shard_map(rank, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)),
                             out_specs=P())(x, up, down)
    args = (jax.ShapeDtypeStruct((TOKENS, HIDDEN), jnp.bfloat16),
            jax.ShapeDtypeStruct((HIDDEN, FFN), jnp.bfloat16),
            jax.ShapeDtypeStruct((FFN, HIDDEN), jnp.bfloat16))
    return mlp, args
