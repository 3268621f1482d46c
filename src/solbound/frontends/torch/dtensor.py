"""Modules whose parameters are DTensors (``parallelize_module``, ``distribute_tensor``):
traced below DTensor.

``torch.export`` cannot trace DTensor's dispatch yet (its sharding specs are not graphable
values). ``make_fx`` can: DTensor's ``__torch_dispatch__`` runs its sharding propagation
and issues plain ATen ops on the local shards and functional collectives for each
redistribution, and those are what gets recorded. ``localize`` traces the module's forward
that way over its local shards (on fake tensors), then wraps the recorded graph in a module
whose parameters and buffers are those local shards, which exports like any other module:
the program of one rank, with its collectives.
"""

from __future__ import annotations


def has_dtensors(module) -> bool:
    """Whether ``module`` holds DTensors. Without an initialized process group it cannot,
    and DTensor's module (half a second to import) is not loaded to find that out."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return False
    from torch.distributed.tensor import DTensor
    return any(isinstance(t, DTensor) for t in list(module.parameters()) + list(module.buffers()))


def localize(module, inputs: tuple):
    """``module`` with DTensor parameters or buffers as a module over their local shards
    (rank 0's program; see the module doc). Inputs stay as given (plain tensors)."""
    import torch
    import torch.nn as nn
    from torch.distributed.tensor import DTensor
    from torch.func import functional_call
    from torch.fx.experimental.proxy_tensor import make_fx

    state = dict(module.named_parameters())
    buffers = dict(module.named_buffers())
    specs = {n: (t.device_mesh, t.placements, t.shape, t.stride())
             for n, t in {**state, **buffers}.items() if isinstance(t, DTensor)}
    local = {n: (t.to_local() if isinstance(t, DTensor) else t).detach()
             for n, t in {**state, **buffers}.items()}

    def forward(tensors, *xs):
        full = {n: DTensor.from_local(t, specs[n][0], specs[n][1], run_check=False,
                                      shape=specs[n][2], stride=specs[n][3])
                if n in specs else t for n, t in tensors.items()}
        out = functional_call(module, full, xs)
        # a DTensor result is this rank's shard of it
        return torch.utils._pytree.tree_map(
            lambda v: v.to_local() if isinstance(v, DTensor) else v, out)

    gm = make_fx(forward, tracing_mode="fake")(local, *inputs)
    names = list(local)

    class Local(nn.Module):
        """One rank's program of a DTensor-parallel module (``frontends/torch/dtensor.py``)."""

        def __init__(self):
            super().__init__()
            self.graph_module = gm
            self._names = {n: n.replace(".", "__") for n in names}
            for n, key in self._names.items():
                if n in state:
                    self.register_parameter(key, nn.Parameter(local[n], requires_grad=False))
                else:
                    self.register_buffer(key, local[n])

        def forward(self, *xs):
            return self.graph_module({n: getattr(self, k) for n, k in self._names.items()}, *xs)

    return Local()
