"""What values a program's drawn inputs must respect, read from its IR.

A frontend that draws inputs itself (JAX's ``ShapeDtypeStruct`` arguments) draws them
where the program is defined, not at random over the whole type:

* an integer input read as an indirect index (an embedding's ids, a gather's indices, a
  class label picking a logit) lies inside every table it indexes: ``[0, n)`` for the
  smallest extent ``n`` it indexes;
* a floating input whose value reaches the argument of a square root, a reciprocal square
  root, a logarithm or a fractional power through sign-preserving arithmetic (sums,
  products, quotients, maxima, reductions, casts) is non-negative: an optimizer's second
  moment (``sqrt(nu / (1 - b2**t)) + eps``), a variance given as an input.

Both are read from the IR alone, so they hold for any frontend; drawing inside them only
narrows the draw, never makes an input the program accepts impossible to draw.

>>> from solbound.ir.text import parse_program
>>> p = parse_program('''
... emb = parameter(f32[10, 4])
... ids = input(i64[3])
... nu = input(f32[4])
... y = output(f32[3, 4])
... z = output(f32[4])
...
... @kernel(i=3, j=4)
... def k_y():
...     y[i, j] = emb[ids[i], j]
...
... @kernel(j=4)
... def k_z():
...     z[j] = sqrt(nu[j] * 0.5 + 1e-8)
... ''')
>>> domains = input_domains(p)
>>> domains["ids"], domains["nu"]
(('index', 10), ('nonneg',))
"""

from __future__ import annotations

from ..ir.model import EXTERNAL_ROLES, Access, Call, Const, Program, walk

# a function defined only for arguments of one sign: its argument is non-negative
_NEEDS_NONNEG = frozenset({"sqrt", "rsqrt", "log", "log2"})
# arithmetic whose result is non-negative when its operands are: the requirement moves to
# every operand (a quotient's and a product's too: drawing both non-negative is allowed)
_SIGN_PRESERVING = frozenset({"add", "mul", "div", "maximum", "minimum", "fma", "abs"})


def _operands_needing_nonneg(e) -> set[str]:
    """Tensors whose non-negativity makes ``e`` non-negative (as far as the arithmetic of
    ``e`` shows): the leaves under sign-preserving operators and casts. A square
    (``a * a``) is non-negative whatever ``a`` is, and asks nothing."""
    out: set[str] = set()
    if isinstance(e, Access):
        if not any(isinstance(i, Access) for i in e.index):
            out.add(e.tensor)
        return out
    if not isinstance(e, Call):
        return out
    if e.op == "mul" and len(e.args) == 2 and e.args[0] == e.args[1]:
        return out
    if e.op in _SIGN_PRESERVING or e.op.startswith("to_"):
        for a in e.args:
            out |= _operands_needing_nonneg(a)
    elif e.op == "pow" and len(e.args) == 2:
        out |= _operands_needing_nonneg(e.args[0])
    return out


def input_domains(p: Program) -> dict[str, tuple]:
    """For each external tensor with a restricted domain: ``("index", n)`` for an integer
    tensor read as an index into extents of at least ``n`` (the smallest), ``("nonneg",)``
    for a floating tensor that must not be negative (see the module doc). Tensors without
    an entry may take any value of their type."""
    index: dict[str, int] = {}
    nonneg: set[str] = set()
    tmap = p.tensor_map
    for k in p.kernels:
        for e in [*walk(k.body), Access(k.out, k.out_index)]:
            if isinstance(e, Access):
                for d, i in enumerate(e.index):
                    if isinstance(i, Access):
                        n = tmap[e.tensor].shape[d]
                        index[i.tensor] = min(index.get(i.tensor, n), n)
            elif isinstance(e, Call) and e.op in _NEEDS_NONNEG:
                nonneg |= _operands_needing_nonneg(e.args[0])
            elif isinstance(e, Call) and e.op == "pow" and len(e.args) == 2 \
                    and isinstance(e.args[1], Const) and float(e.args[1].value) % 1:
                nonneg |= _operands_needing_nonneg(e.args[0])
    # through the program backwards: what a kernel writes must be non-negative, so must
    # what it is computed from (twice over, for a value a loop's next iteration reads)
    for _ in range(2):
        for k in reversed(p.kernels):
            if k.out in nonneg and k.reduce in (None, "sum", "max", "min") and not k.lib:
                nonneg |= _operands_needing_nonneg(k.body)
    out: dict[str, tuple] = {}
    for t in p.tensors:
        if t.role not in EXTERNAL_ROLES:
            continue
        if t.name in index and not t.dtype.startswith("f"):
            out[t.name] = ("index", index[t.name])
        elif t.name in nonneg and t.dtype.startswith(("f", "bf")):
            out[t.name] = ("nonneg",)
    return out
