"""The IR text form: a restricted, executable-looking subset of Python.

``print_program`` and ``parse_program`` are inverses: print, parse, print gives
the same text. The parser reads the text with :func:`ast.parse` (which never
executes anything) and accepts only the node types of the subset below; every
other construct is refused with an :class:`IRSyntaxError` carrying its line.

Example::

    # solbound IR v1
    x = input(f32[4, 8])
    w = parameter(f32[16, 8])
    y = output(f32[4, 16])

    @kernel(b=4, n=16, k=8)
    @origin(op="n1", name="aten.mm", src="model.py:12", unit="matmul")
    def mm_1():
        y[b, n] = sum(x[b, k] * w[n, k])

Body forms (one statement per kernel):

* ``out[i, j] = EXPR`` - a map
* ``out[i, j] = EXPR if GUARD else FILL`` - a map evaluated where ``GUARD`` holds
* ``out[i] = sum(EXPR)`` / ``sum(EXPR, where=GUARD)`` - a reduction over the loop
  variables absent from the output index (also prod, max, min, any, all)
* ``out[i] = argmax(EXPR)`` or ``idx[i], val[i] = argmax(EXPR)`` (and argmin)
* ``out[i, t] = cumsum(EXPR, over=t)`` - an inclusive scan (cumprod, cummax, cummin)
* ``out[idx[i], j] = EXPR`` / ``out[idx[i], j] = sum(EXPR)`` - a scatter: an output index
  read from a tensor; every point overwrites, or combines with (sum, prod, max, min), the
  element it names

A ``GUARD`` is a ``&`` of affine comparisons such as ``(0 <= h + r - 1 < 9)``. A decorator
``@skip(GUARD)`` marks the points where it holds as not work (``Kernel.skip``: the body's
value there is known without its operands).
"""

from __future__ import annotations

import ast
import math
import re

from .affine import Aff, Atom, Guard, quot
from .model import (DTYPE_BYTES, INFIX, PREFIX, REDUCE_OPS, ROLES, SCALAR_OPS, SCAN_OPS,
                    Access, Call, Const, Expr, Idx, Kernel, Program, TensorDecl, index_vars,
                    loop_segments)

HEADER = "# solbound IR v1"
MAX_TEXT = 50_000_000
RESERVED = frozenset(set(SCALAR_OPS) | set(REDUCE_OPS) | set(SCAN_OPS) | set(DTYPE_BYTES)
                     | set(ROLES) | {"kernel", "origin", "skip", "note", "inf", "nan", "where",
                                     "over", "True", "False", "None", "range"})


def fresh_name(hint: str, taken: set[str]) -> str:
    """A new identifier from ``hint`` that is not in ``taken`` (and is added to it): valid
    in the text form, never a loop-variable spelling (``d0``, ``r1``, ``d0h``)."""
    base = re.sub(r"\W", "_", hint).strip("_") or "t"
    if base[0].isdigit() or re.fullmatch(r"[dr]\d+[hl]*", base):
        base = "t_" + base
    name, i = base, 1
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    taken.add(name)
    return name


class IRSyntaxError(ValueError):
    """Text that is not valid IR; ``line`` is 1-based (0 when unknown)."""

    def __init__(self, msg: str, line: int = 0):
        self.line = line
        self.msg = msg
        super().__init__(f"line {line}: {msg}" if line else msg)


# =============================================================================
# printing

_LEVEL = {"or": 2, "xor": 3, "and": 4, "add": 5, "sub": 5, "mul": 6, "div": 6, "mod": 6,
          "floordiv": 6}
_CMP = {"lt", "le", "gt", "ge", "eq", "ne"}


def _fmt_const(v) -> str:
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return repr(float(v))


def _level(e: Expr) -> int:
    if isinstance(e, Call):
        if e.op in _CMP:
            return 1
        if e.op in _LEVEL:
            return _LEVEL[e.op]
        if e.op in PREFIX:
            return 7
        if e.op == "pow":
            return 8
        return 9
    if isinstance(e, Const):
        v = e.value
        return 7 if (not isinstance(v, bool) and v < 0) else 9
    if isinstance(e, Idx):
        if len(e.expr.terms) == 1 and e.expr.const == 0 and e.expr.terms[0][1] == 1:
            return 9
        if len(e.expr.terms) == 1 and e.expr.const == 0:
            return 6 if e.expr.terms[0][1] > 0 else 7
        return 5
    return 9


