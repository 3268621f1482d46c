"""A fixed sample of transformers' causal-LM registry that no other test builds, each
built by the one generic shrinker (``solbound.zoo``) from its own config class and called
with its defaults: analyzed with nothing unsupported, every returned tensor an output,
validated against the library's forward, and every ``nn.Linear`` counted exactly
(tokens x in x out MACs: the product a linear layer needs, from the module alone).
``python bench/registry.py`` runs the whole registry."""

import pytest
import torch

import solbound
from solbound import zoo

SAMPLE = ["bitnet", "biogpt", "bloom", "cohere", "ctrl", "falcon_mamba", "gemma2", "gemma3_text",
          "glm4_moe", "gpt_bigcode", "gpt_neox", "gpt_oss", "granitemoe", "helium", "internlm3",
          "jamba", "qwen3_next",
          # registered for a composite model type: built from the class's own (text) config
          # (Qwen3.5's layers are Qwen3-Next's gated delta net: 13 s, under the slow marker)
          pytest.param("qwen3_5", marks=pytest.mark.slow), "llama4"]


def test_the_shrinker_is_one_rule_over_field_names():
    from transformers import MixtralConfig
    small, changed = zoo.shrink_config(MixtralConfig())
    assert (small.num_hidden_layers, small.hidden_size, small.intermediate_size) == (2, 64, 128)
    # 32 query heads over 8 key/value heads: groups of 4 kept, so 4 heads over 1
    assert (small.num_attention_heads, small.num_key_value_heads) == (4, 1)
    assert (small.num_local_experts, small.num_experts_per_tok) == (4, 2)
    assert small.vocab_size == 4096 and changed["vocab_size"] == (32000, 4096)


def test_the_shrinker_keeps_what_a_config_requires():
    """Relations a model or its config's validator needs, kept by rules over field names:
    a top-k left None by the default config (DeepSeek-V2) gets the shrinker's 2 per token;
    layers that reuse another layer's cache (Gemma 3n) keep one of each kind producing and
    one reusing; a latent-attention head size that must be the sum of its parts (dots3) is
    tried as that sum; a causal LM is a decoder (BERT's causal head); widths in parts and
    positions in factors keep their relations (Reformer); a shorter pattern of layer kinds
    cycled over the layers keeps enough layers for each kind (RecurrentGemma); expert
    counts a default config leaves None get the shrinker's (dots.llm1)."""
    import torch
    b = zoo.build("deepseek_v2")
    assert b.config.num_experts_per_tok == 2 and b.changed["num_experts_per_tok"] == (None, 2)
    b = zoo.build("gemma3n_text")
    assert b.config.num_hidden_layers == 4 and b.config.num_kv_shared_layers == 2
    assert b.config.layer_types == ["sliding_attention", "full_attention"] * 2
    b = zoo.build("dots3_note")
    c = b.config
    assert c.head_dim == c.qk_nope_head_dim + c.qk_rope_head_dim == 32
    b = zoo.build("bert")
    assert b.config.is_decoder and b.changed["is_decoder"] == (False, True)
    # Reformer: axial position embedding widths summing to the model width keep their
    # 1:3 proportion; the axial shape multiplies to the shrunk number of positions
    b = zoo.build("reformer")
    c = b.config
    assert list(c.axial_pos_embds_dim) == [16, 48] and sum(c.axial_pos_embds_dim) == c.hidden_size
    assert c.axial_pos_shape[0] * c.axial_pos_shape[1] == c.max_position_embeddings == 512
    # RecurrentGemma's pattern of kinds (recurrent, recurrent, attention) cycled over the
    # layers: three layers, so that an attention layer (and its cache) exists
    b = zoo.build("recurrent_gemma")
    assert b.config.num_hidden_layers == 3 and b.changed["num_hidden_layers"] == (26, 3)
    assert b.config.block_types == ["recurrent", "recurrent", "attention"]
    assert b.config.layers_block_type[2] != b.config.layers_block_type[0]
    # dots.llm1's default config leaves its expert counts None, which its model reads as
    # numbers: the shrinker's 4 experts, 2 per token, 1 shared
    b = zoo.build("dots1")
    c = b.config
    assert (c.n_routed_experts, c.num_experts_per_tok, c.n_shared_experts) == (4, 2, 1)
    for name in ("deepseek_v2", "gemma3n_text", "dots3_note", "reformer", "recurrent_gemma",
                 "dots1"):
        m = zoo.build(name)
        with torch.no_grad():
            m.model(*m.inputs)               # the default call runs in eager PyTorch


