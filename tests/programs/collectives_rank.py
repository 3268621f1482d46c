"""A per-rank program with every collective PyTorch's c10d offers (sizes per rank):
a column-parallel projection, its all-gather, a reduce-scatter, an all-to-all with equal
splits and a functional all-reduce."""
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

ROWS, COLS = 8, 16


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.n = dist.get_world_size()
        self.w = torch.nn.Parameter(torch.randn(COLS, COLS))

    def forward(self, x):
        y = x @ self.w                                    # (ROWS, COLS)
        gathered = torch.empty(self.n * ROWS, COLS)
        dist.all_gather_into_tensor(gathered, y)          # (n*ROWS, COLS)
        part = torch.empty(ROWS // self.n, COLS)
        dist.reduce_scatter_tensor(part, y)               # (ROWS/n, COLS)
        swapped = torch.empty_like(y)
        dist.all_to_all_single(swapped, y)                # (ROWS, COLS)
        total = funcol.all_reduce(y * 2.0, "sum", dist.group.WORLD)
        return gathered, part, swapped, total


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
