"""Product of upper-triangular matrices in KernelBench's file convention (written for
these tests): get_inputs states the structure by building the inputs with torch.triu."""
import torch
import torch.nn as nn

N = 12


class Model(nn.Module):
    def forward(self, A, B):
        return torch.triu(torch.matmul(A, B))


def get_inputs():
    return [torch.triu(torch.rand(N, N)), torch.triu(torch.rand(N, N))]


def get_init_inputs():
    return []
