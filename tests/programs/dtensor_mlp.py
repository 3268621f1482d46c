"""An MLP sharded with PyTorch's own tensor parallelism (``parallelize_module`` with
``ColwiseParallel`` and ``RowwiseParallel`` on a 1-D device mesh): DTensor parameters."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

TOKENS, DIM, FFN = 8, 64, 256


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(DIM, FFN)
        self.down = nn.Linear(FFN, DIM)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        self.mlp = parallelize_module(MLP(), mesh, {"up": ColwiseParallel(),
                                                    "down": RowwiseParallel()})

    def forward(self, x):
        return self.mlp(x)


def get_inputs():
    return [torch.randn(TOKENS, DIM)]


def get_init_inputs():
    return []
