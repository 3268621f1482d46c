"""Real JAX code nobody here wrote, built from configs with abstract parameters: a Flax linen
ResNet-50 (the ``jax-resnet`` package) and Gemma decoders from keras-hub on the JAX backend.
Nothing unsupported, MACs against closed forms derived from each architecture's definition,
and validation against JAX at small sizes."""

import os

import pytest

os.environ.setdefault("KERAS_BACKEND", "jax")
jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import solbound  # noqa: E402

S = jax.ShapeDtypeStruct


# --- a Flax ResNet ---------------------------------------------------------------------

def _taps(n: int, k: int, s: int, pad: int) -> tuple[int, int]:
    """(output size, valid (position, tap) pairs) along one dimension: taps that land on
    padding are not work."""
    n_out = (n + 2 * pad - k) // s + 1
    return n_out, sum(1 for o in range(n_out) for t in range(k) if 0 <= o * s + t - pad < n)


def _resnet50_macs(size: int, classes: int) -> int:
    """ResNet-50 v1.5 (stride on the 3x3 convolution, a 1x1 projection where the shape
    changes), per image: every convolution's valid taps times its channels, then the
    classifier."""
    def conv(h, cin, cout, k, s, p):
        ho, t = _taps(h, k, s, p)
        return ho, t * t * cin * cout
    h, macs = conv(size, 3, 64, 7, 2, 3)
    h = (h + 2 - 3) // 2 + 1                      # max pool 3x3, stride 2, padding 1
    cin = 64
    for stage, (blocks, width) in enumerate(zip([3, 4, 6, 3], [64, 128, 256, 512])):
        for b in range(blocks):
            s = 2 if b == 0 and stage > 0 else 1
            macs += conv(h, cin, width, 1, 1, 0)[1]
            h2, m = conv(h, width, width, 3, s, 1)
            macs += m + conv(h2, width, 4 * width, 1, 1, 0)[1]
            if cin != 4 * width or s != 1:
                macs += conv(h, cin, 4 * width, 1, s, 0)[1]
            h, cin = h2, 4 * width
    return macs + 2048 * classes


def _resnet(size, batch=1, classes=1000, real=False):
    jax_resnet = pytest.importorskip("jax_resnet")
    model = jax_resnet.ResNet50(n_classes=classes)
    x = S((batch, size, size, 3), jnp.float32)
    init = model.init if real else lambda *a: jax.eval_shape(model.init, *a)
    variables = init(jax.random.key(0), jnp.ones(x.shape) if real else x)   # abstract: no memory
    return (lambda v, x: model.apply(v, x, mutable=False)), (variables, x)


def test_flax_resnet50_counts_every_valid_tap():
    fn, args = _resnet(224, batch=2)
    rep = solbound.analyze(fn, args)
    assert rep.lowered.unsupported == []
    assert rep.counts.macs == 2 * _resnet50_macs(224, 1000) == 7_896_503_808


@pytest.mark.slow   # 15-28 s; the Flax CNN tests keep a Flax convnet validated in CI (the suite's 10-minute budget)
def test_flax_resnet50_validates_at_a_small_size():
    # real initial variables: drawn ones would give batch norm a negative variance
    fn, args = _resnet(32, classes=10, real=True)
    rep = solbound.analyze(fn, args, validate=True)
    assert rep.validation["status"] == "passed", rep.validation
    assert rep.counts.macs == _resnet50_macs(32, 10)


# --- keras-hub Gemma on the JAX backend --------------------------------------------------

def _keras_hub():
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "jax":
        pytest.skip("keras runs another backend here")
    return pytest.importorskip("keras_hub")


def _backbone_fn(model, tokens: int, mask_dtype=jnp.bool_):
    def fn(trainable, non_trainable, ids, mask):
        return model.stateless_call(trainable, non_trainable,
                                    {"token_ids": ids, "padding_mask": mask})[0]
    args = ([v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables],
            S((1, tokens), jnp.int32), S((1, tokens), mask_dtype))
    return fn, args


