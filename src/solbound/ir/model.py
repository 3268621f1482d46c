"""The loop IR data model: tensors, scalar expressions, kernels, programs.

This module knows nothing about any framework. A :class:`Program` is an ordered
list of :class:`Kernel` over named :class:`TensorDecl`. A kernel is a perfect
loop nest over named dimensions with static extents; it writes one output
(an argmax-style reduction may carry a second), its body is a scalar
expression tree over affine (or marked-indirect) accesses, and it either maps,
reduces over the dimensions missing from its output index, or scans along one
dimension.
"""

from __future__ import annotations

import functools

import math
from dataclasses import dataclass, field, replace
from typing import Iterator, Union

from .affine import Aff, Atom, Guard

# ----------------------------------------------------------------------------
# dtypes

DTYPE_BYTES: dict[str, int] = {
    "f64": 8, "f32": 4, "f16": 2, "bf16": 2,
    # 8-bit floats (OCP e4m3fn and e5m2; the fnuz variants of AMD's MI300; e8m0, the
    # power-of-two scales of MX formats) and a byte holding two fp4 e2m1 values (its tensors'
    # shapes count bytes: packed storage is read at its stored size)
    "f8e4m3": 1, "f8e5m2": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "f8e8m0": 1, "f4e2m1x2": 1,
    "i64": 8, "i32": 4, "u32": 4, "i16": 2, "u16": 2, "i8": 1, "u8": 1, "bool": 1,
    "c64": 8, "c128": 16,
}
# formats narrower than 16 bits, by their ml_dtypes name (the executor rounds a conversion
# to one of them onto its grid, as the hardware does)
LOW_FLOATS = {"f8e4m3": "float8_e4m3fn", "f8e5m2": "float8_e5m2",
              "f8e4m3fnuz": "float8_e4m3fnuz", "f8e5m2fnuz": "float8_e5m2fnuz",
              "f8e8m0": "float8_e8m0fnu"}
FLOAT_DTYPES = frozenset({"f64", "f32", "f16", "bf16"} | set(LOW_FLOATS))

ROLES = ("input", "parameter", "buffer", "constant", "assumed", "intermediate", "output")
# roles whose values exist before the program's kernels run. ``assumed``: values the run
# computes from its routing decisions (which tokens go to which expert), fixed by a stated
# assumption and held like constants; the run computes them on chip, so the fused bound
# does not load them from DRAM (``analysis/counts.py``)
EXTERNAL_ROLES = frozenset({"input", "parameter", "buffer", "constant", "assumed"})
# external roles whose storage is in DRAM before the program starts
DRAM_ROLES = frozenset({"input", "parameter", "buffer", "constant"})


@dataclass(frozen=True)
class TensorDecl:
    name: str
    shape: tuple[int, ...]
    dtype: str
    role: str = "intermediate"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"tensor {self.name}: unknown dtype {self.dtype!r}")
        if self.role not in ROLES:
            raise ValueError(f"tensor {self.name}: unknown role {self.role!r}")

    # computed once per declaration (the analyses ask millions of times); a frozen
    # dataclass keeps its fields, the cache lives in the instance's __dict__
    @functools.cached_property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @functools.cached_property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


# ----------------------------------------------------------------------------
# scalar ops: name -> (arity, execution unit). ``None`` unit means no arithmetic
# (a type conversion); every other op is one FLOP on its unit.

VECTOR, SPECIAL, MATRIX = "vector", "special", "matrix"

