"""A size that depends on tensor values (written for these tests): exports with an unbacked
size, which the analysis reports in one line."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, k):
        n = k.item()
        torch._check(n >= 1)
        torch._check(n <= x.shape[0])
        return x[:n] * 2


def get_inputs():
    return [torch.randn(8, 4), torch.tensor(3)]


def get_init_inputs():
    return []