def _decoder_macs(*, layers, tokens, hidden, heads, kv_heads, head_dim, ffn, pairs,
                  qk_norm=False, norms=2, vocab=0):
    """Projections (q, k, v, o), a gated FFN (gate, up, down), attention over the
    ``pairs(layer)`` (query, key) pairs a layer's mask keeps (scores and the weighted sum),
    every RMSNorm's sum of squares (``norms`` per layer, a final one; per head for q and k
    when ``qk_norm``), and the logits against a tied ``vocab`` x hidden embedding."""
    T, H = tokens, hidden
    proj = T * H * (heads * head_dim + 2 * kv_heads * head_dim) + T * heads * head_dim * H
    norm = norms * T * H + (T * (heads + kv_heads) * head_dim if qk_norm else 0)
    return sum(proj + 3 * T * H * ffn + 2 * heads * pairs(i) * head_dim + norm
               for i in range(layers)) + T * H + T * H * vocab


def test_keras_hub_gemma_is_causal_and_validates():
    keras_hub = _keras_hub()
    T = 16
    m = keras_hub.models.GemmaBackbone(vocabulary_size=1000, num_layers=2, num_query_heads=4,
                                       num_key_value_heads=1, hidden_dim=256,
                                       intermediate_dim=1024, head_dim=64)
    rep = solbound.analyze(*_backbone_fn(m, T), validate=True)
    assert rep.lowered.unsupported == []
    assert rep.validation["status"] == "passed", rep.validation
    # keras-hub's Gemma FFN is intermediate_dim // 2 wide (gemma_decoder_block.py); the
    # mask is min(padding, causal): a boolean padding mask is 0 or 1, so the causal
    # triangle's T(T+1)/2 pairs are all the work
    assert rep.counts.macs == _decoder_macs(layers=2, tokens=T, hidden=256, heads=4,
                                            kv_heads=1, head_dim=64, ffn=512,
                                            pairs=lambda i: T * (T + 1) // 2)


def test_keras_hub_gemma3_sliding_window_layers_count_the_band():
    keras_hub = _keras_hub()
    T, W = 32, 8
    m = keras_hub.models.Gemma3Backbone(
        vocabulary_size=1000, image_size=None, num_layers=6, num_query_heads=4,
        num_key_value_heads=1, hidden_dim=128, intermediate_dim=256, head_dim=32,
        use_sliding_window_attention=True, sliding_window_size=W, vision_encoder=None)
    rep = solbound.analyze(*_backbone_fn(m, T), validate=True)
    assert rep.lowered.unsupported == []
    assert rep.validation["status"] == "passed", rep.validation

    def pairs(layer):
        # layers with i % 6 < 5 attend within the window (key within W - 1 of the query,
        # and causal); the sixth is global causal (gemma3_backbone.py)
        if layer % 6 < 5:
            return sum(min(q + 1, W) for q in range(T))
        return T * (T + 1) // 2
    assert rep.counts.macs == _decoder_macs(layers=6, tokens=T, hidden=128, heads=4,
                                            kv_heads=1, head_dim=32, ffn=256, pairs=pairs,
                                            qk_norm=True)


def test_keras_hub_llama_rmsnorm_with_ops_power_counts_its_sum_of_squares():
    # LlamaLayerNorm writes mean(ops.power(x, 2)): JAX's pow primitive, counted as x * x,
    # so each of the 2 norms per layer and the final one is T*H MACs, as Gemma's square is
    keras_hub = _keras_hub()
    T = 8
    m = keras_hub.models.LlamaBackbone(vocabulary_size=100, num_layers=2, num_query_heads=4,
                                       num_key_value_heads=2, hidden_dim=32,
                                       intermediate_dim=48)
    rep = solbound.analyze(*_backbone_fn(m, T), validate=True)
    assert rep.lowered.unsupported == []
    assert rep.validation["status"] == "passed", rep.validation
    # per layer: q, k, v, o 8*32*(32 + 2*16) + 8*32*32 = 24,576; the FFN 3*8*32*48 =
    # 36,864; 4 heads over 36 causal pairs of width 8, twice, 2,304; two norms 2*8*32 = 512;
    # two layers and the final norm (256): 128,768
    want = _decoder_macs(layers=2, tokens=T, hidden=32, heads=4, kv_heads=2, head_dim=8,
                         ffn=48, pairs=lambda i: T * (T + 1) // 2)
    assert rep.counts.macs == want == 128_768
    norms = [k for k in rep.counts.kernels if k.macs and k.kind == "reduction"]
    assert sum(k.macs for k in norms) == 5 * T * 32


_SMALL = dict(vocabulary_size=100, num_layers=2, num_query_heads=4, num_key_value_heads=2,
              hidden_dim=64, intermediate_dim=128)


def _mask_assumed(rep) -> bool:
    pad = rep.lowered.inputs[-1]["ir"]
    return any(n.startswith(f"assumption: integer input {pad} is used only as a mask")
               for n in rep.to_dict()["assumptions"])


def test_keras_hub_llama_with_its_int32_padding_mask_counts_the_causal_triangle():
    """keras-hub declares ``padding_mask`` int32: the mask is ``min(padding, causal)``
    (merge_padding_and_attention_mask, compute_causal_mask), made a boolean for
    ``ops.dot_product_attention`` (JAX's: ``where(mask, scores, -0.7 * finfo.max)``). An
    integer used only as a mask is taken to hold 0 or 1 (stated), so where the causal mask
    is 0 the minimum is 0."""
    keras_hub = _keras_hub()
    T = 16
    m = keras_hub.models.LlamaBackbone(**_SMALL)
    rep = solbound.analyze(*_backbone_fn(m, T, jnp.int32), validate=True)
    assert rep.lowered.unsupported == []
    assert rep.validation["status"] == "passed", rep.validation
    assert _mask_assumed(rep)
    # per layer, head_dim 64 / 4 = 16: q and o 16*64*64 each, k and v 16*64*32 each
    # (196,608); the gated FFN 3*16*64*128 = 393,216; scores and P.V over the 136 causal
    # pairs, 4 heads of width 16, 2*4*16*136 = 17,408; two RMSNorms' sums of squares
    # 2*16*64 = 2,048: 609,280 a layer; two layers and the final norm (1,024): 1,219,584
    want = _decoder_macs(layers=2, tokens=T, hidden=64, heads=4, kv_heads=2, head_dim=16,
                         ffn=128, pairs=lambda i: T * (T + 1) // 2)
    assert rep.counts.macs == want == 1_219_584


@pytest.mark.parametrize("window, pairs, macs", [
    # sum over queries of min(q + 1, W): 1 + 2 + 3 + 13*4 = 58 pairs; attention 2*4*16*58
    # = 7,424 a layer instead of the causal 17,408
    (4, 58, 1_199_616),
    # a window as long as the sequence is the causal triangle
    (16, 136, 1_219_584)])
def test_keras_hub_mistral_sliding_window_counts_the_band(window, pairs, macs):
    """Mistral's window is ``min(causal, int(i < j + W))`` (mistral_transformer_decoder.py):
    the key within W - 1 of the query, and causal."""
    keras_hub = _keras_hub()
    T = 16
    assert sum(min(q + 1, window) for q in range(T)) == pairs
    m = keras_hub.models.MistralBackbone(sliding_window=window, **_SMALL)
    rep = solbound.analyze(*_backbone_fn(m, T, jnp.int32), validate=True)
    assert rep.lowered.unsupported == []
    assert rep.validation["status"] == "passed", rep.validation
    assert _mask_assumed(rep)
    # as Llama (MistralLayerNormalization writes mean(ops.power(x, 2)) too)
    want = _decoder_macs(layers=2, tokens=T, hidden=64, heads=4, kv_heads=2, head_dim=16,
                         ffn=128, pairs=lambda i: pairs)
    assert rep.counts.macs == want == macs


@pytest.mark.slow          # the int32 padding mask is the Llama test's, above
def test_keras_hub_gemma_with_its_int32_padding_mask_is_causal():
    keras_hub = _keras_hub()
    T = 16
    m = keras_hub.models.GemmaBackbone(vocabulary_size=1000, num_layers=2, num_query_heads=4,
                                       num_key_value_heads=1, hidden_dim=256,
                                       intermediate_dim=1024, head_dim=64)
    rep = solbound.analyze(*_backbone_fn(m, T, jnp.int32), validate=True)
    assert rep.validation["status"] == "passed", rep.validation
    assert _mask_assumed(rep)
    assert rep.counts.macs == _decoder_macs(layers=2, tokens=T, hidden=256, heads=4,
                                            kv_heads=1, head_dim=64, ffn=512,
                                            pairs=lambda i: T * (T + 1) // 2)


# --- the gemma library (Google DeepMind's gemma.gm.nn) --------------------------------------

def _gemma_lib():
    """gemma.gm.nn's Transformer and its config module. Imported below the package's
    ``gm.nn.Gemma3_*`` presets: gemma 3.3.0's checkpoint module subclasses
    ``kd.ckpts.AbstractPartialLoader``, which kauldron 1.4.2 (the release that runs on
    current JAX) renamed, so the presets do not import; their configs are spelled out."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")    # kauldron.typing imports TensorFlow
    pytest.importorskip("gemma", reason="the gemma library (tests/corpus-no-deps.txt)")
    from gemma.gm.nn import _config, _modules, _transformer
    return _config, _modules, _transformer


def _gemma3(*, vocab, hidden, ffn, heads, kv_heads, head_dim, layers, window, dtype,
            global_scale=1.0):
    """A Gemma 3 architecture as ``gm.nn.Gemma3_1B`` configures it (gemma/gm/nn/_gemma.py):
    post-attention and post-FFN norms, q/k norms, five sliding-window layers to one global,
    no soft caps."""
    _config, _modules, _transformer = _gemma_lib()
    A = _modules.AttentionType
    cfg = _config.TransformerConfig(
        final_logit_softcap=None, num_embed=vocab, embed_dim=hidden, hidden_dim=ffn,
        num_heads=heads, head_dim=head_dim, num_kv_heads=kv_heads, use_post_attn_norm=True,
        use_post_ffw_norm=True, use_qk_norm=True,
        attention_types=_config.make_attention_layers_types((A.LOCAL_SLIDING,) * 5 + (A.GLOBAL,),
                                                            num_layers=layers),
        query_pre_attn_norm=_config.QueryPreAttentionNormalisation.BY_ONE_OVER_SQRT_HEAD_DIM,
        attn_logits_soft_cap=None, sliding_window_size=window, transpose_gating_einsum=True,
        local_base_frequency=10_000, global_base_frequency=1_000_000,
        global_scale_factor=global_scale, vision_encoder=None)
    return _transformer.Transformer(config=cfg, dtype=dtype)


def _gemma3_small(T, W):
    model = _gemma3(vocab=1000, hidden=128, ffn=256, heads=4, kv_heads=1, head_dim=32,
                    layers=6, window=W, dtype=jnp.float32)
    tokens = S((1, T), jnp.int32)
    params = jax.eval_shape(model.init, jax.random.key(0), tokens)    # abstract: no memory
    return model, params, tokens


def _gemma3_small_macs(T, pairs):
    return _decoder_macs(layers=6, tokens=T, hidden=128, heads=4, kv_heads=1, head_dim=32,
                         ffn=256, pairs=pairs, qk_norm=True, norms=4, vocab=1000)


def test_gemma_library_gemma3_with_static_positions_counts_the_band():
    """Positions and the causal mask given (a prefill with no padding): the sliding layers'
    mask ``|k - q| < W`` and causal is known before the run, so only the band is work."""
    T, W = 32, 8
    model, params, tokens = _gemma3_small(T, W)
    pos, causal = jnp.arange(T)[None], jnp.tril(jnp.ones((1, T, T), bool))
    rep = solbound.analyze(
        lambda p, t: model.apply(p, t, positions=pos, attention_mask=causal).logits,
        (params, tokens), validate=True)
    assert rep.lowered.unsupported == []
    assert rep.validation["status"] == "passed", rep.validation

    def pairs(layer):       # gemma/gm/nn/_modules.py: create_sliding_mask, then AND causal
        return sum(min(q + 1, W) for q in range(T)) if layer % 6 < 5 else T * (T + 1) // 2
    assert rep.counts.macs == _gemma3_small_macs(T, pairs) == 31_394_816
    assert rep.to_dict()["assumptions"] == []


def test_gemma_library_gemma3_default_call_counts_causal_pairs():
    """The default call derives positions from the tokens (``cumsum(tokens != 0) - 1``: 0
    is padding), so the sliding window is data: every layer keeps the causal triangle (the
    ``tril`` the library builds), and the window cannot remove pairs before the run."""
    T, W = 32, 8
    model, params, tokens = _gemma3_small(T, W)
    rep = solbound.analyze(lambda p, t: model.apply(p, t).logits, (params, tokens),
                           validate=True)
    assert rep.lowered.unsupported == []
    assert rep.validation["status"] == "passed", rep.validation
    assert rep.counts.macs == _gemma3_small_macs(T, lambda i: T * (T + 1) // 2) == 31_778_816
    # and says so: the tokens are an input a mask is computed from
    tok = rep.lowered.inputs[-1]["ir"]
    assert any(a.startswith(f"assumption: input {tok} is known only at run time and a mask")
               for a in rep.to_dict()["assumptions"])
