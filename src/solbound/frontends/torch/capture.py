"""Capture a PyTorch program as a core-ATen graph on meta tensors.

``load_problem`` imports a file in KernelBench's convention (``class Model``,
``get_inputs()``, ``get_init_inputs()``) or a ``pkg.module:factory`` callable
returning ``(module, example_inputs)``; ``export_program`` runs
``torch.export`` and the core ATen decomposition without allocating real
tensor memory when the module lives on the meta device.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import traceback
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable


from ..contract import FrontendError  # noqa: E402,F401  (the contract's error type)
from ..loading import import_file as _import_file  # noqa: E402
from ..loading import oneline as _oneline  # noqa: E402
from ..loading import where as _where  # noqa: E402


@dataclass
class Problem:
    """A program to analyze: how to build it, and where it came from."""

    source: str                                   # file path or module:factory
    build: Callable[[str], tuple[Any, tuple]]     # device -> (module, inputs)
    module: Any = None                            # the imported file, when there is one
    params: dict | None = None                    # --param values the build was given

    def build_for_capture(self) -> tuple[Any, tuple, str | None]:
        """(module, inputs, note): on meta tensors, or on the CPU when the constructor
        needs real values (e.g. calls ``.item()``); capture runs on fake tensors anyway."""
        try:
            model, inputs = self.build("meta")
            return model, inputs, None
        except FrontendError as e:
            if "meta" not in str(e):
                raise
        model, inputs = self.build("cpu")
        return model, inputs, "built with real CPU tensors: the model's constructor needs real values"

    def shrink(self):
        """Smaller instances of a file problem: ``(description, Problem)``, largest first.

        The file's module-level integer constants (sizes) are scaled down, batch-like
        names first, then every size constant together.
        """
        if self.module is None:
            return
        sizes = {k: v for k, v in vars(self.module).items()
                 if type(v) is int and not k.startswith("_") and v >= 2}
        batchy = [k for k in sizes if "batch" in k.lower()]
        large = sorted(k for k, v in sizes.items() if v >= 32)   # not kernel sizes or strides
        plans: list[tuple[list[str], bool]] = []      # (int names, shrink tuple shapes too)
        for names, tuples in ((batchy, False), (sorted(set(batchy) | set(large)), True),
                              (sorted(sizes), True)):
            if (names or tuples) and (names, tuples) not in plans:
                plans.append((names, tuples))
        # tuple/list shapes (input_shape = (4096,), layer sizes) shrink with the large plan
        shapes = {k: v for k, v in vars(self.module).items()
                  if isinstance(v, (tuple, list)) and v and all(type(x) is int and x >= 1 for x in v)
                  and not k.startswith("_")}
        seen = set()
        for names, tuples in plans:
            for shift in range(1, 8):
                new: dict = {k: max(1, sizes[k] >> shift) for k in names}
                if tuples:
                    new.update({k: type(v)(max(1, x >> shift) if x >= 32 else x for x in v)
                                for k, v in shapes.items()})
                key = repr(sorted(new.items()))
                if key in seen or all(new[k] == sizes.get(k, shapes.get(k)) for k in new):
                    continue
                seen.add(key)
                desc = ", ".join(f"{k}={sizes.get(k, shapes.get(k))}->{new[k]}" for k in new
                                 if new[k] != sizes.get(k, shapes.get(k)))
                yield desc, _file_problem(self.source, overrides=new, params=self.params)
        yield from self._shrink_literals()

    def _shrink_literals(self):
        """Sizes written as literals: ``get_init_inputs()``'s integers of 32 or more and the
        tensors ``get_inputs()`` returns (their batch dimension and dimensions of 32 or
        more), halved together so that a width given to ``__init__`` and the inputs' last
        dimension stay equal."""
        import functools
        import inspect
        import torch
        mod = self.module
        try:
            init = list(mod.get_init_inputs())
        except Exception:  # noqa: BLE001
            return
        orig_inputs = mod.get_inputs
        # __init__ defaults the file does not pass (class Model: def __init__(self, dim=4096))
        defaults = {}
        try:
            params = list(inspect.signature(mod.Model.__init__).parameters.values())[1:]
        except (TypeError, ValueError):
            params = []
        for p in params[len(init):]:
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and type(p.default) is int \
                    and p.default >= 32:
                defaults[p.name] = p.default
        model_cls = mod.Model
        for shift in range(1, 8):
            def small(n, shift=shift):
                return max(1, n >> shift) if n >= 32 else n

            def shrink_init(v, small=small):
                if type(v) is int:
                    return small(v)
                if isinstance(v, (tuple, list)) and all(type(x) is int for x in v):
                    return type(v)(small(x) for x in v)
                return v
            new_init = [shrink_init(v) for v in init]

            def get_inputs(small=small):
                out = []
                for x in orig_inputs():
                    if isinstance(x, torch.Tensor) and x.dim() > 0:
                        for d, n in enumerate(x.shape):
                            m = max(1, n >> 1) if (d == 0 and 2 <= n < 32) else small(n)
                            if m != n:
                                x = x.narrow(d, 0, m)
                        x = x.contiguous()
                    out.append(x)
                return out
            changed = [f"{a}->{b}" for a, b in zip(init, new_init) if a != b]
            changed += [f"{k}={v}->{small(v)}" for k, v in defaults.items()]
            desc = (f"get_init_inputs {', '.join(changed)}; " if changed else "") + \
                f"input sizes of 32 or more halved {shift} time(s)"
            overrides = {"get_init_inputs": (lambda v=new_init: list(v)), "get_inputs": get_inputs}
            if defaults:
                overrides["Model"] = functools.partial(
                    model_cls, **{k: small(v) for k, v in defaults.items()})
            yield desc, _file_problem(self.source, overrides=overrides, params=self.params)


STRUCTURE_ATTR = "_solbound_structure"
CONST_ATTR = "_solbound_const"
# tensor methods that keep every element where it is in the last two dimensions (or only
# add leading ones): a triangular tensor stays triangular through them
_SHAPE_KEEPING = {"view", "reshape", "unsqueeze", "expand", "contiguous", "to", "float",
                  "half", "bfloat16", "bool", "type", "clone", "detach", "requires_grad_"}


def _input_structure_mode():
    import torch
    from torch.overrides import TorchFunctionMode

    class Mode(TorchFunctionMode):
        """Marks tensors made by ``torch.triu``/``torch.tril`` with
        ``(name, diagonal, value inside or None)``, so that a tensor the program builds
        triangular is known to be zero outside its triangle (and, for ``tril(ones)``,
        one inside): the structure the problem states, read from how it builds its
        inputs and constant buffers, never from their values."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            name = getattr(func, "__name__", "")
            first = args[0] if args else None
            # an in-place update (add_, copy_, __setitem__, ...) may fill the zero triangle
            if name.endswith("_") and name != "requires_grad_" and hasattr(first, STRUCTURE_ATTR):
                delattr(first, STRUCTURE_ATTR)
            if name == "copy_" and len(args) > 1 and isinstance(args[1], torch.Tensor) \
                    and isinstance(first, torch.Tensor) and args[1].shape == first.shape:
                for attr in (STRUCTURE_ATTR, CONST_ATTR):      # overwritten whole: its source's
                    if hasattr(args[1], attr):
                        setattr(first, attr, getattr(args[1], attr))
            if not isinstance(out, torch.Tensor):
                return out
            if name in ("ones", "ones_like") or (name in ("full", "full_like") and len(args) > 1
                                                  and args[1] == 1):
                setattr(out, CONST_ATTR, 1)
            elif name in _SHAPE_KEEPING and isinstance(first, torch.Tensor) and out is not first:
                for attr in (STRUCTURE_ATTR, CONST_ATTR):
                    tag = getattr(first, attr, None)
                    if tag is not None and (attr == CONST_ATTR or (
                            out.dim() >= 2 and out.shape[-2:] == first.shape[-2:])):
                        setattr(out, attr, tag)
            if name.rstrip("_") in ("triu", "tril") and out.dim() >= 2:
                diag = int(args[1] if len(args) > 1 else kwargs.get("diagonal", 0))
                kind = name.rstrip("_")
                inside = getattr(first, CONST_ATTR, None)
                tag = getattr(first, STRUCTURE_ATTR, None)
                if inside is None and tag is not None and tag[2] == 1 and tag[0] == kind and (
                        diag <= tag[1] if kind == "tril" else diag >= tag[1]):
                    inside = 1      # a smaller triangle of a triangle of ones: ones inside
                setattr(out, STRUCTURE_ATTR, (kind, diag, inside))
            elif name in _BAND_OPS and len(args) >= 2:
                band = _band_of(getattr(args[0], STRUCTURE_ATTR, None),
                                getattr(args[1], STRUCTURE_ATTR, None), name)
                if band is not None and out.shape[-2:] == args[0].shape[-2:]:
                    setattr(out, STRUCTURE_ATTR, band)
            return out
    return Mode()


