"""One engine step: a batch of sequences, each ``new`` tokens against ``ctx`` cached ones.

The step program is the model's own forward for each sequence against its own cache (the
transformers cache class the model's config asks for: full layers keep every row, window
layers their last ``window - 1``), logits for each sequence's last token only
(``logits_to_keep=1``), the weights shared by all sequences. :meth:`StepModel.trace`
traces exactly that program for one composition; its fused bound is the step's speed of
light (an engine runs the token-wise operators on the packed tokens, which moves the same
bytes and does the same work once the buffer is unbounded; attention is per sequence).

Tracing every composition costs seconds; a scheduler asks every step. So the counts are
read once per *region* of ``(new, ctx)`` and then evaluated in closed form:

* A sequence's work and traffic are the counts of loop nests whose extents and guard
  constants are affine in ``new`` and ``ctx`` (projections over ``new`` rows, attention
  over ``ctx + new`` keys under the causal or window mask, cache rows read and written).
  Such counts are piecewise polynomials in ``(new, ctx)`` (Ehrhart): within one region,
  where no comparison in the masks or the cache's truncation changes sides, each is one
  polynomial, of degree 2 for these programs (pairs of query and key positions).
* The regions: a prefill (``ctx = 0``), a decode (``new = 1``), an extend (both), and for
  each attention window ``w`` the cache's ``min(ctx, w - 1)`` rows and the mask's
  ``min(p + 1, w)`` keys per query: ``ctx + new <= w``, across it, or ``ctx >= w - 1``.
* In each region the polynomial's coefficients are solved exactly (rationals) from traces
  of the model at as many points as it has monomials, and checked at another traced point
  before use: a model whose counts are not of that form (a chunked attention, a degree the
  region does not have) is refused with the component that disagreed, never fitted.
* A step is the sum over its sequences, but for the weights (parameters, buffers,
  constants): of each, the step reads ``min(sum of the sequences' reads, its size)``, the
  rule by which the fused traffic unites partial reads of one tensor. A dense weight is read
  once per step; a mixture-of-experts layer's experts as the routing assumption spreads the
  step's ``T * k`` (token, expert) pairs over them, as ``analyze`` counts a packed batch.

:class:`StepModel` keeps the solved coefficients; ``bound`` evaluates them (microseconds
per sequence) and puts the sums on the roofline (``bounds.roofline.work_bound``).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import random
import re
import sys
import time
import zlib
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Iterable

from ..bounds.roofline import Bound, Policy, work_bound, work_of
from ..hardware.catalog import Spec
from ..pipeline import specs_of


class StepError(ValueError):
    """A step the model cannot run, or a model without what a step needs (one line)."""


@dataclass(frozen=True)
class Seq:
    """One sequence of a step: ``new`` tokens computed, ``ctx`` tokens already cached."""
    new: int
    ctx: int

    def __str__(self) -> str:
        return f"{self.new}@{self.ctx}"


_ITEM = re.compile(r"^(\d+)@(\d+)(?:x(\d+))?$")


def parse_seqs(text: str) -> list[Seq]:
    """A step's sequences from ``NEW@CTX`` items, ``NEW@CTXxCOUNT`` for ``COUNT`` alike.

    >>> [str(s) for s in parse_seqs("512@0,1@4095x2")]
    ['512@0', '1@4095', '1@4095']
    >>> parse_seqs("512@0,1@")
    Traceback (most recent call last):
    ...
    solbound.serving.step.StepError: --seqs item '1@': expected NEW@CTX or NEW@CTXxCOUNT (e.g. 512@0 or 1@4095x63)
    """
    out: list[Seq] = []
    for item in (t.strip() for t in str(text).split(",")):
        m = _ITEM.match(item)
        if not m:
            raise StepError(f"--seqs item {item!r}: expected NEW@CTX or NEW@CTXxCOUNT "
                            f"(e.g. 512@0 or 1@4095x63)")
        new, ctx, count = int(m[1]), int(m[2]), int(m[3] or 1)
        if new < 1:
            raise StepError(f"--seqs item {item!r}: a sequence in a step computes at least "
                            f"one new token")
        if count < 1:
            raise StepError(f"--seqs item {item!r}: COUNT must be at least 1")
        out += [Seq(new, ctx)] * count
    return out


def as_seqs(seqs) -> list[Seq]:
    """``seqs`` as a list of :class:`Seq`: a ``--seqs`` string, ``Seq``s or ``(new, ctx)``
    pairs."""
    if isinstance(seqs, str):
        return parse_seqs(seqs)
    out = []
    for s in seqs:
        s = s if isinstance(s, Seq) else Seq(*map(int, s))
        if s.new < 1 or s.ctx < 0:
            raise StepError(f"sequence {s}: needs new >= 1 and ctx >= 0")
        out.append(s)
    if not out:
        raise StepError("a step needs at least one sequence")
    return out


# ---------------------------------------------------------------------------- regions

#: token counts below this are classes of their own: a pass may treat a tiny extent
#: specially (the known-value pass guards away row 0 of a two-row ``arange``, which is 0), so
#: counts are polynomials in ``new`` and ``ctx`` only from here on; below, each value is
#: fixed and the polynomial is in the other variable (or the region is one point)
SMALL = 3


def _kind(new: int, ctx: int, small: int = SMALL) -> str:
    n_var, c_var = new >= small, ctx >= small
    if n_var and c_var:
        return "extend"
    if n_var:
        return "prefill" if ctx == 0 else f"n@{ctx}"
    if c_var:
        return "decode" if new == 1 else f"{new}@c"
    return "one" if (new, ctx) == (1, 0) else f"{new}@{ctx}"


def region_of(new: int, ctx: int, windows: tuple[int, ...], tokens: tuple[int, ...] = (),
              chunk: int | None = None, small: int = SMALL) -> tuple:
    """The region of ``(new, ctx)``: its kind, per window which side of the window the
    cache and the mask are on, and per token threshold (a mixture of experts' ``E / k``
    tokens, from which on every expert is hit) which side ``new`` is on. Kinds: ``prefill``
    (``ctx = 0``), ``decode`` (``new = 1``), ``extend``, and for counts below ``SMALL`` a
    kind per fixed value (``n@1``: any ``new`` at ``ctx = 1``; ``2@c``; ``one``: ``1@0``).

    >>> region_of(512, 0, (4096,)), region_of(1, 5000, (4096,)), region_of(100, 4000, (4096,))
    (('prefill', ('within',), ()), ('decode', ('past',), ()), ('extend', ('across',), ()))
    >>> region_of(1, 0, ()), region_of(3, 0, (), (16,)), region_of(2, 9, ())[0]
    (('one', (), ()), ('prefill', (), ('below',)), '2@c')
    """
    kind = _kind(new, ctx, small)
    cuts = tuple("past" if ctx >= w - 1 and ctx > 0 else "within" if ctx + new <= w
                 else "across" for w in windows)
    key = kind, cuts, tuple("below" if new < t else "above" for t in tokens)
    if chunk:
        key += (chunk_side(new, chunk),)
    return key


def chunk_side(new: int, chunk: int) -> str:
    """Where ``new`` tokens stand against a layer that pads them to whole chunks of
    ``chunk``: ``part`` (less than one chunk: the chunk dim is 1 and the padded rows are
    whole rows, which the passes drop), ``one`` (exactly one chunk), ``whole`` (two or more
    whole chunks: no padding at all, so no padding operators) or ``chunks`` (more than one chunk, the last one padded). Within
    ``chunks`` the counts are polynomials in ``new``, ``ctx`` and ``q = ceil(new / chunk)``.

    >>> [chunk_side(n, 64) for n in (5, 63, 64, 65, 128, 200)]
    ['part', 'part', 'one', 'chunks', 'whole', 'chunks']
    """
    if new == chunk:
        return "one"
    return "whole" if new % chunk == 0 else "part" if new < chunk else "chunks"


_N = ((0, 0, 0), (1, 0, 0), (2, 0, 0))          # a polynomial in new
_C = ((0, 0, 0), (0, 1, 0), (0, 2, 0))          # in ctx
_NC = ((0, 0, 0), (1, 0, 0), (0, 1, 0), (2, 0, 0), (1, 1, 0), (0, 2, 0))
# with a chunked layer (a chunk of C tokens), also in the chunks q = ceil(new / C)
_NQ = _N + ((0, 0, 1), (1, 0, 1), (0, 0, 2))
_NCQ = _NC + ((0, 0, 1), (1, 0, 1), (0, 1, 1), (0, 0, 2))


def _monomials_of(key) -> tuple[tuple[int, int, int], ...]:
    """The exponents ``(i, j, k)`` of ``new**i * ctx**j * q**k`` of a region (its key, or
    just its kind), ``q = ceil(new / C)`` the chunks of a layer that pads its tokens to
    whole chunks of ``C``: a variable where the key's chunk side is ``chunks``; where it
    is ``one`` (exactly one chunk) ``new`` is fixed."""
    kind, side = (key, None) if isinstance(key, str) else \
        (key[0], key[3] if len(key) > 3 else None)
    q = side == "chunks"
    if kind == "extend":
        mons = _NCQ if q else _NC
    elif kind == "prefill" or kind.startswith("n@"):
        mons = _NQ if q else _N
    elif kind == "decode" or kind.endswith("@c"):
        mons = _C
    else:
        mons = ((0, 0, 0),)
    return tuple(e for e in mons if e[0] == 0) if side == "one" else mons


def monomials(key, new: int, ctx: int, chunk: int | None = None) -> list[int]:
    """The region's monomials ``new**i * ctx**j * q**k`` at one point (``q``: the chunks
    of ``chunk`` tokens that ``new`` fills, where the region has that variable); ``key``:
    a region key, or just its kind.

    >>> monomials("extend", 5, 7), monomials(("prefill", (), (), "chunks"), 100, 0, chunk=64)
    ([1, 5, 7, 25, 35, 49], [1, 100, 10000, 2, 200, 4])
    """
    q = -(-new // chunk) if chunk else 0
    return [new ** i * ctx ** j * q ** k for i, j, k in _monomials_of(key)]


def _rank(rows: list[list[int]]) -> int:
    """The rank of an integer matrix (exact)."""
    a = [[Fraction(v) for v in r] for r in rows]
    rank, cols = 0, len(a[0]) if a else 0
    for col in range(cols):
        piv = next((r for r in range(rank, len(a)) if a[r][col] != 0), None)
        if piv is None:
            continue
        a[rank], a[piv] = a[piv], a[rank]
        for r in range(rank + 1, len(a)):
            f = a[r][col] / a[rank][col]
            a[r] = [v - f * w for v, w in zip(a[r], a[rank])]
        rank += 1
    return rank


def _solve(rows: list[list[int]], rhs: list[list[int]]) -> list[list[Fraction]] | None:
    """Exact Gauss-Jordan: ``X`` with ``rows @ X = rhs`` (square), None when singular."""
    n = len(rows)
    a = [[Fraction(v) for v in r] + [Fraction(v) for v in b] for r, b in zip(rows, rhs)]
    for col in range(n):
        piv = next((r for r in range(col, n) if a[r][col] != 0), None)
        if piv is None:
            return None
        a[col], a[piv] = a[piv], a[col]
        p = a[col][col]
        a[col] = [v / p for v in a[col]]
        for r in range(n):
            if r != col and a[r][col] != 0:
                f = a[r][col]
                a[r] = [v - f * w for v, w in zip(a[r], a[col])]
    return [row[n:] for row in a]


# ---------------------------------------------------------------------------- the model

def cache_kw(model, cache) -> dict:
    """The cache argument as ``model``'s forward names it: ``cache`` from transformers 5.25
    on (``past_key_values`` is deprecated there, to be removed in 5.40), else
    ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return {"cache" if "cache" in params else "past_key_values": cache}


