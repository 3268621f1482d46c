import torch


class Model(torch.nn.Module):
    def forward(self, x, idx):
        running = torch.cumsum(x, dim=1)          # an inclusive scan along dim 1
        rows = running[idx]                       # rows picked by an index tensor
        return torch.sort(rows, dim=1).values     # a library routine


def get_inputs():
    return [torch.randn(6, 5), torch.tensor([4, 0, 2])]


def get_init_inputs():
    return []
