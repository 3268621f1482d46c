"""Python loops over steps, written as users write them (tests/test_loops.py)."""

import torch


def selective_scan(A, Bu, C, h):
    """Mamba's recurrence as transformers' slow path writes it: a carry, two tensors
    indexed by the step on their third dimension, one on its second, rows appended."""
    outs = []
    for i in range(A.shape[2]):
        h = A[:, :, i] * h + Bu[:, :, i]
        y = torch.matmul(h, C[:, i, :].unsqueeze(-1))
        outs.append(y[:, :, 0])
    return h, torch.stack(outs, dim=-1) * 2


class Recurrence(torch.nn.Module):
    def forward(self, A, Bu, C, h):
        return selective_scan(A, Bu, C, h)


class Elman(torch.nn.Module):
    """``h = tanh(x_t W + h U)`` over time, rows concatenated (``torch.cat``) and the
    state carried with a second, private name per step."""

    def __init__(self, d=8):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(d, d) / d)
        self.u = torch.nn.Parameter(torch.randn(d, d) / d)

    def forward(self, x):
        h = torch.zeros(x.shape[0], self.w.shape[1])
        rows = []
        for t in range(x.shape[1]):
            pre = x[:, t] @ self.w + h @ self.u
            h = torch.tanh(pre)
            rows.append(h[:, None])
        return torch.cat(rows, dim=1)


class Growing(torch.nn.Module):
    """A carry whose shape changes every step: not a scan, run unrolled (noted)."""

    def forward(self, x):
        y = x
        for i in range(x.shape[0]):
            y = torch.cat([y, x[i][None]], dim=0)
        return y


class StepValue(torch.nn.Module):
    """The step used as a number: not a scan, run unrolled (noted)."""

    def forward(self, x):
        acc = x
        for i in range(4):
            acc = acc * 0.5 + i
        return acc


class ElmanLocal(Elman):
    """The weights read into locals before the loop: the body closes over tensors only,
    so the scan's body is traced directly (no TorchDynamo), the tensors passed in."""

    def forward(self, x):
        w, u = self.w, self.u
        h = torch.zeros(x.shape[0], w.shape[1])
        rows = []
        for t in range(x.shape[1]):
            h = torch.tanh(x[:, t] @ w + h @ u)
            rows.append(h)
        return torch.stack(rows, dim=1)
