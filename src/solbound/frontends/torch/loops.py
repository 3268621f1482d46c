"""Python loops over steps, captured as one ``scan`` instead of unrolled.

Tracing runs a Python ``for`` loop: a loop over 2048 time steps (transformers' Mamba
slow path, any hand-written recurrence) becomes 2048 copies of its body in the graph,
each exported, decomposed, lowered and counted again. While a program is exported,
the functions its modules call are rewritten so that such a loop becomes
``torch._higher_order_ops.scan``: one body, traced once, that the lowering turns into a
sequential loop of the IR (``rules/control.py``). Counts are the body's times the trip
count, as for the unrolled loop.

A loop qualifies when it reads, statically (the AST of the function's source):

* ``for i in range(n):`` with a body of plain assignments to names and
  ``acc.append(expr)``, and no ``break``, ``continue``, ``return``, ``yield``, ``del``,
  ``global``/``nonlocal``, assignment to attributes or subscripts, augmented assignment
  or other expression statements (a call made for its effect);
* the loop variable used only as one index of a loop-invariant tensor,
  ``x[:, :, i]`` or ``x[:, i, :]`` (every other entry a whole ``:``), which becomes the
  scanned input ``x.movedim(k, 0)``;
* names the body reads before it assigns them are the carries; names it assigns
  otherwise are private to one iteration and must not be read after the loop (nor may
  the loop variable);
* every accumulator is a list the same function makes empty before the loop and reads
  after it only as ``torch.stack(acc, dim)``, ``torch.cat(acc, dim)`` (which become a
  view or a reshape of the stacked rows) or ``len(acc)``;
* liveness, accumulators and the rest are checked on every path control can take after
  the loop (the next pass of an enclosing loop, an exception handler).

and, when it runs (:func:`scan_loop`): the carries and the indexed tensors are tensors,
each indexed tensor is ``n`` long on its indexed dimension, the accumulators are empty
lists, and the scan traces (a carry that changes dtype or shape, a data-dependent branch
in the body). Otherwise the original loop runs, unrolled, and :data:`NOTES` says why.
"""

from __future__ import annotations

import ast
import contextlib
import contextvars
import copy
import inspect
import os
import types
from dataclasses import dataclass

import torch

# one line per loop that was left unrolled at run time (why), or rewritten
NOTES: list[str] = []
# the source line (``file:line``) of each loop that became a scan, in tracing order
SOURCES: list[str] = []

_PREFIX = "__sb_"


class _Refuse(Exception):
    """This loop does not have the shape a scan needs (the message says why)."""


# ============================================================================
# static analysis of one loop


def _names(node, ctx) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)}


def _is_colon(e) -> bool:
    return isinstance(e, ast.Slice) and e.lower is None and e.upper is None and e.step is None


def _invariant_expr(e, assigned: set[str]) -> bool:
    """A name or an attribute chain on a name the loop body does not assign."""
    while isinstance(e, ast.Attribute):
        e = e.value
    return isinstance(e, ast.Name) and e.id not in assigned


@dataclass
class _Loop:
    carries: list[str]
    accs: list[str]
    xs: list[tuple[str, int]]          # (source of the indexed expression, dimension)
    body: list[ast.stmt]               # with subscripts and appends replaced


