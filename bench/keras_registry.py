"""Every keras-hub backbone on the JAX backend, built small from what keras-hub ships offline,
analyzed with solbound's JAX path, validated against JAX.

    python bench/keras_registry.py                     # every Backbone class, 1 worker
    python bench/keras_registry.py --only LlamaBackbone,ViTBackbone --jsonl out.jsonl
    python bench/keras_registry.py --markdown          # the tables for docs/jax.md

keras-hub's presets are handles to remote checkpoints (``kaggle://...``: their
``config.json`` is not in the package), so a backbone's configuration comes from its own
class: the "randomly initialized ... custom config" example in its docstring (the
constructor call, read with ``ast``, never executed; a sub-model it takes, a vision or text
encoder, is that class's own example, and one the example loads ``from_preset`` is the
class's custom-config example instead), then the constructor's defaults, then a value by
argument name for a required argument still missing (``vocabulary_size``,
``num_layers``, ...). ``shrink_kwargs`` makes it small: one rule over argument names, not
a table per model, with the sizes of the transformers registry (``solbound.zoo``): layers 2,
heads at most 4 keeping the key/value grouping, head size 16, hidden 64, FFN 128,
vocabulary 4096, experts 4 with 2 per token, other widths at most 256; and for what
keras-hub's constructors pass as lists and shapes: per-stage block counts at most 2,
width lists at most 256, per-layer lists and layer indices following the layer count,
image shapes at most 64 pixels a side.

The backbone runs as ``model.stateless_call(trainable, non_trainable, inputs,
training=False)`` on abstract inputs made from its functional inputs (``model.input``:
batch 1, a free sequence length 16, a free image side 64, a free waveform of 4096
samples). Each backbone runs in a
subprocess of its own with a time limit and prints one JSON line: built, analyzed (nothing
unsupported), validated, or the stage that failed with a one-line cause.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import math
import os
import re
import subprocess
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

TOKENS = 16          # a free sequence length
IMAGE = 64           # a free image side, and the largest one kept
SAMPLES = 4096       # a free waveform length
STAGE_BLOCKS = 2     # blocks per stage of a convolutional network
WIDTH_MAX = 256
LAYERS = 2
HEADS = 4
HEAD_DIM = 16
HIDDEN = 64
FFN = 128
VOCAB = 4096
EXPERTS = 4
EXPERTS_PER_TOKEN = 2

# a required argument no example gives, by name (the same sizes the shrinker aims for)
_REQUIRED = [
    (re.compile(r".*vocab(ulary)?_size"), VOCAB),
    (re.compile(r"(.*_)?num_(.*_)?layers|num_layers_(enc|dec)|depth"), LAYERS),
    (re.compile(r"(.*_)?num_key_value_heads"), HEADS // 2),
    (re.compile(r"(\w+_)?num_(\w+_)?heads"), HEADS),
    (re.compile(r"(.*_)?head_(dim|size)"), HEAD_DIM),
    (re.compile(r"(.*_)?(hidden|embedding|embed)_(dim|size)"), HIDDEN),
    (re.compile(r"(.*_)?intermediate_(dim|size)|.*mlp_dim|.*ffn_dim"), FFN),
    (re.compile(r"num_experts"), EXPERTS),
    (re.compile(r"top_k"), EXPERTS_PER_TOKEN),
    (re.compile(r"patch_size"), 16),
    (re.compile(r"image_shape"), (IMAGE, IMAGE, 3)),
    (re.compile(r"num_frames"), 2),
    (re.compile(r"num_classes"), 2),
    (re.compile(r"max_\w*_length"), TOKENS),
    (re.compile(r".*_bias"), False),
    (re.compile(r".*dropout(_rate)?"), 0.0),
    (re.compile(r".*_eps(ilon)?"), 1e-6),
]


class BuildError(Exception):
    """A backbone this script cannot configure or construct."""


class TraceError(Exception):
    """A backbone that constructs but whose call JAX does not trace on these inputs."""


# --- what keras-hub ships: the classes and their documented examples ---------------------

def backbones() -> list[str]:
    """Every Backbone subclass keras-hub exports (``keras_hub.models``)."""
    import keras_hub
    from keras_hub.src.models.backbone import Backbone
    out = []
    for n in sorted(dir(keras_hub.models)):
        c = getattr(keras_hub.models, n)
        if not (isinstance(c, type) and issubclass(c, Backbone)) or c is Backbone:
            continue
        if c.__init__ is Backbone.__init__:
            continue        # a base class with no constructor of its own (FeaturePyramid)
        if c.__name__ != n and hasattr(keras_hub.models, c.__name__):
            continue        # another name of a class listed (SmolLMBackbone: SmolLM3's)
        out.append(n)
    return out


def _class(name: str):
    import keras_hub
    for mod in (keras_hub.models, keras_hub.layers):
        c = getattr(mod, name, None)
        if isinstance(c, type):
            return c
    return None


class Spec:
    """A keras-hub class and the keyword arguments to construct it with."""

    def __init__(self, cls, kwargs: dict):
        self.cls, self.kwargs = cls, kwargs

    def __repr__(self) -> str:
        return f"{self.cls.__name__}({', '.join(f'{k}={v!r}' for k, v in self.kwargs.items())})"


class _Preset:
    """``X.from_preset(...)``: a checkpoint, not available offline."""

    def __init__(self, cls):
        self.cls = cls


_UNKNOWN = object()


def _eval(node, env):
    """A literal expression of the example (numbers, strings, tuples, lists, dicts,
    arithmetic, names assigned before, keras-hub constructor calls); anything else is
    unknown. Nothing is executed."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List)):
        vals = [_eval(e, env) for e in node.elts]
        if any(v is _UNKNOWN for v in vals):
            return _UNKNOWN
        return tuple(vals) if isinstance(node, ast.Tuple) else vals
    if isinstance(node, ast.Dict):
        ks = [_eval(k, env) for k in node.keys]
        vs = [_eval(v, env) for v in node.values]
        if any(x is _UNKNOWN for x in ks + vs):
            return _UNKNOWN
        return dict(zip(ks, vs))
    if isinstance(node, ast.Name):
        return env.get(node.id, _UNKNOWN)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = _eval(node.operand, env)
        return -v if isinstance(v, (int, float)) else _UNKNOWN
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, env), _eval(node.right, env)
        if isinstance(a, list) and (type(b) is int and isinstance(node.op, ast.Mult)
                                    or isinstance(b, list) and isinstance(node.op, ast.Add)):
            return a * b if type(b) is int else a + b       # [True] * 30, a + b
        if not (isinstance(a, (int, float)) and isinstance(b, (int, float))):
            return _UNKNOWN
        ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
               ast.FloorDiv: lambda: a // b, ast.Div: lambda: a / b}
        f = ops.get(type(node.op))
        return f() if f else _UNKNOWN
    if isinstance(node, ast.Call):
        parts = []
        f = node.func
        while isinstance(f, ast.Attribute):
            parts.append(f.attr)
            f = f.value
        if isinstance(f, ast.Name):
            parts.append(f.id)
        parts.reverse()
        if len(parts) >= 2 and parts[-1] == "from_preset":
            cls = _class(parts[-2])
            return _Preset(cls) if cls else _UNKNOWN
        cls = _class(parts[-1]) if parts else None
        if cls is None:
            return _UNKNOWN
        kwargs = {kw.arg: _eval(kw.value, env) for kw in node.keywords if kw.arg}
        return Spec(cls, {k: v for k, v in kwargs.items() if v is not _UNKNOWN})
    return _UNKNOWN


