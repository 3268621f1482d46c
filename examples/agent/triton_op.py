"""A PyTorch program whose operator is a Triton kernel (``torch.library.triton_op``).
torch.export keeps the operator whole; the agent writes its IR, which is checked against
the kernel run by Triton's interpreter on the CPU (``pip install triton``)."""

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton


@triton.jit
def _scaled_residual(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * y + x, mask=mask)


@triton_op("solbound_examples::scaled_residual", mutates_args={})
def scaled_residual(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    wrap_triton(_scaled_residual)[(triton.cdiv(n, 64),)](x, y, out, n, BLOCK=64)
    return out


class Model(torch.nn.Module):
    def forward(self, x, y):
        return torch.ops.solbound_examples.scaled_residual(x, y) * 2.0


def get_inputs():
    return [torch.randn(8, 32), torch.randn(8, 32)]


def get_init_inputs():
    return []