# two triangles of ones combined into a band of ones (GPT-Neo's local attention:
# bitwise_xor(tril(ones), tril(ones, -window)))
_BAND_OPS = {"bitwise_xor", "__xor__", "logical_xor", "sub", "__sub__", "bitwise_and",
             "__and__", "logical_and", "mul", "__mul__"}


def _band_of(a, b, op: str):
    """``("band", (lo, hi), 1)``: ones where ``lo <= col - row < hi``, zeros elsewhere, for
    two triangle-of-ones tags ``a``, ``b`` combined by ``op``; else None."""
    if a is None or b is None or a[2] != 1 or b[2] != 1 or "band" in (a[0], b[0]):
        return None

    def span(t):      # col - row in [lo, hi) where the triangle holds ones
        return (None, t[1] + 1) if t[0] == "tril" else (t[1], None)
    (alo, ahi), (blo, bhi) = span(a), span(b)
    if op in ("bitwise_xor", "__xor__", "logical_xor", "sub", "__sub__"):
        # a minus a triangle inside it (a nested pair of the same kind)
        if a[0] == b[0] == "tril" and b[1] < a[1]:
            return ("band", (b[1] + 1, a[1] + 1), 1)
        if a[0] == b[0] == "triu" and b[1] > a[1]:
            return ("band", (a[1], b[1]), 1)
        if op not in ("sub", "__sub__") and a[0] == b[0] == "tril" and a[1] < b[1]:
            return ("band", (a[1] + 1, b[1] + 1), 1)
        return None
    # intersection: a tril and a triu
    lo = blo if alo is None else alo if blo is None else max(alo, blo)
    hi = bhi if ahi is None else ahi if bhi is None else min(ahi, bhi)
    if lo is None or hi is None or lo >= hi:
        return None
    return ("band", (lo, hi), 1)


def input_structure(inputs) -> list[tuple[str, int, object] | None]:
    """Per input leaf, in the order ``torch.export`` makes placeholders of them:
    ``("triu"|"tril", diagonal, value inside)`` for a tensor built triangular, else ``None``."""
    from torch.utils._pytree import tree_leaves
    return [getattr(x, STRUCTURE_ATTR, None) for x in tree_leaves(list(inputs))]


