"""A training step: a two-layer MLP regressor with a mean-squared-error loss, trained by
AdamW (``make_optimizer``). ``solbound analyze examples/train_mlp.py --train``."""

import torch
import torch.nn as nn

BATCH, D_IN, D_HIDDEN, D_OUT = 64, 256, 1024, 16


class Model(nn.Module):
    def __init__(self, d_in=D_IN, d_hidden=D_HIDDEN, d_out=D_OUT):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x, target):
        y = self.fc2(torch.relu(self.fc1(x)))
        return nn.functional.mse_loss(y, target)


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)


def get_inputs():
    return [torch.randn(BATCH, D_IN), torch.randn(BATCH, D_OUT)]


def get_init_inputs():
    return []