@dataclass(frozen=True)
class CacheLayer:
    """What one layer of the model's cache keeps per token: key and value rows of these
    shapes (batch and sequence dims excluded) and dtypes (torch's names); ``window``: the rows a window
    layer keeps (``window - 1`` of them; None: every row)."""
    kind: str
    key: tuple[int, ...]
    value: tuple[int, ...]
    key_dtype: str
    value_dtype: str
    window: int | None = None
    #: a linear-attention or SSM layer's state, one entry per state tensor: ``(what, index,
    #: shape, dtype)`` with ``what`` ``"conv"`` (the causal convolution's last inputs) or
    #: ``"recurrent"`` (the recurrence's state), the shape without the batch dim. A
    #: sequence holds it whatever its length (``state_bytes``); a layer of kind ``state``
    #: keeps no key/value rows, a ``full`` or ``window`` layer with states keeps both
    states: tuple = ()

    def bytes_per_token(self) -> int:
        import math
        import torch
        if self.kind == "state":
            return 0
        return (math.prod(self.key) * getattr(torch, self.key_dtype).itemsize
                + math.prod(self.value) * getattr(torch, self.value_dtype).itemsize)

    def state_bytes(self) -> int:
        """The bytes of one sequence's state in this layer (0 for a key/value layer)."""
        import math
        import torch
        return sum(math.prod(shape) * getattr(torch, dt).itemsize
                   for _, _, shape, dt in self.states)


def _text_config(model):
    cfg = model.config
    return getattr(cfg, "get_text_config", lambda **_: cfg)(decoder=True)


