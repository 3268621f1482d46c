"""Lower a core-ATen graph (torch.export) to the loop IR.

Every FX value is either a *base* IR tensor (written by a kernel, or a graph
input / parameter / buffer) or a *view* of one. Views are tracked as strided
windows onto their contiguous base, computed by replaying the view op on a
meta tensor; they move no data. A consumer's access through a view becomes an
affine access of the base (see :func:`KernelBuilder.load`), splitting a loop
variable into two when a view merges base dimensions (``flatten``).

Each non-view node is lowered by one rule in :data:`RULES` (see ``rules/``).
Kernels carry the *framework operator* they come from: the node of the
un-decomposed export graph (``from_node``), so that e.g. ``silu``'s
``sigmoid`` and ``mul`` form one library call for the unfused bound.
"""

from __future__ import annotations

import contextlib
import contextvars
import operator
import os
import re
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ...ir.affine import Aff, Atom, Guard
from ...ir.model import (Access, Call, Const, Expr, Kernel, Program, TensorDecl, kernel_reads,
                         subst_expr)
from ...ir.demand import restrict_to_demand
from ...ir.passes import (FlatIndirectError, contiguous_strides, flatten_bases, prune_dead,
                          runtime_mask_notes)
from ..contract import LoweredProgram, Unsupported  # noqa: F401  (re-exported)
from ...ir.fold import dense_mask_notes, fold_report, over_limit_notes, still_read
from ...ir.known import UNKNOWN, Cond, Known, propagate_known, seed_from_structure, undecided_notes
from ...ir.text import RESERVED, fresh_name

TORCH_DTYPES = {
    torch.float64: "f64", torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
    torch.uint8: "u8", torch.bool: "bool",
}
TORCH_DTYPES[torch.complex64] = "c64"
TORCH_DTYPES[torch.complex128] = "c128"

# the agent (``frontends/agent``) that writes the IR of a node no rule lowers, while
# ``translating(agent)`` is active; None: such a node is unsupported
_AGENT: contextvars.ContextVar = contextvars.ContextVar("solbound_agent", default=None)


@contextlib.contextmanager
def translating(agent):
    token = _AGENT.set(agent)
    try:
        yield
    finally:
        _AGENT.reset(token)
for _name, _ir in (("float8_e4m3fn", "f8e4m3"), ("float8_e5m2", "f8e5m2"),
                   ("float8_e4m3fnuz", "f8e4m3fnuz"), ("float8_e5m2fnuz", "f8e5m2fnuz"),
                   ("float8_e8m0fnu", "f8e8m0"), ("float4_e2m1fn_x2", "f4e2m1x2"),
                   ("uint16", "u16"), ("uint32", "u32")):
    if hasattr(torch, _name):
        TORCH_DTYPES[getattr(torch, _name)] = _ir
IR_TO_TORCH = {v: k for k, v in TORCH_DTYPES.items()}


# the framework operators whose products are attention (the precision policy's class)
ATTENTION_OPS = frozenset({"aten.scaled_dot_product_attention",
                           "aten._scaled_dot_product_flash_attention",
                           "aten._scaled_dot_product_efficient_attention",
                           "aten._scaled_dot_product_cudnn_attention",
                           "aten._scaled_dot_product_flash_attention_for_cpu",
                           "aten._scaled_dot_product_attention_math",
                           "aten.multi_head_attention_forward", "aten._native_multi_head_attention"})


# node metadata the training step's join sets (frontends/torch/train.py): the phase of a
# node (forward, backward, optimizer) and, for the optimizer's nodes, their operator
# group (id, name, source); the optimizer's state are buffers optimizer.<param>.<key>
PHASE_KEY = "solbound_phase"
GROUP_KEY = "solbound_group"
OPT_PREFIX = "optimizer."


class LoweringError(Exception):
    """A node that a rule cannot lower (reported as unsupported, with its source)."""


class _NotShaped(Exception):
    """A view access that is not affine on its base's dimensions (only on its flat storage)."""


# ============================================================================
# values


@dataclass
class View:
    """A strided window onto base IR tensor ``base`` (contiguous, row-major)."""

    base: str
    meta: torch.Tensor            # meta tensor sharing storage with the base's meta tensor
    base_shape: tuple[int, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.meta.shape)

    @property
    def strides(self) -> tuple[int, ...]:
        return tuple(self.meta.stride())

    @property
    def offset(self) -> int:
        return int(self.meta.storage_offset())

    @property
    def dtype(self) -> str:
        return TORCH_DTYPES[self.meta.dtype]

    @property
    def ndim(self) -> int:
        return self.meta.dim()

    @property
    def is_full(self) -> bool:
        """The view is its whole base in row-major order (no data reordering)."""
        return (self.shape == self.base_shape and self.offset == 0
                and self.strides == _contig(self.base_shape))


_contig = contiguous_strides       # row-major strides


# ============================================================================
# kernel builder