def _analyze(loop: ast.For, paths: list[list[ast.stmt]]) -> _Loop:
    if not isinstance(loop.target, ast.Name):
        raise _Refuse("the loop variable is not a name")
    var = loop.target.id
    it = loop.iter
    if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"
            and len(it.args) == 1 and not it.keywords):
        raise _Refuse("not a loop over range(n)")
    if loop.orelse:
        raise _Refuse("the loop has an else clause")
    assigned: set[str] = set()
    accs: list[str] = []
    for st in loop.body:
        for n in ast.walk(st):
            if isinstance(n, (ast.Break, ast.Continue, ast.Return, ast.Yield, ast.YieldFrom,
                              ast.Await, ast.Delete, ast.Global, ast.Nonlocal, ast.AugAssign,
                              ast.AnnAssign, ast.With, ast.Try, ast.Raise, ast.Assert,
                              ast.FunctionDef, ast.Lambda, ast.ClassDef, ast.Import,
                              ast.ImportFrom, ast.NamedExpr)):
                raise _Refuse(f"the body has a {type(n).__name__.lower()} statement")
        if isinstance(st, ast.Assign):
            for t in st.targets:
                for n in ast.walk(t):
                    if isinstance(n, (ast.Attribute, ast.Subscript, ast.Starred)):
                        raise _Refuse("the body assigns to an attribute or subscript")
                assigned |= _names(t, ast.Store)
        elif isinstance(st, ast.Expr):
            c = st.value
            if (isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                    and c.func.attr == "append" and isinstance(c.func.value, ast.Name)
                    and len(c.args) == 1 and not c.keywords):
                accs.append(c.func.value.id)
            elif not isinstance(c, ast.Constant):
                raise _Refuse("the body calls a function for its effect")
        elif isinstance(st, (ast.If, ast.For)):
            # Python-level control flow, evaluated when the body is traced; a name it
            # assigns is not surely assigned in every iteration
            for n in ast.walk(st):
                if isinstance(n, ast.Expr) and not isinstance(n.value, ast.Constant):
                    raise _Refuse("the body calls a function for its effect")
                if isinstance(n, (ast.Name, ast.Attribute, ast.Subscript)) \
                        and isinstance(n.ctx, ast.Store):
                    raise _Refuse(f"the body assigns inside a nested {type(st).__name__.lower()}")
        elif not isinstance(st, ast.Pass):
            raise _Refuse(f"the body has a {type(st).__name__.lower()} statement")
    if var in assigned:
        raise _Refuse("the body assigns the loop variable")
    for st in loop.body:
        for n in ast.walk(st):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) \
                    and n.func.attr.endswith("_") and not n.func.attr.endswith("__"):
                raise _Refuse(f"the body updates a tensor in place (.{n.func.attr})")
    if len(set(accs)) != len(accs) or set(accs) & assigned:
        raise _Refuse("an accumulator is appended twice or reassigned in the body")
    for a in accs:
        uses = sum(1 for st in loop.body for n in ast.walk(st)
                   if isinstance(n, ast.Name) and n.id == a)
        if uses != 1:
            raise _Refuse(f"the body uses the list {a} other than appending to it")
    # carries: read (at the top level, in order) before the body assigns them
    carries: list[str] = []
    done: set[str] = set()
    for st in loop.body:
        for n in _names(st, ast.Load):
            if n in assigned and n not in done and n not in carries:
                carries.append(n)
        if isinstance(st, ast.Assign):
            done |= {n for t in st.targets for n in _names(t, ast.Store)}
    # names private to one iteration (and the loop variable) are dead after the loop
    for name in (assigned - set(carries)) | {var}:
        if any(_live_after(name, after) for after in paths):
            raise _Refuse(f"{name} is assigned in the body and read after the loop")
    # the loop variable only as one index of a loop-invariant tensor
    xs: list[tuple[str, int]] = []
    body = [_Indexer(var, assigned, xs).visit(copy.deepcopy(st)) for st in loop.body]
    if any(n.id == var for st in body for n in ast.walk(st) if isinstance(n, ast.Name)):
        raise _Refuse(f"the loop variable {var} is used other than as one index of a tensor")
    if not xs:
        raise _Refuse("the body indexes no tensor by the step")
    ys = iter(range(len(accs)))
    body = [_Appends(accs, ys).visit(st) for st in body]
    return _Loop(carries, accs, xs, body)


def _is_stack_of(node, name: str) -> bool:
    """``torch.stack(name, ...)``/``torch.cat(name, ...)`` (positional or ``dim=``), or
    ``len(name)``."""
    if not isinstance(node, ast.Call) or not node.args or not isinstance(node.args[0], ast.Name) \
            or node.args[0].id != name:
        return False
    f = node.func
    if isinstance(f, ast.Name) and f.id == "len" and len(node.args) == 1 and not node.keywords:
        return True
    return (isinstance(f, ast.Attribute) and f.attr in ("stack", "cat")
            and isinstance(f.value, ast.Name) and f.value.id == "torch" and len(node.args) <= 2
            and all(k.arg == "dim" for k in node.keywords))