SCALAR_OPS: dict[str, tuple[int, str | None]] = {
    # arithmetic (infix in the text form)
    "add": (2, VECTOR), "sub": (2, VECTOR), "mul": (2, VECTOR), "div": (2, VECTOR),
    "neg": (1, VECTOR), "mod": (2, VECTOR), "floordiv": (2, VECTOR),
    # comparisons and logic (infix)
    "lt": (2, VECTOR), "le": (2, VECTOR), "gt": (2, VECTOR), "ge": (2, VECTOR),
    "eq": (2, VECTOR), "ne": (2, VECTOR), "and": (2, VECTOR), "or": (2, VECTOR),
    "xor": (2, VECTOR), "not": (1, VECTOR),
    # named vector functions
    "maximum": (2, VECTOR), "minimum": (2, VECTOR), "abs": (1, VECTOR),
    "select": (3, VECTOR), "floor": (1, VECTOR), "ceil": (1, VECTOR),
    "round": (1, VECTOR), "trunc": (1, VECTOR), "sign": (1, VECTOR),
    "fma": (3, VECTOR), "isnan": (1, VECTOR),
    # a uniform [0, 1) draw per point (random number generation): not reproducible
    # against the framework's generator; validation replays the framework's draws. Its
    # operands (a PRNG key, a seed) are read, not used: they order the draw after them
    "rand": (-1, VECTOR),
    # bits: a right shift (of the integer's int64 value: logical for a non-negative one,
    # arithmetic for a negative one), a left shift (wrapped to the result's width when
    # written); the float32 whose IEEE bits are the low 32 bits of an integer (no
    # arithmetic: a reinterpretation)
    "shr": (2, VECTOR), "shl": (2, VECTOR), "bitcast_f32": (1, None),
    # special functions (transcendentals; one special-function-unit op each)
    "exp": (1, SPECIAL), "exp2": (1, SPECIAL), "log": (1, SPECIAL), "log2": (1, SPECIAL),
    "log1p": (1, SPECIAL), "expm1": (1, SPECIAL), "tanh": (1, SPECIAL),
    "erf": (1, SPECIAL), "sqrt": (1, SPECIAL), "rsqrt": (1, SPECIAL),
    "recip": (1, SPECIAL), "sigmoid": (1, SPECIAL), "sin": (1, SPECIAL),
    "cos": (1, SPECIAL), "pow": (2, SPECIAL), "atan": (1, SPECIAL),
    "erfinv": (1, SPECIAL), "acos": (1, SPECIAL), "asin": (1, SPECIAL),
    # complex numbers from and to their parts (data movement, no arithmetic)
    "complex": (2, None), "real": (1, None), "imag": (1, None),
    # the operands of a library routine (``Kernel.lib``): any number, no arithmetic
    "operands": (-1, None),
}
# special functions with a hardware special-function-unit instruction (one each, at
# least); the others (erf, atan, erfinv) are polynomial code on the vector pipe
SFU_OPS = frozenset({"exp", "exp2", "log", "log2", "log1p", "expm1", "tanh", "sqrt", "rsqrt",
                     "recip", "sigmoid", "sin", "cos", "pow"})
# type conversions: ``to_f32(x)`` etc.
for _dt in DTYPE_BYTES:
    SCALAR_OPS[f"to_{_dt}"] = (1, None)

INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "mod": "%", "floordiv": "//",
         "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!=",
         "and": "&", "or": "|", "xor": "^"}
PREFIX = {"neg": "-", "not": "~"}

REDUCE_OPS = {"sum": 0.0, "prod": 1.0, "max": -math.inf, "min": math.inf,
              "any": False, "all": True, "argmax": None, "argmin": None}
SCAN_OPS = {"cumsum": "sum", "cumprod": "prod", "cummax": "max", "cummin": "min"}

# ----------------------------------------------------------------------------
# expressions


@dataclass(frozen=True)
class Access:
    """``tensor[index...]``. An index is affine in the loop variables or, when
    data-dependent, another :class:`Access` (an indirect access)."""

    tensor: str
    index: tuple[Union[Aff, "Access"], ...]

    @property
    def indirect(self) -> bool:
        return any(isinstance(i, Access) for i in self.index)


@dataclass(frozen=True)
class Const:
    value: float | int | bool


@dataclass(frozen=True)
class Idx:
    """The value of an affine combination of loop variables (e.g. ``i - j``)."""

    expr: Aff


