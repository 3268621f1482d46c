"""The training step (``--train``): forward, backward and optimizer counted exactly,
split by phase, with the step's traffic and resident memory; validated against PyTorch's
own step (loss, gradients, updated parameters and optimizer state).

Counting convention used in the closed forms below: a sum of products is MACs (a
contraction), so ``sum((y - t)**2)`` of a squared error and the bias gradient
``sum_b(g * dy)`` of a layer whose output gradient is itself a product count their points
as MACs, as they do in the forward analysis.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import solbound

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLE = os.path.join(ROOT, "examples", "train_mlp.py")

B, DIN, DH, DOUT = 64, 256, 1024, 16     # examples/train_mlp.py


class MLP(nn.Module):
    def __init__(self, din=DIN, dh=DH, dout=DOUT):
        super().__init__()
        self.fc1 = nn.Linear(din, dh)
        self.fc2 = nn.Linear(dh, dout)

    def forward(self, x, target):
        return nn.functional.mse_loss(self.fc2(torch.relu(self.fc1(x))), target)


def _mlp_inputs(b=B, din=DIN, dout=DOUT):
    torch.manual_seed(0)
    return torch.randn(b, din), torch.randn(b, dout)


def test_mlp_step_exact_counts_traffic_and_memory():
    """MACs, fused bytes and resident memory of an AdamW step, derived by hand."""
    rep = solbound.analyze(MLP(), _mlp_inputs(), arch="h100-sxm", train=True)
    assert not rep.unsupported
    P = DIN * DH + DH + DH * DOUT + DOUT                 # parameters
    fwd = B * DIN * DH + B * DH * DOUT + B * DOUT        # two linears, sum of squares
    # dW2, dX2 (the hidden layer's gradient), dW1 and fc2's bias gradient (a sum of
    # products); no gradient for x (an input) and none for the target
    bwd = DH * DOUT * B + B * DH * DOUT + DH * DIN * B + B * DOUT
    ph = rep.training["phases"]
    assert ph["forward"]["macs"] == fwd
    assert ph["backward"]["macs"] == bwd
    assert ph["optimizer"]["macs"] == 0
    assert rep.counts.macs == fwd + bwd
    # fused: parameters and AdamW's state (exp_avg, exp_avg_sq: 2P, and one step counter
    # per parameter tensor: 4) read and written once, inputs read, the loss written
    state = 2 * P + 4
    assert rep.counts.fused.bytes == 4 * (2 * P + 2 * state + B * DIN + B * DOUT + 1)
    assert sum(p["bytes"]["fused"] for p in ph.values()) == rep.counts.fused.bytes
    # gradients are intermediates: nothing of the backward crosses DRAM in the fused bound
    assert ph["backward"]["bytes"]["fused"] == 0
    mem = rep.training["memory"]
    assert mem["parameters"] == 4 * P
    assert mem["gradients"] == 4 * P
    assert mem["optimizer_state"] == 4 * state
    assert mem["inputs"] == 4 * (B * DIN + B * DOUT)
    assert mem["total"] == mem["parameters"] + mem["optimizer_state"] + mem["inputs"] \
        + mem["buffers"] + mem["peak_intermediates"]
    assert mem["peak_intermediates"] >= mem["gradients"]
    assert mem["fits"]["h100-sxm"]["fits"] is True
    assert rep.training["optimizer"] == "AdamW"
    # the optimizer's arithmetic comes from torch.optim's own AdamW, traced: one sqrt
    # per element of every parameter (the special-function unit), elementwise work only
    assert ph["optimizer"]["flops_by_unit"]["special"] >= P
    assert ph["optimizer"]["flops_by_unit"]["matrix"] == 0


def test_mlp_step_validates_against_pytorch():
    rep = solbound.analyze(MLP(64, 128, 8), _mlp_inputs(16, 64, 8), arch="h100-sxm",
                           train=True, validate=True)
    v = rep.validation
    assert v["status"] == "passed", v
    assert v["compared"] == {"loss": 1, "gradients": 4, "parameters": 4, "optimizer_state": 12}


def test_sgd_momentum_and_frozen_parameters():
    """SGD with momentum: one momentum buffer per trained parameter; a frozen layer takes
    no gradient and no update (its dW is not computed)."""
    m = MLP(64, 128, 8)
    m.fc1.weight.requires_grad_(False)
    opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.1,
                          momentum=0.9)
    rep = solbound.analyze(m, _mlp_inputs(16, 64, 8), arch="h100-sxm", train=True,
                           optimizer=opt, validate=True)
    assert rep.validation["status"] == "passed", rep.validation
    tr = rep.training
    assert tr["optimizer"] == "SGD"
    assert tr["parameters_frozen"] == ["fc1.weight"]
    trained = 128 + 128 * 8 + 8
    assert tr["memory"]["optimizer_state"] == 4 * trained          # momentum buffers
    # backward: dW2, dX2, fc2's bias gradient (a sum of products); fc1's weight is frozen
    # and x is an input, so no product reaches back through fc1
    assert tr["phases"]["backward"]["macs"] == 128 * 8 * 16 + 16 * 128 * 8 + 16 * 8


def test_unused_parameter_is_named_and_not_updated():
    class Extra(MLP):
        def __init__(self):
            super().__init__(64, 128, 8)
            self.unused = nn.Linear(8, 8)
    rep = solbound.analyze(Extra(), _mlp_inputs(16, 64, 8), arch="h100-sxm", train=True)
    assert rep.training["parameters_without_gradient"] == ["unused.weight", "unused.bias"]
    assert any("unused.weight receives no gradient" in n for n in rep.program.notes)
    assert rep.training["parameters_trained"] == 4


def test_forward_without_a_loss_is_one_line_error():
    from solbound.frontends.contract import FrontendError

    class NoLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x)
    with pytest.raises(FrontendError, match=r"returns a scalar loss .* it returned a tensor "
                                            r"of shape \(2, 4\)"):
        solbound.analyze(NoLoss(), (torch.randn(2, 4),), train=True)
    with pytest.raises(FrontendError, match="not a torch.optim optimizer"):
        solbound.analyze(MLP(), _mlp_inputs(), train=True, optimizer="Adamm")


def test_causal_attention_backward_is_four_triangles():
    """Causal attention's backward: dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q, each
    over the causal triangle only (the mask stays a guard), no recomputation."""
    H, T, E = 2, 16, 8

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(E * H, 3 * E * H, bias=False)

        def forward(self, x):
            q, k, v = self.qkv(x).view(1, T, 3, H, E).permute(2, 0, 3, 1, 4)
            o = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return o.float().pow(2).mean()
    torch.manual_seed(0)
    rep = solbound.analyze(Attn(), (torch.randn(1, T, E * H),), arch="h100-sxm",
                           train=True, validate=True)
    assert rep.validation["status"] == "passed", rep.validation
    tri = H * (T * (T + 1) // 2) * E
    bmm = [k for k in rep.counts.kernels if k.opname == "aten.bmm"]
    phase = {op: g.get("phase") for op, g in rep.lowered.groups.items()}
    fwd = [k.macs for k in bmm if phase[k.op] == "forward"]
    bwd = [k.macs for k in bmm if phase[k.op] == "backward"]
    assert fwd == [tri, tri]                 # QK^T and PV, each a triangle
    assert sorted(bwd) == [tri] * 4          # dV, dP, dQ, dK


def _llama():
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg), cfg


class _Labels(nn.Module):
    """``model(input_ids=ids, labels=ids)``: a transformers model given labels."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, ids, labels):
        return self.m(input_ids=ids, labels=labels)


