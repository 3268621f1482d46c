"""A small conv net in KernelBench's file convention (written for these tests)."""
import torch
import torch.nn as nn

batch_size = 4
channels = 3
size = 16


class Model(nn.Module):
    def __init__(self, channels: int, classes: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, classes)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        x = torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
        return torch.softmax(self.fc(x), dim=-1)


def get_inputs():
    return [torch.randn(batch_size, channels, size, size)]


def get_init_inputs():
    return [channels, 10]
