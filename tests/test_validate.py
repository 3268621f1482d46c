"""Validation: golden comparison, first divergent kernel, reduced shapes, `validate --ir`."""

import os

import torch
import torch.nn as nn

import solbound
from helpers import Fn, r
import solbound.frontends.torch.rules  # noqa: F401  (registers the rules)
from solbound.frontends.torch.lower import RULES
from solbound.ir.text import print_program

PROG = os.path.join(os.path.dirname(__file__), "programs")


def test_validate_passes_and_reports_shapes_and_errors():
    rep = solbound.analyze_source(os.path.join(PROG, "small_convnet.py"), validate=True)
    v = rep.validation
    assert v["status"] == "passed" and v["reduced"] is False
    assert v["shapes"] == {"x": [4, 3, 16, 16]}
    assert all(o["worst_rel_error"] is not None and o["worst_rel_error"] <= v["tolerance"]
               for o in v["outputs"])
    # training mode: the running-stat buffer writes are compared too
    assert any(o["kind"] == "buffer_mutation" for o in v["outputs"])


def _break_sigmoid(monkeypatch):
    """A deliberately wrong rule: sigmoid lowered as tanh."""
    good = RULES["aten.sigmoid"]

    def bad(ctx):
        from solbound.frontends.torch.rules._util import elementwise, f
        ctx.bind(elementwise(ctx, lambda a: f("tanh", a), [ctx.args[0]]))
    bad.rule_id = good.rule_id
    monkeypatch.setitem(RULES, "aten.sigmoid", bad)


def test_wrong_rule_is_diagnosed_with_kernel_and_source(monkeypatch):
    _break_sigmoid(monkeypatch)
    m = Fn(lambda s, x: torch.sigmoid(s.l(x)) * 2)
    m.l = nn.Linear(4, 6)
    rep = solbound.analyze(m, (r(3, 4),), validate=True)
    v = rep.validation
    assert v["status"] == "failed"
    fd = v["first_divergence"]
    assert fd["operator"] == "aten.sigmoid.default" and fd["kernel"].startswith("k_sigmoid")
    assert fd["source"] == "helpers.py:17"
    # the float64 re-check ran and did not excuse it: a wrong rule does not shrink
    chk = [o["f64_check"] for o in v["outputs"] if "f64_check" in o]
    assert chk and all(c["ran"] for c in chk) and not any(o["ok"] for o in v["outputs"])
    assert chk[0]["f64_max_abs_diff"] > 0.1 * chk[0]["f32_max_abs_diff"]


def test_divergence_skips_tensors_computed_only_where_read(monkeypatch):
    # the product is computed only on its lower triangle (what tril reads): comparing it
    # whole with PyTorch's full product would blame the matmul for a broken sigmoid
    _break_sigmoid(monkeypatch)
    rep = solbound.analyze(Fn(lambda s, a, b: torch.sigmoid(torch.tril(a @ b))),
                           (r(5, 4), r(4, 5)), validate=True)
    assert rep.lowered.partial and rep.validation["status"] == "failed"
    assert rep.validation["first_divergence"]["operator"] == "aten.sigmoid.default"


def test_divergence_replays_random_draws(monkeypatch):
    # dropout's mask is replayed in the diagnosis too: the broken sigmoid after it is named
    _break_sigmoid(monkeypatch)
    m = Fn(lambda s, x: torch.sigmoid(s.d(x)), d=nn.Dropout(0.5))
    v = solbound.analyze(m, (r(6, 7),), validate=True).validation
    assert v["status"] == "failed" and "replayed" in v["reference"]
    assert v["first_divergence"]["operator"] == "aten.sigmoid.default"


def test_ill_conditioned_output_passes_on_float64_recheck():
    # the second batch norm's batch mean is zero by construction (its input is a bias-free
    # linear map of normalized values, with no affine part that validation could redraw):
    # PyTorch's fp32 running mean is rounding noise, so no relative tolerance accepts the
    # IR's; in float64 the difference vanishes
    torch.manual_seed(0)
    m = nn.Sequential(nn.BatchNorm1d(16, affine=False), nn.Linear(16, 16, bias=False),
                      nn.BatchNorm1d(16))
    v = solbound.analyze(m, (r(2048, 16) * 3 + 5,), validate=True).validation
    assert v["status"] == "passed"
    (o,) = [o for o in v["outputs"] if "f64_check" in o]
    assert o["output"] == "2.running_mean" and o["worst_rel_error"] > v["tolerance"]
    c = o["f64_check"]
    assert c["ran"] and c["f64_max_abs_diff"] <= 1e-3 * c["f32_max_abs_diff"]
    assert "rounding" in v["summary"]


def test_reduced_shapes_when_over_budget():
    rep = solbound.analyze_source(os.path.join(PROG, "big_batch.py"), validate=True,
                                  max_bytes=200_000)
    v = rep.validation
    assert v["status"] == "passed" and v["reduced"] is True
    assert "batch_size=512->" in v["reduced_by"]
    assert v["shapes"]["x"][0] < 512 and v["shapes"]["x"][1] == 48