def test_llama_step_closed_form_and_validation():
    """Every product of a Llama training step from the config: forward, then the two
    products per linear in the backward (dW, dX), four causal triangles per layer."""
    m, c = _llama()
    T = 16
    ids = torch.randint(0, c.vocab_size, (1, T))
    rep = solbound.analyze(_Labels(m), (ids, ids), arch="h100-sxm", train=True,
                           validate=True)
    assert not rep.unsupported
    v = rep.validation
    assert v["status"] == "passed", v
    n_params = sum(1 for _ in m.parameters())
    assert v["compared"] == {"loss": 1, "gradients": n_params, "parameters": n_params,
                             "optimizer_state": 3 * n_params}
    D, F, L, V = c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.vocab_size
    hd = D // c.num_attention_heads
    kv = c.num_key_value_heads * hd
    linear = L * (T * D * D + 2 * T * D * kv + T * D * D + 3 * T * D * F) + T * D * V
    tri = c.num_attention_heads * (T * (T + 1) // 2) * hd
    phase = {op: g.get("phase") for op, g in rep.lowered.groups.items()}

    def products(ph, names):
        return sum(k.macs for k in rep.counts.kernels
                   if phase[k.op] == ph and k.opname in names)
    assert products("forward", ("aten.mm",)) == linear
    assert products("forward", ("aten.bmm",)) == L * 2 * tri
    assert products("backward", ("aten.mm",)) == 2 * linear
    assert products("backward", ("aten.bmm",)) == L * 4 * tri
    # AdamW: fp32 state of two moments per parameter element plus a step per tensor
    P = sum(p.numel() for p in m.parameters())
    assert rep.training["memory"]["optimizer_state"] == 4 * (2 * P + n_params)


def test_gpt2_step():
    """GPT-2 (tied input/output embeddings: one parameter, one gradient), its products in
    closed form. With its default
    dropout the step analyzes (random masks counted); validated with dropout off and SGD:
    the key projection's bias has a gradient that is exactly zero in exact arithmetic
    (softmax ignores a constant added to a row's scores), so its fp32 value is rounding
    noise, which Adam's normalized update would magnify to a full step of either sign."""
    import transformers
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (1, 16))
    m = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=32))
    rep = solbound.analyze(_Labels(m), (ids, ids), arch="h100-sxm", train=True)
    assert not rep.unsupported
    assert rep.lowered.random_draws                     # dropout masks, drawn per step
    # products: per layer c_attn (D -> 3D), attn c_proj, c_fc (D -> 4D), mlp c_proj
    # (4D -> D): 12 T D^2; the tied head T D V; causal attention two triangles forward,
    # four backward; the backward two products per forward one (dW, dX)
    T, D, L, H, V = 16, 32, 2, 4, 64
    layers, head = L * 12 * T * D * D, T * D * V
    tri = L * H * (T * (T + 1) // 2) * (D // H)
    phase = {op: g.get("phase") for op, g in rep.lowered.groups.items()}

    def products(ph, names):
        return sum(k.macs for k in rep.counts.kernels
                   if phase[k.op] == ph and k.opname in names)
    assert products("forward", ("aten.addmm",)) == layers
    assert products("forward", ("aten.mm",)) == head
    assert products("forward", ("aten.bmm",)) == 2 * tri
    assert products("backward", ("aten.mm", "aten.addmm")) == 2 * (layers + head)
    assert products("backward", ("aten.bmm",)) == 4 * tri
    assert rep.training["parameters_trained"] == sum(1 for _ in m.parameters())
    m = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=32, attn_pdrop=0.0,
        resid_pdrop=0.0, embd_pdrop=0.0))
    rep = solbound.analyze(_Labels(m), (ids, ids), arch="h100-sxm", train=True,
                           optimizer="SGD", validate=True)
    v = rep.validation
    assert v["status"] == "passed", v
    # each compared gradient with its parameter's update (the tied embedding's is not
    # matched to the reference yet: a known gap, see docs/training.md)
    assert v["compared"]["gradients"] == v["compared"]["parameters"] > 0


