"""A stated routing assumption for dispatch whose sizes depend on routing decisions.

A mixture-of-experts layer written by hand sends tokens to experts with sizes that
depend on the router's choices: ``torch.where(mask[e])``, ``nonzero``, ``bincount``
and ``.tolist()`` of per-expert counts, ``if tokens.numel() == 0: continue``, boolean
masks selecting rows. Tracing cannot follow any of it: the sizes are tensor values.

Under :class:`RoutingMode` the routing *decisions* take values fixed by an assumption,
and everything computed from them is computed for real, on small CPU "shadow" tensors
that travel with the traced (fake) tensors:

* ``topk(x, k, dim)`` on data (the router's scores) returns the indices of the
  assumption and the scores gathered at them; ``argmax``/``max(x, dim)`` are ``k = 1``.
  ``balanced`` (the default): row ``r``, slot ``j`` picks ``(r*k + j) mod n``, so each of
  the ``n`` experts receives ``T*k/n`` (token, slot) pairs, to within one.
  ``concentrated``: every row picks ``0..k-1`` (the fewest experts, hence the fewest
  expert weights, any routing can touch).
* Integer and boolean tensors computed only from those indices and from constants
  (``one_hot``, comparisons, sums, ``argsort``, ``bincount``, ``histc``) carry a shadow
  with their values under the assumption.
* What needs values (``nonzero``, one-argument ``where``, ``bincount``, ``unique``,
  ``masked_select``, a boolean mask as an index, ``tolist``/``item``/``bool``/``int``)
  is answered from the shadow: Python values become plain numbers, data-dependent
  index tensors become constants of the traced program (with their values when the
  program is traced on the CPU, as validation does). Branches and loops on them follow
  the assumption. Sorts and histograms of the routing stay in the program (counted).

* In a world of several ranks (``--world-size``, ``--ep``), every rank is assumed to route
  its own batch the way this rank does (the assumption depends only on row numbers), so a
  ``dist.all_to_all_single`` of routing-derived values (the per-expert counts that
  expert parallelism exchanges before its tokens) receives this rank's chunk from every
  rank: its result carries that shadow, and the split sizes read from it are equal.

The traced program is the user's program with the router's choices fixed: the same
expert evaluations (``T*k`` in all), the same gathers and ``index_add_`` scatters.
Validation runs the user's model under the same assumption (:class:`ForcedRouting`),
so the IR is checked against the model itself.
"""

from __future__ import annotations

import math

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakIdKeyDictionary

ROUTINGS = ("balanced", "concentrated")
DEFAULT_ROUTING = "balanced"
# the attribute of a constant made on the meta device that holds its value (the shadow),
# so that validation can run the analyzed program with it
VALUE_ATTR = "_solbound_value"
SHADOW_LIMIT = 1 << 24          # largest tensor given a shadow (elements)

# functions whose Python result needs the tensor's values
_PY_VALUE = frozenset({"tolist", "item", "__bool__", "__int__", "__index__", "__float__",
                       "numpy", "__array__", "__len__"})
# functions whose output size depends on values: answered from the shadows
_DATA_SIZED = frozenset({"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive",
                         "bincount", "nonzero_static"})
# routing bookkeeping the IR has no rule for: on shadowed inputs, its results become
# constants (named in the note: their work, O(T*k) elements, is not counted)
# (sorts, histograms and searches have rules now: they are traced and counted)
_PRECOMPUTED: frozenset[str] = frozenset()
# deterministic factories: a shadow for integer/boolean results
_FACTORIES = frozenset({"arange", "zeros", "ones", "full", "tensor", "as_tensor", "eye",
                        "zeros_like", "ones_like", "full_like", "range", "linspace"})


class _plain:
    """Plain eager CPU computation: no dispatch modes (fake tensors, tracing) and no
    torch-function modes (a ``torch.device`` context, this module's own)."""

    def __enter__(self):
        self.a = _disable_current_modes()
        self.b = torch._C.DisableTorchFunction()
        self.a.__enter__()
        self.b.__enter__()
        return self

    def __exit__(self, *exc):
        self.b.__exit__(*exc)
        self.a.__exit__(*exc)
        return False


