"""JAX programs to the loop IR: ``jax.make_jaxpr`` on abstract values, one rule per primitive.

The function is traced on ``jax.ShapeDtypeStruct`` leaves (nothing is allocated). Every jaxpr
variable is a *view* of an IR base tensor: ``(base, shape, strides, offset)`` over the base's
row-major storage. ``transpose``, ``broadcast_in_dim``, ``reshape`` (of a contiguous view),
``squeeze``, ``expand_dims``, static ``slice`` and ``rev`` make views and move no data; an access
through a view that is not its base in row-major order addresses the base as flat storage
(``ir.passes.flatten_bases`` declares it one-dimensional at the end). Calls (``pjit``,
``closed_call``, ``custom_jvp_call``, ``custom_vjp_call``, ``remat``) are inlined, and their
equations keep the group of the top-level equation: a jitted library function such as
``jax.nn.softmax`` is one framework operator for the unfused bound, as eager JAX dispatches
it. A primitive without a rule is listed in ``unsupported`` with its source line; its outputs
become program inputs so the rest is still counted.
"""

from __future__ import annotations

import contextlib
import contextvars

import math
import re
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ...ir.affine import Aff
from ...ir.model import Access, Const, Expr, Kernel, Program, TensorDecl
from ...ir.passes import (contiguous_strides, flatten_bases, mask_inputs, prune_dead, refine,
                          runtime_mask_notes)
from ...ir.text import RESERVED, fresh_name
from ..contract import FrontendError, LoweredProgram, Unsupported

DTYPES = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16",
          "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8",
          "uint32": "u32", "uint16": "u16", "bool": "bool", "complex64": "c64",
          "complex128": "c128", "float8_e4m3fn": "f8e4m3", "float8_e5m2": "f8e5m2",
          "float8_e4m3fnuz": "f8e4m3fnuz", "float8_e5m2fnuz": "f8e5m2fnuz",
          "float8_e8m0fnu": "f8e8m0"}


class JaxLoweringError(Exception):
    """An equation a rule cannot lower (reported as unsupported)."""


def ir_dtype(dtype) -> str:
    name = np.dtype(dtype).name if not hasattr(dtype, "name") else dtype.name
    if name not in DTYPES:
        raise JaxLoweringError(f"dtype {name}")
    return DTYPES[name]


def _key_shape(dtype) -> tuple[int, ...] | None:
    """The words of one PRNG key (``(2,)`` for threefry) when ``dtype`` is a key type."""
    impl = getattr(dtype, "_impl", None)
    return tuple(impl.key_shape) if impl is not None and hasattr(impl, "key_shape") else None


def aval_ir(aval) -> tuple[tuple[int, ...], str]:
    """(IR shape, IR dtype) of a jaxpr value: a PRNG key array ``key<fry>[S]`` is its key
    data, ``u32[S, 2]``."""
    ks = _key_shape(aval.dtype)
    if ks is not None:
        return tuple(aval.shape) + ks, "u32"
    return tuple(aval.shape), ir_dtype(aval.dtype)


@dataclass(frozen=True)
class JView:
    """A strided window onto base IR tensor ``base`` (row-major storage)."""

    base: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: Any                     # an int, or an Aff in a sequential loop's variable
    dtype: str

    def __post_init__(self):
        # Python ints throughout: jaxpr parameters may hold numpy integers (``jnp.split``
        # gives ``split`` its sizes as ``np.int64``), and a view's sizes become kernel
        # extents, point counts and the report's numbers
        object.__setattr__(self, "shape", tuple(int(n) for n in self.shape))
        object.__setattr__(self, "strides", tuple(int(s) for s in self.strides))
        if not isinstance(self.offset, Aff):
            object.__setattr__(self, "offset", int(self.offset))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def is_full(self, base_shape: tuple[int, ...]) -> bool:
        return (self.shape == base_shape and isinstance(self.offset, int) and self.offset == 0
                and self.strides == contiguous_strides(base_shape))

    def contiguous(self) -> bool:
        return self.strides == contiguous_strides(self.shape)