def _check_accumulators(accs: list[str], before: list[ast.stmt],
                        paths: list[list[ast.stmt]]) -> None:
    """Each accumulator is a list this block makes empty before the loop (``acc = []``, not
    a list the caller passed or aliased since) and is read after the loop only as
    ``torch.stack(acc, d)``, ``torch.cat(acc, d)`` or ``len(acc)``: what the stacked rows
    replace exactly."""
    for a in accs:
        made = None
        for j, st in enumerate(before):
            if isinstance(st, ast.Assign) and len(st.targets) == 1 \
                    and isinstance(st.targets[0], ast.Name) and st.targets[0].id == a:
                made = j if isinstance(st.value, ast.List) and not st.value.elts else None
        if made is None:
            raise _Refuse(f"the list {a} is not made empty in this function before the loop")
        if any(isinstance(n, ast.Name) and n.id == a for st in before[made + 1:]
               for n in ast.walk(st)):
            raise _Refuse(f"the list {a} is used between its creation and the loop")
        for after in paths:
            for st in after:
                ok = {id(n.args[0]) for n in ast.walk(st) if _is_stack_of(n, a)}
                # an assignment reads its value and any subscript or attribute target
                value = [st.value] + [t for t in st.targets if not isinstance(t, ast.Name)] \
                    if isinstance(st, ast.Assign) else [st]
                if any(isinstance(n, ast.Name) and n.id == a and id(n) not in ok
                       for v in value for n in ast.walk(v)):
                    raise _Refuse(f"the list {a} is used after the loop other than by "
                                  f"torch.stack, torch.cat or len")
                if isinstance(st, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == a for t in st.targets):
                    break                       # bound again: the rows are not read after


def _over_range(loop: ast.For) -> bool:
    it = loop.iter
    return isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"


def _live_after(name: str, after: list[ast.stmt]) -> bool:
    """Is ``name`` read in ``after`` before it is assigned again (conservatively)?"""
    for st in after:
        if isinstance(st, ast.For) and name in _names(st.target, ast.Store) \
                and name not in _names(st.iter, ast.Load):
            return False               # a loop that binds the name first (its variable)
        loads = name in _names(st, ast.Load)
        if isinstance(st, ast.Assign) and not loads:
            if name in {n for t in st.targets for n in _names(t, ast.Store)}:
                return False
            continue
        if loads or isinstance(st, (ast.AugAssign,)) and name in _names(st, ast.Store):
            return True
        if isinstance(st, (ast.Return, ast.Raise)):
            return False
    return False


class _Indexer(ast.NodeTransformer):
    """``x[:, :, i]`` -> the scanned row ``__sb_x{j}`` (``x.movedim(2, 0)`` scanned)."""

    def __init__(self, var: str, assigned: set[str], xs: list):
        self.var, self.assigned, self.xs = var, assigned, xs

    def visit_Subscript(self, node):
        node = self.generic_visit(node)
        if not isinstance(node.ctx, ast.Load) or not _invariant_expr(node.value, self.assigned):
            return node
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        at = [k for k, e in enumerate(items) if isinstance(e, ast.Name) and e.id == self.var]
        if len(at) != 1 or not all(_is_colon(e) for k, e in enumerate(items) if k != at[0]):
            return node
        key = (ast.unparse(node.value), at[0])
        if key not in self.xs:
            self.xs.append(key)
        return ast.copy_location(ast.Name(f"{_PREFIX}x{self.xs.index(key)}", ast.Load()), node)


class _Appends(ast.NodeTransformer):
    """``acc.append(e)`` -> ``__sb_y{j} = e``."""

    def __init__(self, accs: list[str], ys):
        self.accs, self.ys = accs, ys

    def visit_Expr(self, node):
        c = node.value
        if (isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                and c.func.attr == "append" and isinstance(c.func.value, ast.Name)
                and c.func.value.id in self.accs):
            j = self.accs.index(c.func.value.id)
            return ast.copy_location(
                ast.Assign([ast.Name(f"{_PREFIX}y{j}", ast.Store())], c.args[0]), node)
        return node


# ============================================================================
# rewriting a function


def _tuple(names: list[str], ctx) -> ast.expr:
    return ast.Tuple([ast.Name(n, ctx()) for n in names], ctx())