def _wrap(e: Expr, need: bool) -> str:
    s = print_expr(e)
    return f"({s})" if need else s


def print_index(i) -> str:
    return print_expr(i) if isinstance(i, Access) else str(i)


def print_access(a: Access) -> str:
    if not a.index:
        return f"{a.tensor}[()]"
    return f"{a.tensor}[{', '.join(print_index(i) for i in a.index)}]"


def print_expr(e: Expr) -> str:
    if isinstance(e, Access):
        return print_access(e)
    if isinstance(e, Const):
        return _fmt_const(e.value)
    if isinstance(e, Idx):
        return str(e.expr)
    assert isinstance(e, Call)
    if e.op in INFIX:
        lv = _level(e)
        a, b = e.args
        return f"{_wrap(a, _level(a) < lv or (lv == 1 and _level(a) <= 1))} {INFIX[e.op]} {_wrap(b, _level(b) <= lv)}"
    if e.op in PREFIX:
        (a,) = e.args
        return f"{PREFIX[e.op]}{_wrap(a, _level(a) < 7 or isinstance(a, Const))}"
    if e.op == "pow":
        a, b = e.args
        return f"{_wrap(a, _level(a) <= 8)} ** {_wrap(b, _level(b) < 8)}"
    return f"{e.op}({', '.join(print_expr(a) for a in e.args)})"


def print_guard(g: Guard) -> str:
    return " & ".join(f"({a})" for a in g)


def print_kernel(k: Kernel) -> str:
    dims = ", ".join(f"{d}={n}" for d, n in k.dims)
    lines = [f"@kernel({dims})"]
    if k.lib:
        params = "".join(f", {key}={val!r}" for key, val in k.lib[1])
        lines.append(f"@library(name={_quote(k.lib[0])}{params})")
    meta = [(key, val) for key, val in (("op", k.op), ("name", k.opname), ("src", k.src),
                                        ("unit", k.unit)) if val]
    if meta:
        lines.append("@origin(" + ", ".join(f"{key}={_quote(val)}" for key, val in meta) + ")")
    if k.skip:
        lines.append(f"@skip({print_guard(k.skip)})")
    lines.append(f"def {k.name}():")
    target = print_access(Access(k.out, k.out_index))
    if k.out2 is not None:
        target += ", " + print_access(Access(k.out2, k.out_index))
    body = print_expr(k.body)
    where = f", where={print_guard(k.guard)}" if k.guard else ""
    if k.scan is not None:
        scan_name = {v: s for s, v in SCAN_OPS.items()}[k.reduce]
        rhs = f"{scan_name}({body}, over={k.scan}{where})"
    elif k.reduce is not None:
        rhs = f"{k.reduce}({body}{where})"
    elif k.guard:
        rhs = f"{body} if {print_guard(k.guard)} else {_fmt_const(k.fill)}"
    else:
        rhs = body
    lines.append(f"    {target} = {rhs}")
    return "\n".join(lines)


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def print_program(p: Program) -> str:
    out = [HEADER]
    for n in p.notes:
        out.append(f"note({_quote(n)})")
    for t in p.tensors:
        shape = ", ".join(str(s) for s in t.shape) if t.shape else "()"
        out.append(f"{t.name} = {t.role}({t.dtype}[{shape}])")
    for seg in loop_segments(p.kernels):
        loop = seg[0].loop
        if loop is not None:
            out += ["", f"for {loop[0]} in range({loop[1]}):"]
        for k in seg:
            text = print_kernel(k)
            out += ["", text if loop is None else "\n".join("    " + ln for ln in text.split("\n"))]
    return "\n".join(out) + "\n"


# =============================================================================
# parsing

_BINOPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.Mod: "mod",
           ast.FloorDiv: "floordiv", ast.Pow: "pow", ast.BitAnd: "and", ast.BitOr: "or",
           ast.BitXor: "xor"}
