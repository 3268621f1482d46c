import os
import sys

# several CPU devices for JAX (a shard_map program is validated on a mesh of them); set
# before JAX starts, as the CLI does
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def assert_report_serializes(rep) -> None:
    """``rep.to_dict()`` (what ``--json`` writes) through plain ``json.dumps``, with no
    converter: a numpy scalar anywhere in the report fails here, not in a user's
    ``--json`` (whose writer converts them)."""
    import json
    assert json.loads(json.dumps(rep.to_dict(), allow_nan=False))["schema"] == "solbound.report/1"


@pytest.fixture(autouse=True)
def _jax_reports_serialize(monkeypatch):
    """Every report of a JAX program a test analyzes (``solbound.analyze``,
    ``analyze_source``, the CLI: all go through ``analyze_function``, validation included)
    is also serialized to JSON. No analysis runs twice."""
    from solbound.frontends.jax import frontend as api
    real = api.analyze_function

    def checked(*args, **kwargs):
        rep = real(*args, **kwargs)
        assert_report_serializes(rep)
        return rep
    monkeypatch.setattr(api, "analyze_function", checked)


def pytest_collection_modifyitems(config, items):
    """The tests pinned to one worker (``xdist_group``: built once, traced once) first, so
    that ``--dist loadgroup`` starts its longest units while the other worker takes the
    rest, and the run ends on short tests on both workers (in collection order, these
    groups came last and ran alone). Stable: each group keeps its tests' order."""
    items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)
