"""Accepted IR into a program: labels for a whole translated program, renaming for a
fragment spliced in place of one operator. Pure IR, no framework.

>>> from solbound.ir.text import fresh_name, parse_program
>>> frag = parse_program('''# solbound IR v1
... x = input(f32[4])
... t = intermediate(f32[4])
... y = output(f32[4])
...
... @kernel(i=4)
... def sq():
...     t[i] = x[i] * x[i]
...
... @kernel(i=4)
... def inc():
...     y[i] = t[i] + 1.0
... ''')
>>> taken = {"t", "h_in", "h_out"}
>>> decls, ks = inline(frag, {"x": "h_in"}, {"y": "h_out"},
...                    lambda hint: fresh_name(hint, taken), hint="myop", next_loop=lambda: 0)
>>> [d.name for d in decls], [k.name for k in ks], ks[1].out
(['myop_t'], ['k_myop_sq', 'k_myop_inc'], 'h_out')
"""

from __future__ import annotations

from typing import Callable

from ...ir.affine import Aff
from ...ir.classify import MATRIX_UNITS, classify, product_factors
from ...ir.model import Access, Kernel, Program, TensorDecl, rename_tensors


def matrix_unit(k: Kernel) -> str:
    """The class of contraction a kernel of written IR is, for the precision policy: the
    ``@origin(unit=...)`` it states when it is a contraction, else ``matmul`` for a sum of
    products whose two factors each have a loop variable the other lacks (a matrix
    product, batched or not: what a matrix unit computes), else none (a dot product, a
    sum of squares: vector work, as the traced frontends count them)."""
    if classify(k) != "contraction":
        return ""
    if k.unit in MATRIX_UNITS:
        return k.unit
    a, b = (set().union(*(i.vars for i in x.index if isinstance(i, Aff)))
            for x in product_factors(k))
    return "matmul" if a - b and b - a else ""


def stamp(p: Program, target: str, src: str) -> Program:
    """Every kernel of a whole translated program gets an operator (its own ``@origin``
    op, else its name), a source (the target's line where it names none) and its class of
    contraction (:func:`matrix_unit`)."""
    ks = tuple(k.with_(op=k.op or k.name, opname=k.opname or k.op or k.name,
                       src=k.src or src, unit=matrix_unit(k)) for k in p.kernels)
    return Program(p.tensors, ks, p.notes + (f"translated by the agent from {target}",))


def rename_kernel(k: Kernel, tensors: dict[str, str], name: str,
                  loop: tuple[str, int, int] | None) -> Kernel:
    index = tuple(rename_tensors(i, tensors) if isinstance(i, Access) else i
                  for i in k.out_index)
    return k.with_(name=name, out=tensors.get(k.out, k.out), out_index=index,
                   out2=tensors.get(k.out2, k.out2) if k.out2 else None,
                   body=rename_tensors(k.body, tensors), loop=loop)


def inline(fragment: Program, inputs: dict[str, str], outputs: dict[str, str],
           fresh: Callable[[str], str], hint: str,
           next_loop: Callable[[], int]) -> tuple[list[TensorDecl], list[Kernel]]:
    """The fragment's kernels over the host's tensors: its inputs and outputs renamed to
    the host tensors they stand for, its intermediates and kernels to names the host's
    ``fresh(hint)`` gives, its sequential loops to ids ``next_loop()`` gives. Returns the
    new intermediates and the kernels (with :func:`matrix_unit`), in order."""
    names = {**inputs, **outputs}
    decls = []
    for t in fragment.tensors:
        if t.name not in names:
            new = fresh(f"{hint}_{t.name}")
            names[t.name] = new
            decls.append(TensorDecl(new, t.shape, t.dtype, "intermediate"))
    loops: dict[int, int] = {}
    ks = []
    for k in fragment.kernels:
        loop = None
        if k.loop is not None:
            if k.loop[2] not in loops:
                loops[k.loop[2]] = next_loop()
            loop = (k.loop[0], k.loop[1], loops[k.loop[2]])
        k = rename_kernel(k, names, fresh(f"k_{hint}_{k.name}"), loop)
        ks.append(k.with_(unit=matrix_unit(k)))
    return decls, ks