class _Rewriter(ast.NodeTransformer):
    def __init__(self, file: str, qualname: str, first: int):
        self.file, self.qualname, self.first = file, qualname, first
        self.count = 0
        self.notes = 0
        self.refused: list[str] = []

    def _block(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for i, st in enumerate(stmts):
            if isinstance(st, ast.For):
                try:
                    # statements after the loop, in this block (conservative: a name read
                    # later in an enclosing block is seen by the continuation check below)
                    paths = [stmts[i + 1:] + p for p in self._continuation]
                    lp = _analyze(st, paths)
                    _check_accumulators(lp.accs, stmts[:i], paths)
                except _Refuse as e:
                    self.refused.append(f"line {st.lineno + self.first - 1}: {e}")
                    if _over_range(st):     # said when it runs: one line per loop
                        out.append(self._unrolled_note(st, str(e)))
                else:
                    out.extend(self._scan(st, lp))
                    continue
            out.append(self._visit_children(st, stmts[i + 1:]))
        return out

    # the ways control can go on after the current block: one list of statements each
    _continuation: list[list[ast.stmt]] = [[]]

    def _visit_children(self, st, after):
        saved = self._continuation
        # inside a loop, the loop's own body runs again after any statement in it (a name
        # private to an inner scan may be read at the top of the next pass); a handler or
        # a finally block may run after any statement of its try
        again = list(st.body) if isinstance(st, (ast.For, ast.While, ast.AsyncFor)) else []
        if isinstance(st, ast.Try):
            again = [x for h in st.handlers for x in h.body] + list(st.finalbody)
        self._continuation = [list(after) + p for p in saved] + \
            ([again + list(after) + p for p in saved] if again else [])
        try:
            for field in ("body", "orelse", "finalbody"):
                block = getattr(st, field, None)
                if isinstance(block, list) and block and isinstance(block[0], ast.stmt) \
                        and not isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                ast.ClassDef)):
                    setattr(st, field, self._block(block))
            if isinstance(st, ast.Try):
                for h in st.handlers:
                    h.body = self._block(h.body)
        finally:
            self._continuation = saved
        return st

    def _where(self, loop: ast.For) -> str:
        return f"{self.file}:{loop.lineno + self.first - 1} ({self.qualname})"

    def _unrolled_note(self, loop: ast.For, why: str) -> ast.stmt:
        self.notes += 1
        st = ast.parse(f"__import__('solbound.frontends.torch.loops', fromlist=['unrolled'])"
                       f".unrolled({self._where(loop)!r}, {why!r})").body[0]
        for n in ast.walk(st):
            if "lineno" in n._attributes:
                ast.copy_location(n, loop)
        return st

    def _scan(self, loop: ast.For, lp: _Loop) -> list[ast.stmt]:
        k = self.count
        self.count += 1
        body_name, res = f"{_PREFIX}body{k}", f"{_PREFIX}r{k}"
        carries_in = f"{_PREFIX}c"
        rows = f"{_PREFIX}xs"
        ys = [f"{_PREFIX}y{j}" for j in range(len(lp.accs))]
        head = []
        if lp.carries:
            head.append(ast.Assign([_tuple(lp.carries, ast.Store)], ast.Name(carries_in, ast.Load())))
        if lp.xs:
            head.append(ast.Assign([_tuple([f"{_PREFIX}x{j}" for j in range(len(lp.xs))],
                                           ast.Store)], ast.Name(rows, ast.Load())))
        ret = ast.Return(ast.Tuple([_tuple(lp.carries, ast.Load), _tuple(ys, ast.Load)],
                                   ast.Load()))
        fn = ast.FunctionDef(
            name=body_name,
            args=ast.arguments(posonlyargs=[], args=[ast.arg(carries_in), ast.arg(rows)],
                               kwonlyargs=[], kw_defaults=[], defaults=[]),
            body=head + lp.body + [ret], decorator_list=[], returns=None, type_params=[])
        call = ast.parse(
            f"{res} = __import__('solbound.frontends.torch.loops', fromlist=['scan_loop'])"
            f".scan_loop({body_name}, {ast.unparse(loop.iter)}, "
            f"({', '.join(lp.carries)}{',' if len(lp.carries) == 1 else ''}), "
            f"({''.join(f'({src}, {d}), ' for src, d in lp.xs)}), "
            f"({''.join(f'{a}, ' for a in lp.accs)}), "
            f"{self._where(loop)!r})").body[0]
        unpack = ast.Assign([ast.Tuple([_tuple(lp.carries, ast.Store), _tuple(lp.accs, ast.Store)],
                                       ast.Store())], ast.Name(res, ast.Load()))
        guard = ast.If(ast.Compare(ast.Name(res, ast.Load()), [ast.Is()], [ast.Constant(None)]),
                       [loop], [unpack])
        out = [fn, call, guard]
        for st in out:
            ast.copy_location(st, loop)
            for n in ast.walk(st):
                if not hasattr(n, "lineno") and "lineno" in n._attributes:
                    ast.copy_location(n, loop)
        return out


