"""Precision follows the program, and work on one physical unit adds up in time.

Peaks (h100-sxm.toml): tensor bf16 989.4e12 and tensor tf32 494.7e12 at 1830 MHz, scaled
to the chip's 1980 MHz boost clock (the default), vector fp32 66.9e12 and vector bf16
133.8e12 FLOP/s at 1980 MHz. Each test derives its FLOPs by hand. Times are compared
relatively only (``abs=0``: pytest.approx's default absolute tolerance of 1e-12 would pass
any two of these picosecond times).
"""

import pytest
import torch
import torch.nn.functional as F

from helpers import run

BF16, TF32 = 989.4e12 * 1980 / 1830, 494.7e12 * 1980 / 1830
VF32, VBF16 = 66.9e12, 133.8e12


def _bound(rep, arch="h100-sxm", mode="fused"):
    return rep.bound(arch, mode)


def test_bf16_sdpa_runs_on_bf16_tensor_cores():
    # the CPU decomposition upcasts q, k, v to fp32; the program's tensors are bf16
    b, h, s, d = 1, 2, 16, 8
    q, k, v = (torch.randn(b, h, s, d, dtype=torch.bfloat16) for _ in range(3))
    rep = run(lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v)
    pairs = s * (s + 1) // 2
    matrix = 2 * (2 * b * h * pairs * d)          # two products, 2 FLOPs per MAC
    assert rep.counts.flops["matrix"] == matrix
    bd = _bound(rep)
    assert "tensor_tf32" not in bd.pipe_seconds
    assert bd.pipe_seconds["tensor_bf16"] == pytest.approx(matrix / BF16, rel=1e-12, abs=0)


def test_fp32_sdpa_stays_on_tf32():
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    rep = run(lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v), q, k, v)
    assert set(p for p in _bound(rep).pipe_seconds if p.startswith("tensor")) == {"tensor_tf32"}


def test_tf32_and_bf16_on_the_tensor_cores_add():
    # an fp32 conv (TF32 by PyTorch's default) and a bf16 matmul share the tensor cores
    x, w = torch.randn(1, 2, 6, 6), torch.randn(3, 2, 3, 3)
    a, b = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(8, 4, dtype=torch.bfloat16)
    rep = run(lambda m, x, w, a, b: (F.conv2d(x, w), a @ b), x, w, a, b)
    conv = 2 * (3 * 4 * 4 * 2 * 9)               # 3 out channels, 4x4 outputs, 2x3x3 taps
    mm = 2 * (4 * 4 * 8)
    bd = _bound(rep)
    expect = conv / TF32 + mm / BF16
    assert bd.unit_seconds["tensor"] == pytest.approx(expect, rel=1e-12, abs=0)
    assert bd.compute_seconds == pytest.approx(expect, rel=1e-12, abs=0)
    assert bd.binding_unit == "tensor"


def test_different_units_overlap():
    # fp32 matmul on the FP32 vector pipe (default policy), bf16 matmul on tensor cores
    a, b = torch.randn(4, 8), torch.randn(8, 4)
    c, d = a.bfloat16(), b.bfloat16()
    rep = run(lambda m, a, b, c, d: (a @ b, c @ d), a, b, c, d)
    bd = _bound(rep)
    flops = 2 * 4 * 4 * 8
    assert bd.unit_seconds == pytest.approx({"vector": flops / VF32, "tensor": flops / BF16}, rel=1e-12, abs=0)
    assert bd.compute_seconds == pytest.approx(flops / VF32, rel=1e-12, abs=0)


def test_fp32_and_bf16_vector_work_add():
    x, y = torch.randn(10), torch.randn(10, dtype=torch.bfloat16)
    rep = run(lambda m, x, y: (x * 2, y * 2), x, y)
    bd = _bound(rep)
    assert bd.unit_seconds["vector"] == pytest.approx(10 / VF32 + 10 / VBF16, rel=1e-12, abs=0)


def test_every_catalog_chip_maps_every_pipe_to_a_unit():
    from solbound.hardware.catalog import catalog
    for spec in catalog().values():
        for pipe in spec.peaks:
            unit = spec.unit_of(pipe)
            assert unit in ("tensor", "vector", "fp64", "sfu"), (spec.id, pipe, unit)
            if pipe.startswith("tensor_"):
                assert unit == "tensor"
    # AMD CDNA3: transcendentals and FP64 vector math issue on the vector ALUs
    mi = catalog()["mi300x"]
    assert mi.unit_of("sfu") == mi.unit_of("vector_fp64") == mi.unit_of("vector_fp32") == "vector"
