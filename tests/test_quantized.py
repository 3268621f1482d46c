"""Quantized programs (issue: weights at their stored width, products on the pipe of their
dtypes): packed 4-bit weights unpacked with shifts and masks, fp8 weights, torchao's int8
configs, JAX products on int8 and fp8 operands. Every count is closed form: a linear of
``k`` inputs and ``n`` outputs on ``t`` tokens is t*k*n MACs; the fused bytes are the
stored weights, their scales, the activations in and the result out, each once."""

import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn

from solbound.api import analyze

T, K, N, G = 4, 256, 128, 64          # tokens, inputs, outputs, group size


def _check(rep, macs, fused, pipe):
    assert not rep.unsupported, [(u.operator, u.source) for u in rep.unsupported]
    assert rep.counts.macs == macs
    assert rep.counts.fused.bytes == fused
    b = rep.bound("h100-sxm", "fused")
    assert pipe in b.pipe_seconds and b.pipe_seconds[pipe] > 0, b.pipe_seconds
    assert rep.validation["status"] == "passed", rep.validation


class PackedInt4Linear(nn.Module):
    """The AWQ/GPTQ reference form: two 4-bit weights per byte, unpacked with ``& 0xF``
    and ``>> 4``, dequantized per group of G inputs with a scale and a zero point."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.register_buffer("qw", torch.randint(0, 256, (N, K // 2), dtype=torch.uint8,
                                                 generator=g))
        self.register_buffer("scale", torch.rand(N, K // G, generator=g) * 0.1)
        self.register_buffer("zero", torch.full((N, K // G), 8.0))

    def forward(self, x):
        lo = (self.qw & 0xF).float()
        hi = (self.qw >> 4).float()
        w = torch.stack([lo, hi], -1).reshape(N, K // G, G)
        w = (w - self.zero[..., None]) * self.scale[..., None]
        return x @ w.reshape(N, K).T


def test_packed_int4_weights_are_read_at_their_stored_size():
    rep = analyze(PackedInt4Linear(), (torch.randn(T, K),), arch="h100-sxm", validate=True)
    # 4-bit weights: K/2 bytes per output row; fp32 scales and zeros per group
    fused = N * K // 2 + 2 * N * (K // G) * 4 + T * K * 4 + T * N * 4
    # the product runs in the activations' dtype (fp32 here: the FP32 vector pipe)
    _check(rep, T * K * N, fused, "vector_fp32")


class Fp8Linear(nn.Module):
    """fp8 (e4m3) weights with a per-row scale, dequantized to bf16 in forward."""

    def __init__(self, dtype=torch.float8_e4m3fn):
        super().__init__()
        self.register_buffer("w", (torch.randn(N, K) * 2).to(dtype))
        self.register_buffer("s", torch.rand(N, 1) + 0.5)

    def forward(self, x):
        return x @ (self.w.to(torch.bfloat16) * self.s.to(torch.bfloat16)).T


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_weights_are_one_byte_and_validate(dtype):
    rep = analyze(Fp8Linear(dtype), (torch.randn(T, K, dtype=torch.bfloat16),),
                  arch="h100-sxm", validate=True)
    _check(rep, T * K * N, N * K + N * 4 + T * K * 2 + T * N * 2, "tensor_bf16")


class Fp8Activations(nn.Module):
    """Activations quantized to fp8 in forward (rounded onto e4m3's grid, saturating at
    448): the executor rounds as PyTorch does, so the check is tight."""

    def forward(self, x):
        q = (x * 100).to(torch.float8_e4m3fn)
        return q.float() * 0.01


def test_a_conversion_to_fp8_rounds_onto_its_grid():
    x = torch.randn(T, K) * 3
    rep = analyze(Fp8Activations(), (x,), arch="h100-sxm", validate=True)
    assert not rep.unsupported and rep.validation["status"] == "passed", rep.validation


def _torchao(config, dtype=torch.float32):
    torchao = pytest.importorskip("torchao.quantization")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = nn.Sequential(nn.Linear(K, N, bias=False, dtype=dtype))
        torchao.quantize_(m, getattr(torchao, config)())
    return m


def test_torchao_fp8_weight_only():
    m = _torchao("Float8WeightOnlyConfig", torch.bfloat16)
    rep = analyze(m, (torch.randn(T, K, dtype=torch.bfloat16),), arch="h100-sxm",
                  validate=True)
    # e4m3 weights with one fp32 scale per output row, dequantized to bf16 on chip
    _check(rep, T * K * N, N * K + N * 4 + T * K * 2 + T * N * 2, "tensor_bf16")


def test_torchao_int8_weight_only():
    m = _torchao("Int8WeightOnlyConfig")
    rep = analyze(m, (torch.randn(T, K),), arch="h100-sxm", validate=True)
    # int8 weights (1 B each) and one fp32 scale per output row
    _check(rep, T * K * N, N * K + N * 4 + T * K * 4 + T * N * 4, "vector_fp32")


def test_torchao_int8_dynamic_activations_int8_weights_on_the_int8_pipe():
    m = _torchao("Int8DynamicActivationInt8WeightConfig")
    rep = analyze(m, (torch.randn(T, K),), arch="h100-sxm", validate=True)
    # the activations are quantized on chip (per-token scales), the int8 x int8 product
    # accumulates in int32 on the int8 tensor cores
    _check(rep, T * K * N, N * K + N * 4 + T * K * 4 + T * N * 4, "tensor_int8")


def test_torchao_int4_weight_only_on_its_cpu_layout():
    """torchao's int4 weight-only for CPUs (``PrototypeInt4WeightOnlyConfig``: its
    ``Int4OpaqueTensor`` packs with ``_convert_weight_to_int4pack_for_cpu`` and multiplies
    with ``_weight_int4pack_mm_for_cpu``; the default ``Int4WeightOnlyConfig`` needs mslk,
    which does not install here)."""
    pytest.importorskip("torchao.prototype.quantization.int4")
    from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig
    from torchao.quantization import quantize_
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = nn.Sequential(nn.Linear(K, N, bias=False, dtype=torch.bfloat16))
        quantize_(m, PrototypeInt4WeightOnlyConfig(group_size=G))
    rep = analyze(m, (torch.randn(T, K, dtype=torch.bfloat16),), arch="h100-sxm",
                  validate=True)
    # 4-bit weights (N*K/2 B), a bf16 scale and zero per group and output
    _check(rep, T * K * N, N * K // 2 + (K // G) * N * 2 * 2 + T * K * 2 + T * N * 2,
           "tensor_bf16")


def test_jax_products_on_int8_and_fp8_operands():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    r = np.random.default_rng(0)
    x8 = jnp.asarray(r.integers(-128, 127, (T, K)), jnp.int8)
    w8 = jnp.asarray(r.integers(-128, 127, (K, N)), jnp.int8)

    def int8(x, w):
        return jax.lax.dot_general(x, w, (((1,), (0,)), ((), ())),
                                   preferred_element_type=jnp.int32)
    rep = analyze(int8, (x8, w8), arch="h100-sxm", validate=True)
    _check(rep, T * K * N, T * K + K * N + T * N * 4, "tensor_int8")

    def fp8(x, w):
        return jnp.dot(x.astype(jnp.float8_e4m3fn), w, preferred_element_type=jnp.float32)
    wf8 = jnp.asarray(r.normal(size=(K, N)), jnp.float8_e4m3fn)
    rep = analyze(fp8, (jnp.asarray(r.normal(size=(T, K)), jnp.float32), wf8),
                  arch="h100-sxm", validate=True)
    _check(rep, T * K * N, T * K * 4 + K * N + T * N * 4, "tensor_fp8")


def test_torchao_int8_product_built_on_meta_is_the_out_dtype_operator(tmp_path, monkeypatch):
    """A factory is built on the meta device, where torchao writes its int8 product as the
    ``out_dtype`` higher-order operator (on the CPU it calls ``_int_mm`` and then converts).
    Validation runs that analyzed IR itself on the real module's values (its int8 weight
    and scale, unwrapped by the real program's own export): one program, one verdict."""
    pytest.importorskip("torchao.quantization")
    (tmp_path / "q8.py").write_text(
        "import torch, torch.nn as nn\n"
        "from torchao.quantization import quantize_, Int8DynamicActivationInt8WeightConfig\n"
        f"def make():\n    m = nn.Sequential(nn.Linear({K}, {N}, bias=False))\n"
        "    quantize_(m, Int8DynamicActivationInt8WeightConfig())\n"
        f"    return m, (torch.randn({T}, {K}),)\n")
    monkeypatch.chdir(tmp_path)
    from solbound.api import analyze_source
    rep = analyze_source("q8:make", arch="h100-sxm", validate=True)
    assert "out_dtype" in {k.opname for k in rep.lowered.program.kernels}
    _check(rep, T * K * N, N * K + N * 4 + T * K * 4 + T * N * 4, "tensor_int8")
    assert rep.validation["status"] == "passed" and "retraced_casts" not in rep.validation