class KernelBuilder:
    """Collects the loops, accesses and body of one kernel."""

    def __init__(self, low: "Lowering", dims: list[tuple[str, int]]):
        self.low = low
        self.dims: list[tuple[str, int]] = list(dims)
        self.splits: dict[str, Aff] = {}

    def extent(self, v: str) -> int:
        return dict(self.dims)[v]

    def _split(self, v: str, factor: int) -> tuple[Aff, Aff]:
        n = self.extent(v)
        hi, lo = f"{v}h", f"{v}l"
        pos = [d for d, _ in self.dims].index(v)
        self.dims[pos:pos + 1] = [(hi, n // factor), (lo, factor)]
        sub = Aff.var(hi) * factor + Aff.var(lo)
        self.splits = {k: a.subst({v: sub}) for k, a in self.splits.items()}
        self.splits[v] = sub
        return Aff.var(hi), Aff.var(lo)

    def resolve(self, a: Aff) -> Aff:
        return a.subst(self.splits)

    def load(self, view: View, index: list[Aff | int]) -> Access:
        """Affine access of ``view`` at ``index`` (one entry per view dim).

        The access is expressed on the base's own dimensions, splitting loop
        variables where a view dimension spans several base dimensions (a flatten).
        Where no split does it (a reshape that interleaves dimensions at offsets
        that are not multiples of the base's inner sizes), the base is addressed
        as the flat array it is in memory: ``offset + sum(stride * index)`` is
        always affine, and the lowering declares that base one-dimensional.
        """
        if len(index) != view.ndim:
            raise LoweringError(f"internal: view of rank {view.ndim} indexed with {len(index)}")
        if view.base in self.low.flat:
            return self._load_flat(view, index)
        saved = (list(self.dims), dict(self.splits))
        try:
            return self._load_shaped(view, index)
        except _NotShaped:
            if not self.low.allow_flat:
                raise LoweringError(f"view with shape {view.shape}, strides {view.strides} "
                                    f"of a {view.base_shape} tensor is not affine") from None
            self.dims, self.splits = saved
            self.low.flat.add(view.base)
            return self._load_flat(view, index)

    def _load_flat(self, view: View, index: list[Aff | int]) -> Access:
        flat = Aff.lit(view.offset)
        for e, n, s in zip(index, view.shape, view.strides):
            if n != 1 and s != 0:
                flat = flat + self.resolve(Aff.of(e)) * s
        return Access(view.base, (flat,))

    def _load_shaped(self, view: View, index: list[Aff | int]) -> Access:
        bshape = view.base_shape
        bstr = _contig(bshape)
        r = len(bshape)
        acc = [Aff.lit(0) for _ in range(r)]
        off = view.offset
        for j in range(r):
            c, off = divmod(off, bstr[j]) if bshape[j] else (0, off)
            acc[j] = acc[j] + c

        def digits_of(s: int) -> list[tuple[int, int]]:
            out, rest = [], s
            for j in range(r):
                m, rest = divmod(rest, bstr[j])
                if m:
                    out.append((j, m))
            return out

        base_const = [a.const for a in acc]
        # the largest index of each base dim the view's own elements reach (from its
        # offset and its extents, not from the index expressions, which a guard may take
        # out of range, as a padded window does)
        reach = list(base_const)

        def fits(j: int, m: int, n: int) -> bool:
            return j == 0 or base_const[j] + (n - 1) * m < bshape[j]

        def place_var(v: str, n: int, s: int) -> None:
            """Place loop variable ``v`` (extent ``n``) with flat stride ``s``."""
            digits = digits_of(s)
            if all(fits(j, m, n) for j, m in digits):
                for j, m in digits:
                    acc[j] = acc[j] + Aff.var(v) * m
                    reach[j] += m * (n - 1)
                return
            if len(digits) != 1:
                raise _NotShaped
            j, m = digits[0]
            if bshape[j] % m or n % (bshape[j] // m):
                raise _NotShaped
            f = bshape[j] // m
            hi, lo = self._split(v, f)
            acc[j] = acc[j] + lo * m
            reach[j] += m * (f - 1)
            place_var(hi.single_var(), n // f, s * f)

        for e, n, s in zip(index, view.shape, view.strides):
            if n == 1 or s == 0:
                continue
            e = self.resolve(Aff.of(e))
            digits = digits_of(s)
            if all(fits(j, m, n) for j, m in digits):
                for j, m in digits:
                    acc[j] = acc[j] + e * m
                    reach[j] += m * (n - 1)
                continue
            # the view dim spans several base dims (a flatten): place each term alone
            if e.const or any(c < 0 for _, c in e.terms):
                raise _NotShaped
            for v, c in e.terms:
                place_var(v, self.extent(v), s * c)
        # terms that each fit a base dim may still, together and with the view's offset,
        # carry into the next dim (a window at an offset within a row that holds several
        # heads): then only the flat storage is affine
        if all(view.shape) and any(reach[j] >= bshape[j] for j in range(1, r)):
            raise _NotShaped        # (an empty view reads nothing)
        return Access(view.base, tuple(self.resolve(a) for a in acc))

    def finish(self, name: str, out: str, out_index: list[Aff], body: Expr, *,
               reduce: str | None = None, guard: Guard = (), fill=0, scan: str | None = None,
               out2: str | None = None, unit: str = "",
               loop: tuple[str, int, int] | None = None) -> Kernel:
        sub = dict(self.splits)
        # loops of extent 1 carry no information: fold them to the constant 0
        ones = {d: Aff.lit(0) for d, n in self.dims if n == 1}
        if ones:
            sub = {k: a.subst(ones) for k, a in sub.items()}
            sub.update(ones)
            self.dims = [(d, n) for d, n in self.dims if n != 1]
            if scan in ones:
                scan, reduce = None, None
        return Kernel(
            name=name, dims=tuple(self.dims), out=out,
            out_index=tuple(subst_expr(a, sub) if isinstance(a, Access) else Aff.of(a).subst(sub)
                            for a in out_index),
            body=subst_expr(body, sub), reduce=reduce,
            guard=tuple(Atom(a.expr.subst(sub), a.lo, a.hi) for a in guard), fill=fill,
            scan=scan, out2=out2, unit=unit, loop=loop)


# ============================================================================
# per-node context handed to rules


class OpCtx:
    """What a lowering rule sees: its arguments (views for tensors) and helpers."""

    def __init__(self, low: "Lowering", node: torch.fx.Node):
        self.low = low
        self.node = node
        self.args = low.map_args(node.args)
        self.kwargs = low.map_args(node.kwargs)
        self.val = node.meta.get("val")

    def materialize_views(self) -> None:
        """Copy every strided-view argument into a fresh contiguous tensor (in this
        operator's group: no extra DRAM traffic), for accesses no split makes affine."""
        from .rules.views import materialize

        def m(a):
            if isinstance(a, View) and not a.is_full:
                return materialize(self, a)
            if isinstance(a, (list, tuple)):
                return type(a)(m(x) for x in a)
            return a
        self.args = m(self.args)

    # outputs ----------------------------------------------------------------
    @property
    def out_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.val.shape)

    @property
    def out_dtype(self) -> str:
        return TORCH_DTYPES[self.val.dtype]

    def new_tensor(self, shape, dtype: str, hint: str | None = None) -> View:
        return self.low.new_base(hint or self.node.name, tuple(int(s) for s in shape), dtype)

    def output(self, index: int | None = None) -> View:
        """A fresh base tensor for the node's (index-th) output."""
        val = self.val if index is None else self.val[index]
        name = self.node.name if index is None else f"{self.node.name}_{index}"
        return self.low.new_base(name, tuple(int(s) for s in val.shape), TORCH_DTYPES[val.dtype])

    # kernels --------------------------------------------------------------------
    def builder(self, extents: list[int] | tuple[int, ...], red: list[int] | tuple[int, ...] = ()):
        """A builder over output dims ``d0..`` and reduction dims ``r0..``."""
        dims = [(f"d{i}", int(n)) for i, n in enumerate(extents)]
        dims += [(f"r{i}", int(n)) for i, n in enumerate(red)]
        return KernelBuilder(self.low, dims)

    def emit(self, kb: KernelBuilder, out: View, out_index, body: Expr, **kw) -> None:
        name = self.low.kernel_name(self.node.name)
        target = kb.load(out, [Aff.of(a) for a in out_index])
        if "out2" in kw and kw["out2"] is not None and isinstance(kw["out2"], View):
            kw["out2"] = kw["out2"].base
        k = kb.finish(name, target.tensor, list(target.index), body, **kw)
        self.low.add_kernel(k, self.node)

    def emit_scatter(self, kb: KernelBuilder, out: View, out_index, body: Expr,
                     reduce: str | None = None) -> None:
        """A scatter kernel: ``out[out_index] (reduce)= body``, where ``out_index`` has one
        entry per dim of ``out`` (a whole base tensor), affine or an indirect
        :class:`Access` (see :class:`~solbound.ir.model.Kernel`)."""
        if not out.is_full:
            raise LoweringError("internal: a scatter writes a whole base tensor")
        name = self.low.kernel_name(self.node.name)
        k = kb.finish(name, out.base, list(out_index), body, reduce=reduce)
        self.low.add_kernel(k, self.node)

    def bind(self, value) -> None:
        self.low.env[self.node] = value


Rule = Callable[[OpCtx], None]
RULES: dict[str, Rule] = {}


def rule(*names: str):
    """Register a lowering rule for ATen overloads (``aten.add.Tensor``) or packets (``aten.add``)."""
    def deco(fn: Rule) -> Rule:
        if not hasattr(fn, "rule_id"):
            fn.rule_id = names[0]
        for n in names:
            RULES[n] = fn
        return fn
    return deco


def find_rule(target) -> Rule | None:
    s = str(target)
    if s in RULES:
        return RULES[s]
    packet = s.rsplit(".", 1)[0] if s.count(".") >= 2 else s
    return RULES.get(packet)


# ============================================================================
# the lowering pass


_OWN_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _src_of(node: torch.fx.Node, user_files: tuple[str, ...]) -> str:
    st = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+)', st)
    if not frames:
        return ""
    torch_dir = os.path.dirname(torch.__file__)
    for fname, line in reversed(frames):
        if user_files and os.path.abspath(fname) in user_files:
            return f"{os.path.basename(fname)}:{line}"
    for fname, line in reversed(frames):
        # not torch's, not a generated graph's (a scan body traced by TorchDynamo: its
        # operators are named by the line of the loop), not ours (loops.py runs the scan)
        if not os.path.abspath(fname).startswith((torch_dir, _OWN_DIR)) \
                and not fname.startswith("<"):
            return f"{os.path.basename(fname)}:{line}"
    fname, line = frames[-1]
    return f"{os.path.basename(fname)}:{line}"


class Lowering:
    def __init__(self, ep, user_files: tuple[str, ...] = (), input_structure=(),
                 state_structure=None):
        self.ep = ep
        self.input_structure = list(input_structure)
        self.state_structure = dict(state_structure or {})
        self._constant_targets: dict[str, str] = {}
        self.user_files = tuple(os.path.abspath(f) for f in user_files)
        self.env: dict[torch.fx.Node, Any] = {}
        self.tensors: dict[str, TensorDecl] = {}
        self.kernels: list[Kernel] = []
        self.unsupported: list[Unsupported] = []
        self.notes: list[str] = list(getattr(ep, "solbound_notes", []))
        self.groups: dict[str, dict] = {}
        # tensor names never collide with the loop-variable names rules use
        self._names: set[str] = set(RESERVED) | {"t", "b", "g", "k", "j", "c", "cc", "kk", "ts"}
        self._name_log: list[str] = []     # names in order of creation, for rollback
        self._loops = 0                    # sequential loops made so far (their ids)
        # while a scan's body is lowered (rules/control.py): its loop, which every kernel
        # made then runs in, and a prefix that keeps the body's operator groups apart
        self.scan_loop: tuple[str, int, int] | None = None
        self.group_prefix = ""
        self.scan_src = ""                 # the source line of the loop a scan came from
        self._agent_feedback: dict[str, str] = {}   # node -> the agent's last refusal
        self._cur_group = ("", "", "")
        self.node_src: dict[str, str] = {}
        self.rules_used: set[str] = set()
        # bases addressed as flat storage (declared 1-d at the end), see KernelBuilder.load
        self.flat: set[str] = set()
        self.allow_flat = False
        self.random_draws: dict[str, tuple[str, int | None]] = {}

    # names ------------------------------------------------------------------
    def fresh(self, hint: str) -> str:
        name = fresh_name(hint, self._names)
        self._name_log.append(name)
        return name

    def _undo(self, n_kernels: int, flat: set[str], n_names: int, n_tensors: int,
              n_notes: int) -> None:
        """Forget what a failed lowering attempt created: kernels, flat bases, names,
        tensors, notes and random draws."""
        del self.kernels[n_kernels:]
        self.flat = flat
        for name in self._name_log[n_names:]:
            self._names.discard(name)
            self.tensors.pop(name, None)
            self.random_draws.pop(name, None)
        del self._name_log[n_names:]
        del self.notes[n_notes:]
        if len(self.tensors) != n_tensors:
            raise RuntimeError("internal: lowering rollback left tensors behind")

    def new_loop(self, var: str, count: int) -> tuple[str, int, int]:
        self._loops += 1
        return (var, count, self._loops)

    def kernel_name(self, hint: str) -> str:
        return self.fresh("k_" + hint)

    def new_base(self, hint: str, shape: tuple[int, ...], dtype: str,
                 role: str = "intermediate") -> View:
        name = self.fresh(hint)
        self.tensors[name] = TensorDecl(name, shape, dtype, role)
        meta = torch.empty(shape, dtype=IR_TO_TORCH[dtype], device="meta")
        return View(name, meta, shape)

    def add_kernel(self, k: Kernel, node: torch.fx.Node) -> None:
        op, opname, src = self._cur_group
        if self.scan_loop is not None:
            if k.loop is not None and k.loop != self.scan_loop:
                raise LoweringError("a loop inside a scan body (nested loops are not lowered)")
            k = k.with_(loop=self.scan_loop)
        if k.unit == "matmul" and opname.split(".")[:2] and ".".join(opname.split(".")[:2]) \
                in ATTENTION_OPS:
            k = k.with_(unit="attention")     # a product inside an attention operator
        self.kernels.append(k.with_(op=op, opname=opname, src=src))

    # arguments ------------------------------------------------------------------
    def map_args(self, a):
        if isinstance(a, torch.fx.Node):
            return self.env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(self.map_args(x) for x in a)
        if isinstance(a, dict):
            return {k: self.map_args(v) for k, v in a.items()}
        return a

    # main ---------------------------------------------------------------------
    def run(self) -> LoweredProgram:
        ep = self.ep
        sig = ep.graph_signature
        kinds: dict[str, tuple[str, str]] = {}
        tokens = {spec.arg.name: spec.kind.name == "TOKEN" for spec in sig.input_specs
                  if hasattr(spec.arg, "name")}
        for spec in sig.input_specs:
            kind = spec.kind.name
            role = {"USER_INPUT": "input", "PARAMETER": "parameter", "BUFFER": "buffer",
                    "CONSTANT_TENSOR": "constant"}.get(kind, "input")
            kinds[spec.arg.name] = (role, spec.target or spec.arg.name)
        inputs, state = [], []
        graph = ep.graph_module.graph
        checks = _assertion_only(graph)
        for node in graph.nodes:
            if node.op == "placeholder":
                val = node.meta.get("val")
                if tokens.get(node.name):
                    self.env[node] = None     # an effect token orders side effects only
                    continue
                role, target = kinds.get(node.name, ("input", node.name))
                if not isinstance(val, torch.Tensor):
                    self.env[node] = val
                    if role == "input":
                        inputs.append({"name": node.name, "ir": None, "value": val})
                    continue
                if role == "constant" and _assumes(ep) and target.startswith("lifted_tensor"):
                    role = "assumed"      # made in forward from the assumed routing or sizes
                v = self.new_base(node.name, tuple(int(s) for s in val.shape),
                                  TORCH_DTYPES[val.dtype], role)
                self.env[node] = v
                if role in ("constant", "assumed"):
                    self._constant_targets[v.base] = target
                if role == "input":
                    inputs.append({"name": node.name, "ir": v.base})
                else:
                    state.append({"target": target, "ir": v.base, "role": role})
            elif node.op == "call_function":
                if node in checks:
                    self.env[node] = None     # feeds a run-time assertion only
                    continue
                self.lower_node(node)
            elif node.op == "get_attr":
                self.env[node] = None     # a scan's body: its rule reads the graph module
            elif node.op == "output":
                outputs = self.finish_outputs(node, sig)
        # only now mark outputs (kernels were checked against intermediates)
        program = Program(tuple(self.tensors.values()), tuple(self.kernels), tuple(self.notes))
        try:
            program = flatten_bases(program, self.flat)
        except FlatIndirectError as e:
            name = str(e)
            users = sorted({f"{k.opname or k.op} ({k.src or '?'})" for k in program.kernels
                            if any(a.tensor == name and a.indirect for a in kernel_reads(k))})
            raise LoweringError(f"tensor {name} is read through a view that is affine only on "
                                f"its flat storage and through a data-dependent index by "
                                f"{', '.join(users)}: the IR cannot express both") from None
        program = prune_dead(program)
        kernels = list(program.kernels)
        # an input built triangular is zero outside its triangle; masks built from indices
        # and constant triangular buffers: all become guards (products that read a zero
        # factor skip those points)
        written = {o for k in kernels for o in k.outputs}
        seeds = {name: Cond(atoms, UNKNOWN, Known(0))
                 for name, atoms in self._input_support(inputs, program, written).items()}
        seeds.update(self._state_seeds(state, program, written))
        seeds.update(self._constant_seeds(state, program, written))
        whole_program = Program(program.tensors, tuple(kernels), program.notes)
        folded, dense_masks = fold_report(whole_program)
        shapes = {t.name: t.shape for t in program.tensors}
        bools = frozenset(t.name for t in program.tensors if t.dtype == "bool")
        counters, counter_notes = self._counter_seeds(state, program)
        undecided: list = []
        described: set = set()
        known = propagate_known(kernels, shapes, {**seeds, **counters}, folded,
                                state=frozenset(counters), bools=bools, undecided=undecided,
                                described=described,
                                integers=frozenset(t.name for t in program.tensors
                                                   if t.dtype[:1] in ("i", "u")))
        self.notes.extend(undecided_notes(undecided))
        # the counters' values are stated only where they changed something (a mask)
        if counters:
            plain = propagate_known(kernels, shapes, seeds, folded, bools=bools)
            if known == plain:
                counters = {}
            else:
                self.notes.extend(counter_notes)
        kernels = known
        program = prune_dead(Program(program.tensors, tuple(kernels), program.notes))
        self.notes.extend(dense_mask_notes(whole_program, [
            t for t in still_read(dense_masks, program) if t not in described]))
        self.notes.extend(over_limit_notes(whole_program, program, described=described))
        kernels = list(program.kernels)
        # the inputs that may mask work but whose values only the run knows
        self.notes.extend(runtime_mask_notes(program, set(seeds) | set(counters),
                                             tuple(self.notes)))
        whole = kernels
        kernels = restrict_to_demand(kernels, {t.name for t in program.by_role("intermediate")})
        # tensors now computed only where read: their other elements hold fill values
        partial = {k.out for k, w in zip(kernels, whole) if k.guard != w.guard}
        program = Program(program.tensors, tuple(kernels), tuple(self.notes))
        values = {}
        for node, v in self.env.items():
            first = _flat_views(v)
            if first and node.op == "call_function" and first[0].base in program.tensor_map:
                f = first[0]
                values[node.name] = {"ir": f.base, "shape": list(f.shape),
                                     "strides": list(f.strides), "offset": f.offset,
                                     "src": self.node_src.get(node.name, "")}
        draws = {t: v for t, v in self.random_draws.items() if t in program.tensor_map}
        low = LoweredProgram(program, self.unsupported, outputs, inputs, state, self.groups,
                             values, self.rules_used, draws, partial)
        train = getattr(ep, "solbound_train", None)
        if train is not None:
            grads = {p: values[n]["ir"] for p, n in getattr(ep, "solbound_gradients", {}).items()
                     if n in values}
            low.training = {**train, "gradients": grads,
                            "optimizer_state": [s["ir"] for s in state
                                                if s["target"].startswith(OPT_PREFIX)]}
        return low

    def _input_support(self, inputs: list[dict], program: Program,
                       written: set[str]) -> dict[str, tuple[Atom, ...]]:
        """Zero-outside atoms (over coordinates x0, x1, ...) of inputs built triangular (and
        not updated in place by the program: ``written``)."""
        support = {}
        for spec, st in zip(inputs, self.input_structure):
            name = spec.get("ir")
            if st is None or name is None or name not in program.tensor_map or name in self.flat \
                    or name in written:
                continue
            kind, diag = st[0], st[1]
            r = len(program.tensor_map[name].shape)
            diff = Aff.var(f"x{r - 1}") - Aff.var(f"x{r - 2}")
            if kind == "band":
                support[name] = (Atom(diff, diag[0], diag[1]),)
                self.notes.append(f"input {name} is a band ({diag[0]} <= col - row < {diag[1]}, "
                                  f"built from triangles of ones): products that read it skip "
                                  f"the zeros outside it")
                continue
            support[name] = (Atom(diff, diag, None) if kind == "triu" else Atom(diff, None, diag + 1),)
            self.notes.append(f"input {name} is {'upper' if kind == 'triu' else 'lower'} triangular "
                              f"(get_inputs builds it with torch.{kind}, diagonal {diag}): "
                              f"products that read it skip its zero triangle")
        return support

    def constant_value(self, name: str):
        """The real value of a constant the exported program holds (a lifted
        ``torch.tensor([...])``), by IR tensor name; ``None`` if unknown."""
        target = self._constant_targets.get(name)
        if target is not None and _assumes(self.ep) and target.startswith("lifted_tensor"):
            # made in forward under a routing assumption: they stand for the routing the
            # run decides, and the IR must not depend on whether the trace saw their values
            return None
        val = self.ep.constants.get(target) if target is not None else None
        if isinstance(val, torch.Tensor) and val.device.type == "meta":
            from .capture import LITERAL_ATTR
            lit = getattr(val, LITERAL_ATTR, None)     # torch.tensor(literal) on meta
            return None if lit is None else torch.tensor(lit, dtype=val.dtype).expand(val.shape)
        if val is None or not isinstance(val, torch.Tensor):
            return None
        from torch._subclasses.fake_tensor import FakeTensor
        return None if isinstance(val, FakeTensor) else val

    def _state_seeds(self, state: list[dict], program: Program, written: set[str]) -> dict:
        """Facts of constant buffers built triangular (a causal mask made in ``__init__``) that
        the program does not update in place (``written``)."""
        seeds = {}
        tmap = program.tensor_map
        for st in state:
            tag = self.state_structure.get(st["target"])
            name = st["ir"]
            if tag is None or name not in tmap or name in self.flat or len(tmap[name].shape) < 2 \
                    or name in written:
                continue
            kind, diag, inside = tag
            seeds[name] = seed_from_structure(kind, diag, len(tmap[name].shape), inside)
            if kind == "band":
                self.notes.append(f"{st['role']} {st['target']} is a band of ones ({diag[0]} <= "
                                  f"col - row < {diag[1]}, a sliding window): work it masks "
                                  f"is skipped")
                continue
            self.notes.append(f"{st['role']} {st['target']} is {'lower' if kind == 'tril' else 'upper'}"
                              f" triangular{' of ones' if inside == 1 else ''} (built with "
                              f"torch.{kind}): work it masks is skipped")
        return seeds

    def _constant_seeds(self, state: list[dict], program: Program, written: set[str]) -> dict:
        """Constants made in forward whose values are known (a lifted
        ``torch.tensor(finfo.min)`` mask value): one element is a known value; a larger
        one may be a triangle or band of ones (its structure, read from its values)."""
        from .capture import _triangular_by_value
        seeds = {}
        tmap = program.tensor_map
        for st in state:
            name = st["ir"]
            if st["role"] != "constant" or name not in tmap or name in written or name in self.flat:
                continue
            val = self.constant_value(name)
            if val is None or val.is_complex():
                continue
            if val.numel() == 1:
                seeds[name] = Known(val.reshape(()).item())
            elif val.dim() >= 2 and len(tmap[name].shape) >= 2:
                tag = _triangular_by_value(val)
                if tag is not None:
                    seeds[name] = seed_from_structure(tag[0], tag[1], len(tmap[name].shape), tag[2])
        return seeds

    def _counter_seeds(self, state: list[dict], program: Program) -> tuple[dict, list[str]]:
        """An integer scalar buffer with a real value (a cache's fill counter, which the
        decode step reads to place its row and to mask the positions not yet written): its
        value now, stated as an assumption. On the meta device there is none: what it
        masks is counted dense (and said so). Returns (seeds, notes)."""
        seeds, notes = {}, []
        tmap = program.tensor_map
        read = {a.tensor for k in program.kernels for a in kernel_reads(k)}
        for st in state:
            name = st["ir"]
            t = tmap.get(name)
            if st["role"] != "buffer" or t is None or t.numel != 1 or name not in read \
                    or t.dtype not in ("i64", "i32", "i16", "i8", "u8"):
                continue
            val = self.ep.state_dict.get(st["target"])
            if val is None:
                val = self.ep.constants.get(st["target"])
            if not isinstance(val, torch.Tensor) or val.device.type == "meta":
                continue
            from torch._subclasses.fake_tensor import FakeTensor
            if isinstance(val, FakeTensor):
                continue
            v = int(val.reshape(-1)[0])
            seeds[name] = Known(v)
            notes.append(f"assumption: buffer {st['target']} (an integer the step reads, "
                         f"e.g. a cache's fill count) holds {v}, its value when analyzed: "
                         f"positions and masks computed from it are exact for that value")
        return seeds, notes

    def _group_of(self, node: torch.fx.Node) -> tuple[str, str, str]:
        gid, gname, src = self._group_of_node(node)
        return self.group_prefix + gid, gname, self.scan_src or src

    def _group_of_node(self, node: torch.fx.Node) -> tuple[str, str, str]:
        own = node.meta.get(GROUP_KEY)
        if own is not None:
            return (own[0], re.sub(r"\.default$", "", own[1]),
                    own[2] if len(own) > 2 and own[2] else _src_of(node, self.user_files))
        fn = node.meta.get("from_node") or []
        root = fn[0] if fn else None
        gname = root.name if root is not None else node.name
        gtarget = str(root.target) if root is not None else str(node.target)
        gtarget = re.sub(r"\.default$", "", gtarget)
        return gname, gtarget, _src_of(node, self.user_files)

    def lower_node(self, node: torch.fx.Node) -> None:
        target = node.target
        if target is operator.getitem:
            self.env[node] = self.env[node.args[0]][node.args[1]]
            return
        self._cur_group = self._group_of(node)
        gid, gname, src = self._cur_group
        self.node_src[node.name] = src
        self.groups.setdefault(gid, {"name": gname, "src": src, "module": _module_of(node)})
        if PHASE_KEY in node.meta:
            self.groups[gid].setdefault("phase", node.meta[PHASE_KEY])
        fn = find_rule(target)
        reason = "no lowering rule"
        if fn is not None:
            # a view access that is not affine on its base's dimensions: first copy the
            # views into contiguous tensors (the copy's plain index may split), else
            # address the base as flat storage
            for attempt in ("direct", "materialized", "flat"):
                mark = (len(self.kernels), set(self.flat), len(self._name_log), len(self.tensors),
                        len(self.notes))
                self.allow_flat = attempt == "flat"
                try:
                    ctx = OpCtx(self, node)
                    if attempt == "materialized":
                        ctx.materialize_views()
                    fn(ctx)
                    if node in self.env:
                        self.rules_used.add(fn.rule_id)
                        return
                    reason = "rule produced no value"
                except LoweringError as e:
                    reason = str(e)
                except (NotImplementedError, ValueError, TypeError, KeyError, IndexError) as e:
                    reason = f"{type(e).__name__}: {e}"
                except Exception as e:  # noqa: BLE001 - e.g. a size known only at run time
                    first = (str(e).strip().splitlines() or [""])[0]
                    reason = (f"data-dependent size ({first[:160]})" if "data-dependent" in first
                              else f"{type(e).__name__}: {first[:200]}")
                finally:
                    self.allow_flat = False
                self._undo(*mark)
                if "not affine" not in reason:
                    break
        if _AGENT.get() is not None and self._translate(node):
            return
        self._unsupported(node, reason)

    def _translate(self, node: torch.fx.Node) -> bool:
        """The agent's validated IR for ``node`` (``frontends/torch/agent.py``), spliced in
        its place: its inputs the node's tensor arguments (strided views copied into
        contiguous tensors, in the operator's group), its outputs the node's results. False
        when there is no target or no accepted translation (the node stays unsupported)."""
        from ..agent.splice import inline
        from .agent import at, target_of, tensor_paths
        agent = _AGENT.get()
        target = target_of(node, self._cur_group[2])
        if target is None:
            return False
        tr = agent.translate(target)
        if not tr.accepted:
            self._agent_feedback[node.name] = tr.feedback[-1]["feedback"] if tr.feedback \
                else "no reply"
            return False
        from .rules.views import materialize
        ctx = OpCtx(self, node)
        views = [at(ctx.args, ctx.kwargs, p) for p in tensor_paths(node)]
        views = [v if v.is_full else materialize(ctx, v) for v in views]
        val = node.meta["val"]
        multi = isinstance(val, (list, tuple))
        outs = [ctx.output(i if multi else None) for i in range(len(val) if multi else 1)]
        decls, kernels = inline(tr.program, {o.name: v.base for o, v in zip(target.inputs, views)},
                                {o.name: v.base for o, v in zip(target.outputs, outs)},
                                self.fresh, node.name, lambda: self.new_loop("", 0)[2])
        for d in decls:
            self.tensors[d.name] = d
        for k in kernels:
            self.add_kernel(k, node)
        self.groups[self._cur_group[0]]["agent"] = {
            "model": agent.model, "target": target.name, "attempts": tr.attempts,
            "cached": tr.cached}
        self.env[node] = outs if multi else outs[0]
        return True

    def add_library(self, node: torch.fx.Node, out: View, routine: str,
                    operands: list[View], params: dict) -> None:
        """``out = routine(*operands)``: one library kernel (``ir/library.py``) whose dims
        index the output (``d*``) and each operand (``a{j}_*``), every operand read whole."""
        dims = [(f"d{i}", n) for i, n in enumerate(out.shape)]
        for j, v in enumerate(operands):
            dims += [(f"a{j}_{i}", n) for i, n in enumerate(v.shape)]
        kb = KernelBuilder(self, dims)
        accs = [kb.load(v, [Aff.var(f"a{j}_{i}") for i in range(v.ndim)])
                for j, v in enumerate(operands)]
        body = (Const(0) if not accs else accs[0] if len(accs) == 1
                else Call("operands", tuple(accs)))
        k = kb.finish(self.kernel_name(node.name), out.base,
                      [Aff.var(f"d{i}") for i in range(out.ndim)], body)
        self.add_kernel(k.with_(lib=(routine, tuple(params.items()))), node)

    def _unsupported(self, node: torch.fx.Node, reason: str) -> None:
        opname = re.sub(r"\.default$", "", str(node.target))
        src = self._cur_group[2]
        if node.name in self._agent_feedback:
            reason += f"; the agent's IR did not validate: {self._agent_feedback[node.name]}"
        self.unsupported.append(Unsupported(opname, src, reason, node.name))
        val = node.meta.get("val")
        vals = val if isinstance(val, (list, tuple)) else [val]
        outs = []
        for arg in node.all_input_nodes:
            # what an unsupported operator reads must exist in DRAM: keep it as an output
            for v in _flat_views(self.env.get(arg)):
                decl = self.tensors[v.base]
                if decl.role == "intermediate":
                    self.tensors[v.base] = TensorDecl(decl.name, decl.shape, decl.dtype, "output")
        operands = [v for arg in node.all_input_nodes for v in _flat_views(self.env.get(arg))]
        for i, v in enumerate(vals):
            if isinstance(v, torch.Tensor):
                try:
                    shape = tuple(int(s) for s in v.shape)
                except Exception:  # noqa: BLE001 - a symbolic size torch could not resolve
                    raise LoweringError(
                        f"{opname} at {src or 'unknown source'} has a size that depends on tensor "
                        f"values ({', '.join(map(str, v.shape))}): the analysis needs static "
                        f"sizes (a selection such as nonzero, masked_select or x[mask]: state "
                        f"how much it keeps with --select-fraction F)") from None
                out = self.new_base(f"{node.name}_unsupported" + (f"_{i}" if len(vals) > 1 else ""),
                                    shape, TORCH_DTYPES[v.dtype], "output")
                # an opaque kernel (ir/library.py): it reads every operand and writes the
                # result whole with no arithmetic, so what the operator moves stays in the
                # bound; the executor refuses it (validation is skipped when anything is
                # unsupported)
                self.add_library(node, out, "opaque", operands,
                                 {"op": opname, "cost": not outs})
                self.notes.append(f"{out.base} is produced by unsupported {opname} "
                                  f"({src or 'unknown source'}): its operands are read and its "
                                  f"result written at their sizes, its work is not counted")
                outs.append(out)
            else:
                outs.append(v)
        self.env[node] = outs if isinstance(val, (list, tuple)) else outs[0]

    def finish_outputs(self, node: torch.fx.Node, sig) -> list[dict]:
        specs = sig.output_specs
        paths = iter(output_paths(self.ep))
        res = []
        # a kind export's signature has no name for (the training step's parameter
        # updates, user outputs there)
        overrides = getattr(self.ep, "solbound_output_kinds", None) or [None] * len(specs)
        for spec, arg, over in zip(specs, node.args[0], overrides):
            kind = spec.kind.name
            v = self.env.get(arg) if isinstance(arg, torch.fx.Node) else arg
            entry = {"kind": {"USER_OUTPUT": "output", "BUFFER_MUTATION": "buffer_mutation"}
                     .get(kind, kind.lower()), "target": spec.target}
            if kind == "USER_OUTPUT":
                entry["path"] = next(paths, "")
            if over is not None:
                entry["kind"], entry["target"] = over
            if isinstance(v, View) and kind == "USER_OUTPUT" and not v.is_full \
                    and self.tensors[v.base].role == "intermediate":
                v = self._output_copy(v, arg)
            if isinstance(v, View):
                decl = self.tensors[v.base]
                if decl.role == "intermediate":
                    self.tensors[v.base] = TensorDecl(decl.name, decl.shape, decl.dtype, "output")
                entry.update(ir=v.base, shape=list(v.shape), strides=list(v.strides),
                             offset=v.offset)
            else:
                entry.update(ir=None, value=v if isinstance(v, (int, float, bool)) else None)
            res.append(entry)
        return res


    def _output_copy(self, v: View, node) -> View:
        """A program output that is a view of part of a tensor (``x[:, 0]``): the part is
        copied into an output of its own, in the producing operator's group, so that the
        rest of the tensor stays an intermediate the demand pass can leave uncomputed."""
        writers = [k for k in self.kernels if k.out == v.base]
        if not writers:
            return v
        w = writers[-1]
        # in the producing operator's group; one of its own when that operator runs in a
        # sequential loop (the copy runs once, after it)
        self._cur_group = (w.op if w.loop is None else f"{w.op}.out", w.opname, w.src)
        out = self.new_base(f"{node.name}_out", v.shape, v.dtype)
        dims = [(f"d{i}", n) for i, n in enumerate(v.shape)]
        kb = KernelBuilder(self, dims)
        idx = [Aff.var(f"d{i}") for i in range(len(v.shape))]
        body = kb.load(v, idx)
        target = kb.load(out, idx)
        self.kernels.append(kb.finish(self.kernel_name(node.name + "_out"), target.tensor,
                                      list(target.index), body).with_(op=self._cur_group[0],
                                                                      opname=w.opname, src=w.src))
        return out


_ASSERTIONS = ("aten._assert_scalar", "aten._assert_async", "aten.sym_constrain_range",
               "aten.sym_constrain_range_for_size")


def _assertion_only(graph) -> set:
    """Scalar nodes that only feed run-time assertions (XLM's ``assert lengths.max() <=
    slen``: ``.item()``, a comparison, ``_assert_scalar``): they check the run and compute
    nothing it returns, so they are not lowered (what they read, if nothing else reads
    it, is dead code)."""
    checks: set = set()
    for node in reversed(list(graph.nodes)):
        if node.op != "call_function" or not node.users:
            continue
        if str(node.target).startswith(_ASSERTIONS):
            continue
        val = node.meta.get("val")
        scalar = not isinstance(val, torch.Tensor) or str(node.target).startswith(
            "aten._local_scalar_dense")
        if scalar and all(u in checks or str(u.target).startswith(_ASSERTIONS)
                          for u in node.users):
            checks.add(node)
    return checks


def output_paths(ep) -> list[str]:
    """Where each user output leaf sits in what the program returns (``logits``,
    ``past_key_values[0]``, ``[1]['hidden']``), from the exported output spec; ``""``
    for a program returning a single tensor."""
    from torch.utils._pytree import (GetAttrKey, MappingKey, SequenceKey,
                                     tree_flatten_with_path, tree_unflatten)
    if getattr(ep, "solbound_output_paths", None) is not None:
        return list(ep.solbound_output_paths)
    spec = getattr(getattr(ep, "call_spec", None), "out_spec", None)
    if spec is None:
        return []
    try:
        tree = tree_unflatten([torch.empty(0)] * spec.num_leaves, spec)
        flat = tree_flatten_with_path(tree)[0]
    except Exception:  # noqa: BLE001 - a node type that does not rebuild from placeholders
        return [f"[{i}]" for i in range(spec.num_leaves)]

    def name(path) -> str:
        out = ""
        for k in path:
            if isinstance(k, MappingKey) and isinstance(k.key, str) and k.key.isidentifier():
                out += ("." if out else "") + k.key
            elif isinstance(k, GetAttrKey):
                out += ("." if out else "") + k.name
            elif isinstance(k, SequenceKey):
                out += f"[{k.idx}]"
            else:
                out += str(k)
        return out
    return [name(p) for p, _ in flat]


def _module_of(node: torch.fx.Node) -> str:
    """The user's module path of a node (``encoder.layer.3.attention.self.query``), from
    torch.export's module stack; ``""`` at the top level."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    return path if isinstance(path, str) else ""


def _flat_views(v) -> list[View]:
    if isinstance(v, View):
        return [v]
    if isinstance(v, (list, tuple)):
        return [x for e in v for x in _flat_views(e)]
    return []


def _assumes(ep) -> bool:
    """Was the program traced under a routing or selection-size assumption?"""
    return bool(getattr(ep, "solbound_routing", None) or getattr(ep, "solbound_sizes_assumed", False))


def lower(ep, user_files: tuple[str, ...] = (), input_structure=(),
          state_structure=None) -> LoweredProgram:
    """The loop IR of an exported program. ``input_structure`` (one entry per user input,
    see ``capture.input_structure``) names inputs known to be triangular,
    ``state_structure`` (``capture.state_structure``) constant buffers built triangular."""
    from . import rules  # noqa: F401  (registers the rules)
    from .capture import FrontendError
    try:
        return Lowering(ep, user_files, input_structure, state_structure).run()
    except LoweringError as e:      # a whole-program fact, not one node's: no partial IR
        raise FrontendError(f"lowering failed: {e}") from None