@dataclass(frozen=True)
class Call:
    op: str
    args: tuple["Expr", ...]

    def __post_init__(self) -> None:
        if self.op not in SCALAR_OPS:
            raise ValueError(f"unknown scalar op {self.op!r}")
        arity = SCALAR_OPS[self.op][0]
        if arity >= 0 and len(self.args) != arity:
            raise ValueError(f"{self.op} takes {arity} operands, got {len(self.args)}")


Expr = Union[Access, Const, Idx, Call]


def walk(e: Expr) -> Iterator[Expr]:
    """Pre-order traversal, including accesses nested in indirect indices."""
    yield e
    if isinstance(e, Call):
        for a in e.args:
            yield from walk(a)
    elif isinstance(e, Access):
        for i in e.index:
            if isinstance(i, Access):
                yield from walk(i)


def accesses(e: Expr) -> list[Access]:
    return [x for x in walk(e) if isinstance(x, Access)]


def index_vars(i: "Aff | Access") -> tuple[str, ...]:
    """Loop variables of one index entry (through the indices of an indirect one)."""
    if isinstance(i, Access):
        return tuple(v for j in i.index for v in index_vars(j))
    return i.vars


def subst_index(index: tuple, mapping: dict[str, Aff]) -> tuple:
    return tuple(subst_expr(i, mapping) if isinstance(i, Access) else i.subst(mapping)
                 for i in index)


def kernel_reads(k: "Kernel") -> list[Access]:
    """Every access a kernel reads: its body's, the index tensors of a scatter's output
    position and, for a scatter that combines (``index_add_``), the output elements it
    updates (read, combined, written back)."""
    out = accesses(k.body)
    if k.scatter:
        for i in k.out_index:
            if isinstance(i, Access):
                out.extend(accesses(i))
        if k.reduce is not None:
            out.append(Access(k.out, k.out_index))
    return out


def unpicked(body: Expr, picked, index: list, axis: int, i: int, fill: float) -> Expr:
    """Pass ``i`` of a top-k selection by repeated arg-max (PyTorch's ``topk``, JAX's
    ``top_k``): ``body`` (the candidate at reduction variable ``r0``) or ``fill`` where an
    earlier pass ``p < i`` already picked ``r0``; ``picked(index)`` loads the indices
    tensor at ``index`` (``index`` with ``axis`` set to ``p``)."""
    taken = None
    for p in range(i):
        pi = list(index)
        pi[axis] = Aff.lit(p)
        c = Call("eq", (picked(pi), Idx(Aff.var("r0"))))
        taken = c if taken is None else Call("or", (taken, c))
    return body if taken is None else Call("select", (taken, Const(fill), body))


def subst_expr(e: Expr, mapping: dict[str, Aff]) -> Expr:
    """Substitute loop variables by affine expressions everywhere in ``e``."""
    if isinstance(e, Access):
        return Access(e.tensor, tuple(subst_expr(i, mapping) if isinstance(i, Access)
                                      else i.subst(mapping) for i in e.index))
    if isinstance(e, Idx):
        return Idx(e.expr.subst(mapping))
    if isinstance(e, Call):
        return Call(e.op, tuple(subst_expr(a, mapping) for a in e.args))
    return e


def map_accesses(e: Expr, fn) -> Expr:
    """``e`` with every access ``x`` replaced by ``fn(x)`` (indices of nested accesses
    rewritten first)."""
    if isinstance(e, Access):
        idx = tuple(map_accesses(i, fn) if isinstance(i, Access) else i for i in e.index)
        return fn(Access(e.tensor, idx))
    if isinstance(e, Call):
        return Call(e.op, tuple(map_accesses(a, fn) for a in e.args))
    return e


def map_kernel_accesses(k: "Kernel", fn, **kw) -> "Kernel":
    """``k`` with every access it reads or writes replaced by ``fn(access)`` (see
    :func:`map_accesses`), and the fields ``kw`` changed."""
    out = map_accesses(Access(k.out, k.out_index), fn)
    return replace(k, out=out.tensor, out_index=out.index, body=map_accesses(k.body, fn), **kw)