def test_stored_width_opportunity_from_the_programs_own_weights():
    """A bf16 decode MLP is bound by reading its weights: the report says what int8 and
    int4 weight-only storage would make its fused bound, from its own weight tensors."""
    m = nn.Sequential(nn.Linear(K, 4 * K, bias=False, dtype=torch.bfloat16), nn.SiLU(),
                      nn.Linear(4 * K, K, bias=False, dtype=torch.bfloat16))
    rep = analyze(m, (torch.randn(1, K, dtype=torch.bfloat16),), arch="h100-sxm,b200")
    opp = {(o["arch"], o["scheme"]): o for o in rep.opportunities if o["kind"] == "stored-width"}
    weights = 2 * K * 4 * K
    io = 2 * K * 2                              # the token in and out, bf16
    assert rep.counts.fused.bytes == weights * 2 + io
    int8 = weights + (4 * K + K) * 4           # one fp32 scale per output row
    int4 = weights // 2 + 2 * (K * 4 * K // 128) * 4   # bf16 scale and zero per 128
    for arch in ("h100-sxm", "b200"):
        bw = rep.bound(arch, "fused").bandwidth
        for scheme, stored in (("int8 weight-only", int8), ("int4 weight-only", int4)):
            o = opp[(arch, scheme)]
            assert o["weight_bytes_before"] == weights * 2 and o["weight_bytes_after"] == stored
            assert o["fused_bytes_after"] == stored + io
            assert o["seconds_after"] == pytest.approx((stored + io) / bw, rel=1e-12)