def _triangular_by_value(t) -> tuple[str, int, object] | None:
    """``tril``/``triu`` structure of a constant tensor with real values (a causal mask
    buffer made in ``__init__``): ``(kind, 0, 1 or None)``."""
    import torch
    if t.dim() < 2 or t.shape[-1] < 2 or t.numel() > (1 << 24) or t.is_complex():
        return None
    if t.is_floating_point() and t.element_size() == 1:
        t = t.float()         # float8 has no tril/triu or comparisons on the CPU
    if not torch.any(t):
        return None
    # ones exactly where lo <= col - row < hi: a triangle or a band (a sliding window)
    n, m = t.shape[-2], t.shape[-1]
    diff = torch.arange(m).view(1, m) - torch.arange(n).view(n, 1)
    nz = diff.expand(t.shape)[t != 0]
    lo, hi = int(nz.min()), int(nz.max()) + 1
    band = ((diff >= lo) & (diff < hi)).expand(t.shape)
    if torch.equal(t != 0, band) and torch.all(t[band] == 1) and lo > -(n - 1) and hi < m:
        return ("band", (lo, hi), 1)
    for kind, fn in (("tril", torch.tril), ("triu", torch.triu)):
        if torch.equal(fn(t), t):
            ones = torch.equal(t, fn(torch.ones_like(t)))
            return (kind, 0, 1 if ones else None)
    return None


def state_structure(model) -> dict[str, tuple[str, int, object]]:
    """Triangular constant tensors of a module (buffers and plain tensor attributes), by
    qualified name: tagged when built under the structure mode (meta device), else read
    from their values (a constant the module holds before it runs)."""
    import torch
    out = {}
    for prefix, mod in model.named_modules():
        items = list(mod._buffers.items()) + [(k, v) for k, v in vars(mod).items()
                                              if isinstance(v, torch.Tensor)
                                              and not isinstance(v, torch.nn.Parameter)]
        for name, t in items:
            if not isinstance(t, torch.Tensor):
                continue
            tag = getattr(t, STRUCTURE_ATTR, None)
            if tag is None and t.device.type != "meta":
                tag = _triangular_by_value(t)
            if tag is not None:
                out[f"{prefix}.{name}" if prefix else name] = tag
    return out


def _file_problem(spec: str, overrides: dict | None = None, params: dict | None = None) -> Problem:
    mod = _import_file(spec)
    if params:
        from ..loading import check_params
        check_params(spec, mod, params, module_names=True)
        overrides = {**params, **(overrides or {})}
    for k, v in (overrides or {}).items():
        setattr(mod, k, v)
    missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if not hasattr(mod, n)]
    if missing:
        raise FrontendError(f"{spec}: lacks {', '.join(missing)} (a KernelBench-style file "
                            f"defines class Model, get_inputs() and get_init_inputs())")

    def build(device: str, mod=mod, spec=spec):
        import torch
        try:
            with torch.device(device), _input_structure_mode():
                init = mod.get_init_inputs()
                model = mod.Model(*init)
                inputs = mod.get_inputs()
        except Exception as e:  # noqa: BLE001
            raise FrontendError(f"{spec} ({_where(e, spec)}): building Model/get_inputs "
                                f"failed: {_oneline(e)}") from None
        return model, tuple(inputs)

    return Problem(spec, build, mod, params or None)


def load_problem(spec: str, params: dict | None = None) -> Problem:
    """``FILE.py`` (KernelBench convention) or ``pkg.module:factory``. ``params``: keyword
    arguments of the factory, or module-level constants of the file that they replace
    (``--param batch_size=8``)."""
    params = dict(params or {})
    if spec.endswith(".py") or os.path.sep in spec:
        return _file_problem(spec, params=params)
    if ":" not in spec:
        raise FrontendError(f"{spec}: expected FILE.py or pkg.module:factory")
    from ..loading import check_params, factory_of
    factory = factory_of(spec)           # imported as `python -c` would; one line a failure
    check_params(spec, factory, params)

    def build_factory(device: str):
        import torch
        try:
            with torch.device(device), _input_structure_mode():
                res = factory(**params)
        except Exception as e:  # noqa: BLE001
            raise FrontendError(f"{spec}: factory failed: {_oneline(e)}") from None
        if not (isinstance(res, tuple) and len(res) == 2):
            raise FrontendError(f"{spec}: factory must return (module, example_inputs)")
        model, inputs = res
        return model, tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)

    return Problem(spec, build_factory, params=params or None)


EXPERTS_DISPATCH = "batched_mm"


class _traceable_experts:
    """Mixture-of-experts layers of transformers dispatch tokens to experts by sorting
    them (``grouped_mm``) or by a Python loop over the experts hit (``eager``): sizes that
    depend on the routing, which tracing cannot follow. Every dispatch evaluates each
    (token, chosen expert) pair once, T*k expert evaluations whatever the routing, so while
    tracing the experts use transformers' ``batched_mm`` dispatch, which does the same work
    with static sizes. Restored on exit: validation runs the model's own dispatch."""

    def __init__(self, model, enabled: bool = True):
        self.model, self.enabled, self.changed, self.notes = model, enabled, [], []

    def __enter__(self):
        if not self.enabled:
            return self
        seen = set()
        for mod in self.model.modules():
            cfg = getattr(mod, "config", None)
            impl = getattr(cfg, "_experts_implementation", None) if cfg is not None else None
            if (type(mod).__name__.endswith("Experts") and impl not in (None, EXPERTS_DISPATCH)
                    and id(cfg) not in seen):
                seen.add(id(cfg))
                self.changed.append((cfg, impl))
                cfg._experts_implementation = EXPERTS_DISPATCH
                self.notes.append(
                    f"assumption: mixture-of-experts layers ({type(mod).__name__}, dispatch "
                    f"{impl!r}) are traced with transformers' {EXPERTS_DISPATCH!r} dispatch: the "
                    f"same T*k expert evaluations with static sizes (--keep-experts-dispatch "
                    f"to trace the program's own)")
        return self

    def __exit__(self, *exc):
        for cfg, impl in self.changed:
            cfg._experts_implementation = impl
        return False