def choices(rows: int, n: int, k: int, routing: str) -> torch.Tensor:
    """The (rows, k) indices the assumption picks among ``n`` choices.

    >>> choices(4, 4, 2, "balanced").tolist()
    [[0, 1], [2, 3], [0, 1], [2, 3]]
    >>> choices(2, 8, 2, "concentrated").tolist()
    [[0, 1], [0, 1]]
    """
    if routing not in ROUTINGS:
        raise ValueError(f"routing {routing!r}: expected one of {', '.join(ROUTINGS)}")
    if k > n:
        raise ValueError(f"top-{k} of {n} choices")
    j = torch.arange(k)
    if routing == "concentrated":
        return j.expand(rows, k).clone()
    return (torch.arange(rows)[:, None] * k + j) % n


def _forced_indices(x: torch.Tensor, k: int, dim: int, routing: str) -> torch.Tensor:
    """Indices of the assumption for ``topk(x, k, dim)`` (CPU, int64)."""
    dim %= max(x.dim(), 1)
    shape = list(x.shape) if x.dim() else [1]
    n = shape[dim]
    rest = shape[:dim] + shape[dim + 1:]
    idx = choices(math.prod(rest), n, k, routing).reshape(*rest, k)
    return idx.movedim(-1, dim) if x.dim() else idx.reshape(k)


class _Forcing(TorchFunctionMode):
    """Routing decisions on data take the assumption's values (see the module doc)."""

    def __init__(self, routing: str = DEFAULT_ROUTING):
        super().__init__()
        if routing not in ROUTINGS:
            raise ValueError(f"routing {routing!r}: expected one of {', '.join(ROUTINGS)}")
        self.routing = routing
        self.forced = 0                  # routing decisions fixed so far

    def is_data(self, t) -> bool:
        return True

    def constant(self, ref: torch.Tensor, device) -> torch.Tensor:
        return ref.to(device)

    def _decide(self, func, name, args, kwargs):
        """``topk``/``argmax``/``max(x, dim)`` on data: the assumption's choice, or None."""
        x = args[0] if args else kwargs.get("input")
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or not self.is_data(x):
            return None
        a = list(args[1:])
        if name == "topk":
            k = a[0] if a else kwargs["k"]
            dim = a[1] if len(a) > 1 else kwargs.get("dim", -1)
            largest = a[2] if len(a) > 2 else kwargs.get("largest", True)
            if not largest:
                return None
        elif name in ("argmax", "max"):
            dim = a[0] if a else kwargs.get("dim")
            if dim is None or not isinstance(dim, int):
                return None            # a whole-tensor max is a value, not a choice
            k = 1
            keepdim = a[1] if len(a) > 1 else kwargs.get("keepdim", False)
        else:
            return None
        with _plain():
            ref = _forced_indices(x, int(k), int(dim), self.routing)
        idx = self.constant(ref, x.device)
        self.forced += 1
        values = torch.gather(x, dim, idx)
        if name == "topk":
            return torch.return_types.topk((values, idx))
        if not keepdim:
            # a constant of its own (a view of a constant made while tracing is not one)
            with _plain():
                ref = ref.squeeze(dim)
            values, idx = values.squeeze(dim), self.constant(ref, x.device)
        if name == "argmax":
            return idx
        return torch.return_types.max((values, idx))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in ("topk", "argmax", "max"):
            out = self._decide(func, name, args, kwargs)
            if out is not None:
                return out
        return self._call(func, name, args, kwargs)

    def _call(self, func, name: str, args, kwargs):
        """Any call that is not a routing decision (RoutingMode follows values here)."""
        return func(*args, **kwargs)


class ForcedRouting(_Forcing):
    """For a real run (validation): only the routing decisions change."""


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake
    return is_fake(t) or t.device.type == "meta"