class _Stacks(ast.NodeTransformer):
    """``torch.stack(acc, d)`` / ``torch.cat(acc, d)`` of an accumulator -> the helpers."""

    def __init__(self, accs: set[str]):
        self.accs = accs

    def visit_Call(self, node):
        node = self.generic_visit(node)
        f = node.func
        if (isinstance(f, ast.Attribute) and f.attr in ("stack", "cat")
                and isinstance(f.value, ast.Name) and f.value.id == "torch" and node.args
                and isinstance(node.args[0], ast.Name) and node.args[0].id in self.accs):
            helper = ast.parse(f"__import__('solbound.frontends.torch.loops', "
                               f"fromlist=['{f.attr}']).{f.attr}").body[0].value
            return ast.copy_location(ast.Call(helper, node.args, node.keywords), node)
        return node


_CACHE: dict[types.CodeType, types.CodeType | None] = {}


def rewritten(fn: types.FunctionType) -> types.CodeType | None:
    """The code of ``fn`` with its qualifying loops as scans; None when it has none (or its
    source cannot be read or recompiled to the same closure)."""
    code = fn.__code__
    if code in _CACHE:
        return _CACHE[code]
    _CACHE[code] = None
    try:
        lines, first = inspect.getsourcelines(fn)
        src = "".join(lines)
        # a method's source parsed at its own indentation (under ``if 1:``), not dedented:
        # dedenting would change its docstring, a constant of the code
        nested = src[:1].isspace()
        tree = ast.parse("if 1:\n" + src if nested else src)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    if nested:
        tree.body = tree.body[0].body
        ast.increment_lineno(tree, -1)
    fdef = tree.body[0] if tree.body else None
    if not isinstance(fdef, ast.FunctionDef) or fdef.name != code.co_name:
        return None
    fdef.decorator_list = []
    # the source must be the code that runs (not a file edited since it was imported)
    same = _compiled(copy.deepcopy(fdef), fn, first)
    if same is None or _signature_of(same) != _signature_of(code):
        return None
    rw = _Rewriter(os.path.basename(code.co_filename), fn.__qualname__, first)
    fdef.body = rw._block(fdef.body)
    if not rw.count and not rw.notes:
        return None
    accs = {n for st in ast.walk(fdef) if isinstance(st, ast.Call)
            for n in _scan_accs(st)}
    _Stacks(accs).visit(fdef)
    new = _compiled(fdef, fn, first)
    _CACHE[code] = new
    return new


def _signature_of(c: types.CodeType) -> tuple:
    """What a recompiled function must share with the loaded one: its names, variables,
    constants and lines (the bytecode itself can differ between compiling a whole file and
    one function)."""
    consts = tuple(k if not isinstance(k, types.CodeType) else _signature_of(k)
                   for k in c.co_consts)
    return (c.co_names, c.co_varnames, c.co_freevars, c.co_cellvars, consts,
            c.co_argcount, c.co_kwonlyargcount,
            tuple(sorted({ln for _, _, ln in c.co_lines() if ln is not None}))[1:])
    # (the first line is the decorator's in a decorated function, the def's once recompiled)