def rename_tensors(e: Expr, mapping: dict[str, str]) -> Expr:
    if isinstance(e, Access):
        return Access(mapping.get(e.tensor, e.tensor),
                      tuple(rename_tensors(i, mapping) if isinstance(i, Access) else i
                            for i in e.index))
    if isinstance(e, Call):
        return Call(e.op, tuple(rename_tensors(a, mapping) for a in e.args))
    return e


# ----------------------------------------------------------------------------
# kernels and programs


@dataclass(frozen=True)
class Kernel:
    """One perfect loop nest writing ``out[out_index]``.

    * ``reduce`` is ``None`` (a map: every point writes its own element), a
      reduction op (``sum``, ``max``, ..., ``argmax``) over the dimensions that do
      not appear in ``out_index``, or a scan op (``cumsum``, ...) along ``scan``.
    * ``guard`` restricts the points that evaluate the body. For a reduction the
      other points contribute nothing; for a map they write ``fill``.
    * ``skip`` (a conjunction of atoms, empty for none) marks guarded points that are not
      work: there the body's value is known without its operands (a reduction's identity,
      or a map's constant: the keys a prefix-LM masks, ``-inf`` before the softmax and 0
      after it), so no kernel needs to compute them. Executing them changes nothing
      (the IR is run as if ``skip`` were empty); counting leaves them out. It lets the work
      be a union of regions (the guard minus one conjunction) where a guard alone is
      one region.
    * ``out2`` is the second output of ``argmax``/``argmin`` (the value).
    * ``lib = (routine, ((param, value), ...))`` makes a **library** kernel: a routine with
      no affine loop nest (a sort, an FFT, a factorization; ``ir/library.py``) computes the
      whole of ``out`` from the tensors its body reads, ``operands(a[...], b[...])``, each
      access covering what the routine reads (so footprints stay exact). ``dims`` index
      those accesses and ``out`` (identity); the routine's work is its documented
      convention, not the loop nest's points.
    * A kernel whose ``out_index`` holds an indirect entry (an :class:`Access`, e.g.
      ``out[idx[i], j]``) is a **scatter**: every point of the loop nest writes its own
      element at a position read from a tensor. ``reduce`` is then how the value combines
      with what the output already holds (``None``: overwrite; ``sum``: accumulate, as
      ``index_add_``/``scatter_add``; ``max``, ``min``, ``prod``); the output must have
      been written before (a copy of the tensor updated). A scatter has no guard.
    * ``op``/``opname``/``src`` name the framework operator this kernel belongs to
      (kernels sharing ``op`` are one library call), ``unit`` is a hint of the
      class of contraction (``matmul``, ``conv``, ``attention``) used by the
      precision policy.
    """

    name: str
    dims: tuple[tuple[str, int], ...]
    out: str
    out_index: tuple[Aff, ...]
    body: Expr
    reduce: str | None = None
    guard: Guard = ()
    fill: float | int | bool = 0
    scan: str | None = None
    out2: str | None = None
    op: str = ""
    opname: str = ""
    src: str = ""
    unit: str = ""
    # the sequential loop this kernel runs in: (variable, trip count, loop id). Kernels
    # sharing a loop id form one loop body, executed in order for each iteration; the
    # variable may appear in the kernel's indices and guards (e.g. a time step).
    loop: tuple[str, int, int] | None = None
    lib: tuple = ()
    skip: Guard = ()

    @property
    def extents(self) -> dict[str, int]:
        return dict(self.dims)

    @property
    def count_extents(self) -> dict[str, int]:
        """The loop nest for counting: the enclosing sequential loop's variable first."""
        if self.loop is None:
            return dict(self.dims)
        return {self.loop[0]: self.loop[1], **dict(self.dims)}

    def bind_loop(self, value: int) -> "Kernel":
        """This kernel for one iteration of its sequential loop."""
        v = self.loop[0]
        sub = {v: Aff.lit(value)}
        return replace(self, loop=None, out_index=subst_index(self.out_index, sub),
                       body=subst_expr(self.body, sub),
                       guard=tuple(Atom(a.expr.subst(sub), a.lo, a.hi) for a in self.guard),
                       skip=tuple(Atom(a.expr.subst(sub), a.lo, a.hi) for a in self.skip))

    @property
    def library(self) -> bool:
        """A library routine (see the class doc)."""
        return bool(self.lib)

    @property
    def lib_params(self) -> dict:
        return dict(self.lib[1]) if self.lib else {}

    @property
    def scatter(self) -> bool:
        """The output index is data-dependent (see the class doc)."""
        return any(isinstance(a, Access) for a in self.out_index)

    @property
    def out_vars(self) -> set[str]:
        return set(self._out_vars)

    @functools.cached_property
    def _out_vars(self) -> frozenset[str]:
        return frozenset(v for a in self.out_index for v in index_vars(a))

    @property
    def reduce_vars(self) -> tuple[str, ...]:
        if self.reduce is None or self.scan is not None or self.scatter or self.lib:
            return ()
        used = self.out_vars
        return tuple(d for d, _ in self.dims if d not in used)

    @property
    def outputs(self) -> tuple[str, ...]:
        return (self.out,) if self.out2 is None else (self.out, self.out2)

    def inputs(self) -> list[Access]:
        return kernel_reads(self)

    def with_(self, **kw) -> "Kernel":
        return replace(self, **kw)


