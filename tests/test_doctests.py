"""The examples in module docstrings are tests too."""

import doctest
import importlib

import pytest

MODULES = ["solbound.ir.affine", "solbound.ir.demand", "solbound.analysis.footprint",
           "solbound.analysis.tiling", "solbound.bounds.fidelity", "solbound.bounds.provision",
           "solbound.bounds.opportunities", "solbound.hardware.catalog", "solbound.ir.reroll",
           "solbound.frontends.torch.stacks", "solbound.sweep.spec", "solbound.sweep.engine",
           "solbound.frontends.loading", "solbound.ir.execute", "solbound.ir.collectives",
           "solbound.bounds.comm", "solbound.frontends.torch.distributed",
           "solbound.frontends.agent.prompt", "solbound.frontends.agent.translate",
           "solbound.frontends.agent.cache", "solbound.frontends.agent.splice",
           "solbound.report.tables", "solbound.report.diff", "solbound.cli"]


@pytest.mark.parametrize("name", MODULES)
def test_module_examples(name):
    res = doctest.testmod(importlib.import_module(name))
    assert res.attempted > 0 and res.failed == 0
