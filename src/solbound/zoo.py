"""Every architecture transformers registers, built small from its own config class.

``shrink_config(cfg)`` is one generic rule over config fields, not a table per model:
layer counts to 2, attention heads to at most 4 (key/value heads keeping their grouping),
widths to at most 256, experts to at most 4 (2 per token), vocabularies to at most 4096,
recursively through sub-configs (``text_config``, ``vision_config``, encoder/decoder
configs). ``build(arch, task)`` constructs the registered model class for that task with
random weights from the shrunk default config, and the inputs a user would call it with
(token ids; decoder ids for sequence-to-sequence; pixels for vision), called with its
defaults: no wrapper, no ``use_cache=False``. Where that call fails at the narrowest widths,
or the model does not build with one layer of each kind, ``build`` retries wider (width caps
doubled, then doubled again, never over 256), then with every kind of layer twice, then with
images 64 pixels wide.

    >>> from transformers import LlamaConfig
    >>> small, changed = shrink_config(LlamaConfig())
    >>> small.num_hidden_layers, small.hidden_size, small.num_attention_heads
    (2, 64, 4)
    >>> small.num_key_value_heads, small.intermediate_size, small.vocab_size
    (4, 128, 4096)
"""

from __future__ import annotations

import inspect
import math
import re
from dataclasses import dataclass
from typing import Any

LAYERS = 2
HEADS = 4
HIDDEN = 64
HEAD_DIM = 16
FFN = 128
WIDTH_MAX = 256
EXPERTS = 4
EXPERTS_PER_TOKEN = 2
VOCAB = 4096
TOKENS = 16
IMAGE = 32

TASKS = {
    "causal-lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "masked-lm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "seq2seq": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "vision": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    "audio": "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",
    "ctc": "MODEL_FOR_CTC_MAPPING_NAMES",
    "detection": "MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES",
    "segmentation": "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES",
    "video": "MODEL_FOR_VIDEO_CLASSIFICATION_MAPPING_NAMES",
}
#: a waveform's samples (audio models that take raw audio: 0.25 s at 16 kHz, 12 frames of
#: wav2vec 2.0's 320-sample stride) and a spectrogram's frames (those that take features)
SAMPLES = 4000
FRAMES = 32

# field names by what they mean (matched on the whole name)
_LAYERS = re.compile(r"(num_)?(hidden_|encoder_|decoder_|text_|vision_)?(layers|n_layers?|"
                     r"num_hidden_layers|num_blocks|layers_per_\w+|layer_count|depth)")
_KV_HEADS = re.compile(r"(num_)?(key_value|kv)_heads|n_kv_heads?|num_kv_heads|multi_query_group_num")
_HEADS = re.compile(r"(.*_)?(n_)?heads?")
_HEAD_DIM = re.compile(r"(head_dim|attention_head_size|kv_channels|qk_head_dim|v_head_dim|"
                       r"qk_nope_head_dim|qk_rope_head_dim|head_size|d_kv|rotary_dim|"
                       r"rotary_emb_dim|.*_head_dim)")
_HIDDEN = re.compile(r"(hidden_size|d_model|n_embd|embed_dim|embedding_size|hidden_dim|"
                     r"model_dim|dim|word_embed_proj_dim|n_embed|emb_dim)")
_FFN = re.compile(r".*(intermediate_size|ffn_dim|n_inner|d_ff|ffn_hidden_size|"
                  r"mlp_dim|inner_dim|ff_dim|ffn_dim_size)")
_EXPERTS = re.compile(r"(num_experts|num_local_experts|n_routed_experts|moe_num_experts|"
                      r"num_routed_experts|n_experts)")
_TOPK = re.compile(r"(num_experts_per_tok|num_experts_per_token|top_k|moe_topk|"
                   r"n_activated_experts|experts_per_token|moe_k)")
_GROUPS = re.compile(r"(n_group|topk_group|num_expert_group|n_groups|mamba_n_groups|ssm_n_groups)")
# (not a token type's vocabulary, nor a number a vocabulary is rounded to)
_VOCAB = re.compile(r"(?!.*type_vocab)(?!.*(divisible_by|multiple_of)).*vocab_size(_.*)?")
_KV_SHARED = re.compile(r"num_kv_shared_layers|num_shared_kv_layers|kv_shared_layers")
_TOKEN_ID = re.compile(r".*_token_id")
_SHARED = re.compile(r"(n_|num_)?shared_experts")
_BACKBONE = ("stage_names", "out_features", "out_indices")
_SECTION = re.compile(r"(n|num)_\w+_layers")
_KINDS = re.compile(r".*(block|layer)s?_(types?|pattern|kinds?)")
_POSITIONS = re.compile(r"(max_position_embeddings|n_positions|max_seq_len|seq_length|"
                        r"max_sequence_length|n_ctx)")
