"""A bf16 SwiGLU MLP whose sizes are literals in get_inputs and get_init_inputs (no
module-level constants to shrink): validation over budget cuts both down together."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)
        self.to(torch.bfloat16)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


def get_inputs():
    return [torch.randn(4, 1024, 2048, dtype=torch.bfloat16)]


def get_init_inputs():
    return [2048, 5632]