def export_program(model, inputs: tuple, source: str = "program", keep_experts: bool = False,
                   routing: str | None = None, select_fraction: float | None = None,
                   decompose=None):
    """torch.export + core ATen decomposition; returns the ExportedProgram. Notes on what
    was assumed while tracing are in ``ep.solbound_notes``.

    A program whose sizes or branches depend on routing decisions (a hand-written
    mixture-of-experts dispatch) is traced again under the routing assumption
    ``routing`` (``routing.ROUTINGS``; default balanced), stated in the notes and kept
    in ``ep.solbound_routing`` for validation (``None`` when none was needed).

    ``decompose``: what follows the export (default: the core-ATen decompositions); the
    training step keeps the exported forward to build its joint graph from."""
    import torch
    import torch.nn as nn
    from .routing import DEFAULT_ROUTING, RoutingMode, routing_note

    if not isinstance(model, nn.Module):
        raise FrontendError(f"{source}: Model is not a torch.nn.Module")
    args = tuple(inputs)
    # tensors made in forward without a device (torch.arange(n), torch.zeros(b, c)) go
    # where the program's tensors are, as they would on that device
    devices = {t.device for t in list(model.parameters()) + list(model.buffers())
               + [a for a in _leaves(args) if isinstance(a, torch.Tensor)]}
    home = devices.pop() if len(devices) == 1 else None
    _lift_held_tensors(model)
    register_output_types(model)
    try:
        with _python_state_kept(model) as state:
            return _export(model, args, source, keep_experts, routing, home, state,
                           select_fraction, decompose)
    finally:
        _detach_state(model)


def _detach_state(model) -> None:
    """A trace that ran part of forward on the real tensors (a failed non-strict attempt
    before the strict retry) leaves in-place updates of real buffers in the autograd
    graph (a StaticCache's ``index_copy_``): the buffers are made leaves again, in place
    (every alias, such as a cache layer's reference, keeps seeing the same tensor)."""
    for t in model.buffers():
        if t.grad_fn is not None and t._base is None:
            t.detach_()


_UNKNOWN_OUTPUT = re.compile(r"Found <class '([\w.]+)'> in output, which is not a known type")


def register_output_types(model) -> None:
    """Whatever a model returns is flattened to its tensors: transformers' ``ModelOutput``s
    are pytree nodes already; its caches (``DynamicCache``, ``StaticCache``, hybrid and
    Mamba caches, a model's own ``*Cache`` classes) are registered with transformers' own
    generic flatten (``exporters.exporter_dynamo.register_cache_pytrees_for_model``)."""
    if "transformers" not in sys.modules:
        return
    try:
        from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model
        from transformers.modeling_utils import PreTrainedModel
    except ImportError:     # an older transformers: the unknown-type retry still registers
        return
    for mod in model.modules():
        if isinstance(mod, PreTrainedModel):
            register_cache_pytrees_for_model(mod)


def _register_output_type(exc: BaseException) -> bool:
    """An output of a class torch's pytree does not know (a cache, a dataclass, a plain
    object holding tensors): registered as a node whose leaves are the tensors it holds
    (transformers' generic flatten over attributes, dicts and sequences), so the export
    can be retried. False when the message names no class or nothing can register it."""
    m = _UNKNOWN_OUTPUT.search(str(exc))
    if not m:
        return False
    modname, _, clsname = m.group(1).rpartition(".")
    cls = getattr(sys.modules.get(modname), clsname, None)
    if not isinstance(cls, type):
        return False
    try:
        from transformers.exporters.exporter_dynamo import register_pytree_node
    except ImportError:
        return False
    register_pytree_node(cls)
    return True