def cache_layout(model, kv_dtype: str | None = None) -> list[CacheLayer]:
    """The model's cache, layer by layer, as its own cache class builds it: a one-token
    forward on meta tensors into a ``DynamicCache(config=...)``. Raises :class:`StepError`
    for a model without a cache interface or with cache layers a step cannot yet read."""
    import torch
    try:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer
    except ImportError as e:                      # pragma: no cover - transformers is a dependency
        raise StepError(f"serving steps need transformers ({e})") from None
    state_kinds = _state_layer_classes()
    name = type(model).__name__
    params = inspect.signature(model.forward).parameters
    if getattr(model, "config", None) is None or not ({"cache", "past_key_values"} & set(params)):
        raise StepError(f"{name} has no cache interface: a step needs a transformers causal "
                        f"LM whose forward takes past_key_values (or cache)")
    cache = DynamicCache(config=model.config)
    unsupported = [(i, type(l).__name__) for i, l in enumerate(cache.layers)
                   if type(l) not in (DynamicLayer, DynamicSlidingWindowLayer)
                   and not isinstance(l, state_kinds)]
    cache = new_cache(model.config, kv_dtype)
    if unsupported:
        i, kind = unsupported[0]
        raise StepError(f"{name}: cache layer {i} is a {kind} (quantized rows); a step "
                        f"reads full and sliding-window key/value layers and linear-attention "
                        f"and SSM state layers only so far")
    ids = torch.zeros(1, 1, dtype=torch.long, device="meta")
    from ..frontends.torch.capture import _traceable_experts
    with torch.device("meta"), torch.no_grad():
        meta = _on_meta(model)
        with _traceable_experts(meta):        # static-size expert dispatch (no values)
            meta(input_ids=ids, **cache_kw(meta, cache), use_cache=True)
    out = []
    for i, layer in enumerate(cache.layers):
        states = _states_of(layer) if isinstance(layer, state_kinds) else ()
        if isinstance(layer, state_kinds) and not states:
            raise StepError(f"{name}: cache layer {i} ({type(layer).__name__}) holds no state "
                            f"after a one-token forward: its layer does not use the cache")
        k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
        if getattr(layer, "_quantized_keys", None) is not None:    # QuantizedCache (fp8)
            (k, ks), (v, vs) = layer._quantized_keys, layer._quantized_values
            states = tuple(("scale", j, tuple(t.shape), str(t.dtype).removeprefix("torch."))
                           for j, t in enumerate((ks, vs)))
        if k is None:                        # a linear-attention or SSM layer: state only
            out.append(CacheLayer("state", (), (), "", "", None, states))
            continue
        w = getattr(layer, "sliding_window", None)
        out.append(CacheLayer("window" if w else "full", tuple(k.shape[1:2]) + tuple(k.shape[3:]),
                              tuple(v.shape[1:2]) + tuple(v.shape[3:]),
                              str(k.dtype).removeprefix("torch."),
                              str(v.dtype).removeprefix("torch."), w, states))
    return out


def new_cache(config, kv_dtype: str | None = None):
    """The cache one sequence's step runs against: the ``DynamicCache`` its config asks
    for; with ``kv_dtype="fp8"`` storing e4m3 rows (vLLM's FP8 cache, scale 1:
    ``quantize.fp8_cache``); with ``"quantized-fp8"`` transformers' own
    ``QuantizedCache(backend="fp8")`` (e4m3 rows with a per-tensor scale frozen at the
    first update, the whole cache dequantized to the model's dtype each step)."""
    from transformers import DynamicCache
    if kv_dtype == "quantized-fp8":
        from transformers import QuantizedCache
        try:
            return QuantizedCache(backend="fp8", config=config)
        except (ValueError, ImportError) as e:
            raise StepError(f"transformers' QuantizedCache(backend='fp8'): {e}") from None
    cache = DynamicCache(config=config)
    if kv_dtype == "fp8":                  # the engine's FP8 cache (serving/quantize.py)
        from .quantize import fp8_cache
        fp8_cache(cache)
    return cache


def _fill_quantized(layer, keys, values, key_scale, value_scale, ctx: int, dtype) -> None:
    """A transformers FP8 quantized cache layer as after ``ctx`` tokens: its e4m3 rows and
    per-tensor scales (step inputs), the model's dtype, its token count."""
    import torch
    layer.dtype, layer.device = dtype, keys.device
    layer.keys = torch.tensor([], dtype=dtype, device=keys.device)
    layer.values = torch.tensor([], dtype=dtype, device=keys.device)
    layer.is_initialized = True
    layer._quantized_keys = (keys, key_scale.reshape(()))
    layer._quantized_values = (values, value_scale.reshape(()))
    layer.cumulative_length = ctx


def _state_layer_classes() -> tuple:
    """transformers' linear-attention cache layers (state per sequence; transformers 5.25
    on), empty before."""
    try:
        from transformers.cache_utils import LinearAttentionCacheLayerMixin
    except ImportError:                      # pragma: no cover - older transformers
        return ()
    return (LinearAttentionCacheLayerMixin,)


def _states_of(layer) -> tuple:
    """A linear-attention cache layer's state tensors after a forward: ``(what, index,
    shape without the batch dim, dtype)`` per conv and recurrent state it holds."""
    out = []
    for what, states in (("conv", layer.conv_states), ("recurrent", layer.recurrent_states)):
        for idx, t in sorted(states.items()):
            if t is None:
                continue
            if not hasattr(t, "shape"):
                raise StepError(f"cache layer {type(layer).__name__}: its {what} state {idx} is "
                                f"a {type(t).__name__}, not a tensor")
            out.append((what, idx, tuple(t.shape[1:]), str(t.dtype).removeprefix("torch.")))
    return tuple(out)


def _fill_state(layer, what: str, idx: int, t, ctx: int) -> None:
    """Set one state of a linear-attention cache layer as after ``ctx`` tokens: the tensor
    ``t`` (a step input), the layer's flags and its token count."""
    import torch
    if what == "conv":
        layer.conv_states[idx] = t
        layer.is_conv_states_initialized[idx] = True
        layer.conv_kernel_size[idx] = t.shape[-1]
    else:
        layer.recurrent_states[idx] = t
        layer.is_recurrent_states_initialized[idx] = True
    layer.has_previous_state[idx] = True
    if layer.device is None:
        layer.device, layer.dtype = t.device, t.dtype
    layer.cumulative_length_linear = torch.tensor(ctx, dtype=torch.long, device=t.device)


def _chunk_size(model) -> int | None:
    """The tokens per chunk of a model whose state layers pad a prefill to whole chunks (a
    chunked SSM or linear-attention scan): the config's ``chunk_size`` (Mamba 2's family),
    else the one default ``chunk_size`` of the modeling module's own chunked functions
    (Qwen3-Next's gated delta rule pads to 64). None if neither is there: the regions
    are then checked far past the sampled points, and a model that chunks anyway is
    refused there, never fitted."""
    cfg = _text_config(model)
    for name in ("chunk_size", "mamba_chunk_size", "ssm_chunk_size"):
        v = getattr(cfg, name, None)
        if isinstance(v, int) and v > 1:
            return v
    mod = sys.modules.get(type(model).__module__)
    try:
        src = inspect.getsource(mod) if mod else ""
    except (OSError, TypeError):
        src = ""
    found = {int(v) for v in re.findall(r"\bchunk_size\s*(?::\s*int\s*)?=\s*(\d+)", src)}
    return found.pop() if len(found) == 1 and min(found) > 1 else None


def _on_meta(model):
    """``model`` itself when its weights are on the meta device, else a meta copy (a
    one-token forward to read the cache's shapes needs no values)."""
    import copy
    p = next(model.parameters(), None)
    if p is None or p.device.type == "meta":
        return model
    return copy.deepcopy(model).to("meta")