def test_skipped_when_nothing_can_shrink():
    rep = solbound.analyze_source(os.path.join(PROG, "no_sizes.py"), validate=True,
                                  max_bytes=10_000)
    v = rep.validation
    assert v["status"] == "skipped" and "no reduced instance" in v["reason"]


def test_bf16_program_runs_wide_with_a_bf16_tolerance():
    m = Fn(lambda s, x: torch.softmax(s.l(x), -1))
    m.l = nn.Linear(16, 24).to(torch.bfloat16)
    rep = solbound.analyze(m, (r(5, 16).to(torch.bfloat16),), validate=True)
    v = rep.validation
    assert v["status"] == "passed", v
    assert "eps(bf16)" in v["tolerance_rule"] and v["tolerance"] > 1e-3


def test_a_half_precision_intermediate_sets_the_tolerance_and_a_wrong_rule_still_fails(monkeypatch):
    """The reference rounds every value it stores in float16; the IR runs wide. A float32
    output computed through a float16 intermediate differs by float16 roundings (it
    'failed' at float32's tolerance), and a wrong rule still fails at float16's."""
    m = Fn(lambda s, x: (x.half() @ x.half().t() + 1.3).float() * 2)
    rep = solbound.analyze(m, (r(4, 8),), validate=True)
    v = rep.validation
    assert v["status"] == "passed", v
    assert "eps(f16)" in v["tolerance_rule"]
    _break_sigmoid(monkeypatch)
    m = Fn(lambda s, x: torch.sigmoid(x.half() * 2).float())
    assert solbound.analyze(m, (r(4, 8),), validate=True).validation["status"] == "failed"


def _cli(*args):
    """The command line in this process (``solbound.cli.main``): its exit code and what it
    wrote to stderr (tests/test_cli.py runs the installed command itself)."""
    import contextlib
    import io
    from types import SimpleNamespace
    from solbound.cli import main
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(list(args))
        except SystemExit as e:
            code = e.code
    return SimpleNamespace(returncode=code, stderr=err.getvalue(), stdout=out.getvalue())


def test_validate_ir_exit_codes(tmp_path):
    src = os.path.join(PROG, "small_convnet.py")
    rep = solbound.analyze_source(src)
    good = tmp_path / "good.ir"
    good.write_text(print_program(rep.program))
    assert _cli("validate", src, "--ir", str(good)).returncode == 0
    bad = tmp_path / "bad.ir"
    bad.write_text(good.read_text().replace("exp(", "exp2("))
    res = _cli("validate", src, "--ir", str(bad))
    assert res.returncode == 1
    assert "first divergent kernel: k__softmax" in res.stderr
    invalid = tmp_path / "invalid.ir"
    invalid.write_text("import os\n")
    res = _cli("validate", src, "--ir", str(invalid))
    assert res.returncode == 2 and "line 1" in res.stderr


def test_validate_ir_written_by_hand(tmp_path):
    """An IR written outside solbound, with its own names, matched by role and order."""
    src = tmp_path / "relu2.py"
    src.write_text("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
                   "    def forward(self, x):\n        return torch.relu(x) * 2\n\n"
                   "def get_inputs():\n    return [torch.randn(3, 5)]\n\n"
                   "def get_init_inputs():\n    return []\n")
    ir = tmp_path / "relu2.ir"
    ir.write_text("# solbound IR v1\na = input(f32[3, 5])\nb = output(f32[3, 5])\n\n"
                  "@kernel(i=3, j=5)\ndef twice_relu():\n    b[i, j] = maximum(a[i, j], 0.0) * 2.0\n")
    assert _cli("validate", str(src), "--ir", str(ir)).returncode == 0
    ir.write_text(ir.read_text().replace("* 2.0", "* 3.0"))
    assert _cli("validate", str(src), "--ir", str(ir)).returncode == 1


def test_over_budget_inputs_are_cut_down_when_no_constant_holds_the_size():
    # the sizes live only in the caller's tensors: the batch is halved until it fits
    import torch
    import torch.nn as nn
    import solbound
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    rep = solbound.analyze(m, (torch.randn(512, 64),), validate=True, max_bytes=200_000)
    v = rep.validation
    assert v["status"] == "passed" and v["reduced"], v
    assert v["reduced_by"].startswith("inputs dim 0: 512->") and "reduced shapes" in v["summary"]


def test_literal_sizes_in_get_inputs_and_init_are_reduced_together():
    import os
    import solbound
    path = os.path.join(os.path.dirname(__file__), "programs", "literal_sizes.py")
    rep = solbound.analyze_source(path, validate=True, max_seconds=5, max_bytes=2**28)
    v = rep.validation
    assert v["status"] == "passed" and v["reduced"], v
    assert "get_init_inputs 2048->" in v["reduced_by"]


def test_init_defaults_are_reduced_with_the_inputs():
    import os
    import solbound
    path = os.path.join(os.path.dirname(__file__), "programs", "init_defaults.py")
    rep = solbound.analyze_source(path, validate=True, max_seconds=5, max_bytes=2**26)
    v = rep.validation
    assert v["status"] == "passed" and v["reduced"], v
    assert "dim=1024->" in v["reduced_by"] and "hidden=2048->" in v["reduced_by"]
