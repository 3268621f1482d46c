"""The class of a kernel (contraction, map, reduction, scan, arg-reduction, scatter,
library routine), from its structure alone: what counting, execution and validation
branch on."""

from __future__ import annotations

from .model import Access, Call, Kernel

MATRIX_UNITS = ("matmul", "conv", "attention")


def _strip_cast(e):
    while isinstance(e, Call) and e.op.startswith("to_"):
        e = e.args[0]
    return e


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