_CMPOPS = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq",
           ast.NotEq: "ne"}


def _err(node: ast.AST | None, msg: str) -> IRSyntaxError:
    return IRSyntaxError(msg, getattr(node, "lineno", 0) or 0)


def _name_ok(node: ast.AST, name: str, what: str) -> str:
    if name.startswith("_"):
        raise _err(node, f"{what} name {name!r} may not start with an underscore")
    if name in RESERVED:
        raise _err(node, f"{what} name {name!r} is reserved")
    return name


class _KernelParser:
    def __init__(self, tensors: dict[str, TensorDecl], dims: dict[str, int]):
        self.tensors = tensors
        self.dims = dims

    # affine ------------------------------------------------------------------
    def aff(self, node: ast.AST, quotients: bool = False) -> Aff:
        """An affine index; ``quotients`` (in a guard): a loop variable's block index
        ``d0//64`` is a term too."""
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return Aff.lit(node.value)
        if quotients and isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv):
            if not (isinstance(node.left, ast.Name) and node.left.id in self.dims
                    and isinstance(node.right, ast.Constant) and type(node.right.value) is int
                    and node.right.value > 1):
                raise _err(node, "a guard divides a loop variable by an integer above 1 "
                                 "only (d0//64: its block index)")
            return Aff.var(quot(node.left.id, node.right.value))
        if isinstance(node, ast.Name):
            if node.id not in self.dims:
                raise _err(node, f"{node.id!r} is not a loop dimension of this kernel "
                                 f"(declared: {', '.join(self.dims) or 'none'})")
            return Aff.var(node.id)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -self.aff(node.operand, quotients)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            a, b = self.aff(node.left, quotients), self.aff(node.right, quotients)
            return a + b if isinstance(node.op, ast.Add) else a - b
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            a, b = self.aff(node.left, quotients), self.aff(node.right, quotients)
            if a.is_const:
                return b * a.const
            if b.is_const:
                return a * b.const
            raise _err(node, "an index may multiply a loop variable by an integer only")
        raise _err(node, "an index must be affine in the loop variables "
                         "(integers, loop variables, +, -, * by an integer) or a tensor access")

    def try_aff(self, node: ast.AST) -> Aff | None:
        try:
            return self.aff(node)
        except IRSyntaxError:
            return None

    # guards -------------------------------------------------------------------
    def guard(self, node: ast.AST) -> Guard:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitAnd):
            return self.guard(node.left) + self.guard(node.right)
        if not isinstance(node, ast.Compare):
            raise _err(node, "a guard is a '&' of affine comparisons, e.g. (0 <= h - 1 < 8)")
        terms = [self.aff(x, quotients=True) for x in [node.left, *node.comparators]]
        ops = node.ops
        if (len(ops) == 2 and all(isinstance(o, (ast.Lt, ast.LtE)) for o in ops)
                and terms[0].is_const and terms[2].is_const):
            lo = terms[0].const + (1 if isinstance(ops[0], ast.Lt) else 0)
            hi = terms[2].const + (1 if isinstance(ops[1], ast.LtE) else 0)
            return (Atom(terms[1], lo, hi),)
        atoms: list[Atom] = []
        for a, op, b in zip(terms, ops, terms[1:]):
            if isinstance(op, (ast.Gt, ast.GtE)):
                a, b = b, a
                op = ast.Lt() if isinstance(op, ast.Gt) else ast.LtE()
            strict = 1 if isinstance(op, ast.Lt) else 0
            if isinstance(op, ast.Eq):
                if b.is_const:
                    atoms.append(Atom(a, b.const, b.const + 1))
                else:
                    atoms.append(Atom(b - a, 0, 1))
                continue
            if not isinstance(op, (ast.Lt, ast.LtE)):
                raise _err(node, "guards use <, <=, >, >= and == only")
            if a.is_const:
                atoms.append(Atom(b, a.const + strict, None))
            elif b.is_const:
                atoms.append(Atom(a, None, b.const + 1 - strict))
            else:
                atoms.append(Atom(b - a, strict, None))
        return tuple(atoms)

    # expressions -----------------------------------------------------------------
    def access(self, node: ast.Subscript) -> Access:
        if not isinstance(node.value, ast.Name):
            raise _err(node, "only a named tensor can be indexed")
        name = node.value.id
        if name not in self.tensors:
            raise _err(node, f"unknown tensor {name!r}")
        sl = node.slice
        if isinstance(sl, ast.Tuple):
            elts = list(sl.elts)
        else:
            elts = [sl]
        if len(elts) == 1 and isinstance(elts[0], ast.Tuple) and not elts[0].elts:
            elts = []
        rank = len(self.tensors[name].shape)
        if len(elts) != rank:
            raise _err(node, f"{name} has rank {rank} but is indexed with {len(elts)} indices")
        idx: list = []
        for el in elts:
            if isinstance(el, ast.Subscript):
                inner = self.access(el)
                if self.tensors[inner.tensor].dtype not in ("i64", "i32", "u32", "i16", "i8", "u8", "bool"):
                    raise _err(el, f"indirect index {inner.tensor} must have an integer dtype")
                idx.append(inner)
            else:
                idx.append(self.aff(el))
        return Access(name, tuple(idx))

    def expr(self, node: ast.AST) -> Expr:
        a = self.try_aff(node)
        if a is not None and not isinstance(node, ast.Constant):
            return Idx(a) if not a.is_const else Const(a.const)
        if isinstance(node, ast.Constant):
            if type(node.value) in (int, float, bool):
                return Const(node.value)
            raise _err(node, f"constant {node.value!r} is not a number")
        if isinstance(node, ast.Name):
            if node.id == "inf":
                return Const(math.inf)
            if node.id == "nan":
                return Const(math.nan)
            if node.id in self.tensors:
                raise _err(node, f"tensor {node.id!r} must be indexed")
            raise _err(node, f"unknown name {node.id!r}")
        if isinstance(node, ast.Subscript):
            return self.access(node)
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.USub):
                inner = self.expr(node.operand)
                if isinstance(inner, Const) and not isinstance(inner.value, bool) \
                        and isinstance(node.operand, (ast.Constant, ast.Name)):
                    return Const(-inner.value)
                return Call("neg", (inner,))
            if isinstance(node.op, ast.Invert):
                return Call("not", (self.expr(node.operand),))
            raise _err(node, "unsupported unary operator")
        if isinstance(node, ast.BinOp):
            op = _BINOPS.get(type(node.op))
            if op is None:
                raise _err(node, "unsupported binary operator")
            return Call(op, (self.expr(node.left), self.expr(node.right)))
        if isinstance(node, ast.Compare):
            if len(node.ops) != 1:
                raise _err(node, "chained comparisons are only allowed in guards")
            op = _CMPOPS[type(node.ops[0])]
            return Call(op, (self.expr(node.left), self.expr(node.comparators[0])))
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name):
                raise _err(node, "only scalar ops can be called (no attribute access)")
            fn = node.func.id
            if fn in REDUCE_OPS or fn in SCAN_OPS:
                raise _err(node, f"{fn}(...) must be the whole right-hand side")
            if fn not in SCALAR_OPS or fn in INFIX or fn in PREFIX:
                raise _err(node, f"{fn!r} is not a scalar op "
                                 f"(allowed: {', '.join(sorted(k for k in SCALAR_OPS if k not in INFIX and k not in PREFIX and not k.startswith('to_')))}, to_<dtype>)")
            if node.keywords:
                raise _err(node, f"{fn} takes no keyword arguments")
            arity = SCALAR_OPS[fn][0]
            if arity >= 0 and len(node.args) != arity:
                raise _err(node, f"{fn} takes {arity} operands, got {len(node.args)}")
            return Call(fn, tuple(self.expr(a) for a in node.args))
        raise _err(node, f"{type(node).__name__} is not allowed in an IR expression")

    # statement -----------------------------------------------------------------
    def target(self, node: ast.AST) -> Access:
        if not isinstance(node, ast.Subscript):
            raise _err(node, "the kernel must assign to an indexed tensor")
        return self.access(node)


