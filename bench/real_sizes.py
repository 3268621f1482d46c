"""Real sizes (issue 42, item 4): each analysis timed, its MACs beside a second counter.

* FLUX.1's transformer (diffusers' ``FluxTransformer2DModel`` defaults: 19 double-stream
  and 38 single-stream blocks, 3072 wide) denoising one 1024x1024 image: 4096 latent tokens
  (128x128 latents in 2x2 patches) and 512 text tokens, bf16;
* Whisper large-v3 (transformers' ``WhisperConfig`` at large-v3's sizes) decoding one token
  after a 30 s encoding (1500 encoder frames) with 63 tokens already in its cache;
* LLaVA-1.5-7B (transformers' ``LlavaConfig`` defaults: CLIP ViT-L/14 at 336 px and a
  7B Llama) prefilling one image (576 image tokens) and a 128-token prompt. (Qwen2.5-VL
  does not trace: its vision tower sizes tensors from the values of ``image_grid_thw``,
  ``repeat_interleave(grid[:, 1] * grid[:, 2], grid[:, 0])``, even when the grid is a
  constant made in forward.)

The second counter is PyTorch's ``torch.utils.flop_counter.FlopCounterMode`` run on the
same module on the meta device: it counts matrix products, convolutions and attention (as
dense: it does not read masks), nothing elementwise. Its FLOPs / 2 is set beside
solbound's MACs of contraction kernels; where they differ the difference is explained in
``docs/zoo.md`` (Real sizes), never fitted. Run: ``python bench/real_sizes.py [name ...]``.
"""

from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def _flux():
    from diffusers import FluxTransformer2DModel
    with torch.device("meta"):
        m = FluxTransformer2DModel()
    m = m.to(torch.bfloat16).eval()
    c = m.config
    lat, txt = (1024 // 16) ** 2, 512

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, x, ctx, pooled, t, img_ids, txt_ids):
            return self.m(hidden_states=x, encoder_hidden_states=ctx,
                          pooled_projections=pooled, timestep=t, img_ids=img_ids,
                          txt_ids=txt_ids, return_dict=False)[0]

    def e(*s):
        return torch.empty(*s, dtype=torch.bfloat16, device="meta")
    return Step(), (e(1, lat, c.in_channels), e(1, txt, c.joint_attention_dim),
                    e(1, c.pooled_projection_dim), e(1), e(lat, 3), e(txt, 3))


def _whisper():
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache
    cfg = WhisperConfig(vocab_size=51866, num_mel_bins=128, d_model=1280, encoder_layers=32,
                        decoder_layers=32, encoder_attention_heads=20,
                        decoder_attention_heads=20, encoder_ffn_dim=5120,
                        decoder_ffn_dim=5120)
    with torch.device("meta"):
        m = WhisperForConditionalGeneration(cfg)
    m = m.to(torch.bfloat16).eval()
    past, frames = 63, 1500
    hd = cfg.d_model // cfg.decoder_attention_heads

    class Decode(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, ids, enc, *kv):
            self_c, cross_c = DynamicCache(), DynamicCache()
            for i in range(cfg.decoder_layers):
                self_c.update(kv[4 * i], kv[4 * i + 1], i)
                cross_c.update(kv[4 * i + 2], kv[4 * i + 3], i)
            cache = EncoderDecoderCache(self_c, cross_c)
            return self.m(decoder_input_ids=ids, encoder_outputs=(enc,),
                          past_key_values=cache, use_cache=True).logits

    def e(*s):
        return torch.empty(*s, dtype=torch.bfloat16, device="meta")
    kv = []
    for _ in range(cfg.decoder_layers):
        kv += [e(1, cfg.decoder_attention_heads, past, hd)] * 2
        kv += [e(1, cfg.decoder_attention_heads, frames, hd)] * 2
    ids = torch.zeros(1, 1, dtype=torch.long, device="meta")
    return Decode(), (ids, e(1, frames, cfg.d_model), *kv)


