"""The inverse roofline (provision), the projection across chips and user chip files."""

import json

import pytest
import torch

import solbound
from helpers import Fn
from solbound.bounds.provision import parse_latency, parse_rate, projection, provision
from solbound.cli import main
from solbound.hardware.catalog import SpecError, load_spec, spec_from_file

M, K, N = 64, 1024, 1024


def _matmul():
    return solbound.analyze(Fn(lambda s, x, w: x @ w),
                            (torch.randn(M, K, device="meta"), torch.randn(K, N, device="meta")),
                            arch="h100-sxm,jetson-orin")


def test_provisioning_ratios_are_exact_on_a_matmul():
    rep = _matmul()
    target = parse_latency("1ms")
    doc = provision(rep, target)
    assert doc["schema"] == "solbound.provision/1" and doc["target_seconds"] == 1e-3
    fused_bytes = 4 * (M * K + K * N + M * N)
    flops = 2 * M * K * N                          # fp32 matmul: the FP32 vector pipe
    req = {r["mode"]: r for r in doc["requirements"]}
    assert req["fused"]["bandwidth"] == pytest.approx(fused_bytes / 1e-3, rel=1e-12)
    assert req["fused"]["pipes"] == {"vector_fp32": pytest.approx(flops / 1e-3, rel=1e-12)}
    h100 = load_spec("h100-sxm")
    row = next(c for c in doc["chips"] if c["arch"] == "h100-sxm" and c["mode"] == "fused")
    assert row["factors"]["bandwidth"] == pytest.approx(fused_bytes / h100.bandwidth / 1e-3)
    assert row["factors"]["vector"] == pytest.approx(flops / h100.peak("vector_fp32") / 1e-3)
    assert row["meets"] and row["binding"] == "vector"
    # 1 = just enough: at the chip's own bound the binding factor is exactly 1
    exact = provision(rep, rep.bound("jetson-orin", "fused").seconds)
    orin = next(c for c in exact["chips"] if c["arch"] == "jetson-orin" and c["mode"] == "fused")
    assert orin["shortfall"] == pytest.approx(1.0) and orin["meets"] in (True, False)
    # cache-aware: a larger buffer never needs more bandwidth
    bws = [c["bandwidth"] for c in doc["cache_curve"]]
    assert all(a >= b for a, b in zip(bws, bws[1:]))
    assert doc["cache_curve"][-1]["bytes"] == fused_bytes


def test_rates_and_latencies_parse_with_clear_errors():
    assert parse_rate("500") == pytest.approx(2e-3) and parse_rate("1kHz") == pytest.approx(1e-3)
    assert parse_latency("250us") == pytest.approx(2.5e-4)
    assert main(["provision", "examples/mlp_block.py", "--rate", "fast"]) == 2
    assert main(["provision", "examples/mlp_block.py"]) == 2


def test_projection_gives_fusion_benefit_and_cache_penalty_per_chip():
    rep = _matmul()
    rows = {r["arch"]: r for r in projection(rep)}
    for arch, r in rows.items():
        b = {m: rep.bound(arch, m).seconds for m in ("unfused", "fused", "cache-aware")}
        assert r["fusion_benefit"] == pytest.approx(b["unfused"] / b["fused"])
        assert r["cache_penalty"] == pytest.approx(b["cache-aware"] / b["fused"])
        assert r["cache_penalty"] >= 1.0


GOOD = '''id = "my-chip"
name = "A chip not yet on sale"
vendor = "nvidia"
[dram]
bandwidth = { value = 1.0e12, unit = "B/s", source = "our roadmap" }
[onchip]
l2 = { value = 8388608, unit = "B", source = "our roadmap" }
[peaks]
vector_fp32 = { value = 2.0e13, unit = "FLOP/s", source = "our roadmap" }
tensor_bf16 = { value = 2.0e14, unit = "FLOP/s", source = "our roadmap" }
'''