def _shaped(v: JView, base_shape: tuple[int, ...], index: list[Aff]):
    """``v[index]`` in the base's own coordinates when every view dimension walks one base
    dimension (transposes, broadcasts, strided slices), else ``None``."""
    if not isinstance(v.offset, int):
        return None
    bstr = contiguous_strides(base_shape)
    start, off = [], v.offset
    for j, st in enumerate(bstr):
        c, off = divmod(off, st) if base_shape[j] else (0, off)
        start.append(c)
    acc = [Aff.lit(c) for c in start]
    lo, hi = list(start), list(start)            # the range each base coordinate covers
    for e, n, s in zip(index, v.shape, v.strides):
        if n == 1 or s == 0:
            continue
        for j, st in enumerate(bstr):
            if base_shape[j] > 1 and s % st == 0 and abs(s // st) * (n - 1) < base_shape[j]:
                k = s // st
                acc[j] = acc[j] + e * k
                lo[j] += min(0, k * (n - 1))
                hi[j] += max(0, k * (n - 1))
                break
        else:
            return None
    if any(a < 0 or b >= n for a, b, n in zip(lo, hi, base_shape)):
        return None
    return tuple(acc)


def _src(eqn) -> str:
    from jax._src import source_info_util
    s = source_info_util.summarize(eqn.source_info)
    m = re.match(r"(.*?):(\d+)", s or "")
    if not m:
        return ""
    return f"{m.group(1).rsplit('/', 1)[-1]}:{m.group(2)}"


class Ctx:
    """What a rule sees: the equation, its arguments (views or Python scalars), helpers."""

    def __init__(self, low: "JaxLowering", eqn, args: list):
        self.low, self.eqn, self.args = low, eqn, args
        self.params = eqn.params if eqn is not None else {}

    @property
    def out_avals(self):
        return [v.aval for v in self.eqn.outvars]

    def output(self, i: int = 0) -> JView:
        shape, dtype = aval_ir(self.out_avals[i])
        return self.low.new_base(f"{self.eqn.primitive.name}", shape, dtype)

    def load(self, v, index: list) -> Expr:
        """``v`` at ``index`` (one affine entry per view dim); a Python scalar is a constant."""
        if not isinstance(v, JView):
            return Const(v)
        return self.low.access(v, [Aff.of(i) for i in index])

    def emit(self, out: JView, dims: list[tuple[str, int]], out_index: list, body: Expr, *,
             reduce: str | None = None, scan: str | None = None, unit: str = "",
             out2: str | None = None, guard: tuple = ()) -> None:
        from ...ir.affine import Atom
        from ...ir.model import subst_expr
        dims = [(d, int(n)) for d, n in dims]       # numpy sizes from parameters: ints
        k = Kernel(name=self.low.kernel_name(), dims=tuple((d, n) for d, n in dims if n != 1),
                   out=out.base, out_index=(), body=body, reduce=reduce, scan=scan, unit=unit,
                   out2=out2)
        ones = {d: Aff.lit(0) for d, n in dims if n == 1}
        idx = [Aff.of(a).subst(ones) for a in out_index]
        target = self.low.access(out, idx)
        atoms = tuple(Atom(a.expr.subst(ones), a.lo, a.hi) for a in guard)
        k = k.with_(out_index=target.index, body=subst_expr(body, ones), guard=atoms)
        if scan in ones:
            k = k.with_(scan=None, reduce=None)
        self.low.add_kernel(k)

    def emit_library(self, out: JView, dims: list[tuple[str, int]], out_index: list, body: Expr,
                     lib: tuple) -> None:
        """A library kernel (``ir/library.py``): ``out`` whole from the operands in ``body``."""
        self.emit(out, dims, out_index, body)
        self.low.kernels[-1] = self.low.kernels[-1].with_(lib=lib)

    def bind(self, *values) -> None:
        for var, v in zip(self.eqn.outvars, values):
            self.low.env[var] = v


Rule = Callable[[Ctx], None]
RULES: dict[str, Rule] = {}


def rule(*names: str):
    def deco(fn: Rule) -> Rule:
        for n in names:
            RULES[n] = fn
        return fn
    return deco


# the agent (``frontends/agent``) that writes the IR of an equation no rule lowers, while
# ``translating(agent)`` is active
_AGENT: contextvars.ContextVar = contextvars.ContextVar("solbound_agent_jax", default=None)


@contextlib.contextmanager
def translating(agent):
    token = _AGENT.set(agent)
    try:
        yield
    finally:
        _AGENT.reset(token)


CALLS = ("pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
         "custom_vjp_call_jaxpr", "remat", "checkpoint", "remat2")


class JaxLowering:
    def __init__(self, closed, arg_names: list[str], roles: list[str] | None = None,
                 phases: list[str] | None = None):
        self.closed = closed
        self.arg_names = arg_names
        self.roles = roles or ["input"] * len(arg_names)     # per argument leaf
        self.phases = phases                                 # per top-level equation (a step)
        self.mesh: dict | None = None                        # shard_map's {axis: size}
        self.env: dict = {}
        self.tensors: dict[str, TensorDecl] = {}
        self.kernels: list[Kernel] = []
        self.unsupported: list[Unsupported] = []
        self.notes: list[str] = []
        self.groups: dict[str, dict] = {}
        self.flat: set[str] = set()
        self.state: list[dict] = []
        self._names: set[str] = set(RESERVED) | {"d", "r"}
        self._n = 0
        self._group = ("", "", "")
        self.rules_used: set[str] = set()
        self.loop: tuple[str, int, int] | None = None      # the sequential loop being built
        self._loops = 0
        self.branch_assumed = False
        self.values: dict = {}
        # random draws: IR tensor -> (path of equation indices through inlined calls, output
        # index); the reference records what JAX drew there (``reference.py``)
        self.random_draws: dict[str, tuple[str, int | None]] = {}
        self.draws_unreplayable = ""         # a draw inside a loop or branch: its source
        self._path: list[int] = []
        self._control = 0                    # depth inside scan bodies and cond branches
        # loop id -> where a top-level loop's equation is (its path) and the IR history
        # tensors of its carries: validation can start each iteration from JAX's carries
        self.loop_carries: dict[int, dict] = {}

    # names ------------------------------------------------------------------
    def fresh(self, hint: str) -> str:
        return fresh_name(hint, self._names)

    def kernel_name(self) -> str:
        self._n += 1
        return f"k{self._n}"

    def new_base(self, hint: str, shape: tuple[int, ...], dtype: str, role: str = "intermediate"):
        name = self.fresh(hint)
        self.tensors[name] = TensorDecl(name, tuple(int(s) for s in shape), dtype, role)
        return JView(name, tuple(shape), contiguous_strides(tuple(shape)), 0, dtype)

    def add_kernel(self, k: Kernel) -> None:
        op, opname, src = self._group
        self.kernels.append(k.with_(op=op, opname=opname, src=src, loop=self.loop))

    # accesses -----------------------------------------------------------------
    def access(self, v: JView, index: list[Aff]) -> Access:
        base_shape = self.tensors[v.base].shape
        if v.is_full(base_shape) and v.base not in self.flat:
            return Access(v.base, tuple(index))
        if v.base not in self.flat:
            shaped = _shaped(v, base_shape, index)
            if shaped is not None:              # a transpose, broadcast or slice of the base
                return Access(v.base, shaped)
        flat = Aff.of(v.offset)
        for e, n, s in zip(index, v.shape, v.strides):
            if n != 1 and s != 0:
                flat = flat + e * s
        if len(base_shape) == 1 and v.base not in self.flat:
            return Access(v.base, (flat,))
        self.flat.add(v.base)
        return Access(v.base, (flat,))

    # main -----------------------------------------------------------------------
    def run(self) -> LoweredProgram:
        jaxpr = self.closed.jaxpr
        self.read_vars = _read_vars(jaxpr)
        inputs = []
        for var, name, role in zip(jaxpr.invars, self.arg_names, self.roles):
            v = self.new_base(name, *aval_ir(var.aval), role)
            self.env[var] = v
            inputs.append({"name": name, "ir": v.base})
        self._consts(jaxpr.constvars, self.closed.consts)
        for i, eqn in enumerate(jaxpr.eqns):
            name = eqn.primitive.name
            label = eqn.params.get("name", name) if name in CALLS else name
            self._group = (f"e{i}", f"jax.{label}", _src(eqn))
            self.groups.setdefault(f"e{i}", {"name": f"jax.{label}", "src": _src(eqn),
                                             "module": ""})
            if self.phases is not None:
                self.groups[f"e{i}"]["phase"] = self.phases[i]
            self._path = [i]
            self.lower_eqn(eqn)
            for j, var in enumerate(eqn.outvars):     # where each top-level value lives
                v = self.env.get(var)
                if isinstance(v, JView) and isinstance(v.offset, int):
                    self.values[(i, j)] = {"ir": v.base, "shape": list(v.shape),
                                           "strides": list(v.strides), "offset": v.offset,
                                           "primitive": name, "source": _src(eqn)}
        outputs = []
        for var in jaxpr.outvars:
            v = self.read(var)
            if isinstance(v, JView):
                d = self.tensors[v.base]
                if d.role == "intermediate":
                    if v.is_full(d.shape):
                        self.tensors[v.base] = TensorDecl(d.name, d.shape, d.dtype, "output")
                    else:
                        v = self._copy(v, "out", role="output")
                outputs.append({"kind": "output", "ir": v.base, "shape": list(v.shape),
                                "strides": list(v.strides), "offset": v.offset, "target": None})
            else:
                outputs.append({"kind": "output", "ir": None, "value": v, "target": None})
        program = Program(tuple(self.tensors.values()), tuple(self.kernels), tuple(self.notes))
        program = prune_dead(flatten_bases(program, self.flat))
        masks = mask_inputs(program)
        program, partial, dense = refine(program, {st["ir"]: st["value"] for st in self.state
                                                   if st["role"] == "constant"}, masks)
        program = Program(program.tensors, program.kernels, program.notes + tuple(
            runtime_mask_notes(program, noted=program.notes)))
        for t in dense:
            program = Program(program.tensors, program.kernels, program.notes + (
                f"assumption: mask {t} is known before the run but is not an affine region: "
                f"the work it masks is counted dense",))
        low = LoweredProgram(program, self.unsupported, outputs, inputs, self.state,
                             self.groups, rules_used=self.rules_used, partial=partial)
        low.branch_assumed = self.branch_assumed
        low.mask_inputs = masks             # validation draws them as masks that keep all
        low.random_draws = {t: v for t, v in self.random_draws.items() if t in program.tensor_map}
        low.draws_unreplayable = self.draws_unreplayable
        low.loop_carries = {i: {**c, "carries": [t if t in program.tensor_map else None
                                                 for t in c["carries"]]}
                            for i, c in self.loop_carries.items()}
        low.values = {k: v for k, v in self.values.items() if v["ir"] in program.tensor_map}
        return low

    def _consts(self, constvars, consts) -> None:
        for var, val in zip(constvars, consts):
            arr = np.asarray(val)
            if arr.ndim == 0:
                self.env[var] = arr.item()
                continue
            v = self.new_base("const", arr.shape, ir_dtype(arr.dtype), "constant")
            self.env[var] = v
            self.state.append({"target": v.base, "ir": v.base, "role": "constant", "value": arr})

    def read(self, atom):
        from jax.extend.core import Literal
        if isinstance(atom, Literal):
            val = np.asarray(atom.val)
            return val.item() if val.ndim == 0 else self._literal_array(val)
        return self.env[atom]

    def _literal_array(self, arr):
        v = self.new_base("lit", arr.shape, ir_dtype(arr.dtype), "constant")
        self.state.append({"target": v.base, "ir": v.base, "role": "constant", "value": arr})
        return v

    def lower_eqn(self, eqn) -> None:
        name = eqn.primitive.name
        if name in CALLS:
            self._inline(eqn)
            return
        if name == "cond":
            self._cond(eqn)
            return
        if name in ("scan", "while"):
            try:
                (self._scan if name == "scan" else self._while)(eqn)
                self.rules_used.add(name)
                return
            except JaxLoweringError as e:
                self.unsupported.append(Unsupported(f"jax.{name}", _src(eqn) or self._group[2],
                                                    str(e), name))
                self._opaque(eqn, [self.read(a) for a in eqn.invars], "scan")
                return
        args = [self.read(a) for a in eqn.invars]
        if args and not any(isinstance(a, JView) for a in args) \
                and all(v.aval.shape == () for v in eqn.outvars) and not eqn.primitive.multiple_results:
            # scalars from literals only (a switch index clamped): folded now, by JAX itself
            try:
                val = eqn.primitive.bind(*args, **eqn.params)
                self.env[eqn.outvars[0]] = np.asarray(val).item()
                return
            except Exception:  # noqa: BLE001 - not foldable: lowered as usual
                pass
        fn = RULES.get(name)
        reason = "no lowering rule"
        if fn is not None:
            n_k, n_t = len(self.kernels), dict(self.tensors)
            try:
                ctx = Ctx(self, eqn, args)
                ctx.params = _key_params(eqn)
                fn(ctx)
                self.rules_used.add(name)
                return
            except JaxLoweringError as e:
                reason = str(e)
                del self.kernels[n_k:]
                self.tensors = n_t
        if _AGENT.get() is not None:
            done, why = self._translate(eqn, args)
            if done:
                return
            reason += f"; {why}" if why else ""
        self.unsupported.append(Unsupported(f"jax.{name}", _src(eqn) or self._group[2],
                                            reason, name))
        self._opaque(eqn, args, name)

    def _opaque(self, eqn, args: list, name: str) -> None:
        """An equation no rule lowers: one ``opaque`` library kernel per output
        (``ir/library.py``) reading every operand and writing the output at their sizes,
        with no arithmetic, both kept in DRAM; its work is named, its traffic counted."""
        from ...ir.model import Call
        views = [a for a in args if isinstance(a, JView)]
        for v in views:
            decl = self.tensors[v.base]
            if decl.role == "intermediate":
                self.tensors[v.base] = TensorDecl(decl.name, decl.shape, decl.dtype, "output")
        ctx = Ctx(self, eqn, args)
        for i, var in enumerate(eqn.outvars):
            out = self.new_base(f"{name}_unsupported", *aval_ir(var.aval), "output")
            dims = [(f"d{j}", n) for j, n in enumerate(out.shape)]
            accs = []
            for a, v in enumerate(views):
                dims += [(f"a{a}_{j}", n) for j, n in enumerate(v.shape)]
                accs.append(ctx.load(v, [Aff.var(f"a{a}_{j}") for j in range(v.ndim)]))
            body = (Const(0) if not accs else accs[0] if len(accs) == 1
                    else Call("operands", tuple(accs)))
            ctx.emit_library(out, dims, [Aff.var(f"d{j}") for j in range(out.ndim)], body,
                             ("opaque", (("op", f"jax.{name}"), ("cost", i == 0))))
            self.env[var] = out

    def _translate(self, eqn, args: list) -> tuple[bool, str]:
        """The agent's validated IR for ``eqn`` (``frontends/jax/agent.py``) spliced in its
        place: (spliced, why not)."""
        from ..agent.splice import inline
        from .agent import target_of
        agent = _AGENT.get()
        target = target_of(eqn, _src(eqn) or self._group[2])
        if target is None or not all(isinstance(a, JView) for a in args):
            return False, ""
        tr = agent.translate(target)
        if not tr.accepted:
            last = tr.feedback[-1]["feedback"] if tr.feedback else "no reply"
            return False, f"the agent's IR did not validate: {last}"
        if self.loop is not None and any(k.loop for k in tr.program.kernels):
            return False, "the agent's IR has a loop of its own inside a loop"
        ctx = Ctx(self, eqn, args)
        bases = []
        for v in args:                      # strided windows copied into whole tensors
            if v.is_full(self.tensors[v.base].shape) and v.base not in self.flat:
                bases.append(v.base)
                continue
            c = self.new_base("agent_arg", v.shape, v.dtype)
            dims = [(f"d{i}", n) for i, n in enumerate(v.shape)]
            ctx.emit(c, dims, [Aff.var(d) for d, _ in dims],
                     ctx.load(v, [Aff.var(d) for d, _ in dims]))
            bases.append(c.base)
        outs = [ctx.output(i) for i in range(len(eqn.outvars))]
        decls, kernels = inline(tr.program, {o.name: b for o, b in zip(target.inputs, bases)},
                                {o.name: v.base for o, v in zip(target.outputs, outs)},
                                self.fresh, eqn.primitive.name, self._next_loop)
        for d in decls:
            self.tensors[d.name] = d
        loop = self.loop
        for k in kernels:
            if k.loop is not None:
                self.loop = k.loop
            self.add_kernel(k)
            self.loop = loop
        self.groups.setdefault(self._group[0], {"name": self._group[1], "src": self._group[2]})
        self.groups[self._group[0]]["agent"] = {
            "model": agent.model, "target": target.name, "attempts": tr.attempts,
            "cached": tr.cached}
        ctx.bind(*outs)
        return True, ""

    def _next_loop(self) -> int:
        self._loops += 1
        return self._loops

    def _inline(self, eqn) -> None:
        p = eqn.params
        inner = p.get("jaxpr") or p.get("call_jaxpr") or p.get("fun_jaxpr")
        if inner is None:
            raise FrontendError(f"jax.{eqn.primitive.name} without a jaxpr")
        jaxpr = inner.jaxpr if hasattr(inner, "jaxpr") else inner
        args = [self.read(a) for a in eqn.invars]
        # custom_jvp/vjp calls may pass extra (jvp) operands first: bind the trailing ones
        outs = self._lower_sub(inner, args[len(args) - len(jaxpr.invars):])
        for out, v in zip(eqn.outvars, outs):
            self.env[out] = v

    def _lower_sub(self, inner, args: list) -> list:
        """Lower a nested jaxpr (closed or open) with its inputs bound to ``args``; its
        outputs' values."""
        jaxpr = inner.jaxpr if hasattr(inner, "jaxpr") else inner
        if hasattr(inner, "jaxpr"):
            self._consts(jaxpr.constvars, inner.consts)
        for var, a in zip(jaxpr.invars, args):
            self.env[var] = a
        for j, e in enumerate(jaxpr.eqns):
            self._path.append(j)
            try:
                self.lower_eqn(e)
            finally:
                self._path.pop()
        return [self.read(v) for v in jaxpr.outvars]

    def draw(self, out: JView, eqn, index: int | None = None) -> None:
        """``out`` holds a random draw: validation replays what JAX drew at this equation
        (one inside a loop or a branch cannot be replayed: validation says so)."""
        if self._control:
            self.draws_unreplayable = self.draws_unreplayable or (_src(eqn) or self._group[2]
                                                                  or eqn.primitive.name)
        self.random_draws[out.base] = ("/".join(map(str, self._path)), index)

    def _scan(self, eqn) -> None:
        """``lax.scan`` (forward or reversed): a sequential loop in the IR (see ``_loop``)."""
        p = eqn.params
        nc, ncar = p["num_consts"], p["num_carry"]
        args = [self.read(a) for a in eqn.invars]
        outs = self._loop(p["jaxpr"], p["length"], nc, ncar, args[:nc], args[nc:nc + ncar],
                          args[nc + ncar:], bool(p.get("reverse")), _src(eqn) or self._group[2])
        for out, v in zip(eqn.outvars, outs):
            self.env[out] = v

    def _while(self, eqn) -> None:
        """``lax.while_loop`` shaped as ``fori_loop`` (a counter carry compared with ``lt``
        against a bound carried unchanged, incremented by 1 in the body), both ends known
        to the program: a sequential loop of ``upper - lower`` iterations. Any other
        ``while`` has a trip count known only at run time: named, with its condition."""
        p = eqn.params
        cj, bj = p["cond_jaxpr"].jaxpr, p["body_jaxpr"].jaxpr
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        args = [self.read(a) for a in eqn.invars]
        init = args[cn + bn:]
        trips = _fori_trips(cj, bj, cn, bn, init)
        if trips is None:
            raise JaxLoweringError("a while loop whose trip count is known only at run time "
                                   "(not a fori_loop with both ends known to the program): "
                                   "write it as lax.fori_loop with static bounds or lax.scan")
        outs = self._loop(p["body_jaxpr"], trips, bn, len(init), args[cn:cn + bn], init, [],
                          False, _src(eqn) or self._group[2])
        for out, v in zip(eqn.outvars, outs):
            self.env[out] = v

    def _loop(self, closed, length: int, nc: int, ncar: int, consts, init, xs,
              reverse: bool, src: str = "") -> list:
        """A scan body run ``length`` times: the values of its final carries and of its
        stacked outputs. At the top level a sequential loop in the IR, its body lowered
        once: each carry lives in a history tensor ``[length + 1, ...]`` (iteration ``ts``
        reads row ``ts`` and writes row ``ts + 1``), each stacked output in ``[length,
        ...]``; the scanned inputs are read at row ``ts`` (``length - 1 - ts`` reversed).
        Counting multiplies the body by the trip count. Inside another loop the body is
        unrolled (``UNROLL_LIMIT`` iterations at most)."""
        body = closed.jaxpr
        if any(not isinstance(x, JView) for x in xs):
            raise JaxLoweringError("scan over a literal")
        if self.loop is not None:
            return self._unrolled(closed, length, nc, ncar, consts, init, xs, reverse)
        self._consts(body.constvars, closed.consts)
        ts = Aff.var("ts")
        row = Aff.lit(length - 1) - ts if reverse else ts
        hist = []
        for var, c in zip(body.invars[nc:nc + ncar], init):
            shape, dtype = aval_ir(var.aval)
            h = self.new_base("carry", (length + 1,) + shape, dtype)
            row0 = JView(h.base, shape, h.strides[1:], 0, h.dtype)
            self._copy_into(c, row0)
            hist.append(h)
        ys = [self.new_base("ys", (length,) + aval_ir(v.aval)[0], aval_ir(v.aval)[1])
              for v in body.outvars[ncar:]]
        for var, c in zip(body.invars[:nc], consts):
            self.env[var] = c
        for var, h in zip(body.invars[nc:nc + ncar], hist):
            self.env[var] = JView(h.base, h.shape[1:], h.strides[1:], ts * h.strides[0], h.dtype)
        for var, x in zip(body.invars[nc + ncar:], xs):
            self.env[var] = JView(x.base, x.shape[1:], x.strides[1:],
                                  row * x.strides[0] + x.offset, x.dtype)
        self._loops += 1
        self.loop = ("ts", length, self._loops)
        if not self._control:               # not inside a branch: its path names the loop
            self.loop_carries[self._loops] = {
                "path": "/".join(map(str, self._path)), "length": length,
                "carries": [h.base for h in hist], "source": src}
        self._control += 1
        try:
            for inner in body.eqns:
                self.lower_eqn(inner)
            for var, h in zip(body.outvars[:ncar], hist):
                self._copy_into(self.read(var), JView(h.base, h.shape[1:], h.strides[1:],
                                                      (ts + 1) * h.strides[0], h.dtype))
            for var, y in zip(body.outvars[ncar:], ys):
                self._copy_into(self.read(var), JView(y.base, y.shape[1:], y.strides[1:],
                                                      row * y.strides[0], y.dtype))
        finally:
            self.loop = None
            self._control -= 1
        finals = [JView(h.base, h.shape[1:], h.strides[1:], length * h.strides[0], h.dtype)
                  for h in hist]
        return finals + ys

    def _unrolled(self, closed, length, nc, ncar, consts, init, xs, reverse) -> list:
        """A scan nested in another loop, unrolled: its body lowered once per iteration
        (inside the enclosing loop, so still counted times the outer trip count)."""
        if length > UNROLL_LIMIT:
            raise JaxLoweringError(f"a scan of {length} iterations inside another loop "
                                   f"(nested loops are unrolled up to {UNROLL_LIMIT})")
        body = closed.jaxpr
        self._consts(body.constvars, closed.consts)
        ys = [self.new_base("ys", (length,) + aval_ir(v.aval)[0], aval_ir(v.aval)[1])
              for v in body.outvars[ncar:]]
        carries = list(init)
        self._control += 1
        try:
            for it in range(length):
                row = length - 1 - it if reverse else it
                for var, c in zip(body.invars[:nc], consts):
                    self.env[var] = c
                for var, c in zip(body.invars[nc:nc + ncar], carries):
                    self.env[var] = c
                for var, x in zip(body.invars[nc + ncar:], xs):
                    self.env[var] = JView(x.base, x.shape[1:], x.strides[1:],
                                          row * x.strides[0] + x.offset, x.dtype)
                for inner in body.eqns:
                    self.lower_eqn(inner)
                carries = [self.read(v) for v in body.outvars[:ncar]]
                for var, y in zip(body.outvars[ncar:], ys):
                    self._copy_into(self.read(var), JView(y.base, y.shape[1:], y.strides[1:],
                                                          row * y.strides[0], y.dtype))
        finally:
            self._control -= 1
        return carries + ys

    def _cond(self, eqn) -> None:
        """``lax.cond``/``switch``: a branch index known to the program lowers that branch;
        one known only at run time lowers every branch on trial and keeps the cheapest
        (fewest loop-nest points: a lower bound holds whichever branch runs), stated in the
        notes; validation is then skipped (the run takes the branch its data says)."""
        branches = eqn.params["branches"]
        index, *ops = [self.read(a) for a in eqn.invars]

        def lower_branch(i):
            self._control += 1
            try:
                return self._lower_sub(branches[i], ops)
            finally:
                self._control -= 1
        if not isinstance(index, JView):
            chosen = min(max(int(index), 0), len(branches) - 1)
        else:
            costs = []
            for i in range(len(branches)):
                saved = (len(self.kernels), dict(self.tensors), set(self.flat),
                         list(self.state), len(self.unsupported), set(self._names))
                lower_branch(i)
                costs.append(sum(math.prod(n for _, n in k.dims) * (k.loop[1] if k.loop else 1)
                                 for k in self.kernels[saved[0]:]))
                del self.kernels[saved[0]:]
                self.tensors, self.flat, self.state = saved[1], saved[2], saved[3]
                del self.unsupported[saved[4]:]
                self._names = saved[5]
            chosen = min(range(len(branches)), key=lambda i: costs[i])
            self.branch_assumed = True
            self.notes.append(f"assumption: the branch of {'cond' if len(branches) == 2 else 'switch'}"
                              f" at {_src(eqn) or self._group[2]} is known only at run time: the "
                              f"bound takes branch {chosen} of {len(branches)}, the cheapest "
                              f"(loop-nest points per branch: {costs})")
        for out, v in zip(eqn.outvars, lower_branch(chosen)):
            self.env[out] = v

    def _copy_into(self, src, dst: JView) -> None:
        dims = [(f"d{i}", n) for i, n in enumerate(dst.shape)]
        idx = [Aff.var(d) for d, _ in dims]
        body = self.access(src, idx) if isinstance(src, JView) else Const(src)
        if isinstance(src, JView) and src.ndim == 0:
            body = self.access(src, [])
        Ctx(self, None, []).emit(dst, dims, idx, body)

    def _copy(self, v: JView, hint: str, role: str = "intermediate") -> JView:
        out = self.new_base(hint, v.shape, v.dtype, role)
        self._copy_into(v, out)
        return out


UNROLL_LIMIT = 256


def _fori_trips(cond, body, cn: int, bn: int, init: list) -> int | None:
    """The trip count of a ``while`` shaped as ``fori_loop``: the condition is ``lt`` of
    carry ``i`` and carry ``j`` (``j`` returned unchanged by the body, ``i`` returned as
    ``i + 1``), both initial values known to the program; ``None`` otherwise."""
    from jax.extend.core import Literal
    if len(cond.eqns) != 1 or cond.eqns[0].primitive.name != "lt" \
            or cond.outvars[0] is not cond.eqns[0].outvars[0]:
        return None
    carries = list(cond.invars[cn:])
    a, b = cond.eqns[0].invars
    if isinstance(a, Literal) or isinstance(b, Literal) or a not in carries or b not in carries:
        return None
    i, j = carries.index(a), carries.index(b)
    bin_ = list(body.invars[bn:])
    if body.outvars[j] is not bin_[j]:
        return None
    step = next((e for e in body.eqns if body.outvars[i] in e.outvars), None)
    if step is None or step.primitive.name != "add" or step.invars[0] is not bin_[i] \
            or not isinstance(step.invars[1], Literal) or int(step.invars[1].val) != 1:
        return None
    lo, hi = init[i], init[j]
    if isinstance(lo, JView) or isinstance(hi, JView):
        return None
    return max(0, int(hi) - int(lo))


def _key_params(eqn) -> dict:
    """The parameters of a shape primitive applied to a PRNG key array, extended over the
    trailing key-word dimension its IR value has (``aval_ir``)."""
    p = eqn.params
    keys = [v for v in list(eqn.invars) + list(eqn.outvars)
            if _key_shape(getattr(v.aval, "dtype", None)) is not None]
    if not keys:
        return p
    (w,) = _key_shape(keys[0].aval.dtype)
    p = dict(p)
    name = eqn.primitive.name
    if name == "slice":
        p["start_indices"] = tuple(p["start_indices"]) + (0,)
        p["limit_indices"] = tuple(p["limit_indices"]) + (w,)
        if p.get("strides"):
            p["strides"] = tuple(p["strides"]) + (1,)
    elif name == "transpose":
        p["permutation"] = tuple(p["permutation"]) + (len(p["permutation"]),)
    elif name == "broadcast_in_dim":
        p["broadcast_dimensions"] = tuple(p["broadcast_dimensions"]) + (len(p["shape"]),)
        p["shape"] = tuple(p["shape"]) + (w,)
    elif name == "reshape":
        p["new_sizes"] = tuple(p["new_sizes"]) + (w,)
    elif name not in ("squeeze", "expand_dims", "concatenate", "select_n", "copy", "copy_p",
                      "random_bits", "random_split", "random_fold_in", "random_wrap",
                      "random_unwrap", "random_clone", "random_clone_p", "stop_gradient",
                      "optimization_barrier"):
        raise JaxLoweringError(f"{name} of PRNG keys")
    return p


def _read_vars(jaxpr, acc=None):
    """How many times each variable is read (by an equation, or returned), through nested
    jaxprs (a ``Counter``; a variable read nowhere is absent)."""
    from collections import Counter
    from jax.extend.core import Literal
    acc = Counter() if acc is None else acc
    for eqn in jaxpr.eqns:
        for a in eqn.invars:
            if not isinstance(a, Literal):
                acc[a] += 1
        for val in eqn.params.values():
            for sub in (val if isinstance(val, (list, tuple)) else [val]):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    _read_vars(inner, acc)
    acc.update(v for v in jaxpr.outvars if not isinstance(v, Literal))
    return acc




def spmd_body(closed):
    """The program of one device when the whole function is a ``shard_map`` (possibly
    inside ``jit``): ``(body as a closed jaxpr, {mesh axis: size}, {"in_specs", "out_specs"})``;
    ``None`` without a ``shard_map``. A ``shard_map`` that is part of a larger function is
    refused: what runs outside it runs on global arrays, which a per-device program does
    not describe."""
    import jax
    jaxpr, consts = closed.jaxpr, closed.consts
    while (len(jaxpr.eqns) == 1 and jaxpr.eqns[0].primitive.name in ("pjit", "jit")
           and list(jaxpr.eqns[0].invars) == list(jaxpr.invars)
           and list(jaxpr.eqns[0].outvars) == list(jaxpr.outvars)):
        inner = jaxpr.eqns[0].params["jaxpr"]
        jaxpr, consts = inner.jaxpr, inner.consts
    found = _find_shard_map(closed.jaxpr)
    if not found:
        return None
    eq = jaxpr.eqns[0] if len(jaxpr.eqns) == 1 else None
    if (eq is None or eq.primitive.name != "shard_map" or consts
            or list(eq.invars) != list(jaxpr.invars) or list(eq.outvars) != list(jaxpr.outvars)):
        raise FrontendError(f"shard_map at {found}: it must be the whole function (the "
                            f"program each device runs); work outside it on global arrays is "
                            f"not modelled per device")
    mesh = eq.params["mesh"]
    axes = {str(a): int(n) for a, n in dict(mesh.shape).items()}
    body = eq.params["jaxpr"]
    from jax.extend.core import ClosedJaxpr
    closed_body = body if hasattr(body, "consts") else ClosedJaxpr(body, [])
    specs = {"in_specs": [tuple(s) if s is not None else () for s in eq.params["in_specs"]],
             "out_specs": [tuple(s) if s is not None else () for s in eq.params["out_specs"]]}
    return closed_body, axes, specs


def _find_shard_map(jaxpr) -> str:
    for e in jaxpr.eqns:
        if e.primitive.name == "shard_map":
            return _src(e) or "?"
        for v in e.params.values():
            inner = getattr(v, "jaxpr", None)
            if inner is not None and hasattr(inner, "eqns"):
                hit = _find_shard_map(inner)
                if hit:
                    return hit
    return ""


def trace(fn, args, leaf_args: list | None = None) -> tuple[Any, list[str]]:
    """(closed jaxpr, a name per flattened argument leaf) of ``fn(*args)`` on abstract values.
    ``leaf_args``, when given, receives the index of the argument each leaf belongs to."""
    import jax
    leaves, tree = jax.tree_util.tree_flatten_with_path(args)
    abstract = jax.tree_util.tree_map(
        lambda x: x if isinstance(x, jax.ShapeDtypeStruct)
        else jax.ShapeDtypeStruct(np.shape(x), x.dtype if hasattr(x, "dtype")
                                  else np.asarray(x).dtype), args)
    try:
        closed = jax.make_jaxpr(fn)(*abstract)
    except Exception as e:  # noqa: BLE001 - one line for the user
        msg = str(e).strip().splitlines()
        raise FrontendError(f"jax.make_jaxpr failed: {type(e).__name__}: "
                            f"{msg[0] if msg else ''}") from None
    names = []
    for path, _ in leaves:
        if leaf_args is not None:
            leaf_args.append(getattr(path[0], "idx", 0) if path else 0)
        key = "_".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))))
                       for k in path)
        names.append(re.sub(r"\W", "_", key) or "arg")
    return closed, names