def _parse(block: str):
    """The example's code; a string literal left open before a comma (``"dark,``) is
    closed there, as its author meant."""
    for _ in range(4):
        try:
            return ast.parse(block)
        except SyntaxError as e:
            lines = block.split("\n")
            ln = (e.lineno or 0) - 1
            if "unterminated string" not in str(e) or not 0 <= ln < len(lines):
                return None
            lines[ln] = re.sub(r'(["\'])(\w*),\s*$', r"\1\2\1,", lines[ln])
            block = "\n".join(lines)
    return None


def documented_example(cls) -> Spec | None:
    """The constructor call of ``cls`` with the most arguments in its docstring's code
    examples (the "randomly initialized ... custom config" one), read, not run."""
    doc = inspect.getdoc(cls) or ""
    best = None
    for block in re.findall(r"```python\n(.*?)```", doc, flags=re.S):
        tree = _parse(block)
        if tree is None:
            continue
        env: dict = {}
        for stmt in tree.body:
            value = getattr(stmt, "value", None)
            if value is None:
                continue
            v = _eval(value, env)
            if isinstance(stmt, ast.Assign):
                for t in stmt.targets:
                    if isinstance(t, ast.Name):
                        env[t.id] = v
            for node in ast.walk(value):        # the call may sit inside another one
                if isinstance(node, ast.Call):
                    s = _eval(node, env)
                    if isinstance(s, Spec) and s.cls is cls and (
                            best is None or len(s.kwargs) > len(best.kwargs)):
                        best = s
    return best