def _parse_kernel(fn: ast.FunctionDef, tensors: dict[str, TensorDecl],
                  seen_out: set[str], loop: tuple[str, int, int] | None = None) -> Kernel:
    name = _name_ok(fn, fn.name, "kernel")
    if fn.args.args or fn.args.vararg or fn.args.kwarg or fn.args.kwonlyargs \
            or fn.args.posonlyargs or fn.returns is not None:
        raise _err(fn, f"kernel {name} must take no arguments")
    dims: dict[str, int] = {}
    meta: dict[str, str] = {}
    lib: tuple = ()
    seen_dec: set[str] = set()
    skip_node = None
    for dec in fn.decorator_list:
        if isinstance(dec, ast.Call) and isinstance(dec.func, ast.Name) \
                and dec.func.id == "skip":
            if len(dec.args) != 1 or dec.keywords:
                raise _err(dec, "@skip(CONDITION): one condition over the loop dimensions")
            if skip_node is not None:
                raise _err(dec, "duplicate @skip")
            skip_node = dec.args[0]
            continue
        if not (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Name)
                and dec.func.id in ("kernel", "origin", "library") and not dec.args):
            raise _err(dec, "decorators are @kernel(dim=extent, ...), @library(name=..., ...), "
                            "@origin(...) and @skip(CONDITION) only")
        if dec.func.id in seen_dec:
            raise _err(dec, f"duplicate @{dec.func.id}")
        seen_dec.add(dec.func.id)
        if dec.func.id == "library":
            lib = _parse_library(dec)
            continue
        for kw in dec.keywords:
            if kw.arg is None:
                raise _err(dec, "no ** in decorators")
            if dec.func.id == "kernel":
                if not (isinstance(kw.value, ast.Constant) and type(kw.value.value) is int
                        and kw.value.value >= 1):
                    raise _err(kw.value, f"extent of {kw.arg} must be a positive integer")
                if kw.arg in tensors:
                    raise _err(dec, f"dimension {kw.arg!r} shadows a tensor")
                dims[_name_ok(dec, kw.arg, "dimension")] = kw.value.value
            else:
                if kw.arg not in ("op", "name", "src", "unit"):
                    raise _err(dec, f"unknown @origin field {kw.arg!r}")
                if not (isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str)):
                    raise _err(kw.value, f"@origin {kw.arg} must be a string")
                meta[kw.arg] = kw.value.value
    if "kernel" not in seen_dec:
        raise _err(fn, f"{name} lacks @kernel(...)")
    if len(fn.body) != 1 or not isinstance(fn.body[0], ast.Assign):
        raise _err(fn, f"kernel {name}: the body is exactly one assignment")
    stmt = fn.body[0]
    if len(stmt.targets) != 1:
        raise _err(stmt, "one assignment target")
    if loop is not None and loop[0] in dims:
        raise _err(fn, f"kernel {name}: dimension {loop[0]!r} is the enclosing loop's variable")
    kp = _KernelParser(tensors, dims if loop is None else {**dims, loop[0]: loop[1]})
    skip = kp.guard(skip_node) if skip_node is not None else ()
    tgt = stmt.targets[0]
    outs = [kp.target(t) for t in tgt.elts] if isinstance(tgt, ast.Tuple) else [kp.target(tgt)]
    if len(outs) > 2:
        raise _err(stmt, "at most two outputs (argmax/argmin)")
    for o in outs:
        if tensors[o.tensor].role in ("input", "parameter", "buffer", "constant", "assumed"):
            raise _err(stmt, f"tensor {o.tensor} is a {tensors[o.tensor].role} and cannot be written")
    if len(outs) == 2 and outs[0].index != outs[1].index:
        raise _err(stmt, "both outputs must use the same index")
    rhs = stmt.value
    reduce = scan = None
    guard: Guard = ()
    fill: float | int | bool = 0
    if isinstance(rhs, ast.Call) and isinstance(rhs.func, ast.Name) \
            and (rhs.func.id in REDUCE_OPS or rhs.func.id in SCAN_OPS):
        fname = rhs.func.id
        if len(rhs.args) != 1:
            raise _err(rhs, f"{fname} takes one expression")
        body = kp.expr(rhs.args[0])
        for kw in rhs.keywords:
            if kw.arg == "where":
                guard = kp.guard(kw.value)
            elif kw.arg == "over" and fname in SCAN_OPS:
                if not (isinstance(kw.value, ast.Name) and kw.value.id in dims):
                    raise _err(kw.value, "over= names a loop dimension")
                scan = kw.value.id
            else:
                raise _err(rhs, f"{fname} takes no keyword {kw.arg!r}")
        if fname in SCAN_OPS:
            if scan is None:
                raise _err(rhs, f"{fname} needs over=<dimension>")
            reduce = SCAN_OPS[fname]
        else:
            reduce = fname
    elif isinstance(rhs, ast.IfExp):
        body = kp.expr(rhs.body)
        guard = kp.guard(rhs.test)
        f = kp.expr(rhs.orelse)
        if not isinstance(f, Const):
            raise _err(rhs.orelse, "the else-branch of a guarded map is a constant")
        fill = f.value
    else:
        body = kp.expr(rhs)
    if len(outs) == 2 and reduce not in ("argmax", "argmin"):
        raise _err(stmt, "only argmax/argmin write two outputs")
    if lib and (len(outs) != 1 or reduce is not None or guard):
        raise _err(stmt, f"kernel {name}: a library kernel is 'out[...] = operands(...)'")
    scatter = any(o.indirect for o in outs)
    if scatter and (len(outs) != 1 or guard or scan is not None
                    or reduce not in (None, "sum", "prod", "max", "min")):
        raise _err(stmt, f"kernel {name}: a scatter (indirect output index) is "
                         f"'out[...] = EXPR' or 'out[...] = sum|prod|max|min(EXPR)', unguarded")
    if scatter and outs[0].tensor not in seen_out \
            and tensors[outs[0].tensor].role not in ("input", "buffer"):
        raise _err(stmt, f"kernel {name}: scatters into {outs[0].tensor} before it is written")
    out_vars = {v for i in outs[0].index for v in index_vars(i)}
    if (reduce is None or scan is not None) and not scatter and not lib:
        missing = [d for d in dims if d not in out_vars]
        if missing:
            raise _err(stmt, f"kernel {name}: loop dimension(s) {', '.join(missing)} do not appear "
                             f"in the output index; wrap the body in a reduction (sum, max, ...)")
    for o in outs:
        seen_out.add(o.tensor)
    return Kernel(name=name, dims=tuple(dims.items()), out=outs[0].tensor,
                  out_index=outs[0].index, body=body, reduce=reduce, guard=guard, fill=fill,
                  scan=scan, out2=outs[1].tensor if len(outs) == 2 else None,
                  op=meta.get("op", ""), opname=meta.get("name", ""), src=meta.get("src", ""),
                  unit=meta.get("unit", ""), loop=loop, lib=lib, skip=skip)