def lower(fn, args, train: bool = False, optimizer: str | None = None) -> LoweredProgram:
    """The loop IR of ``fn(*args)`` (``args``: arrays or ``jax.ShapeDtypeStruct`` pytrees).

    ``train=True``: ``fn`` is a training step, ``fn(params, opt_state, *batch)``
    (``frontends/jax/train.py``): parameters and optimizer state get their roles, every
    operator its phase, and ``lowered.training`` the step's gradients and state."""
    from . import rules  # noqa: F401  (registers the rules)
    if not train:
        closed, names = trace(fn, args)
        spmd = spmd_body(closed)
        if spmd is None:
            return JaxLowering(closed, names).run()
        body, mesh, specs = spmd
        low = JaxLowering(body, names)
        low.mesh = mesh
        res = low.run()
        res.world_size = math.prod(mesh.values())
        res.mesh = {"axes": mesh, **specs}
        return res
    import jax
    from . import train as step
    if len(args) < 2:
        raise FrontendError("train=True: a JAX step is called as step(params, opt_state, "
                            "*batch): the first argument holds the parameters, the second "
                            "the optimizer's state")
    which: list = []
    closed, names = trace(fn, args, which)
    closed = step.unwrap(closed)
    jaxpr = closed.jaxpr
    roles = ["parameter" if a == 0 else "buffer" if a == 1 else "input" for a in which]
    phase = step.phases(jaxpr)
    low = JaxLowering(closed, names, roles, phase).run()
    params = [(i, v) for i, (v, a) in enumerate(zip(jaxpr.invars, which)) if a == 0]
    found = step.gradients(jaxpr, phase, [v for _, v in params])
    grads, trained, unused = {}, [], []
    dotted = [_leaf_name(path) for path, _ in jax.tree_util.tree_flatten_with_path(args[0])[0]]
    for pi, (i, _) in enumerate(params):
        name = dotted[pi]
        where = found.get(pi)
        ir = low.values.get(where, {}).get("ir") if where is not None else None
        if ir is None:
            unused.append(name)
            continue
        grads[name] = ir
        trained.append(name)
    state = [spec["ir"] for spec, a in zip(low.inputs, which) if a == 1
             and spec["ir"] in low.program.tensor_map]
    low.training = {"optimizer": optimizer or step.optimizer_name(args[1]),
                    "gradients": grads, "optimizer_state": state, "trained": trained,
                    "stepped": trained, "frozen": [], "unused": unused, "defaults": {}}
    if unused:
        low.program = Program(low.program.tensors, low.program.kernels, low.program.notes + (
            f"the loss does not depend on {', '.join(unused)}: no gradient reaches the "
            f"optimizer (JAX's gradient is zeros, which the step still applies)",))
    return low


def _leaf_name(path) -> str:
    """A parameter's name from its path in the parameters' pytree, dotted as PyTorch
    names parameters (``{"fc1": {"weight": ...}}`` -> ``fc1.weight``)."""
    return ".".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))))
                    for k in path) or "params"


__all__ = ["lower", "trace", "RULES", "rule", "Ctx", "JView", "JaxLoweringError"]