_WIDTHLIKE = re.compile(r".*(size|dim|rank|channels|width|vocab).*")


@dataclass
class Built:
    arch: str           # the registered class name (LlamaForCausalLM)
    model_type: str     # the config's model_type (llama)
    task: str
    model: Any
    inputs: tuple
    config: Any
    changed: dict       # field -> (default, shrunk)
    default: Any = None  # transformers' own default config, unshrunk


class ShrinkError(Exception):
    """A config the shrinker cannot make small, or a model class it cannot build;
    ``default_broken`` when transformers' own default config does not build it either."""

    def __init__(self, message: str, default_broken: bool = False):
        super().__init__(message)
        self.default_broken = default_broken


def _heads(n: int) -> int:
    return min(n, HEADS)


# the cap of each kind of field, in the order a name is tried against them
_CAPS = ((_LAYERS, LAYERS), (_HEAD_DIM, HEAD_DIM), (_HIDDEN, HIDDEN), (_FFN, FFN),
         (_EXPERTS, EXPERTS), (_TOPK, EXPERTS_PER_TOKEN), (_VOCAB, VOCAB))


def shrink_values(values: dict, prefix: str = "", wider: int = 1,
                  repeat: int = 1, image: int = 0) -> dict[str, tuple[Any, Any]]:
    """The overrides for one config's fields: ``{field: (default, shrunk)}``.

    Heads first (key/value heads keep their ratio to query heads), then the widths they
    must divide; any other integer width field over 256 is halved until it fits.
    ``wider`` multiplies the caps of head size, model width and feed-forward width,
    ``repeat`` the layers kept, and ``image`` (pixels) replaces the image rule (see
    ``build``)."""
    out: dict[str, tuple[Any, Any]] = {}
    caps = tuple((pat, min(c * wider, WIDTH_MAX) if pat in (_HEAD_DIM, _HIDDEN, _FFN) else c) for pat, c in _CAPS)

    def put(k, v):
        if values[k] != v:
            out[k] = (values[k], v)

    ints = {k: v for k, v in values.items() if type(v) is int}
    heads = {k: v for k, v in ints.items() if _HEADS.fullmatch(k) and not _KV_HEADS.fullmatch(k)
             and v > 0}
    q_heads = max(heads.values(), default=0)
    new_q = _heads(q_heads) if q_heads else 0
    for k, v in heads.items():
        put(k, _heads(v))
    for k, v in ints.items():
        if _KV_HEADS.fullmatch(k) and v > 0:
            group = max(1, q_heads // v) if q_heads else 1
            put(k, max(1, new_q // group) if new_q else min(v, HEADS))
    for k, v in ints.items():
        if k in out or v <= 0:
            continue
        cap = next((c for pat, c in caps if pat.fullmatch(k)), None)
        if cap is not None:
            put(k, min(v, cap))
        elif _GROUPS.fullmatch(k):
            put(k, 1)
        elif _POSITIONS.fullmatch(k):
            put(k, min(v, 512) if v >= 64 else v)
        elif _WIDTHLIKE.fullmatch(k) and v > WIDTH_MAX:
            n = v
            while n > WIDTH_MAX:
                n //= 2
            put(k, n)
    vocab = min((out.get(k, (None, v))[1] for k, v in ints.items() if _VOCAB.fullmatch(k)),
                default=None)
    if vocab:
        big = sorted(k for k, v in ints.items() if _TOKEN_ID.fullmatch(k) and v >= vocab)
        for i, k in enumerate(big):      # distinct ids at the top of the vocabulary
            put(k, vocab - 1 - i)
    # images: a few patches (2 x 2 where the model patchifies), at most IMAGE pixels wide
    if type(values.get("image_size")) is int and values["image_size"] > 0:
        patch = values.get("patch_size")
        put("image_size", min(values["image_size"], image) if image
            else 2 * patch if type(patch) is int and 0 < patch <= values["image_size"] // 2
            else min(values["image_size"], IMAGE))
    # per-layer lists follow the layer count; a list of layer kinds (layer_types,
    # layers_block_type: sliding and full attention, linear attention, Mamba, hybrid
    # blocks) keeps one layer of each kind, in the order they first appear
    layer_keys = [k for k in out if _LAYERS.fullmatch(k)]
    if layer_keys:
        n = min(out[k][1] for k in layer_keys)
        old_n = max(out[k][0] for k in layer_keys)
        # sections of the stack counted apart that add up to its layers (Dory's input,
        # recurrent and output layers): one layer each, and at least one layer per section
        sections = [k for k, v in ints.items() if _SECTION.fullmatch(k) and v > 0
                    and not _LAYERS.fullmatch(k)]
        if not (len(sections) > 1 and sum(ints[k] for k in sections) == old_n):
            sections = []
        if sections:
            if len(sections) > n:
                n = len(sections)
                for k in layer_keys:
                    out[k] = (out[k][0], n)
        kinds_n = n
        for k, v in values.items():
            if isinstance(v, list) and len(v) == old_n and v and all(isinstance(x, str) for x in v):
                kinds = list(dict.fromkeys(v))
                new = kinds + v[:max(0, n - len(kinds))] if len(kinds) < n else kinds
                kinds_n = max(kinds_n, len(new))
                put(k, new)
        # a shorter pattern of layer kinds cycled over the layers (RecurrentGemma's
        # block_types: recurrent, recurrent, attention): enough layers that each kind occurs
        for k, v in values.items():
            if _KINDS.fullmatch(k) and isinstance(v, list) and 1 < len(v) < old_n \
                    and all(isinstance(x, str) for x in v):
                kinds_n = max(kinds_n, max(v.index(x) for x in set(v)) + 1)
        for k, v in values.items():
            if isinstance(v, list) and len(v) == old_n and k not in out:
                put(k, v[:kinds_n])
        if kinds_n != n:
            for k in layer_keys:
                out[k] = (out[k][0], kinds_n)
        # layers that reuse an earlier layer's cache (Gemma 3n: the last
        # num_kv_shared_layers): one of each kind reuses one of each kind, so the kinds
        # appear twice, once producing a cache and once reusing it
        shared = [k for k, v in ints.items() if _KV_SHARED.fullmatch(k) and v > 0]
        if shared:
            for k in shared:
                put(k, kinds_n)
            for k, v in values.items():
                if isinstance(v, list) and len(v) == old_n and v and k in out:
                    put(k, out[k][1] * 2)
            kinds_n *= 2
            for k in layer_keys:
                out[k] = (out[k][0], kinds_n)
        # the layers twice over (``repeat``, see ``build``): each per-layer list repeated
        if repeat > 1:
            for k, v in values.items():
                if isinstance(v, list) and len(v) == old_n and k in out:
                    put(k, out[k][1] * repeat)
            kinds_n *= repeat
            for k in layer_keys:
                out[k] = (out[k][0], kinds_n)
        # the sections share the layers kept: one each, the rest to the largest
        for i, k in enumerate(sorted(sections, key=lambda k: -ints[k])):
            put(k, 1 + (kinds_n - len(sections) if i == 0 else 0))
        # settings per layer index ({25: {...}, 26: {...}}): those of the layers kept
        for k, v in values.items():
            if isinstance(v, dict) and v and all(str(x).isdigit() for x in v) \
                    and any(int(x) >= kinds_n for x in v):
                put(k, {x: y for x, y in v.items() if int(x) < kinds_n})
    # the experts each token is routed to, left None by a default config whose model
    # reads it as a number (DeepSeek-V2): the shrinker's own number of experts per token;
    # a default config that leaves the expert counts themselves None too (dots.llm1, whose
    # model builds its expert layers from them): the shrinker's experts, and one shared
    if any(_EXPERTS.fullmatch(k) and type(v) is int and v > 0 for k, v in values.items()):
        for k, v in values.items():
            if _TOPK.fullmatch(k) and v is None:
                put(k, EXPERTS_PER_TOKEN)
    elif any(_EXPERTS.fullmatch(k) and v is None for k, v in values.items()) \
            and any(_TOPK.fullmatch(k) and v is None for k, v in values.items()):
        for k, v in values.items():
            if v is None and _EXPERTS.fullmatch(k):
                put(k, EXPERTS)
            elif v is None and _TOPK.fullmatch(k):
                put(k, EXPERTS_PER_TOKEN)
            elif v is None and _SHARED.fullmatch(k):
                put(k, 1)
    # widths given in parts that sum to the model width (Reformer's axial position
    # embeddings) keep their proportions; factors whose product is the number of positions
    # (its axial position shape) halve their largest until they multiply to the new one
    old_layers = {out[k][0] for k in out if _LAYERS.fullmatch(k)}
    for k, v in values.items():
        if not (isinstance(v, (list, tuple)) and len(v) > 1 and len(v) not in old_layers
                and all(type(x) is int and x > 0 for x in v)):
            continue
        for f, (old, new) in list(out.items()):
            if type(old) is not int or type(new) is not int or old == new:
                continue
            if _HIDDEN.fullmatch(f) and sum(v) == old and all(x * new % old == 0 for x in v):
                put(k, type(v)(x * new // old for x in v))
                break
            if _POSITIONS.fullmatch(f) and math.prod(v) == old and new < old:
                parts = list(v)
                while math.prod(parts) > new and max(parts) % 2 == 0:
                    parts[parts.index(max(parts))] //= 2
                if math.prod(parts) == new:
                    put(k, type(v)(parts))
                break
    # a layer pattern given by period and offset (Jamba's attention every 8th layer from
    # the 4th) repeats within the shrunk layers
    for k, v in ints.items():
        if k.endswith("_layer_period") and v > LAYERS:
            put(k, LAYERS)
            off = k.replace("_period", "_offset")
            if type(values.get(off)) is int:
                put(off, values[off] % LAYERS)
    return out


def shrink_config(cfg, wider: int = 1, repeat: int = 1, image: int = 0) -> tuple[Any, dict]:
    """A small copy of a transformers config (see the module docstring) and what changed,
    ``{"field" or "sub.field": (default, shrunk)}``. Sub-configs shrink by the same rule."""
    from transformers import PretrainedConfig
    changed: dict = {}

    def shrink(c, prefix):
        values = c.to_dict()
        fields = _class_fields(type(c))
        # a declared field as the config holds it, where its serialized form differs (Dory
        # serializes each layer as an attention and an MLP block, doubling every layer
        # count, and halves them again on load): the config is rebuilt from keywords, which
        # a class reads as it holds them
        for f in fields or ():
            try:
                v = getattr(c, f)
            except Exception:  # noqa: BLE001 - a per-layer field read globally (Gemma 4)
                continue
            if f in values and values[f] != v and _plain(v):
                values[f] = v
        subs = {}
        for k, v in list(vars(c).items()):
            if isinstance(v, PretrainedConfig):
                subs[k] = shrink(v, f"{prefix}{k}.")
        # a field the class derives from others (its default None or "auto": head_dim,
        # layer_types, a Mamba head size) is left to be derived again from the shrunk ones
        derived = {k for k, d in _class_defaults(type(c)).items()
                   if (d is None or isinstance(d, str)) and values.get(k) is not d
                   and not isinstance(values.get(k), str) and _SIZED(k, values.get(k))}
        # ... and so is a sized attribute that is no field of the class at all, which its
        # __post_init__ computes (Zamba 2's attention and Mamba head sizes from the model
        # width): passed back as a keyword, it would override the derivation afterwards
        # (sizes only: counts of layers, heads, experts and tokens stay the shrinker's)
        if fields is not None:
            derived |= {k for k, v in values.items() if k not in fields and k not in subs
                        and not isinstance(v, (str, dict)) and _SIZED(k, v)
                        and not any(p.fullmatch(k) for p in _COUNTS)}
            # ... and so are a backbone's stage names and the stages it outputs, which
            # transformers' backbone mixin derives from the depths (`out_features`
            # ['stage12'] of a 2-layer backbone does not construct)
            derived |= {k for k in _BACKBONE if k in values and k not in fields}
        over = shrink_values({k: v for k, v in values.items()
                              if k not in subs and k not in derived}, prefix, wider, repeat, image)
        changed.update({prefix + k: v for k, v in over.items()})
        kwargs = {k: v for k, v in values.items()
                  if k not in derived and k not in subs
                  and k not in ("transformers_version", "model_type", "architectures")}
        kwargs.update({k: new for k, (_, new) in over.items()})
        # transformers' documented meanings of two fields some default configs leave None
        # while their model reads them as numbers (HunYuan, Ministral, Nemotron): key/value
        # heads default to the query heads, a head's size to hidden size over heads
        h, q = kwargs.get("hidden_size"), kwargs.get("num_attention_heads")
        if "num_key_value_heads" in kwargs and kwargs["num_key_value_heads"] is None and q:
            kwargs["num_key_value_heads"] = q
            changed[prefix + "num_key_value_heads"] = (None, q)
        if "head_dim" in kwargs and kwargs["head_dim"] is None and h and q:
            kwargs["head_dim"] = h // q
            changed[prefix + "head_dim"] = (None, h // q)
        # sub-configs as the dicts a checkpoint's config.json would hold
        kwargs.update({k: v.to_dict() for k, v in subs.items()})
        # a config may tie its head size to the others (Mamba-2: heads x head size =
        # expand x hidden): other head sizes are tried before giving up
        heads = [k for k in over if _HEAD_DIM.fullmatch(k)]
        tries = [{}] + [{k: d for k in heads} for d in (32, 8, 64, 4)] if heads else [{}]
        # ... or to the sum of its parts without and with rotary position (multi-head
        # latent attention validators: head_dim = qk_nope_head_dim + qk_rope_head_dim)
        nope, rope = kwargs.get("qk_nope_head_dim"), kwargs.get("qk_rope_head_dim")
        if type(nope) is int and type(rope) is int:
            tries.insert(1, {k: nope + rope for k in ("head_dim", "qk_head_dim")
                             if type(kwargs.get(k)) is int and kwargs[k] != nope + rope})
        first = None
        for extra in tries:
            try:
                new = type(c)(**{**kwargs, **extra})
            except Exception as e:  # noqa: BLE001
                first = first or e
                continue
            changed.update({prefix + k: (values.get(k), v) for k, v in extra.items()})
            return new
        raise ShrinkError(f"{type(c).__name__}: the shrunk config does not construct: "
                          f"{type(first).__name__}: {(str(first).splitlines() or [''])[0][:200]}") from None

    return shrink(cfg, ""), changed


def _SIZED(k: str, v) -> bool:
    """A field the shrinker sizes (or a per-layer list): derived ones are re-derived."""
    if isinstance(v, list):     # a list of layer kinds is shrunk kind by kind, not derived
        return not (v and all(isinstance(x, str) for x in v))
    return any(p.fullmatch(k) for p in (_LAYERS, _KV_HEADS, _HEADS, _HEAD_DIM, _HIDDEN, _FFN,
                                        _EXPERTS, _TOPK, _GROUPS, _VOCAB, _WIDTHLIKE))


_COUNTS = (_LAYERS, _KV_HEADS, _HEADS, _EXPERTS, _TOPK, _GROUPS, _VOCAB, _SHARED)


def _plain(v) -> bool:
    """A number, string, flag, None, or list of them (a value a config keyword takes)."""
    if isinstance(v, list):
        return all(_plain(x) for x in v)
    return v is None or isinstance(v, (bool, int, float, str))


def _class_fields(cls) -> set[str] | None:
    """The fields a dataclass config declares (its own and its bases'); None otherwise."""
    import dataclasses
    return {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else None


def _class_defaults(cls) -> dict:
    """A config class's own defaults: its dataclass fields or ``__init__`` keywords."""
    import dataclasses
    if dataclasses.is_dataclass(cls):
        return {f.name: f.default for f in dataclasses.fields(cls)
                if f.default is not dataclasses.MISSING}
    try:
        params = inspect.signature(cls.__init__).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def registry(task: str = "causal-lm") -> list[tuple[str, str]]:
    """``(model_type, class name)`` of every architecture transformers registers for a task."""
    from transformers.models.auto import modeling_auto
    names = getattr(modeling_auto, TASKS[task])
    return sorted((mt, cls if isinstance(cls, str) else cls[0]) for mt, cls in names.items())


def _inputs(task: str, cfg, model) -> tuple:
    import torch
    g = torch.Generator().manual_seed(0)
    text = getattr(cfg, "get_text_config", lambda **_: cfg)(decoder=True)
    vocab = getattr(text, "vocab_size", None) or VOCAB
    sig = inspect.signature(model.forward).parameters
    if task in ("audio", "ctc"):
        return (_audio(cfg, sig, g, model),)
    if task == "video" and "pixel_values" in sig:
        vis = getattr(cfg, "vision_config", cfg)
        size = getattr(vis, "image_size", IMAGE) or IMAGE
        size = size[0] if isinstance(size, (list, tuple)) else size
        frames = getattr(vis, "num_frames", None) or getattr(vis, "frames_per_clip", None) or 2
        return (torch.randn(1, frames, getattr(vis, "num_channels", 3), size, size,
                            generator=g),)
    # a vision model takes pixels, unless its forward reads ids only (ImageGPT classifies
    # an image given as ids of colour clusters)
    if (task in ("vision", "detection", "segmentation") and "pixel_values" in sig) or \
            ("input_ids" not in sig and "pixel_values" in sig):
        vis = getattr(cfg, "vision_config", cfg)
        size = getattr(vis, "image_size", IMAGE)
        size = size[0] if isinstance(size, (list, tuple)) else size
        ch = getattr(vis, "num_channels", 3)
        size = size or IMAGE
        return (torch.randn(1, ch, size, size, generator=g),)
    # a decoder over several parallel codebooks (MusicGen) takes one row of ids per
    # codebook: input_ids of shape (batch * num_codebooks, tokens)
    rows = (getattr(text, "num_codebooks", None) or 1) if task == "causal-lm" else 1
    ids = torch.randint(0, vocab, (rows, TOKENS), generator=g)
    if task == "seq2seq" and "decoder_input_ids" in sig:
        # positionally, as the signature orders them (the arguments between are None)
        names = list(sig)
        args = [None] * (names.index("decoder_input_ids") + 1)
        args[names.index("input_ids") if "input_ids" in names else 0] = ids
        args[-1] = torch.randint(0, vocab, (1, TOKENS // 2), generator=g)
        return tuple(args)
    return (ids,)


def _audio(cfg, sig, g, model=None):
    """An audio model's input as its documentation calls it: a waveform
    (``input_values``, 1 x samples) for the models that read raw audio (wav2vec 2.0's
    family), a spectrogram for those that read features: Whisper's ``input_features``
    (mel bins x twice its encoder positions, what its processor pads to), the Audio
    Spectrogram Transformer's ``input_values`` (its ``max_length`` frames x mel bins), and
    otherwise frames x the feature width the config names (its own or its encoder's:
    wav2vec2-BERT's projection input, Parakeet's and LASR's mel bins), or that width with
    2 or 4 frames stacked where the model's first layer takes them so (Granite Speech 5
    stacks 4: what its feature extractor does; the first width whose call runs)."""
    import torch
    if "input_features" in sig:
        mel = getattr(cfg, "num_mel_bins", None)
        positions = getattr(cfg, "max_source_positions", None)
        if mel and positions:                       # Whisper: (batch, mel, frames)
            return torch.randn(1, mel, 2 * positions, generator=g)
        subs = [cfg] + [v for v in vars(cfg).values()
                        if hasattr(v, "to_dict") and hasattr(v, "model_type")]
        width = next((getattr(c, a) for a in ("feature_projection_input_dim", "feature_size",
                                               "num_mel_bins", "input_feat_per_channel",
                                               "n_mels")
                      for c in subs if isinstance(getattr(c, a, None), int)), 80)
        tries = [torch.randn(1, FRAMES, width * k, generator=g) for k in (1, 2, 4)]
        for x in tries if model is not None else ():
            try:
                with torch.no_grad():
                    model(x)
                return x
            except Exception:  # noqa: BLE001 - the next width
                continue
        return tries[0]
    if getattr(cfg, "num_mel_bins", None) and getattr(cfg, "max_length", None):
        return torch.randn(1, cfg.max_length, cfg.num_mel_bins, generator=g)    # AST
    return torch.randn(1, SAMPLES, generator=g)


def build(model_type: str, task: str = "causal-lm") -> Built:
    """The registered ``task`` model for ``model_type``, small, random weights, eval mode."""
    import torch
    from transformers import AutoConfig
    import transformers
    names = dict(registry(task))
    if model_type not in names:
        raise ShrinkError(f"{model_type}: no {task} architecture registered in transformers")
    cls_name = names[model_type]
    cls = getattr(transformers, cls_name, None)
    if cls is None:
        raise ShrinkError(f"{cls_name}: registered but not importable from transformers")
    try:
        default = AutoConfig.for_model(model_type)
        # a class registered for a composite model type (qwen3_5, llama4, musicgen) takes
        # its own config class (the text or decoder part), as a user constructs it
        own = getattr(cls, "config_class", None)
        if isinstance(own, type) and not isinstance(default, own):
            default = own()
    except Exception as e:  # noqa: BLE001
        raise ShrinkError(f"{model_type}: the default config does not construct: "
                          f"{type(e).__name__}: {str(e).splitlines()[0][:200]}",
                          default_broken=True) from None
    # the narrowest widths and fewest layers first. A model that does not build or whose
    # default call fails there is built again with the width caps doubled, then doubled
    # again (never over 256: xLSTM's config rounds its key width up to a multiple of 64
    # while its layers do not), then with every kind of layer twice (Zamba ties one
    # shared block's weights across its hybrid layers and refuses a single one), then with
    # images 64 pixels wide (ConvNeXt halves 2 x 2 patches of 4 pixels past one pixel)
    first, error = None, None
    for rung in ((1, 1, 0), (2, 1, 0), (4, 1, 0), (1, 2, 0), (1, 1, 64)):
        try:
            built = _build_one(cls, cls_name, default, task, model_type, *rung)
        except ShrinkError as e:
            if e.default_broken:         # no shrinking can help
                raise
            error = error or e
            continue
        first = first or rung
        try:
            with torch.no_grad():
                built.model(*built.inputs)
        except Exception:  # noqa: BLE001 - the caller reports the default call's failure
            continue
        first = rung
        break
    if first is None:
        raise error
    # the model returned has never been called (no state a call may have left): built
    # afresh at the rung whose call ran, else at the first that built
    return _build_one(cls, cls_name, default, task, model_type, *first)


def user_default(default, task: str):
    """A copy of transformers' default config as a user of ``task`` builds it (a causal LM
    is a decoder; see ``_build_one``): building a model mutates its config, so the
    default itself is never built."""
    import copy
    d = copy.deepcopy(default)
    _as_users_build(d, task)
    return d


def _as_users_build(cfg, task: str) -> bool:
    """Set ``cfg`` as a user of ``task`` builds it: a causal LM is a decoder (the encoder
    families registered for the task, BERT, RoBERTa, X-MOD, Reformer, ask their users to
    say so, and refuse or warn without it). True where that changed it."""
    if task == "causal-lm" and getattr(cfg, "is_decoder", None) is False:
        cfg.is_decoder = True
        return True
    # a CTC head is built with its tokenizer's vocabulary (transformers refuses a config
    # without one): wav2vec 2.0's character vocabulary, 32, where the default leaves None
    if task == "ctc" and hasattr(cfg, "vocab_size") and cfg.vocab_size is None:
        cfg.vocab_size = 32
        return True
    return False


def _build_one(cls, cls_name, default, task, model_type, wider, repeat, image=0) -> Built:
    import torch
    cfg, changed = shrink_config(default, wider, repeat, image)
    if _as_users_build(cfg, task):
        changed.update({"is_decoder": (False, True)} if task == "causal-lm"
                       else {"vocab_size": (None, cfg.vocab_size)})
    torch.manual_seed(0)
    try:
        model = cls(cfg).eval()
    except Exception as e:  # noqa: BLE001
        why = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
        try:
            with torch.device("meta"):
                cls(user_default(default, task))
        except Exception as e2:  # noqa: BLE001 - transformers' own default does not build
            raise ShrinkError(f"{cls_name}: transformers' default {type(default).__name__} does "
                              f"not build the model either: {type(e2).__name__}: "
                              f"{(str(e2).splitlines() or [''])[0][:200]}",
                              default_broken=True) from None
        raise ShrinkError(f"{cls_name}: does not build from the shrunk config: {why}") from None
    # a model over several languages (X-MOD) is called after its user picks one: the first
    langs = getattr(cfg, "languages", None)
    if hasattr(model, "set_default_language") and langs:
        model.set_default_language(list(langs)[0])
    inputs = _inputs(task, cfg, model)
    return Built(cls_name, model_type, task, model, inputs, cfg, changed, default)
