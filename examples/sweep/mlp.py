"""A transformer MLP block whose sizes are parameters: `solbound analyze examples/sweep/mlp.py
--param batch=8` replaces the module-level constants below; `solbound sweep
examples/sweep/mlp.toml` runs the grid."""

import torch
import torch.nn as nn

batch = 8          # tokens
width = 1024       # model width
dtype = "bfloat16"


class Model(nn.Module):
    def __init__(self, width, dtype):
        super().__init__()
        dt = getattr(torch, dtype)
        self.up = nn.Linear(width, 4 * width, bias=False, dtype=dt)
        self.down = nn.Linear(4 * width, width, bias=False, dtype=dt)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


def get_init_inputs():
    return [width, dtype]


def get_inputs():
    return [torch.randn(batch, width, dtype=getattr(torch, dtype))]
