"""A module:factory entry point for `solbound analyze tests.programs.factory:build`."""
import torch
import torch.nn as nn


def build():
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)), (torch.randn(8, 16),)
