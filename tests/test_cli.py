"""The command line: inputs, JSON schema, determinism, error paths."""

import json
import os
import subprocess
import sys

import pytest

from solbound.cli import main

HERE = os.path.dirname(__file__)
PROG = os.path.join(HERE, "programs")


def test_analyze_json_schema_and_determinism(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    src = os.path.join(PROG, "small_convnet.py")
    assert main(["analyze", src, "--arch", "h100-sxm,b200", "--json", str(a), "-q"]) == 0
    assert main(["analyze", src, "--arch", "h100-sxm,b200", "--json", str(b), "-q"]) == 0
    assert a.read_bytes() == b.read_bytes()
    d = json.loads(a.read_text())
    assert d["schema"] == "solbound.report/1"
    t = d["totals"]
    assert set(t["flops_by_unit"]) == {"matrix", "vector", "special"}
    assert t["flops"] == sum(t["flops_by_unit"].values())
    assert t["bytes"]["unfused"] > t["bytes"]["fused"] > 0
    assert {(x["arch"], x["mode"]) for x in d["bounds"]} == {
        (a, m) for a in ("h100-sxm", "b200") for m in ("unfused", "fused", "cache-aware")}
    for x in d["bounds"]:
        assert x["seconds"] == max(x["compute_seconds"], x["memory_seconds"])
        assert x["bound"] in ("compute", "memory") and x["peaks"] and x["bandwidth"] > 0
    assert d["unsupported"] == []
    # training mode: batch norm updates its running buffers, which are written
    assert any("bn_running" in k for op in d["kernels"] for k in op["writes"]) or \
        any(k["name"].startswith("k__native_batch_norm") for k in d["kernels"])


def test_factory_entry_point(capsys):
    sys.path.insert(0, HERE)
    try:
        assert main(["analyze", "programs.factory:build", "--arch", "a100-sxm", "--json", "-", "-q"]) == 0
    finally:
        sys.path.remove(HERE)
    d = json.loads(capsys.readouterr().out)
    assert d["totals"]["macs"] == 8 * 16 * 32 + 8 * 32 * 4


@pytest.mark.parametrize("name,needle", [
    ("no_model.py", "lacks Model"),
    ("bad_import.py", "does not import"),
    ("trace_fails.py", "data-dependent control flow or size at trace_fails.py:7 (if x.sum() > 0:"),
    ("missing_file.py", "no such file"),
    ("data_size.py", "aten.slice.Tensor at data_size.py:12 has a size that depends on tensor values"),
])
def test_bad_inputs_exit_nonzero_with_one_line(name, needle):
    r = subprocess.run([sys.executable, "-m", "solbound.cli", "analyze", os.path.join(PROG, name), "-q"],
                       capture_output=True, text=True)
    assert r.returncode == 2
    lines = [x for x in r.stderr.strip().splitlines() if x.startswith("solbound:")]
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert name.split(".")[0] in lines[0]
    assert len(r.stderr.strip().splitlines()) <= 3, r.stderr     # no torch internals


def test_unsupported_operator_is_listed_with_its_line(tmp_path):
    out = tmp_path / "r.json"
    assert main(["analyze", os.path.join(PROG, "unsupported_op.py"), "--json", str(out), "-q"]) == 0
    d = json.loads(out.read_text())
    assert d["unsupported"], "lgamma must be reported"
    u = d["unsupported"][0]
    assert "lgamma" in u["operator"] and u["source"] == "unsupported_op.py:8"
    # the rest is still counted: relu (8*4) and the +1 (8*4 elements)
    assert d["totals"]["flops_by_unit"]["vector"] >= 64
    assert any("not counted" in n for n in d["notes"])


def test_ir_command_writes_parseable_text(tmp_path):
    from solbound.ir.text import parse_program
    out = tmp_path / "p.ir"
    assert main(["ir", os.path.join(PROG, "small_convnet.py"), "-o", str(out)]) == 0
    p = parse_program(out.read_text())
    assert any(k.unit == "conv" for k in p.kernels)


def test_unknown_arch_is_an_error(capsys):
    assert main(["analyze", os.path.join(PROG, "small_convnet.py"), "--arch", "h900", "-q"]) == 2
    assert "unknown arch 'h900'" in capsys.readouterr().err


def test_explain_shows_formula(capsys):
    assert main(["explain", os.path.join(PROG, "small_convnet.py"), "conv2d"]) == 0
    out = capsys.readouterr().out
    assert "|I|" in out and "tensor_tf32" in out and "einsum" in out


def test_catalog_has_the_required_chips_with_sources():
    from solbound.hardware.catalog import catalog
    need = {"h100-sxm", "h100-pcie", "h200", "b200", "a100-sxm", "a6000", "l40s", "rtx-4090",
            "jetson-thor", "jetson-orin", "mi300x", "tpu-v5e"}
    cat = catalog()
    assert need <= set(cat)
    for s in cat.values():
        assert s.bandwidth > 0 and s.source("dram.bandwidth")
        for k in s.peaks:
            assert s.source(k), (s.id, k)


def test_strict_exits_3_when_work_is_uncounted(capsys):
    assert main(["analyze", os.path.join(PROG, "unsupported_op.py"), "-q", "--strict"]) == 3
    assert "left uncounted" in capsys.readouterr().err
    assert main(["analyze", os.path.join(PROG, "small_convnet.py"), "-q", "--strict"]) == 0


def test_an_internal_failure_is_named_as_a_bug_with_its_own_exit_code(monkeypatch, capsys):
    import solbound.api

    def broken(*a, **k):
        raise ValueError("something inside went wrong")
    monkeypatch.setattr(solbound.api, "analyze_source", broken)
    assert main(["analyze", os.path.join(PROG, "small_convnet.py"), "-q"]) == 70
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "internal error (a bug in solbound" in err[0]
    with pytest.raises(ValueError):
        main(["--debug", "analyze", os.path.join(PROG, "small_convnet.py"), "-q"])


def test_explain_an_operator_shows_all_its_kernels(capsys):
    src = os.path.join(HERE, "..", "examples", "mlp_block.py")
    assert main(["explain", src, "linear"]) == 0
    out = capsys.readouterr().out
    # linear = a matmul kernel and its bias add, and the operator's total
    assert out.count("einsum") == 2 and "operator linear (aten.linear, up," in out
    assert main(["explain", src, "nope"]) == 2


def test_quiet_output_is_the_answer_alone_for_a_transformers_model():
    """With -q a transformers program prints its one line and nothing else: no import-time
    warnings of the libraries it pulls in (torchao's kernels built for another Python,
    torch's pytree deprecations), which say nothing about the program."""
    r = subprocess.run([sys.executable, "-m", "solbound", "analyze", "tiny_llama_tp.py",
                        "--arch", "h100-sxm", "-q"], capture_output=True, text=True, cwd=PROG)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert r.stdout.startswith("tiny_llama_tp.py: ") and r.stdout.count("\n") == 1
