"""A small transformer-style MLP block in KernelBench's file convention."""
import torch
import torch.nn as nn

batch, seq, dim, hidden = 8, 128, 512, 2048


class Model(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.up(self.norm(x)))
        return x + self.down(h)


def get_inputs():
    return [torch.randn(batch, seq, dim)]


def get_init_inputs():
    return [dim, hidden]
