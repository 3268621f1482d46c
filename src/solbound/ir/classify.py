"""The class of a kernel (contraction, map, reduction, scan, arg-reduction, scatter,
library routine), from its structure alone: what counting, execution and validation
branch on."""

from __future__ import annotations

from .model import Access, Call, Const, Kernel, Program

MATRIX_UNITS = ("matmul", "conv", "attention")


def _strip_cast(e):
    while isinstance(e, Call) and e.op.startswith("to_"):
        e = e.args[0]
    return e


def _square_as_product(e):
    """``e`` with every ``pow(a, 2)`` written ``a * a``."""
    if not isinstance(e, Call):
        return e
    args = tuple(_square_as_product(a) for a in e.args)
    if e.op == "pow" and isinstance(args[1], Const) and not isinstance(args[1].value, bool) \
            and args[1].value == 2:
        return Call("mul", (args[0], args[0]))
    return e if all(a is b for a, b in zip(args, e.args)) else Call(e.op, args)


def squares_as_products(p: Program) -> Program:
    """One definition of a square in every frontend: ``pow(a, 2)`` (JAX's ``pow`` primitive,
    ``x ** 2.0``, keras' ``ops.power(x, 2)``; a hand-written IR's ``x ** 2``) is the
    product ``a * a``, as PyTorch's lowering, JAX's ``square`` and ``integer_pow`` already
    write it: one multiply on the vector pipe, and, summed, a multiply-add (RMSNorm's
    ``mean(x ** 2)`` counts the MACs of ``sum(x * x)``). The program itself is kept (the
    executor computes ``pow``); the graph counts this form. ``p`` itself when no kernel
    has such a square."""
    kernels, changed = [], False
    for k in p.kernels:
        body = _square_as_product(k.body)
        changed |= body is not k.body
        kernels.append(k if body is k.body else k.with_(body=body))
    return Program(p.tensors, tuple(kernels), p.notes) if changed else p


def product_factors(k: Kernel):
    """The two factors of a kernel body that is a product ``a * b`` (casts stripped around
    the product and around each factor), or None."""
    body = _strip_cast(k.body)
    if not (isinstance(body, Call) and body.op == "mul" and len(body.args) == 2):
        return None
    return tuple(_strip_cast(a) for a in body.args)


def classify(k: Kernel) -> str:
    if k.lib:
        return "library"
    if k.scatter:
        return "scatter"
    if k.scan is not None:
        return "scan"
    if k.reduce in ("argmax", "argmin"):
        return "argreduce"
    if k.reduce is None:
        return "map"
    body = k.body
    if (k.reduce == "sum" and isinstance(body, Call) and body.op == "mul"
            and all(isinstance(_strip_cast(a), Access) for a in body.args)
            and k.reduce_vars):
        return "contraction"
    return "reduction"
