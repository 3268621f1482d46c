"""Training steps of real model code nobody here wrote: a diffusers UNet's noise-prediction
step (PyTorch, torch.optim.SGD) and a Flax CNN trained with optax (JAX), each counted
against a closed form derived in its test from the model's config, and validated against
the framework's own step. Counting convention as in ``tests/test_train.py``: a sum of
products is MACs."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import solbound


def _taps(n_out, k, s, pad, n_in):
    """In-bounds taps summed over output positions along one dimension."""
    return sum(1 for p in range(n_out) for r in range(k) if 0 <= p * s + r - pad < n_in)


# ---------------------------------------------------------------- diffusers UNet (PyTorch)

UNET = dict(sample_size=(8, 12), in_channels=3, out_channels=3, block_out_channels=(8, 16),
            layers_per_block=1, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
            up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=4,
            attention_head_dim=8)


class _NoiseStep(nn.Module):
    """The denoising objective: predict the noise that was added to the image."""

    def __init__(self, unet):
        super().__init__()
        self.unet = unet

    def forward(self, noisy, timesteps, noise):
        return F.mse_loss(self.unet(noisy, timesteps).sample, noise)


def _unet_layers(c, H, W):
    """From a ``UNet2DModel`` config: every convolution ``(name, cin, cout, k, stride,
    (H, W) of its input)`` and every attention block ``(name, channels, tokens)``, following
    diffusers' own bookkeeping: a ResNet block is conv1 (3x3), conv2 (3x3) and a 1x1
    shortcut when its channels change; every down block but the last ends in a stride-2
    3x3 convolution (padding 1); the skip stack holds conv_in's output and every down
    resnet's and downsampler's; up block ``i`` has ``layers_per_block + 1`` resnets, its
    resnet ``j`` reading ``(previous output if j == 0 else its own width)`` plus the popped
    skip's channels, and every up block but the last ends in a nearest 2x upsampling and
    a 3x3 convolution; the mid block is resnet, attention, resnet at the last width."""
    ch = c["block_out_channels"]
    L = c["layers_per_block"]
    convs, attns = [], []

    def resnet(name, cin, cout, hw):
        convs.append((f"{name}.conv1", cin, cout, 3, 1, hw))
        convs.append((f"{name}.conv2", cout, cout, 3, 1, hw))
        if cin != cout:
            convs.append((f"{name}.conv_shortcut", cin, cout, 1, 1, hw))

    hw = (H, W)
    convs.append(("conv_in", c["in_channels"], ch[0], 3, 1, hw))
    skips = [ch[0]]
    cin = ch[0]
    for i, (kind, cout) in enumerate(zip(c["down_block_types"], ch)):
        for j in range(L):
            resnet(f"down_blocks.{i}.resnets.{j}", cin, cout, hw)
            if kind.startswith("Attn"):
                attns.append((f"down_blocks.{i}.attentions.{j}", cout, hw[0] * hw[1]))
            cin = cout
            skips.append(cout)
        if i < len(ch) - 1:
            convs.append((f"down_blocks.{i}.downsamplers.0.conv", cout, cout, 3, 2, hw))
            hw = (hw[0] // 2, hw[1] // 2)
            skips.append(cout)
    resnet("mid_block.resnets.0", cin, cin, hw)
    attns.append(("mid_block.attentions.0", cin, hw[0] * hw[1]))
    resnet("mid_block.resnets.1", cin, cin, hw)
    prev = cin
    for i, (kind, cout) in enumerate(zip(c["up_block_types"], ch[::-1])):
        for j in range(L + 1):
            resnet(f"up_blocks.{i}.resnets.{j}", (prev if j == 0 else cout) + skips.pop(),
                   cout, hw)
            if kind.startswith("Attn"):
                attns.append((f"up_blocks.{i}.attentions.{j}", cout, hw[0] * hw[1]))
        prev = cout
        if i < len(ch) - 1:
            hw = (hw[0] * 2, hw[1] * 2)
            convs.append((f"up_blocks.{i}.upsamplers.0.conv", cout, cout, 3, 1, hw))
    assert not skips
    convs.append(("conv_out", ch[0], c["out_channels"], 3, 1, hw))
    return convs, attns


def _conv_macs(N, cin, cout, k, s, hw):
    """``N * Cout * Cin * taps(H) * taps(W)`` (padding ``k // 2``; output ``ceil(H / s)``)."""
    pad = k // 2
    t = 1
    for n in hw:
        t *= _taps(-(-n // s), k, s, pad, n)
    return N * cout * cin * t


@pytest.mark.slow       # ~50 s on 2 cores: run with -m slow (CI's suite stays under 10 min)
def test_diffusers_unet_noise_prediction_step_closed_form_and_validation():
    """A diffusers ``UNet2DModel`` (ResNet blocks with GroupNorm and the timestep's
    projection, self-attention at the lower resolution, a strided downsampler, a nearest
    upsampler, skip concatenations) trained one SGD step on the noise-prediction loss.
    Every convolution's products from the config: forward, then in the backward the weight
    gradient of each and the input gradient of each but conv_in (the image has none); the
    strided downsampler's input gradient is a transposed convolution over the taps that
    exist. Linear and attention products likewise."""
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    unet = diffusers.UNet2DModel(**UNET)
    N, (H, W) = 2, UNET["sample_size"]
    inputs = (torch.randn(N, 3, H, W), torch.tensor([10, 500]), torch.randn(N, 3, H, W))
    rep = solbound.analyze(_NoiseStep(unet), inputs, arch="h100-sxm", train=True,
                           optimizer="SGD", validate=True)
    assert not rep.unsupported
    v = rep.validation
    assert v["status"] == "passed", v
    n_params = sum(1 for _ in unet.parameters())
    assert v["compared"] == {"loss": 1, "gradients": n_params, "parameters": n_params,
                             "optimizer_state": 0}
    assert "aten.convolution_backward" in rep.lowered.rules_used

    convs, attns = _unet_layers(UNET, H, W)
    # the derivation names every convolution of the model, with its shape
    mods = {n: m for n, m in unet.named_modules() if isinstance(m, nn.Conv2d)}
    assert {n: (m.in_channels, m.out_channels, m.kernel_size[0], m.stride[0])
            for n, m in mods.items()} == {n: (ci, co, k, s) for n, ci, co, k, s, _ in convs}
    per = {n: _conv_macs(N, ci, co, k, s, hw) for n, ci, co, k, s, hw in convs}
    phase = {op: g.get("phase") for op, g in rep.lowered.groups.items()}

    def conv_products(ph):
        return sum(k.macs for k in rep.counts.kernels
                   if phase[k.op] == ph and k.matrix_class == "conv")
    assert conv_products("forward") == sum(per.values())
    assert conv_products("backward") == 2 * sum(per.values()) - per["conv_in"]

    # linear products: q, k, v, out per attention block; the timestep embedding's two
    # linears (b0 -> 4 b0 -> 4 b0) and each resnet's projection of it to its width
    temb = 4 * UNET["block_out_channels"][0]
    lin1 = N * UNET["block_out_channels"][0] * temb
    widths = [co for n, _, co, _, _, _ in convs if n.endswith(".conv2")]
    linear = sum(4 * N * t * c * c for _, c, t in attns) + lin1 + N * temb * temb \
        + sum(N * temb * c for c in widths)

    def products(ph, names):
        return sum(k.macs for k in rep.counts.kernels
                   if phase[k.op] == ph and k.opname in names)
    assert products("forward", ("aten.mm", "aten.addmm")) == linear
    # dW of every linear, dX of all but linear_1 (it reads the timesteps' sinusoids)
    assert products("backward", ("aten.mm", "aten.addmm")) == 2 * linear - lin1
    # attention: heads of attention_head_dim; QK^T and PV forward, four products backward
    hd = UNET["attention_head_dim"]
    scores = sum(N * (c // hd) * t * t * hd for _, c, t in attns)
    assert products("forward", ("aten.bmm",)) == 2 * scores
    assert products("backward", ("aten.bmm",)) == 4 * scores


# ---------------------------------------------------------------- Flax CNN with optax (JAX)

FLAX_CNN = dict(convs=((8, 3, 1), (16, 3, 2)), pool=2, hidden=32, classes=10)


def _same(n, k, s):
    """XLA's 'SAME' padding along one dimension: output ``ceil(n / s)``, the total padding
    ``max((out - 1) s + k - n, 0)`` split with the smaller half before."""
    out = -(-n // s)
    return out, max((out - 1) * s + k - n, 0) // 2


def test_flax_cnn_step_with_optax_adam_closed_form_and_validation():
    """A ``flax.linen`` CNN (3x3 convolutions with 'SAME' padding, the second strided, a
    2x2 max-pool between, two dense layers) trained one optax Adam step on softmax
    cross-entropy with integer labels, analyzed as the function that is the step. From the
    config: each convolution's products over the taps 'SAME' padding leaves in bounds
    (the strided one pads only after: its last row and column of windows are short), each
    dense layer's; the backward is the kernel gradient of every layer and the input
    gradient of every layer but the first (the max-pool's gradient routes, it does not
    multiply; the cross-entropy's gradient at the labels is a gather and a subtraction)."""
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    optax = pytest.importorskip("optax")
    nn_ = pytest.importorskip("flax.linen")
    import numpy as np
    c = FLAX_CNN

    class CNN(nn_.Module):
        @nn_.compact
        def __call__(self, x):
            (f1, k1, s1), (f2, k2, s2) = c["convs"]
            x = nn_.relu(nn_.Conv(f1, (k1, k1), strides=(s1, s1), padding="SAME")(x))
            x = nn_.max_pool(x, (c["pool"],) * 2, strides=(c["pool"],) * 2)
            x = nn_.relu(nn_.Conv(f2, (k2, k2), strides=(s2, s2), padding="SAME")(x))
            x = nn_.relu(nn_.Dense(c["hidden"])(x.reshape(x.shape[0], -1)))
            return nn_.Dense(c["classes"])(x)

    N, H, W, C = 4, 16, 12, 3
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((N, H, W, C)), jnp.float32)
    y = jnp.asarray(rng.integers(0, c["classes"], (N,)), jnp.int32)
    model = CNN()
    params = model.init(jax.random.key(0), x)
    tx = optax.adam(1e-3)

    def loss_fn(p, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()

    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state

    rep = solbound.analyze(step, (params, tx.init(params), x, y), arch="h100-sxm",
                           train=True, validate=True)
    assert rep.lowered.unsupported == []
    assert rep.validation["status"] == "passed", rep.validation
    tr = rep.lowered.training
    assert "ScaleByAdamState" in tr["optimizer"] and tr["unused"] == []
    assert sorted(tr["gradients"]) == sorted(
        f"params.{m}.{leaf}" for m in ("Conv_0", "Conv_1", "Dense_0", "Dense_1")
        for leaf in ("bias", "kernel"))

    # the closed form
    cin, hw, layers = C, (H, W), []
    for i, (f, k, s) in enumerate(c["convs"]):
        t, out = 1, []
        for n in hw:
            o, lo = _same(n, k, s)
            t *= _taps(o, k, s, lo, n)
            out.append(o)
        layers.append(N * f * cin * t)
        cin, hw = f, tuple(out)
        if i == 0:
            hw = tuple(n // c["pool"] for n in hw)
    flat = cin * hw[0] * hw[1]
    layers += [N * flat * c["hidden"], N * c["hidden"] * c["classes"]]
    ph = rep.training["phases"]
    assert ph["forward"]["macs"] == sum(layers)
    assert ph["backward"]["macs"] == 2 * sum(layers) - layers[0]
    assert ph["optimizer"]["macs"] == 0
    convs = [k for k in rep.counts.kernels if k.matrix_class == "conv"]
    assert sum(k.macs for k in convs) == 3 * sum(layers[:2]) - layers[0]

    # parameters, Adam's two moments and its int32 count; fused: each read once and its
    # update written once, the batch read, the loss written
    P = sum(int(np.prod(a.shape)) for a in jax.tree_util.tree_leaves(params))
    assert P == sum(k * k * ci * f + f for (f, k, _), ci in
                    zip(c["convs"], (C, c["convs"][0][0]))) \
        + flat * c["hidden"] + c["hidden"] + c["hidden"] * c["classes"] + c["classes"]
    mem = rep.training["memory"]
    assert mem["parameters"] == mem["gradients"] == 4 * P
    assert mem["optimizer_state"] == 4 * (2 * P + 1)
    assert rep.counts.fused.bytes == 4 * (2 * P + 2 * (2 * P + 1) + N * H * W * C + N + 1)
