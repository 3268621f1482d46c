"""The agent's prompt, built from the IR's own tables.

Everything the model is told about the grammar comes from the modules that define it:
dtypes (``ir.model.DTYPE_BYTES``), roles (``ROLES``), scalar operations and their
arity (``SCALAR_OPS``, spelled with ``INFIX``/``PREFIX`` where they have an operator),
reductions (``REDUCE_OPS``), scans (``SCAN_OPS``), library routines (``ir.library.ROUTINES``)
and the body forms of ``ir.text``'s docstring. The worked examples are IR text that
``solbound ir`` printed for the files beside them (``examples/``); they are parsed and
printed again here, so an example that stopped being valid IR fails at once, and a test
reprints them from their sources. The prompt cannot drift from the grammar.

>>> text = grammar()
>>> "sum" in text and "cumsum" in text and "sort" in text and "f32" in text
True
>>> len(EXAMPLES)
3
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from ...ir import library, model, text as irtext

VERSION = 1              # part of the cache key: a new prompt translates anew
EXAMPLES = ("mlp_softmax", "rnn", "scan_sort")
HERE = os.path.join(os.path.dirname(__file__), "examples")


@dataclass(frozen=True)
class Operand:
    """A tensor the target reads or writes: its name in the IR, shape and IR dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def decl(self, role: str) -> str:
        shape = ", ".join(map(str, self.shape)) if self.shape else "()"
        return f"{self.name} = {role}({self.dtype}[{shape}])"


def _ops_table() -> str:
    rows = []
    for name, (arity, unit) in model.SCALAR_OPS.items():
        if name.startswith("to_") or name in ("operands", "rand"):   # rand: no replay here
            continue
        spell = (f"a {model.INFIX[name]} b" if name in model.INFIX else
                 f"{model.PREFIX[name]}a" if name in model.PREFIX else
                 "a ** b" if name == "pow" else
                 f"{name}(...)" if arity < 0 else
                 f"{name}({', '.join('abc'[:arity])})")
        rows.append(spell)
    return ", ".join(rows)


def grammar() -> str:
    """The IR's grammar in words, from the parser's and the executor's tables."""
    dtypes = ", ".join(model.DTYPE_BYTES)
    roles = ", ".join(model.ROLES)
    reduces = ", ".join(r for r in model.REDUCE_OPS if r not in ("argmax", "argmin"))
    scans = ", ".join(model.SCAN_OPS)
    routines = ", ".join(sorted(r for r in library.ROUTINES
                               if r not in library.KINDS and r != "opaque"))
    body_forms = irtext.__doc__.split("Body forms (one statement per kernel):", 1)[1].strip()
    return f"""\
The solbound loop IR is a restricted subset of Python. It is parsed, never executed as
Python: only the forms below are accepted.

File layout:
* the first line is `{irtext.HEADER}`;
* then tensor declarations, one per line: `NAME = role(dtype[d0, d1, ...])` (a scalar:
  `dtype[()]`); roles: {roles}; dtypes: {dtypes};
* then kernels. A kernel is a function with no arguments under `@kernel(i=4, j=8, ...)`,
  which declares its loop variables and their extents (a perfect loop nest), and holds
  exactly one assignment. `@origin(op="...", name="...")` may name what it computes.
* a sequential loop over kernels: `for t in range(N):` with `@kernel` functions indented
  under it; `t` may appear in their indices (time steps of a recurrence).

Body forms:
{body_forms}

Indices are affine in the loop variables (integers, loop variables, `+`, `-`, `*` by an
integer), or a tensor access with an integer dtype (an indirect index, a gather). Every
access names every dimension of its tensor. A guard keeps points, e.g. a zero-padded
convolution: `y[b, o, i] = sum(x[b, c, i + r - 1] * w[o, c, r], where=(0 <= i + r - 1 < 10))`.
Reductions: {reduces}, and `argmax`/`argmin`. Scans: {scans}.
Scalar operations: {_ops_table()}; conversions `to_<dtype>(a)`; constants are numbers,
`inf`, `nan`, `True`, `False`; a loop variable used as a value is its index.
Library routines (for work no loop nest describes), written
`@library(name="ROUTINE", ...)` over a body that reads the operands: {routines}.
Tensors written by a kernel are `intermediate` or `output`; every kernel writes one tensor
(an `argmax` may write an index and a value); a tensor is written before it is read."""


@functools.lru_cache(maxsize=None)
def examples() -> tuple[tuple[str, str], ...]:
    """(source, IR text) of the worked examples, the IR parsed and printed again."""
    out = []
    for name in EXAMPLES:
        with open(os.path.join(HERE, name + ".py"), encoding="utf-8") as f:
            src = f.read()
        with open(os.path.join(HERE, name + ".ir"), encoding="utf-8") as f:
            ir = irtext.print_program(irtext.parse_program(f.read()))
        out.append((src, ir))
    return tuple(out)


SYSTEM = ("You translate programs into the solbound loop IR, a small language of affine "
          "loop nests. Your translation is parsed by a strict parser and run against the "
          "original program on random inputs; it is accepted only when every output "
          "matches. Reply with the whole IR in one fenced code block (```), and nothing "
          "else that matters: only the first code block is read.")


def first_message(source: str, inputs: list[Operand], outputs: list[Operand],
                  params: dict | None = None, what: str = "program") -> str:
    """The user message of the first request: grammar, worked examples, the target."""
    parts = [grammar(), "", "Worked examples (a source, then the IR solbound accepts for it):"]
    for i, (src, ir) in enumerate(examples(), 1):
        parts += [f"\nExample {i}, source:", "```python", src.rstrip(), "```",
                  f"Example {i}, IR:", "```", ir.rstrip(), "```"]
    parts += ["", f"Now translate this {what}:", "```python", source.rstrip(), "```", "",
              "Declare exactly these inputs (same names, shapes and dtypes, in this order):"]
    parts += [f"    {o.decl('input')}" for o in inputs]
    parts.append("and exactly these outputs:")
    parts += [f"    {o.decl('output')}" for o in outputs]
    if params:
        parts.append("Its non-tensor arguments: "
                     + ", ".join(f"{k}={v!r}" for k, v in params.items()) + ".")
    parts.append("Declare no other input, parameter, buffer or constant; anything else "
                 "you need is an intermediate the kernels compute.")
    return "\n".join(parts)


def feedback_message(attempt: int, feedback: str) -> str:
    return (f"Attempt {attempt} was not accepted: {feedback}\n"
            f"Reply with the corrected IR, whole, in one fenced code block.")