def _export(model, args, source, keep_experts, routing, home, state, select_fraction=None,
            decompose=None):
    import torch
    from .loops import NOTES as LOOP_NOTES, SOURCES as LOOP_SOURCES, loops_as_scans
    from .routing import DEFAULT_ROUTING, RoutingMode, counts_note, routing_note, sizes_note
    lifted = False
    traced_literals = False     # scalar literals made in forward as constants, first
    mode = None
    strict = False          # non-strict first; strict (TorchDynamo) when that fails
    registered: set[str] = set()
    first_failure = None
    frozen: list = []
    while True:
        state.restore()             # every attempt starts from the model's state
        try:
            # torch prints the partial graph of a failed trace to stderr: the user gets
            # one line from us instead
            with warnings.catch_warnings(), _fast_recurrent_shapes(), _quiet_torch_logs(), \
                    _flex_device_check_lifted(), contextlib.redirect_stderr(io.StringIO()), \
                    (torch.device(home) if home is not None else contextlib.nullcontext()), \
                    _traceable_experts(model, not keep_experts) as experts, \
                    (mode if mode is not None else contextlib.nullcontext()), \
                    (_literal_values(traced_literals) if not strict
                     else contextlib.nullcontext()), \
                    (loops_as_scans(model) if not strict else contextlib.nullcontext()):
                warnings.simplefilter("ignore")
                del LOOP_NOTES[:], LOOP_SOURCES[:]
                ep = torch.export.export(model, args, strict=strict)
            if mode is None and _has_value_sizes(ep):
                # sizes that follow tensor values (x[mask]): trace under the assumption
                mode = RoutingMode(routing or DEFAULT_ROUTING, select_fraction)
                first = None
                continue
            with warnings.catch_warnings(), _fast_recurrent_shapes(), _quiet_torch_logs():
                warnings.simplefilter("ignore")
                if decompose is not None:
                    ep = decompose(ep)
                else:
                    table = _decomp_table()
                    done = decompose_program(ep, dict(table))
                    extra = _custom_ops_with_reference(done)
                    if extra:       # a second pass over the decomposed program
                        table.update(extra)
                        try:
                            done = decompose_program(done, table)
                        except Exception:  # noqa: BLE001 - the reference does not trace
                            pass           # (data-dependent sizes): the operator stays unsupported
                    ep = done
            for mod in model.modules():     # traced values must not stay in held objects
                _rebind(mod)
            ep.solbound_notes = list(experts.notes) + _loop_notes()
            ep.solbound_loop_sources = list(LOOP_SOURCES)
            ep.solbound_routing = None
            ep.solbound_sizes_assumed = False
            if mode is not None and (mode.forced or mode.answered or mode.precomputed):
                ep.solbound_routing = mode.routing
                ep.solbound_notes.append(routing_note(mode))
            if mode is not None and mode.assumed_sizes:
                ep.solbound_sizes_assumed = True
                ep.solbound_notes.append(sizes_note(mode))
            if mode is not None and mode.bounded_counts:
                ep.solbound_notes.append(counts_note(mode))
            return ep
        except Exception as e:  # noqa: BLE001
            if not lifted and "mutated" in str(e) and _lift_tensor_attributes(model):
                lifted = True
                continue   # a plain tensor attribute updated in forward: now a buffer
            if not traced_literals and not strict and _MUTATED_CONSTANT.search(str(e)):
                traced_literals = True
                continue   # a literal made in forward and updated there: now an operator
            if "can require gradients" in str(e) and not frozen:
                # a quantized tensor-subclass parameter (optimum-quanto's frozen weights)
                # that export unwraps into integer tensors, which cannot require gradients:
                # the forward does not need them to
                frozen = [p for p in model.parameters() if p.requires_grad]
                for p in frozen:
                    p.requires_grad_(False)
                if frozen:
                    continue
            unknown = _UNKNOWN_OUTPUT.search(str(e))
            if unknown and unknown.group(1) not in registered:
                registered.add(unknown.group(1))
                if _register_output_type(e):
                    continue   # an output type pytree did not know: now a node
                raise FrontendError(
                    f"{source}: the program returns a {unknown.group(1)}, which solbound cannot "
                    f"flatten to tensors (install transformers for its generic flatten, or return "
                    f"tensors, tuples, lists or dicts)") from None
            data_dep = "data-dependent" in str(e) or type(e).__name__.startswith(
                "GuardOnDataDependent")
            if data_dep and mode is None:
                mode = RoutingMode(routing or DEFAULT_ROUTING, select_fraction)
                first = e
                continue   # sizes that follow routing decisions: trace under the assumption
            if mode is not None and (data_dep or first is not None):
                where, code = _user_frame(e if data_dep else first)
                raise FrontendError(
                    f"{source}: data-dependent control flow or size at {where}"
                    + (f" ({code})" if code else "")
                    + ": the program branches, loops or sizes a tensor on tensor values that "
                      "do not follow from a routing decision (topk/argmax), which tracing "
                      "cannot follow; write it with torch.cond / torch.where or fixed sizes, "
                      "or state how much a selection (nonzero, masked_select, x[mask]) keeps "
                      "with --select-fraction F"
                ) from None
            if not strict and mode is None:
                # some programs trace only under TorchDynamo (transformers'
                # TorchExportableModuleWithStaticCache: "expected compiled_fn to be
                # GraphModule" without it): retry strict before giving up
                strict, first_failure = True, e
                continue
            culprit = first_failure if first_failure is not None else e
            raise FrontendError(f"{source}: torch.export failed to trace ({_where(culprit)}): "
                                f"{_oneline(culprit)}"
                                + (f" (strict export failed too: {_oneline(e)})"
                                   if first_failure is not None else "")) from None


_MUTATED_CONSTANT = re.compile(r"Constant \S+ is mutated in the forward method")


def _loop_notes() -> list[str]:
    """What happened to the Python loops over steps while tracing (``loops.py``), one line
    per loop (a loop called once per layer is named once, with its count)."""
    from .loops import NOTES as LOOP_NOTES
    seen: dict[str, int] = {}
    for n in LOOP_NOTES:
        seen[n] = seen.get(n, 0) + 1
    return [n + (f" (each of {c} calls)" if c > 1 else "") for n, c in seen.items()]


LITERAL_ATTR = "_solbound_literal"


def _literal_values(traced: bool = False):
    """``torch.tensor(literal)`` made in forward on the meta device (GPT-Neo's mask value,
    ``torch.tensor(torch.finfo(dtype).min, device=x.device)``) has no value there: the
    literal is kept on the tensor (``LITERAL_ATTR``), so the lowering knows the constant
    as it would on a real device.

    ``traced``: a scalar literal is made by ``torch.full`` instead, an operator of the
    traced program rather than a constant export lifts out of it. A constant the program
    updates in place cannot be lifted (transformers 5.25's linear-attention cache layer
    makes its token counter ``torch.tensor(0)`` in forward and ``add_``s to it: "Constant
    ... is mutated in the forward method"); the export is retried this way then."""
    import torch
    from torch.overrides import TorchFunctionMode

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if traced and func is torch.tensor and args and isinstance(args[0], (bool, int, float)) \
                    and set(kwargs or {}) <= {"dtype", "device"}:
                kw = dict(kwargs or {})
                dtype = kw.get("dtype") or (torch.bool if isinstance(args[0], bool) else
                                            torch.int64 if isinstance(args[0], int) else
                                            torch.get_default_dtype())
                return torch.full((), args[0], dtype=dtype, device=kw.get("device"))
            out = func(*args, **(kwargs or {}))
            if func is torch.tensor and args and isinstance(out, torch.Tensor) \
                    and out.device.type == "meta" and _is_literal(args[0]):
                setattr(out, LITERAL_ATTR, args[0])
            return out
    return Mode()


def _is_literal(v, depth: int = 0) -> bool:
    if isinstance(v, (bool, int, float)):
        return True
    if isinstance(v, (list, tuple)) and depth < 3 and len(v) <= 4096:
        return all(_is_literal(x, depth + 1) for x in v)
    return False


def _has_value_sizes(ep) -> bool:
    """Does a traced value have a size known only at run time (an unbacked symbol)?"""
    import torch
    for n in ep.graph.nodes:
        val = n.meta.get("val")
        for v in (val if isinstance(val, (list, tuple)) else [val]):
            if isinstance(v, torch.Tensor) and any(not isinstance(d, int) for d in v.shape):
                return True
    return False


def _leaves(args):
    from torch.utils._pytree import tree_leaves
    return tree_leaves(list(args))