def _compiled(fdef: ast.FunctionDef, fn: types.FunctionType, first: int):
    """``fdef`` compiled as ``fn`` was: inside a class of its class's name (private names
    mangled, ``super()`` and ``__class__`` as in the original), inside a function binding
    the original's free variables (so the code closes over the same cells in the same
    order), at the original's line numbers. None when that does not give the same free
    variables."""
    code = fn.__code__
    free = code.co_freevars
    node: ast.stmt = fdef
    parts = fn.__qualname__.split(".")
    if len(parts) >= 2 and parts[-2] != "<locals>":
        node = ast.ClassDef(name=parts[-2], bases=[], keywords=[], body=[node],
                            decorator_list=[], type_params=[])
    outer_free = [n for n in free if n != "__class__"] if isinstance(node, ast.ClassDef) else free
    if outer_free:
        node = ast.FunctionDef(
            name=f"{_PREFIX}outer",
            args=ast.arguments(posonlyargs=[], args=[ast.arg(n) for n in outer_free],
                               kwonlyargs=[], kw_defaults=[], defaults=[]),
            body=[node, ast.Pass()], decorator_list=[], returns=None, type_params=[])
    module = ast.Module([node], type_ignores=[])
    ast.fix_missing_locations(module)
    ast.increment_lineno(module, first - 1)
    try:
        compiled = compile(module, code.co_filename, "exec")
    except (SyntaxError, ValueError):
        return None

    def find(c: types.CodeType):
        for k in c.co_consts:
            if isinstance(k, types.CodeType):
                if k.co_name == code.co_name:
                    return k
                got = find(k)
                if got is not None:
                    return got
        return None
    new = find(compiled)
    if new is None or new.co_freevars != free:
        return None
    return new


def _scan_accs(call: ast.Call) -> list[str]:
    """The accumulator names of a generated ``scan_loop`` call."""
    if not (isinstance(call.func, ast.Attribute) and call.func.attr == "scan_loop"):
        return []
    accs = call.args[4]
    return [e.id for e in accs.elts if isinstance(e, ast.Name)] if isinstance(accs, ast.Tuple) else []


# ============================================================================
# run time


class Stacked:
    """The rows a scan stacked (``ys[t]`` is what iteration ``t`` appended), in place of
    the list the loop would have built: read only by :func:`stack`, :func:`cat` and
    ``len`` (``_check_accumulators``)."""

    def __init__(self, ys: torch.Tensor):
        self.ys = ys

    def __len__(self) -> int:
        return self.ys.shape[0]


def stack(tensors, dim: int = 0):
    """``torch.stack`` of an accumulator: the stacked rows moved to ``dim`` (the list
    itself when the loop ran unrolled)."""
    if isinstance(tensors, Stacked):
        nd = tensors.ys.dim()
        return tensors.ys.movedim(0, dim if dim >= 0 else nd + dim)
    return torch.stack(tensors, dim)


def cat(tensors, dim: int = 0):
    """``torch.cat`` of an accumulator: the stacked rows merged into ``dim``."""
    if isinstance(tensors, Stacked):
        ys = tensors.ys
        d = dim if dim >= 0 else ys.dim() - 1 + dim
        moved = ys.movedim(0, d)               # [..., n, size_d, ...]
        return moved.reshape(*moved.shape[:d], -1, *moved.shape[d + 2:])
    return torch.cat(tensors, dim)


def unrolled(where: str, why: str) -> None:
    """A loop over ``range`` that is not a scan runs unrolled: said once per call."""
    NOTES.append(f"the Python loop at {where} is unrolled: {why}")


def _same(a, b) -> bool:
    return a is b


def _aliases(a, b) -> bool:
    if a is b:
        return True
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    try:
        return bool(torch._C._is_alias_of(a, b))
    except Exception:  # noqa: BLE001 - a traced value that cannot say: assume it may
        return True


def _closure_tensors(body) -> list:
    out = []
    for cell in body.__closure__ or ():
        try:
            v = cell.cell_contents
        except ValueError:
            continue
        if isinstance(v, torch.Tensor):
            out.append(v)
    return out


_PLAIN = (type(None), bool, int, float, complex, str, torch.dtype, torch.device,
          types.ModuleType, types.BuiltinFunctionType)


def _plain_globals(f: types.FunctionType, depth: int, seen=None) -> bool:
    """Does ``f`` (and, ``depth`` calls deep, the functions it names) read only plain
    globals: no tensor, module or object that may hold one, no closure?"""
    seen = set() if seen is None else seen
    if id(f) in seen:
        return True
    seen.add(id(f))
    for name in _code_names(f.__code__):
        g = f.__globals__.get(name)
        if g is None or isinstance(g, _PLAIN + (type,)):
            continue
        if not isinstance(g, types.FunctionType) or g.__closure__ or depth <= 0 \
                or not _plain_globals(g, depth - 1, seen):
            return False
    return True


