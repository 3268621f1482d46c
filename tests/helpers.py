"""Shared helpers for the tests: analyze a callable on small inputs."""

import torch
import torch.nn as nn

import solbound


class Fn(nn.Module):
    def __init__(self, fn, **mods):
        super().__init__()
        self.fn = fn
        for k, v in mods.items():
            setattr(self, k, v)

    def forward(self, *xs):
        return self.fn(self, *xs)


def run(fn_or_module, *inputs, arch="h100-sxm", policy=None, **mods):
    m = fn_or_module if isinstance(fn_or_module, nn.Module) else Fn(fn_or_module, **mods)
    return solbound.analyze(m, inputs, arch=arch, precision_policy=policy)


def totals(rep):
    t = rep.to_dict()["totals"]
    return (t["macs"], t["flops_by_unit"]["matrix"], t["flops_by_unit"]["vector"],
            t["flops_by_unit"]["special"], t["bytes"]["unfused"], t["bytes"]["fused"])


def r(*shape):
    return torch.randn(*shape)
