"""Real JAX code nobody here wrote, next to XLA's own cost analysis.

    python bench/jax_real.py

For each model: analyze time, our MACs and FLOPs (2 x MACs + vector + special), and
``jax.jit(f).lower(*args).cost_analysis()["flops"]``. Models: a Flax linen ResNet-50
(``jax-resnet``) at 224x224, batch 8; keras-hub Gemma-2B's shapes (18 layers, hidden 2048,
8 heads of 256, one KV head, FFN 32768 / 2) and a Gemma-3-1B-shaped decoder (26 layers,
hidden 1152, 4 heads of 256, one KV head, FFN 6912, sliding window 512 on five layers of
six) on the JAX backend, 1024 tokens. keras builds real variables, so the Gemma models
allocate their weights (about 10 GB for Gemma-2B's shapes in float32: the script uses
bfloat16). Then Google DeepMind's ``gemma`` library (``gemma.gm.nn.Transformer``) at
Gemma-3-1B and Gemma-3-12B (text) shapes, 1024 tokens, bf16, on abstract parameters
(``jax.eval_shape(model.init, ...)``: no weights in memory), positions given (the band is
known) and by default (positions from the tokens: the window is data). Peak RSS is printed
after each row.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import solbound  # noqa: E402
from test_jax_real import _backbone_fn, _decoder_macs, _gemma3, _resnet50_macs  # noqa: E402


def xla_flops(fn, args) -> float:
    ca = jax.jit(fn).lower(*args).cost_analysis()
    ca = ca[0] if isinstance(ca, (list, tuple)) else ca
    return float(ca.get("flops", float("nan")))


def row(name, fn, args, closed):
    t = time.perf_counter()
    rep = solbound.analyze(fn, args)
    secs = time.perf_counter() - t
    ours = 2 * rep.counts.macs + rep.counts.flops["vector"] + rep.counts.flops["special"]
    xla = xla_flops(fn, args)
    print(f"| {name} | {secs:.1f} s | {len(rep.lowered.unsupported)} | {rep.counts.macs:,} "
          f"| {'=' if rep.counts.macs == closed else '!= ' + format(closed, ',')} | {ours:,} "
          f"| {xla:,.0f} | {xla / ours:.3f} |", flush=True)
    import resource
    print(f"<!-- peak RSS so far {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f}"
          f" GiB -->", file=sys.stderr, flush=True)
    return rep


def gemma_library(T: int = 1024) -> None:
    """gemma.gm.nn's Transformer at Gemma-3-1B and -12B text shapes (gemma/gm/nn/_gemma.py)."""
    shapes = {"1B": dict(vocab=262144, hidden=1152, ffn=6912, heads=4, kv_heads=1,
                         head_dim=256, layers=26, window=512),
              "12B": dict(vocab=262144, hidden=3840, ffn=15360, heads=16, kv_heads=8,
                          head_dim=256, layers=48, window=1024, global_scale=8.0)}
    for name, sh in shapes.items():
        model = _gemma3(dtype=jnp.bfloat16, **sh)
        tokens = jax.ShapeDtypeStruct((1, T), jnp.int32)
        params = jax.eval_shape(model.init, jax.random.key(0), tokens)
        W = sh["window"]
        band = sum(min(q + 1, W) for q in range(T))
        common = dict(layers=sh["layers"], tokens=T, hidden=sh["hidden"], heads=sh["heads"],
                      kv_heads=sh["kv_heads"], head_dim=sh["head_dim"], ffn=sh["ffn"],
                      qk_norm=True, norms=4, vocab=sh["vocab"])
        pos, causal = jnp.arange(T)[None], jnp.tril(jnp.ones((1, T, T), bool))
        row(f"gemma library Gemma 3 {name} (text), {T} tokens, bf16, positions given",
            lambda p, t: model.apply(p, t, positions=pos, attention_mask=causal).logits,
            (params, tokens),
            _decoder_macs(pairs=lambda i: band if i % 6 < 5 else T * (T + 1) // 2, **common))
        row(f"gemma library Gemma 3 {name} (text), {T} tokens, bf16, default call",
            lambda p, t: model.apply(p, t).logits, (params, tokens),
            _decoder_macs(pairs=lambda i: T * (T + 1) // 2, **common))


def main() -> None:
    print("| model | analyze | unsupported | MACs | closed form | our FLOPs | XLA cost_analysis "
          "FLOPs | XLA / ours |")
    print("|---|---|---|---|---|---|---|---|")
    if "--gemma-only" in sys.argv:
        return gemma_library()
    import jax_resnet
    model = jax_resnet.ResNet50(n_classes=1000)
    x = jax.ShapeDtypeStruct((8, 224, 224, 3), jnp.float32)
    variables = jax.eval_shape(model.init, jax.random.key(0), x)
    row("jax-resnet ResNet50, 8x224x224", lambda v, x: model.apply(v, x, mutable=False),
        (variables, x), 8 * _resnet50_macs(224, 1000))

    import keras
    import keras_hub
    keras.config.set_floatx("bfloat16")
    T = 1024
    m = keras_hub.models.GemmaBackbone(vocabulary_size=256000, num_layers=18, num_query_heads=8,
                                       num_key_value_heads=1, hidden_dim=2048,
                                       intermediate_dim=32768, head_dim=256)
    fn, args = _backbone_fn(m, T)
    row("keras-hub Gemma (2B shapes), 1024 tokens, bf16", fn, args,
        _decoder_macs(layers=18, tokens=T, hidden=2048, heads=8, kv_heads=1, head_dim=256,
                      ffn=16384, pairs=lambda i: T * (T + 1) // 2))
    del m, fn, args
    W = 512
    m = keras_hub.models.Gemma3Backbone(
        vocabulary_size=262144, image_size=None, num_layers=26, num_query_heads=4,
        num_key_value_heads=1, hidden_dim=1152, intermediate_dim=6912, head_dim=256,
        use_sliding_window_attention=True, sliding_window_size=W, vision_encoder=None)
    fn, args = _backbone_fn(m, T)
    row("keras-hub Gemma 3 (1B shapes), 1024 tokens, bf16", fn, args,
        _decoder_macs(layers=26, tokens=T, hidden=1152, heads=4, kv_heads=1, head_dim=256,
                      ffn=6912, qk_norm=True,
                      pairs=lambda i: sum(min(q + 1, W) for q in range(T)) if i % 6 < 5
                      else T * (T + 1) // 2))
    del m, fn, args
    gemma_library()


if __name__ == "__main__":
    main()