def _parse_library(dec: ast.Call) -> tuple:
    """``@library(name="sort", dim=1, ...)``: the routine and its parameters (literals)."""
    from .library import ROUTINES
    name, params = None, []
    for kw in dec.keywords:
        if kw.arg is None:
            raise _err(dec, "no ** in decorators")
        try:
            val = ast.literal_eval(kw.value)
        except ValueError:
            raise _err(kw.value, f"@library {kw.arg} must be a literal") from None
        if kw.arg == "name":
            name = val
        else:
            params.append((kw.arg, val))
    if not isinstance(name, str) or name not in ROUTINES:
        raise _err(dec, f"unknown library routine {name!r} (known: {', '.join(sorted(ROUTINES))})")
    return (name, tuple(params))


def _parse_loop(stmt: ast.For, tensors: dict[str, TensorDecl], lid: int) -> tuple[str, int, int]:
    """``for VAR in range(N):`` over kernels: a sequential loop (e.g. time steps)."""
    if stmt.orelse or getattr(stmt, "type_comment", None):
        raise _err(stmt, "a loop has no else-branch")
    if not isinstance(stmt.target, ast.Name):
        raise _err(stmt, "a loop variable is one name")
    it = stmt.iter
    if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"
            and len(it.args) == 1 and not it.keywords and isinstance(it.args[0], ast.Constant)
            and type(it.args[0].value) is int and it.args[0].value >= 1):
        raise _err(stmt, "loops are `for VAR in range(N)` with a positive integer N")
    var = _name_ok(stmt, stmt.target.id, "loop variable")
    if var in tensors:
        raise _err(stmt, f"loop variable {var!r} shadows a tensor")
    return (var, it.args[0].value, lid)