def _direct(step, body, init: list, rows: list):
    """``scan_op`` called directly, its body traced by ``make_fx`` rather than compiled by
    TorchDynamo (which ``scan`` does, about 2 s a call): possible when everything the body
    closes over is a tensor (passed as an additional input, the closure's cell pointing at
    the traced value while the body is traced) or a plain value. None otherwise, or when
    the direct call fails (``scan`` then takes the body as it can)."""
    from torch._higher_order_ops.scan import scan_op
    cells = []
    for cell in body.__closure__ or ():
        try:
            v = cell.cell_contents
        except ValueError:          # a name the function has not bound yet
            return None
        if isinstance(v, torch.Tensor):
            cells.append(cell)
        elif not isinstance(v, _PLAIN):
            return None             # an object that may hold tensors (a module, a function)
    if not _plain_globals(body, 3):
        return None
    ncar, nx = len(init), len(rows)

    def flat(*args):
        saved = [c.cell_contents for c in cells]
        for c, v in zip(cells, args[ncar + nx:]):
            c.cell_contents = v
        try:
            nxt, out = step(list(args[:ncar]), list(args[ncar:ncar + nx]))
        finally:
            for c, v in zip(cells, saved):
                c.cell_contents = v
        return [*nxt, *out]
    try:
        res = scan_op(flat, init, rows, tuple(c.cell_contents for c in cells))
    except Exception:  # noqa: BLE001 - e.g. an operator make_fx cannot take here
        return None
    return list(res[:ncar]), list(res[ncar:])


def scan_loop(body, rng, carries: tuple, xs: tuple, accs: tuple, where: str):
    """Run the loop as ``scan``: ``(carries, accumulators)`` after it, or None (the caller
    then runs the original loop) when the values at run time do not allow it."""
    from torch._higher_order_ops.scan import scan

    def refuse(why: str):
        unrolled(where, why)
        return None
    if not isinstance(rng, range) or rng.start != 0 or rng.step != 1:
        return refuse("not a loop over range(n)")
    n = len(rng)
    if n < 2:
        return None
    if not all(isinstance(c, torch.Tensor) for c in carries):
        return refuse("a carry is not a tensor")
    if not all(isinstance(a, list) and not a for a in accs):
        return refuse("an accumulator is not an empty list")
    rows = []
    for x, d in xs:
        if not isinstance(x, torch.Tensor) or x.dim() <= d or x.shape[d] != n:
            return refuse(f"an indexed value is not a tensor {n} long on dimension {d}")
        rows.append(x.movedim(d, 0))
    # a scan's inputs must not share memory (h = h0 with h0 also read in the body, the
    # same tensor as two carries): such an initial carry is copied, once
    held = _closure_tensors(body)
    carries = list(carries)
    for i, c in enumerate(carries):
        if any(_aliases(c, o) for o in carries[:i] + rows + held):
            carries[i] = c.clone()

    def step(c, r):
        nxt, out = body(tuple(c), tuple(r))
        nxt = list(nxt)
        # a carry passed through, swapped or taken from a scanned row would be an output
        # aliasing an input: a copy of it (as the unrolled loop's rebinding costs nothing,
        # this is one more copy per step, only in such bodies). Under TorchDynamo (a body
        # that closes over a module) only the same tensor is recognized.
        seen = list(c) + list(r) + held
        same = _same if torch.compiler.is_compiling() else _aliases
        for i, v in enumerate(nxt):
            if isinstance(v, torch.Tensor) and any(same(v, o) for o in seen + nxt[:i]):
                nxt[i] = v.clone()
        # each row appended is copied, as torch.stack copies it after the unrolled loop
        # (and a scan's outputs must not alias one another)
        return nxt, [y.clone() if isinstance(y, torch.Tensor) else y for y in out]
    try:
        # forward only (the training step traces loops as written): without autograd the
        # scan skips building its joint backward graph, most of its tracing time
        with torch.no_grad():
            direct = _direct(step, body, carries, rows)
            if direct is not None:
                final, ys = direct
            else:
                final, ys = scan(step, carries, rows)
    except Exception as e:  # noqa: BLE001 - a body scan cannot take: the loop runs unrolled
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return refuse(f"scan does not take its body ({type(e).__name__}: {first[:160]})")
    NOTES.append(f"the Python loop at {where} is one scan of {n} iterations")
    SOURCES.append(where.split(" ")[0])
    return tuple(final), tuple(Stacked(y) for y in ys)


