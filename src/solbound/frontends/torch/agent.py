"""The agent's target for one operator the PyTorch lowering cannot lower (a
``torch.library.custom_op``, a ``torch.library.triton_op``, an ATen operator without a
rule): its code, the shapes and dtypes of this call, and the operator itself run on real
CPU tensors as the reference. A Triton kernel the operator launches runs in Triton's
interpreter (``TRITON_INTERPRET=1``'s ``InterpretedFunction``) on the CPU tensors, and its
source is part of the prompt.

The lowering (``lower.Lowering._translate``) splices an accepted fragment in place of the
node: the fragment's inputs are the node's tensor arguments (strided views copied into
contiguous tensors first, inside the operator's group), its outputs the node's results.
"""

from __future__ import annotations

import contextlib
import inspect
import sys

import numpy as np
import torch

from ..agent.prompt import Operand
from ..agent.translate import Target
from ...ir.text import RESERVED, fresh_name
from .lower import TORCH_DTYPES


def tensor_paths(node: torch.fx.Node) -> list[tuple]:
    """Where each tensor argument sits: ``("args", i)``, ``("args", i, j)`` (a list
    argument), ``("kwargs", name)``, in call order."""
    out = []
    for i, a in enumerate(node.args):
        if isinstance(a, torch.fx.Node):
            out.append(("args", i))
        elif isinstance(a, (list, tuple)):
            out += [("args", i, j) for j, b in enumerate(a) if isinstance(b, torch.fx.Node)]
    for k, a in node.kwargs.items():
        if isinstance(a, torch.fx.Node):
            out.append(("kwargs", k))
    return out


def at(args: tuple, kwargs: dict, path: tuple):
    v = args[path[1]] if path[0] == "args" else kwargs[path[1]]
    return v[path[2]] if len(path) == 3 else v


def _arg_names(node: torch.fx.Node) -> list[str]:
    schema = getattr(node.target, "_schema", None)
    return [a.name for a in schema.arguments] if schema is not None else []


def _source(node: torch.fx.Node) -> str:
    """The operator's own code where there is some (a custom op's implementation), and
    its schema."""
    schema = getattr(node.target, "_schema", None)
    parts = [f"# operator {node.target}" + (f": {schema}" if schema is not None else "")]
    qual = str(schema.name) if schema is not None else ""
    try:
        from torch._library.custom_ops import OPDEFS
        opdef = OPDEFS.get(qual)
    except ImportError:
        opdef = None
    fn = _user_function(getattr(opdef, "_init_fn", None)) if opdef is not None else None
    if fn is not None:
        try:
            parts.append(inspect.getsource(fn))
        except (OSError, TypeError):
            pass
        for kernel in _triton_kernels(fn):
            try:
                parts.append("# the Triton kernel it launches:\n"
                             + inspect.getsource(kernel.fn))
            except (OSError, TypeError):
                pass
    elif getattr(node.target, "__doc__", None):
        parts.append('"""' + node.target.__doc__.strip()[:2000] + '"""')
    return "\n".join(parts)


def _user_function(fn, depth: int = 3):
    """The user's own function behind an operator's implementation: ``triton_op`` (and
    similar wrappers) register a closure of torch's around it."""
    if fn is None or not (getattr(fn, "__module__", "") or "").startswith("torch") or depth == 0:
        return fn
    inner = getattr(fn, "__wrapped__", None)
    cells = []
    for c in getattr(fn, "__closure__", None) or ():
        try:
            if callable(c.cell_contents):
                cells.append(c.cell_contents)
        except ValueError:          # an empty cell
            pass
    for cand in ([inner] if inner else []) + cells:
        found = _user_function(cand, depth - 1)
        if found is not None and not (found.__module__ or "").startswith("torch"):
            return found
    return fn


