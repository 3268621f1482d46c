"""Closed-form roofline bounds for a matmul, a conv and an elementwise chain on two chips."""

import math

import pytest
import torch
import torch.nn as nn

from helpers import run
from solbound.bounds.roofline import Policy, PolicyError

CHIPS = {  # (vector fp32, tf32 tensor, bf16 tensor, DRAM B/s) from the catalog; the H100's
    # tensor rates are printed at 1830 MHz and its SMs boost to 1980 MHz (the default clock)
    "h100-sxm": (66.9e12, 494.7e12 * 1980 / 1830, 989.4e12 * 1980 / 1830, 3.35e12),
    "a100-sxm": (19.5e12, 156e12, 312e12, 2.039e12),
}


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, device="meta", dtype=dtype)


@pytest.mark.parametrize("arch", sorted(CHIPS))
def test_matmul_fp32_no_tf32(arch):
    n = 1024
    rep = run(lambda s, a, b: a @ b, meta(n, n), meta(n, n), arch=arch)
    vec, tf32, bf16, bw = CHIPS[arch]
    b = rep.bound(arch, "fused")
    assert b.compute_seconds == pytest.approx(2 * n**3 / vec, rel=1e-12)
    assert b.memory_seconds == pytest.approx(3 * n * n * 4 / bw, rel=1e-12)
    assert b.seconds == b.compute_seconds and b.bound == "compute"
    assert b.intensity == pytest.approx(2 * n**3 / (3 * n * n * 4))


@pytest.mark.parametrize("arch", sorted(CHIPS))
def test_matmul_bf16_tensor_cores_and_tf32_override(arch):
    n = 2048
    vec, tf32, bf16, bw = CHIPS[arch]
    rep = run(lambda s, a, b: a @ b, meta(n, n, dtype=torch.bfloat16),
              meta(n, n, dtype=torch.bfloat16), arch=arch)
    assert rep.bound(arch, "fused").compute_seconds == pytest.approx(2 * n**3 / bf16, rel=1e-12)
    assert rep.bound(arch, "fused").memory_seconds == pytest.approx(3 * n * n * 2 / bw, rel=1e-12)
    rep = run(lambda s, a, b: a @ b, meta(n, n), meta(n, n), arch=arch, policy="matmul=tf32")
    assert rep.bound(arch, "fused").compute_seconds == pytest.approx(2 * n**3 / tf32, rel=1e-12)


@pytest.mark.parametrize("arch", sorted(CHIPS))
def test_conv_uses_tf32_by_default(arch):
    vec, tf32, bf16, bw = CHIPS[arch]
    conv = nn.Conv2d(64, 128, 3, bias=False, device="meta")
    rep = run(lambda s, x: s.c(x), meta(8, 64, 34, 34), arch=arch, c=conv)
    macs = 8 * 128 * 32 * 32 * 64 * 9
    b = rep.bound(arch, "fused")
    assert b.compute_seconds == pytest.approx(2 * macs / tf32, rel=1e-12)
    nbytes = (8 * 64 * 34 * 34 + 128 * 64 * 9 + 8 * 128 * 32 * 32) * 4
    assert b.memory_seconds == pytest.approx(nbytes / bw, rel=1e-12)
    rep = run(lambda s, x: s.c(x), meta(8, 64, 34, 34), arch=arch, c=conv, policy="fp32")
    assert rep.bound(arch, "fused").compute_seconds == pytest.approx(2 * macs / vec, rel=1e-12)


@pytest.mark.parametrize("arch", sorted(CHIPS))
def test_elementwise_chain_memory_bound(arch):
    vec, tf32, bf16, bw = CHIPS[arch]
    n = 1 << 24
    rep = run(lambda s, x: torch.relu(x * 2 + 1), meta(n), arch=arch)
    fused, unfused = rep.bound(arch, "fused"), rep.bound(arch, "unfused")
    assert fused.memory_seconds == pytest.approx(2 * n * 4 / bw, rel=1e-12)
    assert unfused.memory_seconds == pytest.approx(6 * n * 4 / bw, rel=1e-12)
    assert fused.compute_seconds == pytest.approx(3 * n / vec, rel=1e-12)
    assert fused.bound == "memory" and unfused.seconds == pytest.approx(3 * fused.seconds)


def test_unknown_policy_is_an_error():
    with pytest.raises(PolicyError):
        Policy.parse("matmul=int4")
    assert Policy.parse("tf32").fp32 == {"matmul": "tf32", "conv": "tf32", "attention": "tf32"}


def test_chip_without_a_pipe_says_which_substitute():
    rep = run(lambda s, a, b: a @ b, meta(64, 64), meta(64, 64), arch="tpu-v5e")
    notes = rep.bound("tpu-v5e", "fused").notes
    assert any("no vector_fp32 peak" in n for n in notes)
    assert math.isfinite(rep.bound("tpu-v5e", "fused").seconds)


def test_peaks_at_the_chips_highest_clock_by_default_and_at_a_clock_given():
    """The H100 SXM's dense tensor rates are printed at 1830 MHz, its SMs boost to 1980 MHz:
    the default bound scales them up (no kernel beats it); @datasheet keeps them, a sustained
    clock scales every compute peak, DRAM bandwidth stays."""
    n = 2048
    a, c = meta(n, n, dtype=torch.bfloat16), meta(n, n, dtype=torch.bfloat16)
    secs = {}
    for arch in ("h100-sxm", "h100-sxm@datasheet", "h100-sxm@1500MHz"):
        rep = run(lambda s, x, y: x @ y, a, c, arch=arch)
        b = rep.bounds[0]
        secs[arch] = b.compute_seconds
        assert b.memory_seconds == pytest.approx(3 * n * n * 2 / 3.35e12, rel=1e-12, abs=0)
    flops = 2 * n ** 3
    assert secs["h100-sxm"] == pytest.approx(flops / (989.4e12 * 1980 / 1830), rel=1e-12, abs=0)
    assert secs["h100-sxm@datasheet"] == pytest.approx(flops / 989.4e12, rel=1e-12, abs=0)
    assert secs["h100-sxm@1500MHz"] == pytest.approx(flops / (989.4e12 * 1500 / 1830),
                                                      rel=1e-12, abs=0)
    rep = run(lambda s, x, y: x @ y, a, c, arch="h100-sxm")
    assert any("1980 MHz" in x and "1830 MHz" in x for x in rep.bounds[0].notes)


def test_a_clock_on_the_command_line(capsys):
    from solbound.cli import main
    assert main(["analyze", "examples/mlp_block.py", "--arch", "h100-sxm", "--clock", "fast"]) == 2
    assert "clock 'fast': use max, datasheet" in capsys.readouterr().err
    assert main(["analyze", "examples/mlp_block.py", "--arch", "h20", "--clock", "1500"]) == 2
    assert "h20: " in capsys.readouterr().err