def test_the_shrinker_rederives_sizes_and_retries_wider_or_deeper():
    """Sizes a config class computes in ``__post_init__`` from the model width, and which
    are no fields of it (Zamba 2's attention and Mamba head sizes), are re-derived from the
    shrunk width rather than shrunk on their own; a layer count named ``num_blocks``
    (xLSTM) is a layer count. A model whose default call fails at the narrowest widths is
    built again wider (xLSTM rounds its key width up to a multiple of 64 in its config
    but not in its layers: 64 wide fails, 128 runs), and one that does not build with one
    layer of each kind gets every kind twice (Zamba ties its shared block across hybrid
    layers and refuses a single one)."""
    b = zoo.build("zamba2")
    c = b.config
    assert c.hidden_size == 64 and c.attention_hidden_size == 2 * c.hidden_size
    assert c.attention_head_dim == 2 * c.hidden_size // c.num_attention_heads == 32
    assert c.mamba_headdim == int(c.mamba_expand * c.hidden_size) // c.n_mamba_heads == 32
    assert c.layers_block_type == ["linear_attention", "hybrid"] and c.hybrid_layer_ids == [1]
    b2 = zoo.build("xlstm")
    c2 = b2.config
    assert (c2.num_hidden_layers, c2.num_blocks, c2.hidden_size) == (2, 2, 128)
    assert b2.changed["hidden_size"] == (4096, 128)
    with pytest.raises(ValueError, match="matC_old has wrong shape"):
        small = zoo._build_one(type(b2.model), b2.arch, type(c2)(), "causal-lm", "xlstm", 1, 1)
        with torch.no_grad():
            small.model(*small.inputs)
    b3 = zoo.build("zamba")
    c3 = b3.config
    assert c3.num_hidden_layers == 4
    assert c3.layers_block_type == ["linear_attention", "hybrid"] * 2
    with pytest.raises(zoo.ShrinkError, match="tie_weights_keys"):
        zoo._build_one(type(b3.model), b3.arch, type(c3)(), "causal-lm", "zamba", 1, 1)
    # a vocabulary by any other suffix is a vocabulary: Gemma 4's per-layer embeddings are
    # looked up with the token ids, so they keep the whole shrunk vocabulary (halved to
    # 256 as a plain width, the default call indexed past their end)
    b4 = zoo.build("gemma4_text")
    assert b4.config.vocab_size_per_layer_input == b4.config.vocab_size == 4096
    # layers per stack are a layer count: HRM's config derives its cache slots from them,
    # one per stack layer, cycle and module (2 x 2 x (3 + 1) = 16), which the model indexes
    b5 = zoo.build("hrm_text")
    c5 = b5.config
    assert c5.num_layers_per_stack == 2
    assert c5.num_hidden_layers == 2 * c5.H_cycles * (c5.L_cycles + 1) == 16
    # Dory serializes each layer as an attention and an MLP block (every layer count
    # doubled) and halves them on load: the shrinker reads the fields as the config holds
    # them; its input, recurrent and output sections, which add up to the layers, get one
    # layer each
    b6 = zoo.build("dory")
    c6 = b6.config
    assert (c6.num_hidden_layers, c6.n_input_layers, c6.n_recurrent_layers, c6.n_output_layers) \
        == (3, 1, 1, 1)
    assert c6.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    # the sections share the layers kept, however many: at twice the layers (the ladder's
    # repeat rung), 6 layers as 1 + 4 + 1, the largest section taking the rest
    from transformers import AutoConfig
    c7, _ = zoo.shrink_config(AutoConfig.for_model("dory"), 1, 2)
    assert (c7.num_hidden_layers, c7.n_input_layers, c7.n_recurrent_layers, c7.n_output_layers) \
        == (6, 1, 4, 1)
    # a token type's vocabulary (2 types) is no vocabulary of tokens: RoBERTa's special ids
    # keep their defaults, distinct (they were capped to 1, the padding id)
    from transformers import RobertaConfig
    c8, changed8 = zoo.shrink_config(RobertaConfig())
    assert (c8.pad_token_id, c8.bos_token_id, c8.eos_token_id) == (1, 0, 2)
    assert "eos_token_id" not in changed8
    for m in (b, b2, b3, b4, b5, b6):
        with torch.no_grad():
            m.model(*m.inputs)               # the default call runs in eager PyTorch


@pytest.mark.parametrize("model_type", SAMPLE)
def test_a_registered_architecture_called_with_its_defaults(model_type):
    b = zoo.build(model_type)
    ids = b.inputs[0]
    tokens = ids.numel()
    rep = solbound.analyze(b.model, b.inputs, arch="h100-sxm", source=b.arch, validate=True)
    assert rep.unsupported == [], rep.unsupported
    d = rep.to_dict()
    outs = d["outputs"]
    assert outs and outs[0]["path"] == "logits" and outs[0]["shape"][:2] == [1, tokens]
    # every nn.Linear the forward calls once on every token: exactly tokens*in*out MACs
    macs = {m["module"]: m["macs"] for m in d["modules"]}
    linears = {name: mod for name, mod in b.model.named_modules()
               if type(mod) is torch.nn.Linear and name in macs}
    assert linears, "no linear layer attributed"
    for name, mod in linears.items():
        want = tokens * mod.in_features * mod.out_features
        assert macs[name] == want, (name, macs[name], want)
    assert rep.validation["status"] == "passed", rep.validation