def _expert_thresholds(cfg) -> tuple[int, ...]:
    """Token counts from which a mixture-of-experts layer's experts are all hit under the
    routing assumption (``E / k``, from the config's expert count and experts per token),
    where the experts' weight reads stop growing with the tokens."""
    e = next((getattr(cfg, a) for a in ("num_experts", "num_local_experts", "n_routed_experts")
              if isinstance(getattr(cfg, a, None), int) and getattr(cfg, a) > 1), None)
    k = getattr(cfg, "num_experts_per_tok", None)
    if not e or not isinstance(k, int) or k < 1:
        return ()
    return (-(-e // k),)


def _layer_stack(model, count: int):
    """``(parent, attribute, ModuleList)`` of the model's decoder layers: the module list of
    ``count`` layers (one per cache layer), the one named ``layers`` first; None if none."""
    import torch
    found = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == count and name:
            parent_name, _, attr = name.rpartition(".")
            found.append((not name.endswith("layers"), name.count("."),
                          model.get_submodule(parent_name) if parent_name else model, attr, mod))
    if not found:
        return None
    found.sort(key=lambda f: f[:2])
    return found[0][2:]


def _signature(layer, i: int, cfg, cache: CacheLayer) -> tuple:
    """What makes two decoder layers count alike: their classes, parameter and buffer
    shapes and dtypes, their layer type in the config and their cache layer."""
    types = getattr(cfg, "layer_types", None)
    return (tuple(type(m).__name__ for m in layer.modules()),
            tuple((n, tuple(p.shape), str(p.dtype)) for n, p in layer.named_parameters()),
            tuple((n, tuple(b.shape), str(b.dtype)) for n, b in layer.named_buffers()),
            types[i] if types and i < len(types) else None, cache)


def _derived(cfg, name: str) -> bool:
    """Whether the config computes ``name`` (a property without a setter: Mamba 2's
    ``layer_types``, from its layer count) instead of holding it."""
    prop = getattr(type(cfg), name, None)
    return isinstance(prop, property) and prop.fset is None


class _keep_layers:
    """Within the block, ``model`` runs only the decoder layers ``keep`` (None: all): the
    layer list, the config's layer count and layer types, and each kept layer's
    ``layer_idx`` (its cache slot) renumbered; all restored on exit."""

    def __init__(self, model, stack, keep):
        self.model, self.stack, self.keep = model, stack, keep

    def __enter__(self):
        if self.keep is None:
            return self
        import torch
        parent, attr, layers = self.stack
        cfgs = {id(c): c for c in (self.model.config, _text_config(self.model))}.values()
        self.saved = [(parent, attr, layers)]
        self.cfg_saved = [(c, c.num_hidden_layers,
                           None if _derived(c, "layer_types") else getattr(c, "layer_types", None))
                          for c in cfgs]
        self.idx_saved = []
        # per-layer lists a config derives from its layer count (Jamba's layer_types and
        # layers_block_type, from an attention period and offset): the kept layers' own,
        # through a subclass of the config's class for the duration
        self.class_saved = []
        for c in cfgs:
            derived = {}
            for name in dir(type(c)):
                if not _derived(c, name):
                    continue
                try:
                    v = getattr(c, name)
                except Exception:  # noqa: BLE001 - a property that needs more than the config
                    continue
                if isinstance(v, (list, tuple)) and len(v) == c.num_hidden_layers:
                    kept = type(v)(v[i] for i in self.keep)
                    derived[name] = property(lambda _self, kept=kept: kept)
            if derived:
                self.class_saved.append((c, type(c)))
                object.__setattr__(c, "__class__", type(type(c).__name__, (type(c),), derived))
        setattr(parent, attr, torch.nn.ModuleList([layers[i] for i in self.keep]))
        for c, _, types in self.cfg_saved:
            c.num_hidden_layers = len(self.keep)
            if types is not None:
                c.layer_types = [types[i] for i in self.keep]
        for j, i in enumerate(self.keep):
            for m in layers[i].modules():
                if isinstance(getattr(m, "layer_idx", None), int):
                    self.idx_saved.append((m, m.layer_idx))
                    m.layer_idx = j
        return self

    def __exit__(self, *exc):
        if self.keep is None:
            return False
        parent, attr, layers = self.saved[0]
        setattr(parent, attr, layers)
        for c, n, types in self.cfg_saved:
            c.num_hidden_layers = n
            if types is not None:
                c.layer_types = types
        for m, i in self.idx_saved:
            m.layer_idx = i
        for c, cls in self.class_saved:
            object.__setattr__(c, "__class__", cls)
        return False


class _Sequences:
    """Builds the step program of one composition: ``module`` runs the model for each
    sequence against its own cache (filled from the inputs) and returns each sequence's
    last-token logits; ``inputs`` are the token ids and cached keys and values."""

    def __init__(self, model, layout: list[CacheLayer], all_logits: bool = False,
                 kv_dtype: str | None = None):
        self.model, self.layout, self.kv_dtype = model, layout, kv_dtype
        # the last token's logits only (as engines decode); a speculative verify step keeps
        # every new token's (transformers' default)
        self.keep = not all_logits and \
            "logits_to_keep" in inspect.signature(model.forward).parameters

    def module(self, seqs: list[Seq], model=None):
        """The step module over ``model`` (default: the model; a tensor-parallel rank's
        sharded copy under :meth:`StepModel._rank`)."""
        import torch
        model = self.model if model is None else model
        layout, keep, kv_dtype = self.layout, self.keep, self.kv_dtype
        quantized = kv_dtype == "quantized-fp8"

        class Step(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = model

            def forward(self, *flat):
                outs, i = [], 0
                for s in seqs:
                    ids = flat[i]
                    i += 1
                    cache = new_cache(self.m.config, kv_dtype)
                    if s.ctx:
                        for li, L in enumerate(layout):
                            if quantized:    # rows and the two scales
                                _fill_quantized(cache.layers[li], *flat[i:i + 4], s.ctx,
                                                self.m.dtype)
                                i += 4
                                continue
                            if L.kind != "state":
                                cache.update(flat[i], flat[i + 1], li)
                                i += 2
                            for what, idx, _, _ in L.states:
                                _fill_state(cache.layers[li], what, idx, flat[i], s.ctx)
                                i += 1
                    kw = {"logits_to_keep": 1} if keep else {}
                    outs.append(self.m(input_ids=ids, **cache_kw(self.m, cache),
                                       use_cache=True, **kw).logits)
                return tuple(outs)

        step = Step()
        if getattr(model, "solbound_tp", None):   # one rank of transformers' own TP plan
            step.solbound_tp = model.solbound_tp
        return step

    def inputs(self, seqs: list[Seq], real: bool = False, seed: int = 0, model=None) -> list:
        """Random token ids and cache rows with ``real``; else zeros on the device of
        ``model`` (default: the model; meta tensors for a model built on the meta device)."""
        import torch
        g = torch.Generator().manual_seed(seed)
        vocab = _text_config(self.model).vocab_size
        p = next((self.model if model is None else model).parameters(), None)
        dev = "cpu" if real or p is None else p.device
        flat = []
        for s in seqs:
            flat.append(torch.randint(0, vocab, (1, s.new), generator=g) if real else
                        torch.zeros(1, s.new, dtype=torch.long, device=dev))
            if s.ctx:
                for L in self.layout:
                    rows = ((L.key, L.key_dtype), (L.value, L.value_dtype)) \
                        if L.kind != "state" else ()
                    for shape, dt in rows:
                        full = (1, shape[0], s.ctx, *shape[1:])
                        dtype = getattr(torch, dt)
                        flat.append(torch.randn(full, generator=g).to(dtype) if real else
                                    torch.zeros(full, dtype=dtype, device=dev))
                    for what, _, shape, dt in L.states:      # the state after ctx tokens
                        dtype = getattr(torch, dt)
                        if what == "scale":                    # a quantized cache's scale
                            flat.append((torch.rand((1, *shape), generator=g) + 0.5).to(dtype)
                                        if real else torch.ones((1, *shape), dtype=dtype,
                                                                device=dev))
                            continue
                        flat.append(torch.randn((1, *shape), generator=g).to(dtype) if real
                                    else torch.zeros((1, *shape), dtype=dtype, device=dev))
        return flat


# ---------------------------------------------------------------------------- counts

@dataclass
class StepCounts:
    """A step's totals: MACs, FLOPs per unit, fused DRAM bytes, and the work per pipe and
    special functions the roofline takes (under the model's precision policy)."""
    macs: int
    flops: dict[str, int]
    bytes: int
    work: dict[str, int]
    special: dict[str, int]
    sequences: int
    tokens: int
    exact: bool = True
    # a tensor-parallel rank's collectives: ``KIND:RANKS`` -> payload bytes summed over calls
    comm: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = {"macs": self.macs, "flops": sum(self.flops.values()),
             "flops_by_unit": dict(self.flops), "bytes": {"fused": self.bytes},
             "exact": self.exact, "sequences": self.sequences, "tokens": self.tokens}
        if self.comm:
            d["collectives"] = [{"kind": k.split(":")[0], "ranks": int(k.split(":")[1]),
                                 "bytes": v} for k, v in sorted(self.comm.items())]
        return d

    def collectives(self) -> list:
        """The step's collectives as ``bounds.comm.comm_time`` takes them
        (:func:`collectives_of`)."""
        return collectives_of(self.comm)


def collectives_of(payloads: dict[str, float]) -> list:
    """``KIND:RANKS -> payload bytes`` (a tensor-parallel rank's step components, summed over
    its calls and pieces) as ``analysis.counts.Collective``s over the whole group, one call
    each: a collective's time is linear in its payload on each link, so payloads add."""
    from ..analysis.counts import Collective
    out = []
    for k, v in sorted(payloads.items()):
        kind, ranks = k.split(":")
        if v:
            out.append(Collective(kind, int(round(v)), int(ranks), 1, "", "", "", ""))
    return out


def _integral(x: float, what: str) -> int:
    r = round(x)
    if abs(x - r) > 1e-6 * max(1.0, abs(x)):
        raise StepError(f"{what} is not a whole number of operations ({x})")
    return int(r)


def components(rep, policy: Policy) -> tuple[dict[str, int], dict[str, int]]:
    """The additive quantities of one traced step (``Report``) and the sizes of the tensors
    sequences share. Quantities: ``macs``, ``flops:UNIT``, ``work:PIPE``, ``special:FN``,
    ``bytes`` (the fused traffic but for the shared tensors) and ``read:T``, the bytes read
    of each parameter, buffer and constant ``T`` (sequences of a step read the same weights:
    the step reads ``min(sum of the sequences' reads, size)`` of each, the rule by which
    the fused traffic unites partial reads of one tensor)."""
    pc = rep.counts
    if rep.lowered.unsupported:
        ops = sorted({u if isinstance(u, str) else str(u) for u in rep.lowered.unsupported})
        raise StepError(f"the step program has operators solbound does not lower: "
                        f"{', '.join(ops[:5])}")
    d = {"macs": pc.macs}
    d.update({f"flops:{k}": v for k, v in pc.flops.items() if v})
    work, special = work_of(pc.kernels, policy)
    d.update({f"work:{k}": _integral(v, f"work on {k}") for k, v in work.items() if v})
    d.update({f"special:{k}": _integral(v, f"{k} ops") for k, v in special.items() if v})
    tm = rep.program.tensor_map
    shared = {t: b for t, b in pc.fused.reads.items()
              if tm[t].role in ("parameter", "buffer", "constant")}
    d["bytes"] = pc.fused.bytes - sum(shared.values())
    d.update({f"read:{t}": b for t, b in shared.items()})
    for c in pc.collectives:
        if c.group and tuple(c.group) != tuple(range(c.ranks)):
            raise StepError(f"collective {c.kind} over ranks {c.group}: a step reads "
                            f"collectives over the whole tensor-parallel group only")
        key = f"comm:{c.kind}:{c.ranks}"
        d[key] = d.get(key, 0) + c.bytes * c.calls
    return d, {t: tm[t].nbytes for t in shared}


@dataclass
class Region:
    """The solved polynomials of one region: ``coef[component]`` per monomial."""
    key: tuple
    points: list[tuple[int, int]]
    coef: dict[str, list[Fraction]]
    exact: bool = True
    seconds: float = 0.0
    chunk: int | None = None       # the model's chunk size (q's, in a ``chunks`` region)

    def matrix(self):
        """``(names, F)``: the coefficients as a float matrix (components x monomials), for
        the fast evaluation of :meth:`StepModel.bounds`."""
        if getattr(self, "_matrix", None) is None:
            import numpy as np
            names = sorted(self.coef)
            self._matrix = names, np.array([[float(a) for a in self.coef[c]] for c in names])
        return self._matrix

    def at(self, new: int, ctx: int) -> dict[str, Fraction]:
        m = monomials(self.key, new, ctx, self.chunk)
        return {c: sum(a * x for a, x in zip(cs, m)) for c, cs in self.coef.items()}


@dataclass
class StepModel:
    """A model's engine steps, read once from its own code: ``bound(seqs, arch)`` is the
    fused roofline of any composition of sequences, exact against :meth:`trace` of that
    composition, in microseconds once the composition's regions are read.

    ``model``: a transformers causal LM (weights real or on the meta device). The first
    composition in a region traces the model at the region's points (a few seconds each
    for a small model; ``progress`` prints them); ``warm(...)`` reads regions ahead."""
    model: object
    precision_policy: str | Policy | None = None
    progress: bool = False
    seed: int = 0
    shallow: bool = True
    tp: int = 1
    logits: str = "last"
    weights: str | None = None      # "fp8": W8A8 FP8 linears (serving/quantize.py)
    kv_dtype: str | None = None     # "fp8": the cache stores FP8 rows (vLLM's, scale 1);
    #                                 "quantized-fp8": transformers' QuantizedCache(backend="fp8")
    layout: list[CacheLayer] = field(init=False)
    windows: tuple[int, ...] = field(init=False)
    regions: dict = field(init=False, default_factory=dict)
    traces: int = field(init=False, default=0)
    _sizes: dict = field(init=False, default_factory=dict)
    _sizes_total: dict | None = field(init=False, default=None)
    _weights: int | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.logits not in ("last", "all"):
            raise StepError(f"logits={self.logits!r}: 'last' (decoding) or 'all' (a "
                            f"speculative verify step)")
        if not isinstance(self.tp, int) or self.tp < 1:
            raise StepError(f"tensor-parallel degree {self.tp!r}: expected a positive integer")
        for what, v in (("weights", self.weights), ("kv_dtype", self.kv_dtype)):
            allowed = (None, "fp8", "quantized-fp8") if what == "kv_dtype" else (None, "fp8")
            if v not in allowed:
                raise StepError(f"{what}={v!r}: one of "
                                f"{', '.join(repr(a) for a in allowed[1:])} (or none: the "
                                f"model's own dtype)")
        if self.weights == "fp8" and self.tp == 1:
            self.model = copy.deepcopy(self.model)
            self._fp8(self.model)
        with self._rank() as m:
            self.layout = cache_layout(m, self.kv_dtype)
        self.windows = tuple(sorted({L.window for L in self.layout if L.window}))
        self.thresholds = _expert_thresholds(_text_config(self.model))
        self.policy = (self.precision_policy if isinstance(self.precision_policy, Policy)
                       else Policy.parse(self.precision_policy))
        self._build = _Sequences(self.model, self.layout, self.logits == "all", self.kv_dtype)
        cfg = _text_config(self.model)
        self.max_positions = getattr(cfg, "max_position_embeddings", None)
        self.name = type(self.model).__name__ + (f" (TP {self.tp})" if self.tp > 1 else "") \
            + (" (every token's logits)" if self.logits == "all" else "") \
            + (" FP8" if self.weights == "fp8" else "") \
            + (" FP8 KV" if self.kv_dtype == "fp8" else "") \
            + (" QuantizedCache(fp8)" if self.kv_dtype == "quantized-fp8" else "")
        self.stateful = any(what != "scale" for L in self.layout for what, *_ in L.states)
        self.chunk = _chunk_size(self.model) if self.stateful else None
        # a causal convolution of K taps over fewer than K new tokens reads only the taps
        # that reach them: below K each count of tokens is a class of its own
        self.small = max([SMALL] + [shape[-1] for L in self.layout
                                    for what, _, shape, _ in L.states if what == "conv"])

        self._stack = _layer_stack(self.model, len(self.layout))
        self._signatures = ([_signature(layer, i, cfg, self.layout[i])
                             for i, layer in enumerate(self._stack[2])]
                            if self._stack else [])

    # -- tracing ---------------------------------------------------------------

    @contextlib.contextmanager
    def _rank(self):
        """The model as rank 0 of ``tp`` holds it, for the duration: with ``tp > 1`` a meta
        copy sharded by the model's own tensor-parallel plan (``--tp``,
        ``frontends/torch/parallel.py``) under a fake process group of ``tp`` ranks, grad
        off (transformers' tensor-parallel layers run on local shards with explicit
        all-reduces for inference); else the model itself."""
        if self.tp == 1:
            yield self.model
            return
        import torch
        from ..frontends.torch.distributed import fake_world
        from ..frontends.torch.parallel import ParallelError, tensor_parallel
        meta = _on_meta(self.model)
        m = copy.deepcopy(meta) if meta is self.model else meta
        if self.weights == "fp8":          # before the plan: its forwards wrap these
            self._fp8(m)
        with fake_world(self.tp), torch.no_grad():
            try:
                m = tensor_parallel(m, self.tp)
            except ParallelError as e:
                raise StepError(f"{type(self.model).__name__}: {e}") from None
            if self.weights == "fp8":      # each rank's shard with its own rows' scales
                from .quantize import shard_scales
                shard_scales(m)
            yield m

    def _fp8(self, model) -> None:
        from .quantize import fp8_linears
        if not fp8_linears(model):
            raise StepError(f"{type(self.model).__name__} has no nn.Linear layers to store "
                            f"in FP8")

    def program(self, seqs, real: bool = False, model=None):
        """``(module, inputs)``: the step program of ``seqs`` (real random inputs with
        ``real``, for validation; else meta tensors) over ``model`` (default: the model)."""
        seqs = self.check(seqs)
        return (self._build.module(seqs, model),
                self._build.inputs(seqs, real=real, seed=self.seed, model=model))

    def trace(self, seqs, arch=None, validate: bool = False, **options):
        """The step program of ``seqs`` traced and analyzed directly (``solbound.analyze``):
        what :meth:`counts` must equal. With ``tp > 1``: rank 0's program (its shards, its
        collectives)."""
        from ..api import analyze
        if validate and self.tp > 1:
            raise StepError("validating a tensor-parallel step is not done: validate the "
                            "step at tp=1 (the same program on one rank's shards is the "
                            "analysis of `solbound analyze --tp N --validate`)")
        if validate and self.weights == "fp8":
            raise StepError("validating an FP8 step is not done: its product "
                            "(torch._scaled_mm) runs on CUDA only; the rule is checked against "
                            "its definition (tests/test_quantized.py) and the BF16 step validates")
        real = validate and self._has_values()
        with self._rank() as m:
            module, inputs = self.program(seqs, real=real, model=m)
            return analyze(module, inputs, arch=arch, precision_policy=self.policy,
                           validate=validate, **options)

    def weights_bytes(self) -> int:
        """The bytes of the weights one chip holds (rank 0's shards with ``tp > 1``)."""
        if self._weights is None:
            from .capacity import weights_bytes
            with self._rank() as m:
                self._weights = weights_bytes(m)
        return self._weights

    def _has_values(self) -> bool:
        p = next(self.model.parameters(), None)
        return p is not None and p.device.type != "meta"

    def _probe(self, new: int, ctx: int) -> tuple[dict[str, int], bool]:
        """The components of one sequence ``new@ctx`` at the model's full depth, from the
        traces of shallow copies (:meth:`_depths`): the layers outside the stack once, each
        kind of layer times its count."""
        t = time.perf_counter()
        total: dict[str, int] = {}
        exact = True
        for keep, weight in self._depths():
            with _keep_layers(self.model, self._stack, keep):
                self._build.layout = [self.layout[i] for i in keep] if keep is not None \
                    else self.layout
                try:
                    rep = self.trace([Seq(new, ctx)], arch="h100-sxm", modes=("fused",))
                finally:
                    self._build.layout = self.layout
            self.traces += 1
            exact &= rep.counts.fused.exact
            comps, sizes = components(rep, self.policy)
            for c, v in comps.items():
                total[c] = total.get(c, 0) + weight * v
            self._sizes_total = None
            for tname, size in sizes.items():      # a layer of a kind stands for its count
                self._sizes.setdefault((keep and tuple(keep), weight), {})[tname] = size
        if self.progress:
            print(f"  traced {self.name} at {new}@{ctx} ({time.perf_counter() - t:.1f} s)",
                  file=sys.stderr, flush=True)
        return {c: v for c, v in total.items() if v}, exact

    def sizes(self) -> dict[str, int]:
        """Each shared tensor's bytes times the layers it stands for (its net weight over
        the shallow traces: 1 outside the layer stack and for the first layer of a kind,
        ``n_k - 1`` for the second)."""
        if self._sizes_total is not None:
            return self._sizes_total
        out: dict[str, int] = {}
        for (_, weight), sizes in self._sizes.items():
            for t, b in sizes.items():
                out[t] = out.get(t, 0) + weight * b
        self._sizes_total = out
        return out

    def _depths(self) -> list[tuple[list[int] | None, int]]:
        """Shallow models whose weighted sum is the full model's counts: ``S0`` (the first
        layer of each kind) with weight ``1 - sum_k (n_k - 1)`` and, per kind ``k`` with
        ``n_k > 1`` layers, ``S0`` plus a second layer of that kind with weight
        ``n_k - 1`` (a layer's counts do not depend on the others', so the difference of the
        two traces is one layer of kind ``k``). ``[(None, 1)]``: trace the model whole."""
        if self._stack is None or not self.shallow:
            return [(None, 1)]
        kinds: dict[tuple, list[int]] = {}
        for i, sig in enumerate(self._signatures):
            kinds.setdefault(sig, []).append(i)
        s0 = sorted(v[0] for v in kinds.values())
        out, rest = [], 1
        for idx in kinds.values():
            if len(idx) > 1:
                out.append((sorted(s0 + [idx[1]]), len(idx) - 1))
                rest -= len(idx) - 1
        if sum(len(k) for k, _ in out) + len(s0) + 2 * len(out) >= len(self._signatures):
            return [(None, 1)]      # a trace costs about two layers: the whole model is cheaper
        return [(s0, rest)] + out

    def key(self, new: int, ctx: int) -> tuple:
        """The region of ``new@ctx`` for this model (:func:`region_of` over its windows,
        expert thresholds and chunk)."""
        return region_of(new, ctx, self.windows, self.thresholds, self.chunk, self.small)

    def region(self, key: tuple) -> Region:
        """The solved region ``key`` (see :func:`region_of`), traced on first use."""
        r = self.regions.get(key)
        if r is None:
            r = self.regions[key] = self._solve_region(key)
        return r

    def _points(self, key: tuple, count: int) -> list[tuple[int, int]]:
        kind = key[0]
        mons = _monomials_of(key)
        one_chunk = len(key) > 3 and key[3] == "one"       # new is the chunk size
        if len(mons) == 1:                            # a point: its own class
            if one_chunk and kind in ("prefill", "extend"):
                return [(self.chunk, 0)] if kind == "prefill" else []
            n, c = (1, 0) if kind == "one" else map(int, kind.split("@"))
            return [(n, c)]
        rng = random.Random(zlib.crc32(repr((self.seed,) + key).encode()))   # stable across runs
        span = max(self.windows, default=0)
        hi_n, hi_c = max(span, *self.thresholds, 5 * (self.chunk or 0), 0) + 48, 2 * span + 48
        if self.max_positions:
            hi_n, hi_c = min(hi_n, self.max_positions), min(hi_c, self.max_positions - 1)
        pts: list[tuple[int, int]] = []
        for _ in range(200000):
            n = rng.randint(self.small, max(hi_n, self.small + 8)) if (1, 0, 0) in mons \
                else self.chunk if one_chunk else 1 if kind == "decode" \
                else int(kind.split("@")[0])
            c = rng.randint(self.small, max(hi_c, self.small + 8)) if (0, 1, 0) in mons \
                else 0 if kind == "prefill" else int(kind.split("@")[1])
            if self.max_positions and n + c > self.max_positions:
                continue
            if self.key(n, c) == key and (n, c) not in pts:
                pts.append((n, c))
                if len(pts) == count:
                    return pts
        if len(pts) > len(mons):                   # a small region: all of its points
            return pts
        raise StepError(f"{self.name}: no {count} points in region {key} below the model's "
                        f"{self.max_positions} positions")

    def _solve_region(self, key: tuple) -> Region:
        t0 = time.perf_counter()
        chunk = self.chunk
        k = len(_monomials_of(key))
        pts = self._points(key, k + 4)
        # k points whose monomials are independent, then one more to check the solution
        chosen: list[tuple[int, int]] = []
        for p in pts:
            if _rank([monomials(key, *q, chunk) for q in chosen + [p]]) == len(chosen) + 1:
                chosen.append(p)
                if len(chosen) == k:
                    break
        else:
            raise StepError(f"{self.name}: region {key} has no {k} points in general position")
        check = next((p for p in pts if p not in chosen), None)
        values, exact = [], True
        for p in chosen:
            v, e = self._probe(*p)
            values.append(v)
            exact &= e
        names = sorted(set().union(*values))
        rhs = [[v.get(c, 0) for c in names] for v in values]
        sol = _solve([monomials(key, *p, chunk) for p in chosen], rhs)
        coef = {c: [sol[i][j] for i in range(k)] for j, c in enumerate(names)}
        r = Region(key, chosen + ([check] if check else []), coef, exact, chunk=chunk)
        if check is None:                     # a region of one point: traced, nothing to solve
            r.seconds = time.perf_counter() - t0
            return r
        far = self._far_point(key, check) if self.stateful else None
        for point in filter(None, (check, far)):
            got, e = self._probe(*point)
            r.exact = r.exact and exact and e
            want = r.at(*point)
            sizes = self.sizes()        # of the tensors the probes have read so far
            for c in sorted(set(got) | set(want)):
                g, w = got.get(c, 0), want.get(c, 0)
                if c.startswith("read:"):    # a step reads at most the whole tensor
                    g, w = min(g, sizes[c[5:]]), min(w, sizes[c[5:]])
                if g != w:
                    raise StepError(
                        f"{self.name}: {c} at {point[0]}@{point[1]} is {got.get(c, 0):,}, not "
                        f"the {float(want.get(c, 0)):,.0f} a degree-2 polynomial through the "
                        f"region's other points gives (region {key}"
                        + (f", chunks of {self.chunk}" if self.chunk else "") + "): its counts "
                        f"are not of the form a step model evaluates; analyze compositions "
                        f"with StepModel.trace")
        if far:
            r.points.append(far)
        r.seconds = time.perf_counter() - t0
        return r

    def _far_point(self, key: tuple, near: tuple[int, int]) -> tuple[int, int] | None:
        """A point of region ``key`` with ``new`` well past the sampled range (several
        chunks of a chunked layer, or 320 tokens where no chunk size was read): a model with
        state layers may pad or chunk its tokens in ways the sampled points do not show, so
        its regions are checked there too. None where ``new`` is fixed in the region."""
        if (1, 0, 0) not in _monomials_of(key):
            return None
        base = 5 * self.chunk + 3 if self.chunk else 320
        for n in (base, base // 2 + 1, base // 4 + 2):
            if self.max_positions and n + near[1] > self.max_positions:
                continue
            if self.key(n, near[1]) == key:
                return (n, near[1])
        return None

    def warm(self, seqs) -> "StepModel":
        """Read every region ``seqs`` touches now (tracing), not at the first bound."""
        for s in self.check(seqs):
            self.region(self.key(s.new, s.ctx))
        return self

    # -- evaluation ------------------------------------------------------------

    def check(self, seqs) -> list[Seq]:
        """``seqs`` as :class:`Seq`s, each inside the model's positions."""
        seqs = as_seqs(seqs)
        if self.max_positions:
            for s in seqs:
                if s.new + s.ctx > self.max_positions:
                    raise StepError(f"sequence {s}: position {s.new + s.ctx - 1} is beyond "
                                    f"{self.name}'s {self.max_positions} positions "
                                    f"(max_position_embeddings)")
        return seqs

    def _sums(self, seqs: list[Seq]) -> dict[tuple, list[int]]:
        """Per region, the sums of its monomials over the sequences in it."""
        sums: dict[tuple, list[int]] = {}
        for s in seqs:
            key = self.key(s.new, s.ctx)
            m = monomials(key, s.new, s.ctx, self.chunk)
            acc = sums.get(key)
            if acc is None:
                sums[key] = m
            else:
                for i, x in enumerate(m):
                    acc[i] += x
        return sums

    def counts(self, seqs) -> StepCounts:
        """The step's totals, exact (rational arithmetic on the solved polynomials)."""
        seqs = self.check(seqs)
        total: dict[str, Fraction] = {}
        exact = True
        for key, m in self._sums(seqs).items():
            r = self.region(key)
            exact &= r.exact
            for c, cs in r.coef.items():
                total[c] = total.get(c, 0) + sum(a * x for a, x in zip(cs, m))
        ints = {}
        for c, v in total.items():
            if v.denominator != 1:
                raise StepError(f"{self.name}: {c} of the step is not a whole number ({v})")
            ints[c] = int(v)
        return self._assemble(ints, len(seqs), sum(s.new for s in seqs), exact)

    def decode_sums(self, first: int, last: int) -> dict[tuple, list[int]]:
        """Per region, the monomial sums of the one-token sequences ``1@ctx`` for every
        ``ctx`` in ``[first, last]`` (a request's decode steps), in closed form: the range
        is cut where a window's side changes (``ctx = w - 1``)."""
        out: dict[tuple, list[int]] = {}
        bounds = {w - 1 for w in self.windows} | set(range(1, self.small + 1))
        cuts = sorted(b for b in bounds if first < b <= last)
        for a, b in zip([first] + cuts, cuts + [last + 1]):
            if b <= a:
                continue
            key = self.key(1, a)
            n = b - a
            if len(_monomials_of(key)) == 1:        # a class of one ctx
                acc = out.setdefault(key, [0])
                acc[0] += n
                continue
            s1 = (a + b - 1) * n // 2
            s2 = ((b - 1) * b * (2 * b - 1) - (a - 1) * a * (2 * a - 1)) // 6
            acc = out.setdefault(key, [0, 0, 0])
            acc[0] += n
            acc[1] += s1
            acc[2] += s2
        return out

    def totals(self, sums: dict[tuple, list[int]], sequences: int, tokens: int) -> StepCounts:
        """The counts of sequences given by their regions' monomial sums (floating point):
        ``sequences`` of them computing ``tokens`` new tokens in all, as if in one step
        (the shared weights counted once)."""
        import numpy as np
        total: dict[str, float] = {}
        exact = True
        for key, m in sums.items():
            r = self.region(key)
            exact &= r.exact
            names, mat = r.matrix()
            for c, v in zip(names, mat @ np.array(m, dtype=float)):
                total[c] = total.get(c, 0.0) + v
        return self._assemble(total, sequences, tokens, exact)

    def _assemble(self, totals: dict, sequences: int, tokens: int, exact: bool) -> StepCounts:
        sizes = self.sizes()
        nbytes = totals.get("bytes", 0) + sum(min(v, sizes[c[5:]]) for c, v in totals.items()
                                              if c.startswith("read:"))

        def part(prefix):
            return {c.split(":", 1)[1]: v for c, v in sorted(totals.items())
                    if c.startswith(prefix) and v}
        return StepCounts(totals.get("macs", 0), part("flops:"), nbytes, part("work:"),
                          part("special:"), sequences, tokens, exact, part("comm:"))

    def fast_counts(self, seqs) -> StepCounts:
        """:meth:`counts` in floating point (relative error ~1e-16, for a scheduler's inner
        loop): one matrix-vector product per region."""
        seqs = self.check(seqs)
        return self.totals(self._sums(seqs), len(seqs), sum(s.new for s in seqs))

    def least_reads(self) -> dict[str, Fraction]:
        """The bytes a one-token decode (``1@1``) reads of each shared tensor: what every
        step reads of it at least (a step computes at least one token)."""
        probe = self.region(self.key(1, 1)).at(1, 1)
        return {c[5:]: v for c, v in probe.items() if c.startswith("read:")}

    def whole_reads(self) -> set[str]:
        """The shared tensors even a one-token decode reads whole: every step reads them
        once (the dense weights; of a mixture of experts, none of the experts)."""
        sizes = self.sizes()
        return {t for t, v in self.least_reads().items() if v >= sizes[t]}

    def shared_bytes(self) -> int:
        """The bytes of :meth:`whole_reads`: what every step reads at least once."""
        sizes = self.sizes()
        return sum(sizes[t] for t in self.whole_reads())

    def bounds(self, seqs, arch=None) -> list[Bound]:
        """The step's fused roofline on each chip of ``arch`` (``fast_counts``)."""
        c = self.fast_counts(seqs)
        expl = (f"{c.sequences} sequences, {c.tokens} new tokens: weights once, each "
                f"sequence's cache rows read and its new rows written, last-token logits"
                + (f"; per rank of {self.tp} (its shards and collectives)" if self.tp > 1
                   else ""))
        return [work_bound({k: float(v) for k, v in c.work.items()},
                           {k: float(v) for k, v in c.special.items()}, c.bytes,
                           sum(c.flops.values()), spec, "fused", expl,
                           collectives=c.collectives())
                for spec in specs_of(arch)]

    def bound(self, seqs, arch: str | Spec = "h100-sxm") -> Bound:
        """The step's fused roofline on one chip."""
        bs = self.bounds(seqs, arch)
        if len(bs) != 1:
            raise StepError(f"bound() takes one chip; use bounds() for {len(bs)}")
        return bs[0]

    def seconds(self, seqs, spec: Spec) -> float:
        return self.bound(seqs, spec).seconds

    def to_dict(self, seqs, arch=None, prices: dict[str, float] | None = None) -> dict:
        """The report schema ``analyze`` writes (``totals``, ``bounds``), for a step; each
        bound's ``usd``: its seconds at ``prices[arch]`` (else the catalog's) per chip-hour."""
        from ..report.report import SCHEMA
        seqs = self.check(seqs)
        c = self.counts(seqs)
        return {"schema": SCHEMA, "source": f"{self.name} step",
                "step": {"sequences": [str(s) for s in seqs], "regions_traced": self.traces,
                         "tp": self.tp},
                "precision_policy": {"fp32": dict(self.policy.fp32),
                                     "description": self.policy.describe()},
                "totals": c.to_dict(),
                "bounds": [{"arch": b.arch, "mode": b.mode, "seconds": b.seconds,
                            "compute_seconds": b.compute_seconds,
                            "memory_seconds": b.memory_seconds, "bound": b.bound,
                            "bytes": b.bytes, "flops": b.flops,
                            "intensity": b.intensity if b.bytes else None,
                            "pipe_seconds": b.pipe_seconds, "unit_seconds": b.unit_seconds,
                            "binding_unit": b.binding_unit, "peaks": b.peaks,
                            "bandwidth": b.bandwidth, "notes": b.notes,
                            "explanation": b.explanation,
                            "comm_seconds": b.comm_seconds,
                            "link_bandwidth": b.link_bandwidth or None,
                            "usd": _usd(b, spec, prices, self.tp)}
                           for b, spec in zip(self.bounds(seqs, arch), specs_of(arch))]}


def _usd(b: Bound, spec: Spec, prices: dict[str, float] | None, chips: int = 1) -> float | None:
    """A bound's cost at ``prices[arch]`` USD per chip-hour, else the chip's own price, on
    ``chips`` chips (a tensor-parallel group)."""
    p = (prices or {}).get(b.arch, spec.price_per_hour)
    return b.seconds * p * chips / 3600 if p else None


def regions_of(seqs: Iterable[Seq], windows: tuple[int, ...]) -> set[tuple]:
    return {region_of(s.new, s.ctx, windows) for s in seqs}