def test_a_users_chip_file_is_used_and_every_field_is_checked(tmp_path, capsys):
    good = tmp_path / "my.toml"
    good.write_text(GOOD)
    spec = spec_from_file(str(good))
    assert spec.id == "my-chip" and spec.capacity() == 8388608
    out = tmp_path / "p.json"
    assert main(["project", "examples/mlp_block.py", "--arch", "h100-sxm", "--chip-file",
                 str(good), "--json", str(out)]) == 0
    assert [r["arch"] for r in json.loads(out.read_text())["chips"]] == ["h100-sxm", "my-chip"]
    for bad, field in ((GOOD.replace("value = 1.0e12", "value = -5"), "dram.bandwidth"),
                       (GOOD.replace("tensor_bf16", "tensor_bf17"), "peaks.tensor_bf17"),
                       (GOOD + 'colour = "red"\n', "colour"),
                       (GOOD.replace(', source = "our roadmap" }\n[onchip]', ' }\n[onchip]'),
                        "dram.bandwidth")):
        p = tmp_path / "bad.toml"
        p.write_text(bad)
        with pytest.raises(SpecError, match=field.replace(".", r"\.")):
            spec_from_file(str(p))
        assert main(["analyze", "examples/mlp_block.py", "--chip-file", str(p), "-q"]) == 2
        assert field in capsys.readouterr().err


def _chain(fn, *shapes):
    return solbound.analyze(Fn(fn), tuple(torch.randn(*s, device="meta") for s in shapes),
                            arch="h100-sxm")


def test_matrix_chains_are_reordered_only_where_the_other_order_wins():
    # A 8x64, B 64x4096, C 4096x64: (AB)C = 8*64*4096 * 2 MACs; A(BC) = 64*4096*64 + 8*64*64
    ab_c = 2 * 8 * 64 * 4096
    a_bc = 64 * 4096 * 64 + 8 * 64 * 64
    shapes = ((8, 64), (64, 4096), (4096, 64))
    assert [o for o in _chain(lambda s, a, b, c: (a @ b) @ c, *shapes).opportunities
            if o["kind"] == "reorder"] == []
    (o,) = [o for o in _chain(lambda s, a, b, c: a @ (b @ c), *shapes).opportunities
            if o["kind"] == "reorder"]
    assert (o["macs_before"], o["macs_after"]) == (a_bc, ab_c)
    # the other way round: A 4096x8, B 8x4096, C 4096x8 -> A(BC) wins
    shapes = ((4096, 8), (8, 4096), (4096, 8))
    (o,) = [o for o in _chain(lambda s, a, b, c: (a @ b) @ c, *shapes).opportunities
            if o["kind"] == "reorder"]
    assert o["macs_before"] == 4096 * 8 * 4096 + 4096 * 4096 * 8
    assert o["macs_after"] == 8 * 4096 * 8 + 4096 * 8 * 8


def test_an_mla_like_decode_shrinks_by_the_closed_form():
    # DeepSeek MLA, absorbed: scores = q . (c W_uk)^T for H heads of width D, a latent of
    # width R cached for T positions; the program builds k = c W_uk first (T*R*D MACs) then
    # q k^T (H*T*D); the optimal order is (q W_uk^T) c^T: H*D*R + H*R*T. The scale (a scalar
    # multiply between the products) does not break the chain.
    H, D, R, T = 16, 128, 512, 4096

    def mla(s, q, c, w):
        k = (c @ w) * 0.125
        return q @ k.T
    rep = _chain(mla, (H, D), (T, R), (R, D))
    (o,) = [o for o in rep.opportunities if o["kind"] == "reorder"]
    assert o["macs_before"] == T * R * D + H * T * D
    assert o["macs_after"] == H * D * R + H * R * T
    # the einsum before and after, step by step: c.W first, then q against every position;
    # q.W^T first, then against the cached latent
    assert len(o["einsum_before"]) == len(o["einsum_after"]) == 2
    assert o["einsum_before"] != o["einsum_after"]
    d = rep.to_dict()["opportunities"]
    assert d[0]["einsum"] and d[0]["sources"] and d[0]["fused_seconds_after"]["h100-sxm"] \
        < rep.bound("h100-sxm", "fused").seconds


def test_precision_opportunity_for_fp32_contractions():
    rep = _chain(lambda s, a, b: a @ b, (1024, 1024), (1024, 1024))
    prec = {o["fp32_contractions_on"]: o for o in rep.opportunities if o["kind"] == "precision"}
    h100 = load_spec("h100-sxm")
    flops = 2 * 1024 ** 3
    assert prec["tf32"]["seconds_before"] == pytest.approx(flops / h100.peak("vector_fp32"))
    # on TF32 tensor cores the matmul is memory-bound or at the TF32 peak, whichever is slower
    memory = 3 * 1024 * 1024 * 4 / h100.bandwidth
    assert prec["tf32"]["seconds_after"] == pytest.approx(max(flops / h100.peak("tensor_tf32"), memory))
    assert prec["bf16"]["seconds_after"] == pytest.approx(max(flops / h100.peak("tensor_bf16"), memory))