def _parameters(cls):
    sig = inspect.signature(cls.__init__)
    return [p for p in list(sig.parameters.values())[1:]
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]


def _arg_doc(cls, name: str) -> str:
    """The Args entry of ``name`` in ``cls``'s docstring (up to the next entry)."""
    doc = inspect.getdoc(cls) or ""
    m = re.search(rf"^\s*{re.escape(name)}\s*:(.*?)(?=^\s*\**\w+\s*:|\Z)", doc,
                  flags=re.S | re.M)
    return m.group(1) if m else ""


def _by_name(cls, name: str, layers: int, depth: int):
    """A value for a required argument no example gives, or ``_UNKNOWN``: a sub-model the
    argument's documentation names (``A `keras_hub.models.ResNetBackbone` instance``; an
    ``image_encoder`` it does not name is a ResNet), a per-layer list of the kinds its
    documentation quotes (``"sliding_attention"`` or ``"full_attention"``: one layer of
    each), then a size by name."""
    doc = _arg_doc(cls, name)
    named = re.findall(r"keras_hub\.models\.(\w+)", doc)
    if named or name == "image_encoder":
        sub = _class(named[0] if named else "ResNetBackbone")
        if sub is not None and depth <= 2:
            return configure(sub, depth + 1)
    if name.endswith("layer_types"):
        kinds = list(dict.fromkeys(re.findall(r'"(\w+)"', doc)))
        if kinds:
            return (kinds * layers)[:max(layers, len(kinds))]
    for pat, val in _REQUIRED:
        if pat.fullmatch(name):
            return val
    return _UNKNOWN


def configure(cls, depth: int = 0) -> Spec:
    """``cls``'s documented example over its constructor's defaults, a sub-model it loads
    from a preset replaced by that class's own example, required arguments still missing
    filled by name."""
    return complete(documented_example(cls) or Spec(cls, {}), depth)


def complete(spec: Spec, depth: int = 0) -> Spec:
    """A documented call over the class's literal defaults, its sub-models completed the
    same way, its missing required arguments filled by name."""
    cls = spec.cls
    kwargs = {}
    for p in _parameters(cls):      # literal defaults, so that the shrinker sees them
        d = p.default
        if p.default is not inspect.Parameter.empty and (
                type(d) in (int, float) or isinstance(d, tuple)
                and all(type(x) is int or x is None for x in d)):
            kwargs[p.name] = d
    for k, v in spec.kwargs.items():
        if isinstance(v, _Preset):
            if depth > 2:
                raise BuildError(f"{cls.__name__}: sub-models nested too deep")
            v = configure(v.cls, depth + 1)
        elif isinstance(v, Spec):
            v = complete(v, depth + 1)
        kwargs[k] = v
    layers = next((v for k, v in kwargs.items()
                   if type(v) is int and re.fullmatch(r"(.*_)?num_(.*_)?layers", k)), 2)
    for p in _parameters(cls):
        if p.default is not inspect.Parameter.empty or p.name in kwargs:
            continue
        v = _by_name(cls, p.name, layers, depth)
        if v is _UNKNOWN:
            raise BuildError(f"{cls.__name__}: required argument {p.name!r} has no "
                             f"documented value and no value by name")
        kwargs[p.name] = v
    return Spec(cls, kwargs)


