import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.RNN(3, 4, bias=False)

    def forward(self, x):
        return self.rnn(x)[0]


def get_inputs():
    return [torch.randn(5, 1, 3)]


def get_init_inputs():
    return []