def test_a_selection_computed_from_constants_is_exact_not_assumed():
    """X-MOD picks each language adapter's tokens with a boolean mask of its language ids,
    ``default_lang_id * torch.ones(batch)``: values the program computes from constants,
    so the selection is answered exactly while tracing, with no routing assumption."""
    b = zoo.build("xmod")
    rep = solbound.analyze(b.model, b.inputs, arch="h100-sxm", source=b.arch, validate=True)
    assert rep.unsupported == [] and rep.validation["status"] == "passed"
    notes = rep.program.notes
    assert any("no routing assumption" in n and "__getitem__" in n for n in notes), notes
    assert not any(n.startswith("assumption: routing") for n in notes)


def _bench_registry():
    import importlib.util
    import os
    spec = importlib.util.spec_from_file_location(
        "registry_bench", os.path.join(os.path.dirname(__file__), "..", "bench", "registry.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_failures_of_transformers_own_defaults_are_named_upstream(monkeypatch):
    """A default config transformers itself cannot build stops the shrinker at once; a
    default call that fails on transformers' own default config at full size (checked on
    the meta device) the way it fails on the shrunk one is stage ``upstream`` in
    ``bench/registry.py``. When no rung of the retry ladder runs, the model returned is
    still one that was never called."""
    built = []
    real = zoo._build_one

    def counting(*a, **k):
        b = real(*a, **k)
        b.model.calls = 0
        b.model.register_forward_pre_hook(lambda m, args: setattr(m, "calls", m.calls + 1))
        built.append(b)
        return b

    monkeypatch.setattr(zoo, "_build_one", counting)
    with pytest.raises(zoo.ShrinkError, match="default DbrxConfig does not build") as e:
        zoo.build("dbrx")
    assert e.value.default_broken and built == []
    b = zoo.build("blt")                 # its forward asks a config for what only sub-configs hold
    assert len(built) == 6 and b is built[-1] and b.model.calls == 0    # five rungs, then afresh
    assert [x.model.calls for x in built[:5]] == [1, 1, 1, 1, 1]
    monkeypatch.undo()
    rec = _bench_registry().one("causal-lm", "blt", validate=False)
    assert rec["stage"] == "upstream", rec
    assert rec["error"].startswith("transformers' own default config, full size, fails the same way: "
                                   "AttributeError")


def test_a_backbones_stage_names_follow_its_shrunk_depth():
    """transformers' backbone mixin derives a vision model's stage names and the stages it
    outputs from its depth: passed back unshrunk (``out_features`` ['stage12'] of a
    2-layer DINOv2), the config does not construct; re-derived, they name the last stage."""
    # ConvNeXt halves 2 x 2 patches of 4 pixels past one pixel: the last rung of the
    # retry ladder gives it images 64 pixels wide
    b = zoo.build("convnext", "vision")
    assert b.config.image_size == 64 and tuple(b.inputs[0].shape) == (1, 3, 64, 64)
    with torch.no_grad():
        b.model(*b.inputs)
    b = zoo.build("dinov2", "vision")
    c = b.config
    assert c.num_hidden_layers == 2 and c.stage_names == ["stem", "stage1", "stage2"]
    assert c.out_features == ["stage2"] and c.out_indices == [2]
    with torch.no_grad():
        assert b.model(*b.inputs).logits.shape[0] == 1


def test_a_vision_model_that_reads_ids_gets_ids():
    """ImageGPT classifies an image given as ids of colour clusters: its forward reads
    ``input_ids`` and no pixels, so it is called with ids in its vocabulary."""
    b = zoo.build("imagegpt", "vision")
    (ids,) = b.inputs
    assert ids.dtype == torch.long and int(ids.max()) < b.config.vocab_size
    with torch.no_grad():
        assert b.model(*b.inputs).logits.shape[0] == 1


def test_audio_models_are_called_as_their_processors_feed_them():
    """The audio and CTC registries (``python bench/registry.py --task audio --task ctc``):
    Whisper takes mel bins x twice its encoder positions; wav2vec2-BERT its projection's
    input width; Granite Speech 5 four stacked mel frames (its first layer's width); a CTC
    head gets a character vocabulary where the default config leaves none; wav2vec 2.0
    takes a waveform, analyzes with nothing unsupported and validates."""
    b = zoo.build("whisper", "audio")
    c = b.config
    assert tuple(b.inputs[0].shape) == (1, c.num_mel_bins, 2 * c.max_source_positions)
    b = zoo.build("granite_speech5_ctc", "ctc")
    assert b.inputs[0].shape[-1] == 4 * b.config.encoder_config.num_mel_bins
    b = zoo.build("wav2vec2-bert", "ctc")
    assert b.changed["vocab_size"] == (None, 32)
    assert b.inputs[0].shape[-1] == b.config.feature_projection_input_dim
    b = zoo.build("wav2vec2", "ctc")
    assert tuple(b.inputs[0].shape) == (1, zoo.SAMPLES)
    rep = solbound.analyze(b.model, b.inputs, validate=True)
    assert not rep.lowered.unsupported and rep.validation["status"] == "passed"