def _parse_tensor(stmt: ast.Assign) -> TensorDecl:
    if len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name):
        raise _err(stmt, "a tensor declaration is NAME = role(dtype[shape])")
    name = _name_ok(stmt, stmt.targets[0].id, "tensor")
    call = stmt.value
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
            and call.func.id in ROLES and len(call.args) == 1 and not call.keywords):
        raise _err(stmt, f"a tensor declaration is NAME = role(dtype[shape]) with role one of "
                         f"{', '.join(ROLES)}")
    ty = call.args[0]
    if not (isinstance(ty, ast.Subscript) and isinstance(ty.value, ast.Name)
            and ty.value.id in DTYPE_BYTES):
        raise _err(ty, f"unknown dtype; use one of {', '.join(DTYPE_BYTES)}")
    sl = ty.slice
    elts = sl.elts if isinstance(sl, ast.Tuple) else [sl]
    if len(elts) == 1 and isinstance(elts[0], ast.Tuple) and not elts[0].elts:
        elts = []
    shape = []
    for el in elts:
        if not (isinstance(el, ast.Constant) and type(el.value) is int and el.value >= 0):
            raise _err(el, "shape entries are non-negative integers")
        shape.append(el.value)
    return TensorDecl(name, tuple(shape), ty.value.id, call.func.id)


