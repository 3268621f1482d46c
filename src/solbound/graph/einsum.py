"""Lift IR kernels to extended einsums and build the tensor DAG.

An extended einsum names, for one kernel, its class (a contraction that can run
on a matrix unit, a map, a reduction, a scan, an arg-reduction), its operand
accesses and its index signature. The :class:`Graph` adds producers,
consumers and framework-operator groups. Counting (``analysis``) reads only
this structure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.classify import (MATRIX_UNITS, _strip_cast, classify,  # noqa: F401  (re-exported)
                           squares_as_products)
from ..ir.model import Access, Kernel, Program, kernel_reads

@dataclass(frozen=True)
class Einsum:
    kernel: Kernel
    kind: str                      # contraction | map | reduction | scan | argreduce | scatter
    #                                | library
    operands: tuple[Access, ...]   # distinct accesses read (nested indirect ones included)
    signature: str                 # e.g. "x[d0,r0] * w[d1,r0] -> y[d0,d1] (sum r0)"

    @property
    def is_contraction(self) -> bool:
        return self.kind == "contraction"


def _sig(k: Kernel, ops: tuple[Access, ...]) -> str:
    def acc(a: Access) -> str:
        return f"{a.tensor}[{','.join(str(i) if not isinstance(i, Access) else acc(i) for i in a.index)}]"
    lhs = " * ".join(acc(a) for a in ops) if ops else "const"
    out = acc(Access(k.out, k.out_index))
    red = f" ({k.reduce} {','.join(k.reduce_vars)})" if k.reduce_vars else ""
    if k.scatter:
        red = f" (scatter{', ' + k.reduce if k.reduce else ''})"
    if k.lib:
        red = f" (library {k.lib[0]})"
    if k.scan:
        red = f" ({k.reduce}-scan {k.scan})"
    return f"{lhs} -> {out}{red}"


def lift(k: Kernel) -> Einsum:
    seen: dict[Access, None] = {}
    for a in kernel_reads(k):
        seen.setdefault(a, None)
    ops = tuple(seen)
    return Einsum(k, classify(k), ops, _sig(k, ops))


@dataclass
class Graph:
    program: Program
    nodes: list[Einsum]
    producers: dict[str, list[int]] = field(default_factory=dict)
    consumers: dict[str, list[int]] = field(default_factory=dict)
    groups: dict[str, list[int]] = field(default_factory=dict)   # op id -> node indices


def build_graph(p: Program) -> Graph:
    """The einsum graph of ``p``, its squares written as products (``squares_as_products``:
    ``pow(x, 2)`` counts as ``x * x`` whichever frontend wrote it)."""
    p = squares_as_products(p)
    g = Graph(p, [lift(k) for k in p.kernels])
    for i, n in enumerate(g.nodes):
        for o in n.kernel.outputs:
            g.producers.setdefault(o, []).append(i)
        for a in n.operands:
            lst = g.consumers.setdefault(a.tensor, [])
            if not lst or lst[-1] != i:
                lst.append(i)
        g.groups.setdefault(n.kernel.op or n.kernel.name, []).append(i)
    return g