def test_a_transformers_model_quantized_through_torchaoconfig(tmp_path):
    """transformers' own route: a (random, saved locally) Llama loaded with
    ``quantization_config=TorchAoConfig(Int8WeightOnlyConfig())``, called with its
    defaults (its KV cache returned). The linears' weights are read as int8 with one fp32
    scale per output row; transformers keeps ``lm_head`` unquantized."""
    pytest.importorskip("torchao.quantization")
    from torchao.quantization import Int8WeightOnlyConfig
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, TorchAoConfig
    h, f, v, t, kv = 64, 128, 128, 16, 32          # width, FFN, vocab, tokens, kv width
    cfg = LlamaConfig(hidden_size=h, intermediate_size=f, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=v,
                      max_position_embeddings=64)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = AutoModelForCausalLM.from_pretrained(
            tmp_path, quantization_config=TorchAoConfig(Int8WeightOnlyConfig()),
            dtype=torch.float32,
            # transformers 5.25 kernelizes by default, which needs the `kernels` package;
            # the model as its eager layers compute it is what is analyzed
            use_kernels=False)
    rep = analyze(m, (torch.randint(0, v, (1, t)),), arch="h100-sxm", validate=True)
    # per layer: q, k, v, o, gate, up, down as (in, out)
    linears = [(h, h), (h, kv), (h, kv), (h, h), (h, f), (h, f), (f, h)]
    per_layer = sum(i * o + o * 4 for i, o in linears)        # int8 weights, fp32 scales
    fused = (2 * per_layer + 5 * h * 4           # 2 layers; 5 RMSNorm weights
             + v * h * 4                         # lm_head, fp32
             + t * h * 4 + t * 8                 # the 16 embedding rows read, the ids
             + t * v * 4 + 2 * 2 * t * kv * 4    # logits; keys and values returned (cache)
             + (16 // 2) * 4)                    # RoPE inverse frequencies
    # the linears, lm_head, causal attention (4 heads of 16: scores and values over the
    # t(t+1)/2 pairs), and each RMSNorm's sum of squares
    macs = (2 * t * sum(i * o for i, o in linears) + t * h * v
            + 2 * 4 * (t * (t + 1) // 2) * 16 * 2 + 5 * t * h)
    _check(rep, macs, fused, "vector_fp32")


@pytest.mark.parametrize("bits", [8, 4])
def test_optimum_quanto_weights(bits):
    """optimum-quanto's frozen weights: its own operators (``quanto::qbytes_mm``,
    ``quanto::unpack``) are traced through their reference implementations; int8 weights
    with one fp32 scale per output row, or 4-bit weights two per byte with an fp32 scale and
    shift per group of 128."""
    quanto = pytest.importorskip("optimum.quanto")
    op = torch.ops.quanto.unpack.default
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)
    # quanto's CPU kernel for ``unpack`` is a C++ extension it compiles on first use (74 s
    # on a fresh 2-core machine): the real module's run uses quanto's own reference
    # implementation of the operator instead, for this test only (the library is
    # destroyed with the test, which restores the CPU kernel)
    lib = torch.library.Library("quanto", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lib.impl("unpack", lambda t, bits: op.redispatch(keys, t, bits), "CPU")
        m = nn.Sequential(nn.Linear(K, N, bias=False))
        quanto.quantize(m, weights=quanto.qint8 if bits == 8 else quanto.qint4)
        quanto.freeze(m)
        try:
            rep = analyze(m, (torch.randn(T, K),), arch="h100-sxm", validate=True)
        finally:
            lib._destroy()
    io = T * K * 4 + T * N * 4
    stored = N * K + N * 4 if bits == 8 else N * K // 2 + 2 * (N * K // 128) * 4
    _check(rep, T * K * N, stored + io, "vector_fp32")


class CpuInt4Linear(nn.Module):
    """PyTorch's own CPU int4 weight-only product (what torchao's int4 CPU layout and
    gpt-fast call): 4-bit weights packed by ``_convert_weight_to_int4pack_for_cpu``, a bf16
    scale and zero per group of ``G`` inputs. ``n`` = 96 outputs: one block of 64 and a
    tail of 32, the two packing layouts; ``pack_in_forward`` packs in the forward instead."""

    def __init__(self, n=96, pack_in_forward=False):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        q = torch.randint(0, 16, (n, K), dtype=torch.int32, generator=g)
        self.pack_in_forward = pack_in_forward
        if pack_in_forward:
            self.register_buffer("q", q)
        else:
            self.register_buffer("packed", torch._convert_weight_to_int4pack_for_cpu(q, 1))
        sz = torch.stack([torch.rand(K // G, n, generator=g) * 0.1,
                          torch.randn(K // G, n, generator=g) * 0.1], -1)
        self.register_buffer("sz", sz.to(torch.bfloat16))

    def forward(self, x):
        packed = (torch._convert_weight_to_int4pack_for_cpu(self.q, 1)
                  if self.pack_in_forward else self.packed)
        return torch._weight_int4pack_mm_for_cpu(x, packed, G, self.sz)


@pytest.mark.parametrize("n", [96, 64, 48])
def test_pytorch_cpu_int4_weights_are_half_a_byte_each(n):
    rep = analyze(CpuInt4Linear(n), (torch.randn(T, K, dtype=torch.bfloat16),),
                  arch="h100-sxm", validate=True)
    # packed weights N*K/2 B, a bf16 scale and zero per group and output, x and out in bf16;
    # the product on the bf16 tensor cores after an on-chip dequantization
    _check(rep, T * K * n, n * K // 2 + (K // G) * n * 2 * 2 + T * K * 2 + T * n * 2,
           "tensor_bf16")
    # the dequantization: shift, mask, subtract, multiply, add per weight (the conversion
    # to float is not arithmetic)
    assert rep.counts.flops["vector"] == 5 * n * K


def test_pytorch_cpu_int4_packing_in_forward():
    rep = analyze(CpuInt4Linear(96, pack_in_forward=True),
                  (torch.randn(T, K, dtype=torch.bfloat16),), arch="h100-sxm", validate=True)
    # the int32 weights are read whole (4 B each) and packed on chip: an or and a shift
    # per byte, then the unpacking as above
    _check(rep, T * K * 96, 96 * K * 4 + (K // G) * 96 * 2 * 2 + T * K * 2 + T * 96 * 2,
           "tensor_bf16")
    assert rep.counts.flops["vector"] == 5 * 96 * K + 2 * 96 * K // 2


def test_the_cpu_int4_layout_is_checked_against_this_machines_packer():
    """PyTorch packs int4 weights in blocks of the CPU's vector width (64 outputs with
    AVX-512, 32 with AVX2): the width this machine uses is found by the probe, and it
    packs every size in it."""
    from solbound.frontends.torch.rules.int4pack import (WIDTHS, block_width, layout_holds,
                                                         positions)
    width = block_width(96)
    assert width in WIDTHS
    assert layout_holds(96, 64, width) and layout_holds(16, 64, width) \
        and layout_holds(208, 64, width)
    # and the other width's layout is not this machine's where the two differ
    other = next(w for w in WIDTHS if w != width)
    assert not layout_holds(96, 64, other)
    # the kernels' indices are a bijection onto every (output, input) pair, at each width
    for w in WIDTHS:
        assert sorted(positions(80, 64, w).reshape(-1).tolist()) == list(range(80 * 64))


class BlockScaledFp8(nn.Module):
    """DeepSeek-V3's fp8 product: activations scaled per 1 x 128 block, weights per
    128 x 128 block (``_scaled_mm`` with 2-d scales; it runs on CUDA only, so the model is
    built on meta and the IR is checked against the definition below)."""

    def forward(self, a, w, sa, sw):
        return torch._scaled_mm(a, w.t(), sa, sw, out_dtype=torch.bfloat16)


def test_block_scaled_fp8_product():
    from solbound.ir.execute import execute
    m, k, n, blk = 8, 256, 256, 128
    meta = dict(device="meta")
    args = (torch.empty(m, k, dtype=torch.float8_e4m3fn, **meta),
            torch.empty(n, k, dtype=torch.float8_e4m3fn, **meta),
            torch.empty(m, k // blk, **meta), torch.empty(k // blk, n // blk, **meta))
    rep = analyze(BlockScaledFp8(), args, arch="h100-sxm")
    assert not rep.unsupported
    # the tensor cores sum each 128-wide K block of every output (m*n*k MACs, fp8); the
    # vector pipe scales each block's sum by its two scales and adds the blocks: two
    # multiplies and an add per output and block
    assert rep.counts.macs == m * n * k + m * n * (k // blk)
    b = rep.bound("h100-sxm", "fused")
    assert b.pipe_seconds.get("tensor_fp8", 0) > 0
    # fp8 operands once, fp32 scales once, the bf16 result
    assert rep.counts.fused.bytes == m * k + n * k + 4 * (m * k // blk + k * n // blk ** 2) \
        + 2 * m * n
    # the IR computes the definition: sum_k a[m,k] sa[m, k/128] w[n,k] sw[k/128, n/128]
    rng = np.random.default_rng(0)
    a = rng.integers(-8, 8, (m, k)).astype(np.float32)        # exact in e4m3
    w = rng.integers(-8, 8, (n, k)).astype(np.float32)
    sa = rng.random((m, k // blk)).astype(np.float32)
    sw = rng.random((k // blk, n // blk)).astype(np.float32)
    names = [t.name for t in rep.program.tensors if t.role == "input"]
    out = execute(rep.program, dict(zip(names, (a, w, sa, sw))))
    y = out[next(t.name for t in rep.program.tensors if t.role == "output")]
    want = (a * np.repeat(sa, blk, 1)) @ (w * np.repeat(np.repeat(sw, blk, 0), blk, 1).T).T
    # float32 sums in another order: the error is relative to the largest output
    np.testing.assert_allclose(y, want, rtol=0, atol=1e-6 * np.abs(want).max())


def test_mx_scales_are_named_and_nothing_vanishes_from_the_bound():
    """e8m0 (MX) block scales are not lowered: the product is named unsupported in one
    line with its source, and what it moves stays in the bound (its fp8 operands and
    scales read, its bf16 result written) rather than counting as zero."""
    m, k, n = 8, 256, 256
    meta = dict(device="meta")
    args = (torch.empty(m, k, dtype=torch.float8_e4m3fn, **meta),
            torch.empty(n, k, dtype=torch.float8_e4m3fn, **meta),
            torch.empty(m, k // 32, dtype=torch.float8_e8m0fnu, **meta),
            torch.empty(n, k // 32, dtype=torch.float8_e8m0fnu, **meta))
    rep = analyze(BlockScaledFp8(), args, arch="h100-sxm")
    [u] = rep.unsupported
    assert u.operator == "aten._scaled_mm" and u.source.startswith("test_quantized.py:")
    assert "e8m0 (MX block scales" in u.reason or "f8e8m0 (MX block scales" in u.reason
    assert rep.counts.fused.bytes == m * k + n * k + (m + n) * k // 32 + 2 * m * n
    assert rep.counts.macs == 0
