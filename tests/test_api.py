"""The Python API and CLI polish: inputs, names, errors a user sees."""

import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import solbound


def test_bare_tensor_input_case_insensitive_chip_and_short_repr():
    rep = solbound.analyze(nn.Linear(4, 3), torch.randn(2, 4), arch="H100-SXM")
    assert rep.counts.macs == 2 * 4 * 3
    assert rep.bound("H100-sxm").mode == "fused"
    r = repr(rep)
    assert len(r) < 200 and "24 MACs" in r and "h100-sxm" in r


def test_unknown_bound_lists_what_exists():
    rep = solbound.analyze(nn.Linear(4, 3), (torch.randn(2, 4),), arch="h100-sxm")
    with pytest.raises(KeyError, match="h100-sxm/fused, h100-sxm/unfused"):
        rep.bound("h100", "fused")


class _MadeInForward(nn.Module):
    """Tensors made in forward without a device (very common in real models)."""

    def __init__(self):
        super().__init__()
        self.l = nn.Linear(8, 8)

    def forward(self, x):
        pos = torch.arange(x.shape[1])
        return self.l(x) + pos[None, :, None] + torch.ones(x.shape[1])[None, :, None] \
            + torch.zeros(x.shape[0], 8)[:, None, :]


def test_tensors_made_in_forward_follow_a_meta_model():
    with torch.device("meta"):
        m, x = _MadeInForward(), torch.randn(2, 5, 8)
    rep = solbound.analyze(m, (x,))
    assert rep.counts.macs == 2 * 5 * 8 * 8 and rep.lowered.unsupported == []


def test_version_and_python_m():
    out = subprocess.run([sys.executable, "-m", "solbound", "--version"], capture_output=True,
                         text=True)
    assert out.returncode == 0 and out.stdout.strip() == f"solbound {solbound.__version__}"


SIBLING = """import torch, torch.nn as nn
from helper_mod_{tag} import block
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.b = block()
    def forward(self, x):
        return self.b(x)
def get_inputs():
    return [torch.randn(2, 4)]
def get_init_inputs():
    return []
def factory():
    return Model(), get_inputs()
"""


def test_sibling_imports_and_factories_from_the_current_directory(tmp_path):
    tag = tmp_path.name.replace("-", "_")
    (tmp_path / f"helper_mod_{tag}.py").write_text("import torch.nn as nn\n"
                                                     "def block():\n    return nn.Linear(4, 4)\n")
    (tmp_path / f"prog_{tag}.py").write_text(SIBLING.format(tag=tag))
    # a file importing its sibling, run from elsewhere
    r = subprocess.run([sys.executable, "-m", "solbound", "analyze", str(tmp_path / f"prog_{tag}.py"),
                        "-q", "--arch", "h100-sxm"], capture_output=True, text=True, cwd="/")
    assert r.returncode == 0, r.stderr
    # -q: one line, the counts and each chip's fused bound
    assert r.stdout.strip().count("\n") == 0 and "32 MACs" in r.stdout and "h100-sxm" in r.stdout
    # pkg.module:factory from the current directory
    r = subprocess.run([sys.executable, "-m", "solbound", "analyze", f"prog_{tag}:factory", "-q"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and "32 MACs" in r.stdout, r.stderr


def test_user_text_is_not_rich_markup(capsys):
    from rich.console import Console
    rep = solbound.analyze(nn.Linear(4, 3), torch.randn(2, 4), source="zoo:llama:[bold]x")
    console = Console(width=200, force_terminal=False, emoji=False)
    rep.render(console=console)
    out = capsys.readouterr().out
    assert "zoo:llama:[bold]x" in out


def test_validation_statuses_that_prove_nothing_are_not_passes():
    import json

    class ZeroHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(4, 3)
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)

        def forward(self, x):
            return self.head(torch.relu(x))
    # a zero-initialized head: its parameters are redrawn for the check (and put back)
    m = ZeroHead()
    rep = solbound.analyze(m, torch.randn(2, 4), validate=True)
    assert rep.validation["status"] == "passed", rep.validation
    assert rep.validation["redrawn"] == ["head.weight", "head.bias"]
    assert "drawn around it" in rep.validation["summary"] and not torch.any(m.head.weight)

    # an output constant whatever the parameters: inconclusive, never passed
    class ConstantOut(nn.Module):
        def forward(self, x):
            return x * 0 + 1
    rep = solbound.analyze(ConstantOut(), torch.randn(2, 4), validate=True)
    assert rep.validation["status"] == "inconclusive" and "constant" in rep.validation["reason"]
    # an unsupported operator: skipped, with the operator named
    from helpers import Fn
    rep = solbound.analyze(Fn(lambda s, x: torch.lgamma(x.abs() + 1)), torch.randn(8), validate=True)
    assert rep.validation["status"] == "skipped" and "lgamma" in rep.validation["reason"]
    # a meta-device module has no values to run
    with torch.device("meta"):
        m, x = nn.Linear(4, 3), torch.randn(2, 4)
    rep = solbound.analyze(m, x, validate=True)
    assert rep.validation["status"] == "skipped" and "meta" in rep.validation["reason"]
    # the attribute is what the JSON says, validated or not
    rep = solbound.analyze(nn.Linear(4, 3), torch.randn(2, 4))
    assert rep.validation == json.loads(rep.to_json())["validation"] == {"status": "not requested"}


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(8, 8)
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(self.q(x))


class _Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([_Block(), _Block()])
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        for b in self.layers:
            x = b(x)
        return self.head(x).sum()


def test_operators_carry_the_users_module_paths_and_roll_up_per_module():
    import json
    rep = solbound.analyze(_Stack(), torch.randn(4, 8), arch="h100-sxm")
    d = json.loads(rep.to_json())
    mods = {o["module"] for o in d["operators"]}
    assert {"layers.0.q", "layers.1.q", "layers.0.act", "layers.1.act", "head"} <= mods
    top = {r["module"]: r for r in rep.by_module(depth=1)}
    assert set(top) == {"layers", "head", "(top level)"}
    assert top["layers"]["macs"] == 2 * 4 * 8 * 8 and top["head"]["macs"] == 4 * 8 * 2
    assert sum(r["flops"] for r in top.values()) == d["totals"]["flops"]
    assert sum(r["macs"] for r in d["modules"]) == d["totals"]["macs"]