def _llava():
    from transformers import LlavaConfig, LlavaForConditionalGeneration
    cfg = LlavaConfig()                 # transformers' defaults: llava-1.5-7b's sizes
    with torch.device("meta"):
        m = LlavaForConditionalGeneration(cfg)
    m = m.to(torch.bfloat16).eval()
    v = cfg.vision_config
    n_img = (v.image_size // v.patch_size) ** 2      # 576 image tokens (336 px, 14 px patches)
    prompt = 128
    ids = torch.full((1, n_img + prompt), 1, dtype=torch.long)
    ids[0, 1:1 + n_img] = cfg.image_token_id
    pixels = torch.empty(1, 3, v.image_size, v.image_size, dtype=torch.bfloat16, device="meta")

    from programs.hf import ImageTextLM
    prefill = ImageTextLM(m)
    prefill.closed_form = _llava_closed(cfg, n_img, prompt)
    return prefill, (ids, pixels)


def _llava_closed(cfg, n_img: int, prompt: int) -> int:
    """LLaVA's contraction MACs by hand: the vision tower up to its feature layer (-2: the
    last layer's output is read by nothing), the projector on the image tokens, the
    language model over the image and prompt tokens (causal pairs), its head (logits for
    every token, as the model computes them)."""
    v, t = cfg.vision_config, cfg.text_config
    n_v = n_img + 1                                  # patches and the class token
    layers_v = v.num_hidden_layers + cfg.vision_feature_layer + 1     # -2: 23 of 24
    patch = n_img * v.hidden_size * 3 * v.patch_size ** 2
    per_v = n_v * (4 * v.hidden_size ** 2 + 2 * v.hidden_size * v.intermediate_size) \
        + 2 * n_v * n_v * v.hidden_size
    proj = n_img * (v.hidden_size * t.hidden_size + t.hidden_size * t.hidden_size)
    n = n_img + prompt
    kv = t.num_key_value_heads * (t.hidden_size // t.num_attention_heads)
    per_t = n * (2 * t.hidden_size ** 2 + 2 * t.hidden_size * kv
                 + 3 * t.hidden_size * t.intermediate_size) \
        + 2 * t.hidden_size * n * (n + 1) // 2
    head = n * t.hidden_size * t.vocab_size
    # the feature layer drops the class token: in the last layer computed, its query, its
    # row of attention, its output projection and its MLP are read by nothing (its key and
    # value are: every patch attends to it)
    cls = 2 * v.hidden_size ** 2 + 2 * n_v * v.hidden_size \
        + 2 * v.hidden_size * v.intermediate_size
    return patch + layers_v * per_v - cls + proj + t.num_hidden_layers * per_t + head


MODELS = {"flux-1024": _flux, "whisper-large-v3-decode": _whisper,
          "llava-1.5-7b-prefill": _llava}


def _second_counter(model, args) -> int:
    """FlopCounterMode's FLOPs / 2, or a closed form where PyTorch cannot run the model on
    the meta device (LLaVA's mask creation calls ``.item()``)."""
    if hasattr(model, "closed_form"):
        return model.closed_form
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        model(*args)
    return fc.get_total_flops() // 2


def main(names) -> None:
    import solbound
    for name in names or MODELS:
        model, args = MODELS[name]()
        t0 = time.perf_counter()
        rep = solbound.analyze(model, args, arch="h100-sxm")
        dt = time.perf_counter() - t0
        ours = sum(k.macs for k in rep.counts.kernels if k.kind == "contraction")
        other = _second_counter(model, args)
        fused = rep.bound("h100-sxm", "fused").seconds
        what = "closed form" if hasattr(model, "closed_form") else "FlopCounterMode"
        print(f"{name}: analysis {dt:.1f} s; MACs {rep.totals['macs']:,} (contractions "
              f"{ours:,}); {what} {other:,} ({ours / other:.4f}x); unsupported "
              f"{len(rep.unsupported)}; h100-sxm fused {fused * 1e3:.3f} ms", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
