"""A tensor-parallel MLP written per rank, Megatron style: the first linear is split by
columns (each rank computes F/N of the hidden features), the second by rows (each rank
contracts its F/N features), and one all-reduce sums the ranks' partial outputs.

    solbound analyze examples/parallel/tp_mlp.py --world-size 8 --arch h100-sxm
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

TOKENS, HIDDEN, FFN = 16, 4096, 16384


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        hidden, ffn = HIDDEN, FFN
        n = dist.get_world_size() if dist.is_initialized() else 1
        if ffn % n:
            raise ValueError(f"ffn {ffn} does not split over {n} ranks")
        self.up = torch.nn.Parameter(torch.randn(ffn // n, hidden, dtype=torch.bfloat16))    # column shard
        self.down = torch.nn.Parameter(torch.randn(hidden, ffn // n, dtype=torch.bfloat16))  # row shard

    def forward(self, x):
        y = F.linear(F.gelu(F.linear(x, self.up)), self.down)    # this rank's partial sum
        dist.all_reduce(y)
        return y


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