# --- the shrinker ------------------------------------------------------------------------

# argument names by what they mean (matched on the whole name)
_LAYERS = re.compile(r"(\w+_)?num_(\w+_)?layers|num_layers_\w+|num_hidden_layers|depth|"
                     r"depth_single_blocks")
_KV_HEADS = re.compile(r"(\w+_)?num_(global_)?key_value_heads|(\w+_)?num_kv_heads")
_HEADS = re.compile(r"(\w+_)?num_(\w+_)?heads|(\w+_)?attention_heads")
_HEAD_DIM = re.compile(r"(\w+_)?head_(dim|size)|key_value_dim")
_HIDDEN = re.compile(r"(\w+_)?(hidden|embedding|embed|model)_(dim|size)|hidden_dim|"
                     r"(\w+_)?hidden_size")
_FFN = re.compile(r"(\w+_)?intermediate_(dim|size)|(\w+_)?mlp_dim|(\w+_)?ffn_dim")
_VOCAB = re.compile(r"(\w+_)?vocab(ulary)?_size(_\w+)?")
_EXPERTS = re.compile(r"num_experts")
_TOPK = re.compile(r"top_k|num_experts_per_token")
_TOKEN_ID = re.compile(r"\w+_token_(id|index)")
_WIDTHLIKE = re.compile(r"\w*(dim|filters|channels|features|rank|lora)\w*")
_STAGE_COUNTS = re.compile(r"(stackwise|layerwise)_(num_)?(blocks|repeats|depths?)|depths|"
                           r"stackwise_depth")
_QUERIES = re.compile(r"num_queries")
# a learned position table as long as the sequence: some add it whole (SigLIP)
_POSITIONS = re.compile(r"max_(\w+_)?sequence_length")
_LAYER_INDEX = re.compile(r"\w+_(layer_)?ind(ices|ex)|eval_idx")
_WIDTH_LIST = re.compile(r"\w*(filters|hidden_dims|hidden_sizes|channels|_dims)")