def parse_program(text: str) -> Program:
    """Parse IR text; raises :class:`IRSyntaxError` naming the offending line."""
    if len(text) > MAX_TEXT:
        raise IRSyntaxError(f"IR text larger than {MAX_TEXT} characters")
    try:
        tree = ast.parse(text, mode="exec")
    except SyntaxError as e:  # the text is not even Python
        raise IRSyntaxError(f"not valid IR syntax: {e.msg}", e.lineno or 0) from None
    except (RecursionError, MemoryError, ValueError):
        raise IRSyntaxError("IR text nests too deeply or is malformed") from None
    tensors: dict[str, TensorDecl] = {}
    kernels: list[Kernel] = []
    notes: list[str] = []
    seen_out: set[str] = set()
    names: set[str] = set()
    n_loops = 0
    try:
        for stmt in tree.body:
            if isinstance(stmt, ast.Assign):
                if kernels:
                    raise _err(stmt, "tensor declarations come before the kernels")
                t = _parse_tensor(stmt)
                if t.name in tensors:
                    raise _err(stmt, f"tensor {t.name} declared twice")
                tensors[t.name] = t
            elif isinstance(stmt, ast.FunctionDef):
                k = _parse_kernel(stmt, tensors, seen_out)
                if k.name in names:
                    raise _err(stmt, f"kernel {k.name} defined twice")
                names.add(k.name)
                kernels.append(k)
            elif isinstance(stmt, ast.For):
                loop = _parse_loop(stmt, tensors, n_loops)
                n_loops += 1
                for fn in stmt.body:
                    if not isinstance(fn, ast.FunctionDef):
                        raise _err(fn, "a loop body holds @kernel functions only")
                    k = _parse_kernel(fn, tensors, seen_out, loop)
                    if k.name in names:
                        raise _err(fn, f"kernel {k.name} defined twice")
                    names.add(k.name)
                    kernels.append(k)
            elif (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
                  and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id == "note"
                  and len(stmt.value.args) == 1 and not stmt.value.keywords
                  and isinstance(stmt.value.args[0], ast.Constant)
                  and isinstance(stmt.value.args[0].value, str)):
                notes.append(stmt.value.args[0].value)
            else:
                raise _err(stmt, f"{type(stmt).__name__} is not allowed in IR text "
                                 f"(only tensor declarations, note(...) and @kernel functions)")
    except RecursionError:
        raise IRSyntaxError("IR text nests too deeply") from None
    prog = Program(tuple(tensors.values()), tuple(kernels), tuple(notes))
    from .check import check_program
    check_program(prog)
    return prog