def loop_private(kernels) -> set[str]:
    """Tensors a sequential loop's body writes afresh in every iteration: one writer, in
    the loop, indexed without the loop variable, and not read in the loop before it is
    written (nothing carries over from the previous iteration). Facts and demanded regions
    of such a tensor hold in every iteration, as for a kernel outside any loop."""
    writers: dict[str, int] = {}
    for k in kernels:
        for o in k.outputs:
            writers[o] = writers.get(o, 0) + 1
    private: set[str] = set()
    for seg in loop_segments(kernels):
        if seg[0].loop is None:
            continue
        var = seg[0].loop[0]
        written: set[str] = set()
        for k in seg:
            early = {a.tensor for a in kernel_reads(k)} - written
            for o in k.outputs:
                if writers.get(o) == 1 and var not in k.out_vars and o not in early:
                    private.add(o)
            written.update(k.outputs)
        # read before its writer in the body: carried from the previous iteration
        for i, k in enumerate(seg):
            for a in kernel_reads(k):
                if any(a.tensor in w.outputs for w in seg[i:]):
                    private.discard(a.tensor)
    return private


def per_iteration_loops(kernels) -> set[tuple[str, int, int]]:
    """Sequential loops whose body holds several framework operators, each called once per
    iteration (a rerolled stack of layers: its unrolled copies were separate eager calls).
    A loop that is one operator (an LSTM, a JAX ``scan``) is one library call."""
    ops: dict[tuple, set] = {}
    for k in kernels:
        if k.loop is not None:
            ops.setdefault(k.loop, set()).add(k.op or k.name)
    return {lp for lp, o in ops.items() if len(o) > 1}


def loop_segments(kernels) -> list[list[Kernel]]:
    """Kernels in program order, grouped: one sequential loop's body (consecutive kernels
    sharing its loop id) is one segment, every other kernel a segment of its own."""
    segments: list[list[Kernel]] = []
    for k in kernels:
        if k.loop is not None and segments and segments[-1][0].loop is not None \
                and segments[-1][0].loop[2] == k.loop[2]:
            segments[-1].append(k)
        else:
            segments.append([k])
    return segments


@dataclass(frozen=True)
class Program:
    tensors: tuple[TensorDecl, ...]
    kernels: tuple[Kernel, ...]
    # free-form notes the frontend attaches (assumptions, e.g. indirect traffic)
    notes: tuple[str, ...] = field(default=())

    @functools.cached_property
    def tensor_map(self) -> dict[str, TensorDecl]:
        """Name -> declaration, built once per program (passes ask for it per kernel;
        rebuilding it each time made lowering quadratic in the program's size). Do not
        modify it: a program is immutable."""
        return {t.name: t for t in self.tensors}

    def by_role(self, *roles: str) -> list[TensorDecl]:
        return [t for t in self.tensors if t.role in roles]