class _quiet_torch_logs:
    """torch logs whole graphs and tracebacks at ERROR level while tracing fails; the user
    gets one line from us instead."""

    def __enter__(self):
        # one filter on torch's loggers' handlers would miss records propagated to the
        # root's; setting each torch.* logger's level costs a cache clear over every logger
        # per call (seconds over a benchmark): a filter on each torch logger that has
        # handlers, and on the root's handlers, for records from torch
        import logging
        self.saved = logging.root.manager.disable
        logging.disable(max(self.saved, logging.ERROR))
        return self

    def __exit__(self, *exc):
        import logging
        logging.disable(self.saved)
        return False


def _user_frame(exc: BaseException) -> tuple[str, str]:
    """The innermost traceback frame outside torch (the user's, or their library's, line)."""
    import torch
    torch_dir = os.path.dirname(torch.__file__)
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not os.path.abspath(f.filename).startswith((torch_dir, here))]
    if not frames:
        return _where(exc), ""
    f = frames[-1]
    return f"{os.path.basename(f.filename)}:{f.lineno}", (f.line or "").strip()


RECURRENT = ("aten.lstm.input", "aten.gru.input", "aten.rnn_tanh.input", "aten.rnn_relu.input")
# triangular masks: one guarded copy (their decomposition builds index tensors and a
# comparison, which would count as work and hide the triangle from the demand analysis)
# roll: two slice copies per dimension (its decomposition computes index vectors with fmod
# and gathers through them: index arithmetic a roll does not need)
KEEP = RECURRENT + ("aten.tril.default", "aten.triu.default", "aten.roll.default")


# core ATen operators that torch keeps whole but decomposes well into gathers and
# arithmetic (PyTorch's own decompositions: the index computation, the gathers, the
# interpolation weights): nearest and bilinear upsampling, grid sampling
EXTRA_DECOMPOSITIONS = ("upsample_nearest2d.vec", "upsample_nearest2d.default",
                        "upsample_bilinear2d.vec", "upsample_bilinear2d.default",
                        "upsample_nearest1d.default", "upsample_nearest3d.default",
                        "grid_sampler_2d.default")


_TABLE: dict = {}


def _masked_scatter(self, mask, source):
    """``self.masked_scatter(mask, source)`` (a VLM's image features put at its image
    tokens): position ``p`` where the mask holds takes ``source``'s element number
    ``count(mask before p)``, in row-major order; the rest keep ``self``. As a running
    count (a scan) and a gather, which the IR expresses; PyTorch has no decomposition."""
    import torch
    m = mask.expand_as(self).reshape(-1)
    idx = (torch.cumsum(m.to(torch.int64), 0) - 1).clamp(min=0)
    flat = source.reshape(-1)
    idx = idx.clamp(max=max(flat.numel() - 1, 0))
    return torch.where(m, flat[idx], self.reshape(-1)).view(self.shape)


def _is_all_true(x):
    """``_is_all_true`` (the check ``torch.all`` makes before an assertion): ``all``."""
    import torch
    return torch.all(x)


def _repeat_interleave_indices(repeats, output_size=None):
    """``repeat_interleave(repeats, output_size=N)`` (the index form that
    ``x.repeat_interleave(counts)`` decomposes to: ``j`` repeated ``repeats[j]`` times) as
    the search of every output position in the running total of ``repeats``:
    ``searchsorted(cumsum(repeats), arange(N), right=True)`` (the rows a grouped dispatch
    hands each expert: expert parallelism's received expert ids)."""
    import torch
    n = output_size if output_size is not None else int(repeats.sum())
    total = torch.cumsum(repeats, 0)
    return torch.searchsorted(total, torch.arange(n, device=repeats.device, dtype=total.dtype),
                              right=True, out_int32=repeats.dtype == torch.int32)


def _decomp_table():
    """Core ATen decompositions, except recurrent layers (lowered whole, as a loop over
    time steps; unrolling them would make thousands of nodes) and triangular masks, plus
    PyTorch's decompositions of the operators in EXTRA_DECOMPOSITIONS, plus the index form
    of ``repeat_interleave`` as a search (:func:`_repeat_interleave_indices`).

    A plain dict, built once per process and copied per call (materializing torch's lazy
    table costs tens of milliseconds a call); rebuilt when the set of registered
    composite operators changes (a custom operator registered since)."""
    import torch
    from torch._decomp import decomposition_table
    from torch.export import default_decompositions
    key = _cia_key()
    if _TABLE.get("key") != key:
        table = default_decompositions()
        for op in list(table.keys()):
            if str(op) in KEEP:
                del table[op]
        for name in EXTRA_DECOMPOSITIONS:
            packet, overload = name.split(".")
            op = getattr(getattr(torch.ops.aten, packet), overload)
            if op in decomposition_table:
                table[op] = decomposition_table[op]
        table[torch.ops.aten.repeat_interleave.Tensor] = _repeat_interleave_indices
        table[torch.ops.aten.masked_scatter.default] = _masked_scatter
        table[torch.ops.aten._is_all_true.default] = _is_all_true
        _TABLE.update(key=key, table=dict(table.items()))
    _cache_cia_ops()
    _override_only_what_changes()
    return dict(_TABLE["table"])


def _custom_ops_with_reference(ep) -> dict:
    """Operators of other libraries left in a decomposed program that solbound has no rule
    for but that carry a reference implementation in PyTorch's dispatcher (a
    ``CompositeExplicitAutograd`` kernel: ``torch.library.impl(..., "default")``, as
    optimum-quanto's ``qbytes_mm`` and ``unpack``): decomposing them into that
    implementation traces their arithmetic, which the rules then lower."""
    import torch
    from .lower import find_rule
    out = {}
    for n in ep.graph.nodes:
        op = n.target
        if (n.op != "call_function" or not isinstance(op, torch._ops.OpOverload)
                or op.namespace in ("aten", "prims") or op in out or find_rule(op)):
            continue
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeExplicitAutograd"):
            out[op] = (lambda op: lambda *a, **k: op._op_dk(
                torch._C.DispatchKey.CompositeExplicitAutograd, *a, **k))(op)
    return out