def _triton_kernels(fn) -> list:
    """The Triton kernels (``@triton.jit`` functions) ``fn`` names among its globals."""
    names = getattr(getattr(fn, "__code__", None), "co_names", ())
    g = getattr(fn, "__globals__", {})
    return [g[n] for n in names if type(g.get(n)).__name__ == "JITFunction"]


@contextlib.contextmanager
def triton_on_cpu():
    """While active, a Triton kernel launch runs in Triton's interpreter (what
    ``TRITON_INTERPRET=1`` makes of a kernel at its definition), so the operator runs on
    CPU tensors; nothing changes when the program did not import triton."""
    if "triton" not in sys.modules:
        yield
        return
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    orig = JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        interp = self.__dict__.get("_solbound_interpreted")
        if interp is None:
            interp = self.__dict__["_solbound_interpreted"] = InterpretedFunction(self.fn)
        return interp.run(*args, grid=grid, warmup=warmup, **kwargs)
    JITFunction.run = run
    try:
        yield
    finally:
        JITFunction.run = orig


def target_of(node: torch.fx.Node, src: str) -> Target | None:
    """The target for ``node``, or None when it cannot be one (an output that is not a
    tensor, a dtype the IR lacks, an argument that is a symbolic size)."""
    val = node.meta.get("val")
    vals = list(val) if isinstance(val, (list, tuple)) else [val]
    if not vals or not all(isinstance(v, torch.Tensor) and v.dtype in TORCH_DTYPES
                           for v in vals):
        return None
    paths = tensor_paths(node)
    names = _arg_names(node)
    taken = set(RESERVED)
    inputs = []
    for p in paths:
        v = at(node.args, node.kwargs, p)
        meta = v.meta.get("val")
        if not isinstance(meta, torch.Tensor) or meta.dtype not in TORCH_DTYPES:
            return None
        hint = (p[1] if p[0] == "kwargs" else names[p[1]] if p[1] < len(names)
                else f"a{p[1]}") + (f"_{p[2]}" if len(p) == 3 else "")
        try:
            shape = tuple(int(s) for s in meta.shape)
        except Exception:  # noqa: BLE001 - a symbolic size
            return None
        inputs.append(Operand(fresh_name(hint, taken), shape, TORCH_DTYPES[meta.dtype]))
    outputs = [Operand(fresh_name("out" if len(vals) == 1 else f"out{i}", taken),
                       tuple(int(s) for s in v.shape), TORCH_DTYPES[v.dtype])
               for i, v in enumerate(vals)]
    params = {}
    for i, a in enumerate(node.args):
        if isinstance(a, (list, tuple)):          # tensors in a list: named by position
            a = type(a)(f"<tensor {n}>" if isinstance(b, torch.fx.Node) else b
                        for n, b in enumerate(a))
        if not isinstance(a, torch.fx.Node):
            params[names[i] if i < len(names) else f"a{i}"] = a
    params.update({k: a for k, a in node.kwargs.items() if not isinstance(a, torch.fx.Node)})
    in_dtypes = [at(node.args, node.kwargs, p).meta["val"].dtype for p in paths]

    def reference(arrays):
        args = [list(a) if isinstance(a, (list, tuple)) else a for a in node.args]
        kwargs = dict(node.kwargs)
        for p, arr, dt in zip(paths, arrays, in_dtypes):
            t = torch.from_numpy(np.ascontiguousarray(arr)).to(dt)
            if p[0] == "kwargs":
                kwargs[p[1]] = t
            elif len(p) == 3:
                args[p[1]][p[2]] = t
            else:
                args[p[1]] = t
        with torch.no_grad(), triton_on_cpu():
            res = node.target(*args, **kwargs)
        res = list(res) if isinstance(res, (list, tuple)) else [res]
        return [r.detach().float().numpy() if r.dtype in (torch.bfloat16, torch.float16)
                else r.detach().numpy() for r in res]
    return Target(name=str(node.target).removesuffix(".default"), source=_source(node),
                  inputs=inputs, outputs=outputs, reference=reference, params=params,
                  what="operator", src=src)