class RoutingMode(_Forcing):
    """While tracing: decisions fixed, values derived from them carried as shadows."""

    def __init__(self, routing: str = DEFAULT_ROUTING, select_fraction: float | None = None):
        super().__init__(routing)
        self.select_fraction = select_fraction
        self.assumed_sizes: list[str] = []   # selections sized by select_fraction
        self.bounded_counts: list[str] = []  # bincounts sized by their minlength
        self.shadows = WeakIdKeyDictionary()
        self.answered: list[str] = []    # data-dependent questions answered, by function
        self.precomputed: list[str] = []  # bookkeeping replaced by its assumed values

    def is_data(self, t) -> bool:
        return self.shadow(t) is None

    def shadow(self, t):
        if not isinstance(t, torch.Tensor):
            return None
        s = self.shadows.get(t)
        if s is not None:
            return s
        return None if _is_fake(t) else t          # a real constant is its own value

    def constant(self, ref: torch.Tensor, device) -> torch.Tensor:
        """A constant of the traced program holding ``ref`` (values kept off meta)."""
        with _plain():
            ref = ref.contiguous().clone()       # its own storage: not a view of another
            c = ref.to(device, copy=True)
        self.shadows[c] = ref
        if c.device.type == "meta":
            setattr(c, VALUE_ATTR, ref)
        return c

    def _shadow_args(self, args, kwargs):
        """(args, kwargs) with every tensor replaced by its shadow, or None when one has none."""
        missing = []

        def sub(a):
            if isinstance(a, torch.Tensor):
                s = self.shadow(a)
                if s is None:
                    missing.append(a)
                return s
            if isinstance(a, torch.device) or (isinstance(a, str) and a in ("meta", "cuda")):
                return torch.device("cpu")
            return a
        sa, sk = tree_map(sub, args), tree_map(sub, kwargs)
        if "device" in sk:
            sk["device"] = "cpu"
        return None if missing else (sa, sk)

    def _run_on_shadows(self, func, args, kwargs):
        got = self._shadow_args(args, kwargs)
        if got is None:
            return None
        sa, sk = got
        with _plain():
            return func(*sa, **sk)

    def _call(self, func, name: str, args, kwargs):
        if name in _PY_VALUE:
            s = self.shadow(args[0]) if args else None
            if s is not None and _is_fake(args[0]):
                self.answered.append(name)
                with _plain():
                    return func(s, *args[1:], **kwargs)
            return func(*args, **kwargs)
        if name in _PRECOMPUTED:
            ref = self._run_on_shadows(func, args, kwargs)
            if ref is not None:
                self.precomputed.append(name)
                dev = args[0].device
                consts = [self.constant(r, dev) if isinstance(r, torch.Tensor) else r
                          for r in (ref if isinstance(ref, tuple) else (ref,))]
                return type(ref)(consts) if isinstance(ref, tuple) else consts[0]
        if name in _DATA_SIZED or (name == "where" and len(args) + len(kwargs) == 1):
            ref = self._run_on_shadows(func, args, kwargs)
            if ref is not None:
                self.answered.append(name)
                dev = args[0].device
                return tree_map(lambda r: self.constant(r, dev)
                                if isinstance(r, torch.Tensor) else r, ref)
            if name == "masked_select":
                x, mask = args[0], args[1]
                m = self.shadow(mask)
                if m is not None or self.select_fraction is not None:
                    x, mask = torch.broadcast_tensors(x, mask)
                    return self._index_by_mask(x, (mask,))
            if name == "bincount":
                x = args[0]
                weights = args[1] if len(args) > 1 else kwargs.get("weights")
                minlength = args[2] if len(args) > 2 else kwargs.get("minlength", 0)
                if minlength and x.dim() == 1:
                    # values below minlength (stated): a scatter-add of ones (or weights)
                    self.bounded_counts.append(f"bincount at {_caller()}: values below "
                                               f"minlength={minlength}")
                    src = torch.ones_like(x, dtype=torch.long) if weights is None else weights
                    out = torch.zeros(minlength, dtype=src.dtype, device=x.device)
                    return out.index_add(0, x, src)
            if self.select_fraction is not None and name in ("nonzero", "argwhere", "where"):
                x = args[0]
                pos = self._assumed_positions(x, name)
                if name == "where" or kwargs.get("as_tuple") or (len(args) > 1 and args[1]):
                    return pos
                with _plain():
                    ref = torch.stack([self.shadows[p] for p in pos], dim=1) if pos else \
                        torch.zeros(0, 0, dtype=torch.long)
                return self.constant(ref, x.device)
            return func(*args, **kwargs)
        if name in ("__getitem__", "__setitem__") and len(args) >= 2:
            idx = args[1] if isinstance(args[1], tuple) else (args[1],)
            masks = [i for i in idx if isinstance(i, torch.Tensor) and i.dtype == torch.bool]
            if masks and (self.select_fraction is not None
                          or all(self.shadow(m) is not None for m in masks)) \
                    and self.shadow(args[0]) is None:
                if all(self.shadow(m) is not None for m in masks):
                    self.answered.append(name)
                new = self._mask_to_indices(idx)
                if name == "__getitem__":
                    return func(args[0], new)
                func(args[0], new, *args[2:])
                return None
        out = func(*args, **kwargs)
        if name == "all_to_all_single" and args and isinstance(args[0], torch.Tensor):
            self._symmetric_all_to_all(args[0], out, *args[1:4])
            return out
        self._propagate(func, name, args, kwargs, out)
        return out

    def _symmetric_all_to_all(self, input, out, out_splits, in_splits, group) -> None:
        """The shadow of ``all_to_all_single(input, out_splits, in_splits, group)`` (the
        functional collective that export makes of ``dist.all_to_all_single``) on
        routing-derived values with equal splits, under the symmetric-ranks assumption (the
        module doc): chunk ``s`` of the result is this rank's chunk of the input, for every
        ``s``."""
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import _resolve_process_group
        s = self.shadow(input)
        n = len(out_splits or [])
        if s is None or not _is_fake(input) or not isinstance(out, torch.Tensor) or not n \
                or not s.dim() or tuple(out.shape) != tuple(s.shape) \
                or len(set(out_splits)) != 1 or list(in_splits or []) != list(out_splits) \
                or s.shape[0] != n * out_splits[0]:
            return
        pg = _resolve_process_group(group) if isinstance(group, str) else group
        rank = dist.get_rank(pg)
        with _plain():
            chunk = s.reshape((n, s.shape[0] // n) + tuple(s.shape[1:]))[rank]
            self.shadows[out] = chunk.unsqueeze(0).expand((n,) + tuple(chunk.shape)) \
                .reshape(s.shape).clone()
        self.answered.append("all_to_all_single")

    def _mask_to_indices(self, idx: tuple) -> tuple:
        """A boolean mask index as the integer index tensors of its true positions (the
        assumed ones when the mask's values are data)."""
        new = []
        for i in idx:
            if isinstance(i, torch.Tensor) and i.dtype == torch.bool:
                if self.shadow(i) is None:
                    new.extend(self._assumed_positions(i, "boolean mask"))
                    continue
                with _plain():
                    pos = self.shadow(i).nonzero(as_tuple=True)
                new.extend(self.constant(p, i.device) for p in pos)
            else:
                new.append(i)
        return tuple(new)

    def _assumed_positions(self, x: torch.Tensor, what: str) -> tuple:
        """The first ``round(select_fraction * numel)`` positions of ``x`` in row-major
        order, as one index constant per dimension: a selection whose size only the data
        knows, sized by the stated fraction."""
        n = x.numel()
        k = int(round(self.select_fraction * n))
        with _plain():
            flat = torch.arange(k)
            coords, rest = [], flat
            for size in reversed(list(x.shape) or [1]):
                coords.append(rest % size)
                rest = rest // size
            coords.reverse()
        self.assumed_sizes.append(f"{what} at {_caller()}: {k} of {n}")
        return tuple(self.constant(c, x.device) for c in coords[:max(x.dim(), 1)])

    def _index_by_mask(self, x, idx):
        return x[self._mask_to_indices(idx)]

    def _propagate(self, func, name: str, args, kwargs, out) -> None:
        inplace = (name.endswith("_") and not name.endswith("__")) or name == "__setitem__"
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if not outs and not inplace:
            return
        leaves = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        if not leaves and name not in _FACTORIES:
            return
        if not leaves and any(t.is_floating_point() or t.is_complex() for t in outs) \
                and name not in ("zeros", "ones"):
            # other float factories are data to be, not routing; zeros and ones may hold
            # values the program then decides with (X-MOD's language ids, default_lang_id
            # * torch.ones(batch), compared per adapter; JetMoE's zeros.scatter(1, idx, 1)
            # summed into per-expert counts)
            return
        if any(t.numel() > SHADOW_LIMIT for t in outs + leaves):
            if inplace and args and isinstance(args[0], torch.Tensor):
                self.shadows.pop(args[0], None)
            return
        if not all(self.shadow(a) is not None for a in leaves):
            if inplace and args and isinstance(args[0], torch.Tensor):
                self.shadows.pop(args[0], None)
            return
        try:
            ref = self._run_on_shadows(func, args, kwargs)
        except Exception:  # noqa: BLE001 - a value we cannot mirror stays unknown
            if inplace and args and isinstance(args[0], torch.Tensor):
                self.shadows.pop(args[0], None)
            return
        if inplace:
            return                        # the shadow of args[0] was updated in place
        refs = [r for r in tree_flatten(ref)[0] if isinstance(r, torch.Tensor)]
        if len(refs) != len(outs):
            return
        for t, r in zip(outs, refs):
            if _is_fake(t) and tuple(t.shape) == tuple(r.shape):
                self.shadows[t] = r


def _caller() -> str:
    """The innermost frame outside torch and solbound (the user's line)."""
    import os
    import traceback
    torch_dir = os.path.dirname(torch.__file__)
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for f in reversed(traceback.extract_stack()):
        p = os.path.abspath(f.filename)
        if not p.startswith((torch_dir, here)):
            return f"{os.path.basename(f.filename)}:{f.lineno}"
    return "?"


def counts_note(mode: "RoutingMode") -> str:
    return ("assumption: " + "; ".join(dict.fromkeys(mode.bounded_counts))
            + " (the output has minlength bins)")


def sizes_note(mode: "RoutingMode") -> str:
    return (f"assumption: selections whose size only the data knows keep a fraction "
            f"{mode.select_fraction:g} of their elements, the first in row-major order "
            f"(--select-fraction): " + "; ".join(dict.fromkeys(mode.assumed_sizes)))


def routing_note(mode: "RoutingMode") -> str:
    what = sorted(set(mode.answered))
    pre = sorted(set(mode.precomputed))
    if not mode.forced:
        # no routing decision: the values asked for follow from the program's constants
        # (X-MOD's language ids), computed exactly while tracing; no assumption
        return ("sizes and branches that depend on tensor values ("
                + ", ".join(what or ["none"])
                + ") follow from values the program computes from its constants, computed "
                  "while tracing (exact, no routing assumption)")
    return (f"assumption: routing is {mode.routing} ({mode.forced} routing decision(s) fixed: "
            + ("top-k row r, slot j picks expert (r*k + j) mod E, T*k/E tokens per expert"
               if mode.routing == "balanced" else "every token picks experts 0..k-1")
            + "); the sizes and branches that depend on it ("
            + ", ".join(what or ["none"])
            + ") follow that routing (--routing balanced|concentrated)"
            + ("; every rank routes its own batch the same way, so an all-to-all of the "
               "per-expert counts receives this rank's counts from each rank"
               if "all_to_all_single" in what else "")
            + (f"; routing bookkeeping computed from it while tracing, its work not counted: "
               f"{', '.join(pre)}" if pre else ""))