def shrink_kwargs(kwargs: dict) -> tuple[dict, dict]:
    """Small constructor arguments by one rule over their names, recursively through
    sub-models: layers 2, heads at most 4 with the key/value heads keeping their grouping
    (32 over 8 becomes 4 over 1), head size 16, hidden widths 64 (the same for every
    hidden-like width, which keras-hub often requires to be equal), FFN widths 128,
    vocabularies 4096 (token ids moved below it), experts 4 with 2 per token, any other
    width over 256 halved until it fits; lists: per-stage block counts at most 2, widths
    capped the same way, per-layer lists cut to the layers kept (one layer of each kind in a
    list of kinds, which may keep more than 2 layers), layer indices kept below the layer
    count; image shapes and sizes at most 64 a side. Returns (kwargs, {name: (old, new)})."""
    out, changed = dict(kwargs), {}

    def put(k, v):
        if v != kwargs[k]:
            out[k], changed[k] = v, (kwargs[k], v)

    ints = {k: v for k, v in kwargs.items() if type(v) is int and v > 0}
    heads = {k: v for k, v in ints.items() if _HEADS.fullmatch(k) and not _KV_HEADS.fullmatch(k)}
    for k, v in heads.items():
        put(k, min(v, HEADS))
    staged = {k: v for k, v in kwargs.items() if _HEADS.fullmatch(k) and isinstance(
        v, (list, tuple)) and v and all(type(x) is int for x in v)}
    for k, v in staged.items():         # heads per stage (Swin's (3, 6, 12, 24))
        put(k, type(v)(min(x, HEADS) for x in v))
    for k, v in ints.items():
        if _KV_HEADS.fullmatch(k):
            # the query heads of the same prefix (encoder_, decoder_), else the most
            prefix = k[:k.index("num_")] if "num_" in k else ""
            q = [h for h in heads if h.startswith(prefix)] or list(heads)
            q_old = max((heads[h] for h in q), default=v)
            group = max(1, q_old // v)
            put(k, max(1, min(q_old, HEADS) // group))
    # a hidden width every head count divides (3 and 4 heads: 48)
    counts = [out[k] for k in heads] + [x for k in staged for x in out[k]]
    q_new = math.lcm(*counts) if counts else 1
    for k, v in ints.items():
        if k in changed or k in heads or _KV_HEADS.fullmatch(k):
            continue
        if _LAYERS.fullmatch(k):
            put(k, min(v, LAYERS))
        elif _HEAD_DIM.fullmatch(k):
            put(k, min(v, HEAD_DIM))
        elif _HIDDEN.fullmatch(k):
            put(k, v if v <= HIDDEN else max(q_new, HIDDEN // q_new * q_new))
        elif _FFN.fullmatch(k):
            put(k, min(v, FFN))
        elif _VOCAB.fullmatch(k):
            put(k, min(v, VOCAB))
        elif _EXPERTS.fullmatch(k):
            put(k, min(v, EXPERTS))
        elif _TOPK.fullmatch(k):
            put(k, min(v, EXPERTS_PER_TOKEN))
        elif _QUERIES.fullmatch(k):
            put(k, min(v, TOKENS))
    # a width equal to a hidden width (a convolution's filters feeding the residual
    # stream, an output projection) stays equal to it
    hidden = {kwargs[k]: out[k] for k in ints if _HIDDEN.fullmatch(k) and k in changed}
    for k, v in ints.items():
        if k in changed or k in heads or not _WIDTHLIKE.fullmatch(k):
            continue
        if v in hidden:
            put(k, hidden[v])
        elif v > WIDTH_MAX:
            put(k, _cap(v))
    vocab = min((out[k] for k in ints if _VOCAB.fullmatch(k)), default=None)
    if vocab:
        big = sorted(k for k, v in ints.items() if _TOKEN_ID.fullmatch(k) and v >= vocab)
        for i, k in enumerate(big):         # distinct ids at the top of the vocabulary
            put(k, vocab - 1 - i)
    layer_keys = [k for k in ints if _LAYERS.fullmatch(k) and k in changed]
    layers = min((out[k] for k in ints if _LAYERS.fullmatch(k)), default=None)
    if layer_keys:
        # per-layer lists follow the layer count; a list of kinds keeps one layer of each
        old_n = max(kwargs[k] for k in layer_keys)
        n = layers
        for k, v in kwargs.items():
            if isinstance(v, list) and len(v) == old_n and v and all(
                    isinstance(x, str) for x in v):
                kinds = list(dict.fromkeys(v))
                new = kinds + v[:max(0, n - len(kinds))]
                n = max(n, len(new))
                put(k, new)
        for k, v in kwargs.items():
            if isinstance(v, list) and len(v) == old_n and k not in changed:
                put(k, v[:n])
        if n != layers:
            for k in layer_keys:
                put(k, n)
            layers = n
    for k, v in kwargs.items():
        if isinstance(v, Spec):
            sub, ch = shrink_kwargs(v.kwargs)
            out[k] = Spec(v.cls, sub)
            changed.update({f"{k}.{a}": b for a, b in ch.items()})
        elif k in changed:
            continue
        elif _STAGE_COUNTS.fullmatch(k) and isinstance(v, (list, tuple)) and all(
                type(x) is int for x in v):
            put(k, type(v)(min(x, STAGE_BLOCKS) for x in v))
        elif _POSITIONS.fullmatch(k) and type(v) is int:
            put(k, min(v, TOKENS))
        elif _WIDTH_LIST.fullmatch(k) and isinstance(v, list):
            put(k, _cap(v))
        elif _LAYER_INDEX.fullmatch(k) and layers is not None:
            put(k, _indices(v, layers))
        elif k == "image_shape" and isinstance(v, (tuple, list)) and len(v) == 3:
            put(k, tuple(min(x, IMAGE) if isinstance(x, int) else x for x in v[:2]) + (v[2],))
        elif k in ("image_size", "anchor_image_size") and isinstance(v, (int, tuple, list)):
            put(k, _small_side(v))
    return out, changed


def _cap(v):
    """A width at most ``WIDTH_MAX``, halved until it fits (a list: each element)."""
    if isinstance(v, list):
        return [_cap(x) for x in v]
    if type(v) is int and v > WIDTH_MAX:
        while v > WIDTH_MAX:
            v //= 2
    return v


def _indices(v, layers: int):
    """Layer indices kept below the layer count (the last layer if none is)."""
    if type(v) is int:
        return v if v < layers else layers - 1
    if isinstance(v, (list, tuple)) and all(type(x) is int for x in v):
        kept = [x for x in v if x < layers] or [layers - 1]
        return type(v)(kept)
    return v


def _small_side(v):
    if type(v) is int:
        return min(v, IMAGE)
    return type(v)(min(x, IMAGE) if type(x) is int else x for x in v)


def sequence_length(spec: Spec) -> int:
    """The free sequence length: ``TOKENS``, or less where a position table is shorter
    (``max_sequence_length=12`` in a documented example)."""
    limits = [v for k, v in _walk(spec) if type(v) is int and v > 0 and re.fullmatch(
        r"max_(\w+_)?(sequence_length|position_embeddings)", k)]
    return min([TOKENS] + limits)


def _walk(spec: Spec):
    for k, v in spec.kwargs.items():
        if isinstance(v, Spec):
            yield from _walk(v)
        else:
            yield k, v


# --- building and calling ----------------------------------------------------------------

def construct(spec: Spec):
    kwargs = {k: construct(v) if isinstance(v, Spec) else v for k, v in spec.kwargs.items()}
    return spec.cls(**kwargs)


def build(name: str, images: bool = True):
    """(model, shrunk spec, {argument: (documented, shrunk)}) for one backbone class;
    ``images=False`` keeps the documented image sizes (a model whose windows and stages
    need them: Swin's 7x7 windows over four stages)."""
    import keras
    cls = _class(name)
    if cls is None:
        raise BuildError(f"{name}: not exported by keras_hub.models")
    spec = configure(cls)
    kwargs, changed = shrink_kwargs(spec.kwargs)
    if not images:
        kwargs = _restore_images(kwargs, spec.kwargs)
        changed = {k: v for k, v in changed.items() if not _IMAGE_ARG.search(k)}
    spec = Spec(cls, kwargs)
    keras.utils.set_random_seed(0)
    return construct(spec), spec, changed


_IMAGE_ARG = re.compile(r"(^|\.)(image_shape|image_size|anchor_image_size)$")


def _restore_images(kwargs: dict, documented: dict) -> dict:
    out = {}
    for k, v in kwargs.items():
        d = documented.get(k)
        if isinstance(v, Spec) and isinstance(d, Spec):
            v = Spec(v.cls, _restore_images(v.kwargs, d.kwargs))
        elif _IMAGE_ARG.search(k) and k in documented:
            v = d
        out[k] = v
    return out


def cause(e: BaseException) -> str:
    """One line: keras' "Exception encountered when calling X.call()" followed by the
    message it wraps (its second paragraph), terminal colours removed."""
    from solbound.frontends.loading import oneline
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    line = oneline(e)
    m = re.search(r"Exception encountered when calling (\S+)\s*\n+\s*(.+)", text)
    if m:
        line = f"{type(e).__name__} in {m.group(1)} {m.group(2).strip()}"
    return re.sub(r"\x1b\[[0-9;]*m", "", line)[:300]


def traced(name: str):
    """(model, spec, changed, fn, args) whose function JAX traces: the shrunk build, or,
    when that does not trace, the build at its documented image sizes."""
    import jax
    model, spec, changed = build(name)
    fn, args = program(model, sequence_length(spec))
    try:
        jax.make_jaxpr(fn)(*args)
    except Exception as first:  # noqa: BLE001
        if not any(_IMAGE_ARG.search(k) for k in changed):
            raise TraceError(cause(first)) from None
        try:
            model, spec, changed = build(name, images=False)
            fn, args = program(model, sequence_length(spec))
            jax.make_jaxpr(fn)(*args)
        except Exception:  # noqa: BLE001
            raise TraceError(cause(first)) from None
    return model, spec, changed, fn, args


def abstract_inputs(model, tokens: int = TOKENS):
    """The backbone's functional inputs as ``ShapeDtypeStruct`` (batch 1, a free sequence
    length ``tokens``, a free image side ``IMAGE``), in the structure it takes them."""
    import jax
    import numpy as np

    def leaf(kt):
        shape = list(kt.shape)
        spatial = len(shape) == 4        # (batch, height, width, channels)
        # a one-channel float sequence is a waveform: samples, not tokens
        wave = len(shape) == 3 and shape[2] == 1 and np.dtype(kt.dtype).kind == "f"
        out = []
        for i, n in enumerate(shape):
            if n is None:
                n = 1 if i == 0 else (IMAGE if spatial and i in (1, 2) else
                                      SAMPLES if wave else tokens)
            out.append(n)
        return jax.ShapeDtypeStruct(tuple(out), np.dtype(kt.dtype))
    return jax.tree_util.tree_map(leaf, model.input)


def program(model, tokens: int = TOKENS):
    """(function, args): the backbone as a JAX function of its variables and inputs."""
    def fn(trainable, non_trainable, inputs):
        return model.stateless_call(trainable, non_trainable, inputs, training=False)[0]
    return fn, ([v.value for v in model.trainable_variables],
                [v.value for v in model.non_trainable_variables],
                abstract_inputs(model, tokens))


def one(name: str, validate: bool = True) -> dict:
    """Build, analyze and validate one backbone (in this process)."""
    import warnings
    warnings.simplefilter("ignore")
    import solbound
    from solbound.frontends.loading import oneline
    rec: dict = {"backbone": name, "stage": "build"}
    t0 = time.perf_counter()
    try:
        model, spec, changed, fn, args = traced(name)
    except TraceError as e:
        rec.update(status="error", stage="trace", error=str(e),
                   seconds=time.perf_counter() - t0)
        return rec
    except Exception as e:  # noqa: BLE001
        rec.update(status="error", error=cause(e), seconds=time.perf_counter() - t0)
        return rec
    rec["changed"] = {k: [repr(a)[:40], repr(b)[:40]] for k, (a, b) in changed.items()}
    rec["params"] = int(sum(v.numpy().size for v in model.weights))
    rec["stage"] = "analyze"
    t1 = time.perf_counter()
    try:
        rep = solbound.analyze(fn, args, arch="h100-sxm")
    except Exception as e:  # noqa: BLE001
        rec.update(status="error", error=cause(e), seconds=time.perf_counter() - t0)
        return rec
    rec.update(macs=rep.counts.macs, flops=sum(rep.counts.flops.values()),
               kernels=len(rep.program.kernels),
               unsupported=sorted({u.operator for u in rep.unsupported}),
               unsupported_why={u.operator: u.reason[:160] for u in rep.unsupported},
               notes=[n for n in rep.to_dict()["assumptions"] if "mask" in n][:4],
               analyze_seconds=round(time.perf_counter() - t1, 2))
    rec["status"] = "unsupported" if rec["unsupported"] else "analyzed"
    if validate and not rec["unsupported"]:
        rec["stage"] = "validate"
        try:
            from solbound.frontends.jax.reference import validate_within_budget
            v = validate_within_budget(rep.lowered, fn, args)
        except Exception as e:  # noqa: BLE001
            v = {"status": "error", "reason": f"internal: {oneline(e)}"}
        rec["validation"] = v.get("status")
        rec["validation_reason"] = (v.get("reason") or "")[:300]
        if v.get("status") == "failed":
            rec["validation_reason"] = (v.get("summary", "") + " " + str(
                v.get("first_divergence", ""))[:200])[:300]
    rec["seconds"] = round(time.perf_counter() - t0, 2)
    return rec


# --- the registry ------------------------------------------------------------------------

def run_all(only=None, jobs=1, timeout=300, validate=True, jsonl=None) -> list[dict]:
    from concurrent.futures import ThreadPoolExecutor
    todo = [n for n in _listed() if not only or n in only]
    out = open(jsonl, "a") if jsonl else None

    def run(name):
        cmd = [sys.executable, os.path.abspath(__file__), "--one", name]
        if not validate:
            cmd.append("--no-validate")
        t0 = time.perf_counter()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"backbone": name, "status": "error", "stage": "timeout",
                    "error": f"over {timeout} s", "seconds": round(time.perf_counter() - t0, 1)}
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        if line:
            return json.loads(line[-1])
        err = (p.stderr.strip().splitlines() or ["no output"])[-1]
        return {"backbone": name, "status": "error", "stage": "crash",
                "error": f"the worker died (rc {p.returncode}): {err[:200]}"}

    done = []
    with ThreadPoolExecutor(jobs) as pool:
        for i, rec in enumerate(pool.map(run, todo)):
            done.append(rec)
            if out:
                out.write(json.dumps(rec) + "\n")
                out.flush()
            print(f"[{i + 1}/{len(todo)}] {rec['backbone']}: {rec['status']} "
                  f"{rec.get('validation', '')} "
                  f"{rec.get('error', '') or rec.get('validation_reason', '')[:120]}",
                  file=sys.stderr, flush=True)
    return done


def _listed() -> list[str]:
    """The backbone names, from a subprocess (the parent imports no keras)."""
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--list"],
                       capture_output=True, text=True, timeout=300)
    return json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("[")][-1])


def _cause(r: dict) -> str:
    if r["status"] == "error":
        cause = r.get("error", "")
    elif r["status"] == "unsupported":
        why = r.get("unsupported_why", {})
        cause = "unsupported: " + ", ".join(f"{u} ({why[u]})" if why.get(u) else u
                                            for u in r["unsupported"])
    else:
        cause = f"validation {r.get('validation')}: {r.get('validation_reason', '')}"
    return cause.replace("|", "/").replace("\n", " ")[:240]


def summary(recs: list[dict]) -> str:
    n = len(recs)
    built = [r for r in recs if r.get("stage") != "build"]
    analyzed = [r for r in recs if r["status"] == "analyzed"]
    validated = [r for r in analyzed if r.get("validation") == "passed"]

    def pct(x):
        return f"{len(x)} ({100 * len(x) / n:.0f}%)" if n else "0"
    return ("| backbones | built | analyzed, nothing unsupported | validated |\n"
            "|---|---|---|---|\n"
            f"| {n} | {pct(built)} | {pct(analyzed)} | {pct(validated)} |")


def table(recs: list[dict]) -> str:
    rows = ["| backbone | status | validation | MACs | analyze s | cause |",
            "|---|---|---|---|---|---|"]
    for r in sorted(recs, key=lambda r: r["backbone"]):
        ok = r["status"] == "analyzed" and r.get("validation") in ("passed", None)
        rows.append(f"| {r['backbone']} | {r['status']} ({r.get('stage', '')}) | "
                    f"{r.get('validation', '')} | {r.get('macs', ''):,} | "
                    f"{r.get('analyze_seconds', '')} | {'' if ok else _cause(r)} |"
                    if isinstance(r.get("macs"), int) else
                    f"| {r['backbone']} | {r['status']} ({r.get('stage', '')}) | "
                    f"{r.get('validation', '')} |  |  | {_cause(r)} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated Backbone class names")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--no-validate", action="store_true")
    ap.add_argument("--jsonl", help="append one JSON line per backbone here")
    ap.add_argument("--from-jsonl", help="summarize an earlier run instead of running")
    ap.add_argument("--markdown", action="store_true", help="print the per-backbone table")
    ap.add_argument("--one", metavar="BACKBONE", help=argparse.SUPPRESS)
    ap.add_argument("--list", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.list:
        print(json.dumps(backbones()), flush=True)
        return 0
    if a.one:
        print(json.dumps(one(a.one, not a.no_validate)), flush=True)
        return 0
    if a.from_jsonl:
        recs = [json.loads(ln) for ln in open(a.from_jsonl) if ln.strip()]
    else:
        t0 = time.perf_counter()
        recs = run_all(set(a.only.split(",")) if a.only else None, a.jobs, a.timeout,
                       not a.no_validate, a.jsonl)
        print(f"{len(recs)} backbones in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    print(summary(recs))
    if a.markdown:
        print()
        print(table(recs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
