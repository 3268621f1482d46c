"""A tensor-parallel causal self-attention block written per rank: each rank projects the
input to its HEADS/N heads (column shards of q, k, v), attends, and applies its rows of the
output projection; one all-reduce sums the ranks' partial outputs."""
import torch
import torch.distributed as dist
import torch.nn.functional as F

TOKENS, DIM, HEADS, HEAD_DIM = 16, 64, 8, 8


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        n = dist.get_world_size() if dist.is_initialized() else 1
        self.h = HEADS // n
        self.wq = torch.nn.Parameter(torch.randn(self.h * HEAD_DIM, DIM) / DIM ** 0.5)
        self.wk = torch.nn.Parameter(torch.randn(self.h * HEAD_DIM, DIM) / DIM ** 0.5)
        self.wv = torch.nn.Parameter(torch.randn(self.h * HEAD_DIM, DIM) / DIM ** 0.5)
        self.wo = torch.nn.Parameter(torch.randn(DIM, self.h * HEAD_DIM) / DIM ** 0.5)

    def forward(self, x):                                  # x: (TOKENS, DIM), replicated
        def heads(w):
            return F.linear(x, w).view(TOKENS, self.h, HEAD_DIM).transpose(0, 1)
        o = F.scaled_dot_product_attention(heads(self.wq), heads(self.wk), heads(self.wv),
                                           is_causal=True)
        y = F.linear(o.transpose(0, 1).reshape(TOKENS, self.h * HEAD_DIM), self.wo)
        dist.all_reduce(y)
        return y


def get_inputs():
    return [torch.randn(TOKENS, DIM)]


def get_init_inputs():
    return []
