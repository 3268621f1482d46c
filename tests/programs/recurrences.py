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


def _fill(x, h, outs):
    for t in range(x.shape[1]):
        h = torch.tanh(x[:, t] + h)
        outs.append(h)
    return h


class CallerList(torch.nn.Module):
    """The rows go to a list the caller made and reads: not a scan (the caller's list)."""

    def forward(self, x, h):
        outs = []
        _fill(x, h, outs)
        return sum(outs)


class ListAfter(torch.nn.Module):
    """The rows used as a list after the loop: not a scan."""

    def forward(self, x, h):
        outs = []
        for t in range(x.shape[1]):
            h = torch.tanh(x[:, t] + h)
            outs.append(h)
        outs.reverse()
        return torch.stack(outs, 1)


class Swap(torch.nn.Module):
    """Carries swapped and one read from the initial value: a scan whose outputs would
    alias its inputs, copied where they would."""

    def forward(self, x, a):
        b = a * 2
        h = a
        for t in range(x.shape[1]):
            a, b = b, a + x[:, t] + h * 0.5
        return a + b


class LoopBack(torch.nn.Module):
    """A name private to the inner loop read at the top of the outer loop's next pass."""

    def forward(self, x, h):
        z = h
        for layer in range(2):
            h = h + z * layer
            for t in range(x.shape[1]):
                z = x[:, t] * 2
                h = torch.tanh(z + h)
        return h


class Private(torch.nn.Module):
    """A private (mangled) attribute read in a method with a loop."""

    def __init__(self):
        super().__init__()
        self.__w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x, h):
        w = self.__w
        for t in range(x.shape[1]):
            h = torch.tanh(x[:, t] @ w + h)
        return h


class ZerosLgamma(torch.nn.Module):
    """A zero initial state and a body operator no rule lowers."""

    def forward(self, x):
        h = torch.zeros(x.shape[0], x.shape[2])
        for t in range(x.shape[1]):
            h = torch.lgamma(x[:, t].abs() + 1) + h
        return h


class Layered(torch.nn.Module):
    """A time loop inside a loop over layers, in one function: the inner loop is a scan
    (its variable is bound again by the next pass, nothing private is read there)."""

    def forward(self, x, h):
        for layer in range(2):
            outs = []
            for t in range(x.shape[1]):
                h = torch.tanh(x[:, t] + h * (layer + 1))
                outs.append(h)
            x = torch.stack(outs, 1)
        return x