def _cia_key() -> tuple:
    """What the set of composite-implicit operators depends on: the C++ dispatcher's
    registrations and the operator namespaces."""
    import torch
    regs = torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd")
    return (len(regs), hash(tuple(regs)), tuple(torch.ops._dir))


def _cache_cia_ops() -> None:
    """``run_decompositions`` walks every operator namespace for its composite-implicit
    operators on every call (about 60 ms; torch cannot cache it because a custom operator
    may register later). Cached here under :func:`_cia_key`, which changes when one does."""
    import torch.export.exported_program as ep_mod
    orig = getattr(ep_mod, "_collect_all_valid_cia_ops", None)
    if orig is None or getattr(orig, "_solbound_cached", False):
        return
    memo: dict = {}

    def cached():
        key = _cia_key()
        if memo.get("key") != key:
            memo.update(key=key, ops=orig())
        return set(memo["ops"])
    cached._solbound_cached = True
    ep_mod._collect_all_valid_cia_ops = cached


#: per thread (ranks are validated in threads), the operators of the program
#: :func:`decompose_program` decomposes (none set: any other caller of
#: ``run_decompositions``, which gets torch's behaviour unchanged)
_DECOMPOSING = threading.local()


def decompose_program(ep, table):
    """``ep.run_decompositions(table)``, faster: of the composite-implicit operators whose
    table entry is their own composite kernel, only those the program calls are patched
    (:func:`_override_only_what_changes`)."""
    ops = set()
    for gm in ep.graph_module.modules():
        graph = getattr(gm, "graph", None)
        if graph is not None:
            ops.update(n.target for n in graph.nodes if n.op == "call_function")
    _DECOMPOSING.ops = ops
    try:
        return ep.run_decompositions(table)
    finally:
        _DECOMPOSING.ops = None


def _override_only_what_changes() -> None:
    """``run_decompositions`` patches the Python kernels of every composite-implicit
    operator (about 500, twice per call: 70% of the call's time on a small program) with
    the callable its table gives, then restores them. For most the callable is the
    operator's own composite kernel (``_get_decomp_for_cia``: a partial of a closure
    ``_special_op_to_decompose_cia`` on that operator, recognized by its code), which the
    dispatcher runs below autograd anyway, except where the program calls the operator
    itself (a patched ``linear`` on a permuted input decomposes to ``bmm``, an unpatched
    one to a copy and ``mm``). Under :func:`decompose_program` only the program's own
    operators and the entries that differ (operators kept whole, solbound's
    decompositions) are patched: the decomposed program is the same, node for node,
    metadata included (``bench/decomp_identity.py`` compares both on KernelBench)."""
    import functools
    import torch.export.exported_program as ep_mod
    orig = getattr(ep_mod, "_override_composite_implicit_decomp", None)
    try:
        from torch._export.utils import _get_decomp_for_cia
        import torch
        probe = _get_decomp_for_cia(torch.ops.aten.linear.default)
        own = probe.func.__code__ if isinstance(probe, functools.partial) else None
    except (ImportError, AttributeError):
        own = None
    if orig is None or own is None or getattr(orig, "_solbound_filtered", False):
        return

    def needless(op, fn, called) -> bool:
        return op not in called and isinstance(fn, functools.partial) \
            and getattr(fn.func, "__code__", None) is own \
            and fn.keywords.get("kernel") is op and not fn.args

    def filtered(cia_ops_to_callable):
        called = getattr(_DECOMPOSING, "ops", None)
        if called is None:
            return orig(cia_ops_to_callable)
        return orig({op: fn for op, fn in cia_ops_to_callable.items()
                     if not needless(op, fn, called)})
    filtered._solbound_filtered = True
    filtered._solbound_original = orig
    ep_mod._override_composite_implicit_decomp = filtered


@contextlib.contextmanager
def _flex_device_check_lifted(cpu_backward: bool = False):
    """FlexAttention's Python device check lifted: ``flex_attention`` refuses meta inputs
    ("only supported on CUDA, CPU, HPU, or MPS devices") and a CPU backward before it
    dispatches. While tracing (meta or fake inputs) nothing runs, so the check is skipped;
    with ``cpu_backward`` (a training step's reference run) the CPU backward runs PyTorch's
    dense reference. Restored on exit."""
    try:
        import torch.nn.attention.flex_attention as fa
    except ImportError:
        yield
        return
    orig = getattr(fa, "_validate_device", None)
    if orig is None:
        yield
        return

    from torch._subclasses.fake_tensor import FakeTensor

    def validate(query, key, value):
        # traced (fake or meta): nothing runs here, and a CPU model's parameters that
        # require gradients must not stop the forward's capture ("does not support backward
        # on CPU": the analysis of a training step traces the backward itself). With
        # ``cpu_backward`` (the reference run of a training step) the eager CPU backward
        # runs: PyTorch's dense reference (``sdpa_dense_backward``), which its compiled CPU
        # kernel lacks
        if query.device.type == "meta" or isinstance(query, FakeTensor):
            return
        if cpu_backward and query.device.type == "cpu":
            return
        orig(query, key, value)
    fa._validate_device = validate
    try:
        yield
    finally:
        fa._validate_device = orig