def test_cli_train_json_and_validate():
    out = subprocess.run([sys.executable, "-m", "solbound", "analyze", EXAMPLE, "--train",
                          "--arch", "h100-sxm,a100-sxm", "--json", "-", "-q", "--validate"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert set(doc["phases"]) == {"forward", "backward", "optimizer"}
    assert doc["training"]["optimizer"] == "AdamW"            # the file's make_optimizer
    assert doc["training"]["optimizer_defaults"]["weight_decay"] == 0.01
    assert doc["memory"]["fits"]["a100-sxm"]["fits"] is True
    assert doc["validation"]["status"] == "passed"
    bad = subprocess.run([sys.executable, "-m", "solbound", "analyze", EXAMPLE,
                          "--optimizer", "SGD"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode != 0 and "--train" in bad.stderr


def test_autocast_step_multiplies_in_bf16_with_fp32_master_weights():
    """``torch.autocast`` decides the products' precision (bf16, forward and backward);
    the parameters and the optimizer's state stay fp32. Traced on fake CPU tensors built
    under a FakeTensorMode too (how a large model is analyzed without allocating it):
    autocast does not apply to meta tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(64, 128)
            self.b = nn.Linear(128, 8)

        def forward(self, x, y):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                z = self.b(torch.relu(self.a(x)))
            return nn.functional.cross_entropy(z.float(), y)

    def make():
        torch.manual_seed(0)
        return Mixed(), (torch.randn(32, 64), torch.randint(0, 8, (32,)))
    m, inp = make()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    # (not validated here: at these sizes the bf16 gradient of the first layer is
    # ill-conditioned, PyTorch's own bf16 and fp32 runs differ by 16% in it)
    rep = solbound.analyze(m, inp, arch="h100-sxm", train=True, optimizer=opt)
    mm = [k for k in rep.counts.kernels if k.opname in ("aten.mm", "aten.addmm")]
    assert mm and {k.dtype for k in mm} == {"bf16"}
    assert sum(k.macs for k in mm) == 3 * (32 * 64 * 128 + 32 * 128 * 8) - 32 * 64 * 128
    assert {t.dtype for t in rep.program.tensors if t.role in ("parameter", "buffer")} == {"f32"}
    with FakeTensorMode(shape_env=ShapeEnv(tracked_fakes=[]), allow_non_fake_inputs=True):
        fm, finp = make()
    frep = solbound.analyze(fm, finp, arch="h100-sxm", train=True, optimizer="SGD")
    fmm = [k for k in frep.counts.kernels if k.opname in ("aten.mm", "aten.addmm")]
    assert {k.dtype for k in fmm} == {"bf16"}
    assert sum(k.macs for k in fmm) == sum(k.macs for k in mm)


class _ConvPool(nn.Module):
    """conv (padding 1) -> relu -> 2x2 max-pool -> grouped strided conv -> relu -> linear."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 4, 3, padding=1)
        self.c2 = nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2)
        self.fc = nn.Linear(6 * 4 * 4, 5)

    def forward(self, x, y):
        h = nn.functional.max_pool2d(torch.relu(self.c1(x)), 2)
        h = torch.relu(self.c2(h))
        return nn.functional.cross_entropy(self.fc(h.flatten(1)), y)


def conv_step_inputs():
    torch.manual_seed(0)
    return _ConvPool(), (torch.randn(2, 3, 16, 16), torch.randint(0, 5, (2,)))


def _taps(n_out, k, s, pad, n_in):
    """In-bounds taps summed over output positions along one dimension."""
    return sum(1 for p in range(n_out) for r in range(k) if 0 <= p * s + r - pad < n_in)


def test_conv_pool_step_closed_form_and_validation():
    """The convolution's backward (input gradient as the transposed convolution over the
    taps that exist, weight gradient as a correlation) and max-pooling's (the gradient
    added where the forward's window maximum was), validated against PyTorch."""
    m, inp = conv_step_inputs()
    rep = solbound.analyze(m, inp, arch="h100-sxm", train=True, optimizer="SGD",
                           validate=True)
    assert not rep.unsupported
    assert rep.validation["status"] == "passed", rep.validation
    assert {"aten.convolution_backward", "aten.max_pool2d_with_indices_backward"} \
        <= rep.lowered.rules_used
    N = 2
    c1 = N * 4 * 3 * _taps(16, 3, 1, 1, 16) ** 2          # 2 x 4 out x 3 in channels
    c2 = N * 6 * 2 * _taps(4, 3, 2, 1, 8) ** 2            # groups 2: 2 input channels each
    fc = N * 96 * 5
    ce = N                                                # the picked log-probabilities
    ph = rep.training["phases"]
    assert ph["forward"]["macs"] == c1 + c2 + fc + ce
    # dW and dX of c2 and fc, dW of c1 (no gradient for the image)
    assert ph["backward"]["macs"] == 2 * c2 + c1 + 2 * fc


def test_step_memory_against_dram_capacity_in_provision_and_project():
    """A 2.4e9-parameter layer (built under a FakeTensorMode: nothing allocated) trained
    with AdamW: parameters, gradients and two moments are 16 bytes per parameter, more
    than an RTX 4090's 24 GB and less than an H100's 80 GB."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from solbound.bounds.provision import projection, provision
    n = 49152
    with FakeTensorMode(shape_env=ShapeEnv(tracked_fakes=[]), allow_non_fake_inputs=True):
        m = nn.Linear(n, n, bias=False)
        inp = (torch.randn(4, n), torch.randn(4, n))

    class Step(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = m

        def forward(self, x, target):
            return nn.functional.mse_loss(self.lin(x), target)
    rep = solbound.analyze(Step(), inp, arch="h100-sxm,rtx-4090", train=True)
    mem = rep.training["memory"]
    P = n * n
    assert mem["parameters"] == 4 * P and mem["gradients"] == 4 * P
    assert mem["optimizer_state"] == 4 * (2 * P + 1)
    assert mem["fits"]["h100-sxm"]["fits"] is True
    assert mem["fits"]["rtx-4090"]["fits"] is False
    doc = provision(rep, 1.0)
    assert doc["dram_capacity"] == mem["total"]
    assert {r["arch"]: r["fits_dram"] for r in doc["chips"]} == {"h100-sxm": True,
                                                                 "rtx-4090": False}
    assert not any(r["meets"] for r in doc["chips"] if r["arch"] == "rtx-4090")
    assert {r["arch"]: r["fits_dram"] for r in projection(rep)} == {"h100-sxm": True,
                                                                    "rtx-4090": False}


@pytest.mark.slow      # ~22 s; run with -m slow
def test_mixtral_step_closed_form_and_validation():
    """A mixture of experts: each token's k experts evaluated once (transformers'
    batched dispatch while tracing, a stated assumption), the router's products, and in
    the backward two products per forward product (the router's included: its gradient
    flows back through the routing weights)."""
    import transformers
    c = transformers.MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, num_local_experts=4,
                                   num_experts_per_tok=2)
    torch.manual_seed(0)
    m = transformers.MixtralForCausalLM(c)
    T = 16
    ids = torch.randint(0, c.vocab_size, (1, T))
    rep = solbound.analyze(_Labels(m), (ids, ids), arch="h100-sxm", train=True,
                           validate=True)
    assert not rep.unsupported
    assert rep.validation["status"] == "passed", rep.validation
    D, F, L, V, E, K = (c.hidden_size, c.intermediate_size, c.num_hidden_layers,
                        c.vocab_size, c.num_local_experts, c.num_experts_per_tok)
    hd = D // c.num_attention_heads
    kv = c.num_key_value_heads * hd
    dense = L * (T * D * (D + 2 * kv + D) + T * D * E) + T * D * V   # projections, router
    experts = L * T * K * 3 * D * F
    tri = L * 2 * c.num_attention_heads * (T * (T + 1) // 2) * hd
    phase = {op: g.get("phase") for op, g in rep.lowered.groups.items()}

    def products(ph, name):
        return sum(k.macs for k in rep.counts.kernels
                   if phase[k.op] == ph and k.opname == name)
    assert products("forward", "aten.mm") == dense
    assert products("forward", "aten.bmm") == experts + tri
    assert products("backward", "aten.mm") == 2 * dense
    assert products("backward", "aten.bmm") == 2 * experts + 2 * tri


def test_masked_fill_attention_backward_keeps_the_mask():
    """Attention written by hand, ``scores.masked_fill(~tril, -inf)``: masked_fill's
    gradient ``where(~tril, 0, dS)`` is zero outside the triangle (dS is, and the mask's
    complement says so), so dQ and dK are triangles like dV and dP."""
    T, E = 12, 8

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (nn.Linear(E, E, bias=False) for _ in range(3))

        def forward(self, x, y):
            s = self.q(x) @ self.k(x).transpose(-1, -2)
            s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
            return nn.functional.mse_loss(torch.softmax(s, -1) @ self.v(x), y)
    torch.manual_seed(0)
    rep = solbound.analyze(Attn(), (torch.randn(T, E), torch.randn(T, E)), arch="h100-sxm",
                           train=True, optimizer="SGD", validate=True)
    assert rep.validation["status"] == "passed", rep.validation
    phase = {op: g.get("phase") for op, g in rep.lowered.groups.items()}
    tri = T * (T + 1) // 2 * E
    mm = sorted(k.macs for k in rep.counts.kernels
                if k.opname == "aten.mm" and phase[k.op] == "backward")
    # dV, dP, dQ, dK on the triangle; the three weight gradients (no dX: x is an input)
    assert mm == sorted([tri] * 4 + [T * E * E] * 3)


@pytest.mark.slow      # ~16 s; run with -m slow
def test_checkpointed_regions_are_noted_not_counted():
    """transformers' gradient checkpointing: the step's counts are those of the step
    without it (the bound counts no recomputation), and each checkpointed layer is named
    in a note with the forward work its recomputation asks for."""
    m, c = _llama()
    ids = torch.randint(0, c.vocab_size, (1, 16))
    plain = solbound.analyze(_Labels(m), (ids, ids), arch="h100-sxm", train=True,
                             optimizer="SGD")
    m.gradient_checkpointing_enable()
    rep = solbound.analyze(_Labels(m), (ids, ids), arch="h100-sxm", train=True,
                           optimizer="SGD")
    assert rep.counts.macs == plain.counts.macs
    rec = rep.lowered.training["recompute"]
    assert [r["region"] for r in rec] == [f"m.model.layers.{i}" for i in range(2)]
    T, D, F = 16, c.hidden_size, c.intermediate_size
    kv = c.num_key_value_heads * D // c.num_attention_heads
    linear = T * D * D + 2 * T * D * kv + T * D * D + 3 * T * D * F
    # the layer's products, its two RMSNorms' sums of squares, and attention dense: the
    # boolean mask the layer receives is known by shape only there (an upper estimate,
    # which the record states)
    H = c.num_attention_heads
    dense = linear + 2 * T * D + 2 * H * T * T * (D // H)
    assert all(r["macs"] == dense and r["calls"] == 1 and r["masks_as_data"] for r in rec)
    assert sum("checkpointed region m.model.layers.0" in n for n in rep.program.notes) == 1


@pytest.mark.slow      # ~19 s; run with -m slow
def test_step_over_budget_validates_at_reduced_shapes():
    """Over the validation budget, a smaller instance of the file (its size constants
    scaled down) whose step keeps the kernel structure is validated instead."""
    from solbound.api import analyze_source
    rep = analyze_source(EXAMPLE, arch="h100-sxm", train=True, validate=True,
                         max_bytes=5 * 2**20)
    v = rep.validation
    assert v["status"] == "passed", v
    assert v["reduced"] and "d_hidden=1024->" in v["reduced_by"]
    assert rep.counts.macs == B * DIN * DH + B * DH * DOUT + B * DOUT \
        + DH * DOUT * B + B * DH * DOUT + DH * DIN * B + B * DOUT   # the analyzed sizes


def test_wrong_step_fails_and_names_the_first_divergent_kernel(monkeypatch):
    """A lowering rule made wrong on purpose (ReLU as the identity): the step fails
    validation and the diagnosis names the first kernel whose value differs."""
    from solbound.frontends.torch import lower as lowering
    from solbound.frontends.torch.rules._util import elementwise

    def wrong_relu(ctx):
        ctx.bind(elementwise(ctx, lambda a: a, [ctx.args[0]]))
    wrong_relu.rule_id = "aten.relu"
    monkeypatch.setitem(lowering.RULES, "aten.relu", wrong_relu)
    monkeypatch.setitem(lowering.RULES, "aten.relu.default", wrong_relu)
    rep = solbound.analyze(MLP(64, 128, 8), _mlp_inputs(16, 64, 8), arch="h100-sxm",
                           train=True, optimizer="SGD", validate=True)
    v = rep.validation
    assert v["status"] == "failed"
    assert not next(o for o in v["outputs"] if o["output"] == "loss")["ok"]
    fd = v["first_divergence"]
    assert fd is not None and "relu" in fd["node"] and fd["kernel"].startswith("k_relu")
