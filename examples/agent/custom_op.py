"""A PyTorch program with an operator no lowering rule knows: a custom op whose CPU
implementation calls numpy. The agent writes its IR; the rest is traced."""

import torch


@torch.library.custom_op("solbound_test::rms_scale", mutates_args=())
def rms_scale(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS-normalize each row of x and scale it by w (a CPU implementation)."""
    x_np = x.numpy()
    rms = (x_np ** 2).mean(axis=-1, keepdims=True)
    return torch.from_numpy(x_np / (rms + eps) ** 0.5 * w.numpy())


@rms_scale.register_fake
def _(x, w, eps):
    return torch.empty_like(x)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.w = torch.nn.Parameter(torch.ones(16))

    def forward(self, x):
        return self.lin(torch.ops.solbound_test.rms_scale(x, self.w, 1e-6))


def get_inputs():
    return [torch.randn(4, 16)]


def get_init_inputs():
    return []