# ============================================================================
# which functions a model calls


# packages whose functions are not the program's (a user file is imported as
# ``solbound_user_...``, which is the program's)
_NOT_USERS = frozenset({"torch", "solbound", "numpy", "typing", "functools", "builtins"})


def _functions_of(model) -> list[types.FunctionType]:
    """The Python functions a model's modules may call: their classes' methods and, to a
    depth of three, the module-level functions those name (decorated ones unwrapped)."""
    # the least depth each function was reached at: a function reached first through a
    # wrapper's closure (one deeper) is walked again when its wrapper's ``__wrapped__``
    # reaches it at the wrapper's own depth
    seen: dict[int, int] = {}
    out: list[types.FunctionType] = []
    todo: list[tuple[object, int]] = []
    for m in model.modules():
        for cls in type(m).__mro__:
            if cls.__module__.startswith(("torch.", "builtins")):
                continue
            for v in vars(cls).values():
                todo.append((v, 0))
    while todo:
        f, depth = todo.pop()
        if isinstance(f, (staticmethod, classmethod)):
            f = f.__func__
        if isinstance(f, types.FunctionType) and hasattr(f, "__wrapped__"):
            todo.append((f.__wrapped__, depth))
        if not isinstance(f, types.FunctionType) or seen.get(id(f), depth + 1) <= depth:
            continue
        first = id(f) not in seen
        seen[id(f)] = depth
        mod = getattr(f, "__module__", "") or ""
        if mod.split(".")[0] in _NOT_USERS:
            continue
        if first:
            out.append(f)
        if depth >= 3:
            continue
        for cell in f.__closure__ or ():
            try:
                todo.append((cell.cell_contents, depth + 1))
            except ValueError:
                pass
        for name in _code_names(f.__code__):
            g = f.__globals__.get(name)
            if isinstance(g, types.FunctionType):
                todo.append((g, depth + 1))
            elif _function_object(g):
                # a function wrapped in an object at module level (transformers 5.25's hub
                # kernels make ``mamba_selective_scan`` an ``nn.Module`` whose ``forward``
                # calls the function it closes over): its class's methods stand for it
                todo.extend((v, depth) for v in vars(type(g)).values())
    return out


def _function_object(g) -> bool:
    """A callable object of a user's or library's class (not a class, not torch's)."""
    if g is None or isinstance(g, (type, types.ModuleType, types.BuiltinFunctionType)) \
            or not callable(g):
        return False
    mod = type(g).__module__ or ""
    return not mod.startswith(("torch", "builtins", "functools")) \
        and mod.split(".")[0] not in _NOT_USERS


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _code_names(c)
    return names


def _has_range_loop(code: types.CodeType) -> bool:
    return "range" in _code_names(code)


_ENABLED = contextvars.ContextVar("solbound_loops_as_scans", default=True)


@contextlib.contextmanager
def capturing(enabled: bool):
    """Whether exports inside capture Python loops as scans (``analyze(reroll=False)``:
    every iteration traced, as written)."""
    token = _ENABLED.set(enabled)
    try:
        yield
    finally:
        _ENABLED.reset(token)


@contextlib.contextmanager
def loops_as_scans(model):
    """While active, the qualifying loops of every function ``model`` calls run as scans
    (the functions' code is swapped and restored after)."""
    swapped: list[tuple[types.FunctionType, types.CodeType]] = []
    if not _ENABLED.get():
        yield
        return
    try:
        for f in _functions_of(model):
            if not _has_range_loop(f.__code__):
                continue
            new = rewritten(f)
            if new is not None:
                swapped.append((f, f.__code__))
                f.__code__ = new
        yield
    finally:
        for f, code in swapped:
            f.__code__ = code