class _fast_recurrent_shapes:
    """While tracing, give recurrent ops a shape-only implementation on fake/meta tensors.

    PyTorch computes their output shapes by running the per-time-step decomposition on
    fake tensors (minutes for a 6-layer, 512-step LSTM). Real tensors keep the original
    kernels; everything is restored on exit.
    """

    def __enter__(self):
        import torch
        import torch._decomp as decomp
        from torch._subclasses.fake_tensor import FakeTensor
        self.saved = []
        for name in RECURRENT:
            packet, overload = name.split(".")[1:]
            op = getattr(getattr(torch.ops.aten, packet), overload)

            def shaped(orig, lstm=packet == "lstm"):
                def fn(input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
                       batch_first):
                    if not isinstance(input, FakeTensor) and input.device.type != "meta":
                        return orig(input, hx, params, has_biases, num_layers, dropout, train,
                                    bidirectional, batch_first)
                    h = hx[0] if lstm else hx
                    out = input.new_empty(list(input.shape[:-1])
                                          + [(2 if bidirectional else 1) * h.shape[-1]])
                    if lstm:
                        return out, h.new_empty(h.shape), hx[1].new_empty(hx[1].shape)
                    return out, h.new_empty(h.shape)
                return fn
            self.saved.append((op, dict(op.py_kernels), decomp.decomposition_table.get(op)))
            for key, orig in list(op.py_kernels.items()):
                op.py_kernels[key] = shaped(orig)
            if op in decomp.decomposition_table:
                decomp.decomposition_table[op] = shaped(decomp.decomposition_table[op])
            op._dispatch_cache.clear()
        return self

    def __exit__(self, *exc):
        import torch._decomp as decomp
        for op, kernels, dec in self.saved:
            op.py_kernels.clear()
            op.py_kernels.update(kernels)
            if dec is not None:
                decomp.decomposition_table[op] = dec
            op._dispatch_cache.clear()
        return False


def _lift_tensor_attributes(model) -> bool:
    """Register plain tensor attributes (state kept across calls, e.g. an RNN's
    ``self.hidden``) as buffers, so their updates are traced as buffer writes."""
    import torch
    lifted = False
    for mod in model.modules():
        for name, val in list(vars(mod).items()):
            if isinstance(val, torch.Tensor) and not isinstance(val, torch.nn.Parameter) \
                    and not name.startswith("_"):
                delattr(mod, name)
                mod.register_buffer(name, val)
                lifted = True
    return lifted


class _python_state_kept:
    """Tracing runs ``forward``: Python-side state it updates (a cache layer's
    ``cumulative_length_int += 1``, a module's step counter) is put back afterwards, so
    the model is in the state it was analyzed in (validation runs it next)."""

    _SCALARS = (int, float, bool, str, type(None))

    def __init__(self, model):
        import torch
        objs = list(model.modules())
        for mod in objs[:]:
            objs.extend(owner for owner, _, _ in _held_objects(mod))
        self.saved = []
        seen = set()
        for o in objs:
            if id(o) in seen or isinstance(o, (list, dict)):
                continue
            seen.add(id(o))
            vals = {k: v for k, v in vars(o).items()
                    if isinstance(v, self._SCALARS) and not (isinstance(o, torch.nn.Module)
                                                              and k == "training")}
            if vals:
                self.saved.append((o, vals))

    def __enter__(self):
        return self

    def restore(self) -> None:
        for o, vals in self.saved:
            for k, v in vals.items():
                if vars(o).get(k, v) is not v:
                    setattr(o, k, v)

    def __exit__(self, *exc):
        self.restore()
        return False


def _held_objects(mod):
    """(owner, key, tensor) of the tensors held by the plain objects a module keeps."""
    import torch
    out = []
    for name, val in list(vars(mod).items()):
        if not name.startswith("_") and not isinstance(val, (torch.Tensor, torch.nn.Module)):
            out.extend(_held_tensors(val))
    return out


def _lift_held_tensors(model) -> None:
    """Tensors held by other objects a module keeps (a transformers ``StaticCache``: a
    list of layers, each holding its key and value tensors) become buffers of the module,
    and a forward pre-hook hands the object the module's buffers at every call: tracing
    replaces buffers by traced values, and the object must update those. Done before
    tracing: a traced in-place update of a tensor export sees as a constant alters the
    real tensor (it ends up requiring grad)."""
    import torch
    for mod in model.modules():
        if getattr(mod, "_solbound_rebind", None):
            continue
        rebind = []
        for name, val in list(vars(mod).items()):
            if name.startswith("_") or isinstance(val, (torch.Tensor, torch.nn.Module)):
                continue
            for i, (owner, key, t) in enumerate(_held_tensors(val)):
                buf = f"solbound_{name}_{i}"
                mod.register_buffer(buf, t)
                rebind.append((owner, key, buf))
        if rebind:
            mod._solbound_rebind = rebind
            mod.register_forward_pre_hook(lambda m, args: _rebind(m))


def _rebind(mod) -> None:
    """Hand the objects a module holds its current buffers (see _lift_tensor_attributes)."""
    for owner, key, buf in getattr(mod, "_solbound_rebind", ()):
        if isinstance(owner, (list, dict)):
            owner[key] = getattr(mod, buf)
        else:
            setattr(owner, key, getattr(mod, buf))


def _held_tensors(obj, depth: int = 4, seen=None):
    """(owner, key, tensor) for the tensors an object holds, through its attributes,
    lists and dicts (not modules, not parameters), up to ``depth`` levels."""
    import torch
    seen = seen if seen is not None else set()
    if depth == 0 or id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool, type)):
        return []
    seen.add(id(obj))
    items: list = []
    if isinstance(obj, list):
        items = list(enumerate(obj))
    elif isinstance(obj, dict):
        items = [(k, v) for k, v in obj.items() if isinstance(k, (str, int))]
    elif hasattr(obj, "__dict__") and not isinstance(obj, torch.nn.Module) \
            and type(obj).__module__.split(".")[0] not in ("builtins", "torch", "numpy"):
        items = [(k, v) for k, v in vars(obj).items() if not k.startswith("__")]
    out = []
    for key, v in items:
        if isinstance(v, torch.Tensor):
            if not isinstance(v, torch.nn.Parameter):
                out.append((obj, key, v))
        elif not isinstance(v, torch.nn.Module):
            out.extend(_held_tensors(v, depth - 1, seen))
    return out
