"""Affine index expressions and affine predicates over loop variables.

An :class:`Aff` is ``sum(coef * var) + const`` with integer coefficients. It is
immutable, hashable and prints in a canonical order, so that the IR text form
round-trips exactly.

>>> a = Aff.var("p") * 2 + Aff.var("r") - 1
>>> str(a)
'p*2 + r - 1'
>>> a.subst({"p": Aff.var("q") + 3})
Aff(terms=(('q', 2), ('r', 1)), const=5)
>>> Atom(a, 0, 7).holds({"p": 1, "r": 0})
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np


@dataclass(frozen=True)
class Aff:
    """``sum(c * v for v, c in terms) + const``; terms sorted by first use, no zero coefficients."""

    terms: tuple[tuple[str, int], ...] = ()
    const: int = 0

    # construction ---------------------------------------------------------
    @staticmethod
    def var(name: str) -> "Aff":
        return Aff(((name, 1),), 0)

    @staticmethod
    def lit(value: int) -> "Aff":
        return Aff((), int(value))

    @staticmethod
    def of(x: "Aff | int | str") -> "Aff":
        if isinstance(x, Aff):
            return x
        if isinstance(x, str):
            return Aff.var(x)
        if isinstance(x, (int, np.integer)):
            return Aff.lit(int(x))
        raise TypeError(f"not an affine expression: {x!r}")

    @staticmethod
    def _build(coefs: dict[str, int], const: int) -> "Aff":
        return Aff(tuple((v, c) for v, c in coefs.items() if c != 0), int(const))

    # arithmetic ------------------------------------------------------------
    def __add__(self, other: "Aff | int") -> "Aff":
        o = Aff.of(other)
        coefs = dict(self.terms)
        for v, c in o.terms:
            coefs[v] = coefs.get(v, 0) + c
        return Aff._build(coefs, self.const + o.const)

    __radd__ = __add__

    def __neg__(self) -> "Aff":
        return Aff(tuple((v, -c) for v, c in self.terms), -self.const)

    def __sub__(self, other: "Aff | int") -> "Aff":
        return self + (-Aff.of(other))

    def __rsub__(self, other: "Aff | int") -> "Aff":
        return Aff.of(other) + (-self)

    def __mul__(self, k: int) -> "Aff":
        if not isinstance(k, (int, np.integer)):
            raise TypeError("affine expressions multiply by integers only")
        k = int(k)
        return Aff._build({v: c * k for v, c in self.terms}, self.const * k)

    __rmul__ = __mul__

    # queries ---------------------------------------------------------------
    @property
    def vars(self) -> tuple[str, ...]:
        return tuple(v for v, _ in self.terms)

    def coef(self, var: str) -> int:
        return dict(self.terms).get(var, 0)

    @property
    def is_const(self) -> bool:
        return not self.terms

    def single_var(self) -> str | None:
        """The variable if this is exactly ``v`` (coefficient 1, no constant)."""
        if len(self.terms) == 1 and self.terms[0][1] == 1 and self.const == 0:
            return self.terms[0][0]
        return None

    def subst(self, mapping: Mapping[str, "Aff"]) -> "Aff":
        out = Aff.lit(self.const)
        for v, c in self.terms:
            out = out + (mapping[v] * c if v in mapping else Aff(((v, c),), 0))
        return out

    def rename(self, mapping: Mapping[str, str]) -> "Aff":
        return self.subst({k: Aff.var(v) for k, v in mapping.items()})

    def bounds(self, extents: Mapping[str, int]) -> tuple[int, int]:
        """Inclusive [min, max] of the expression over the box ``0 <= v < extent``."""
        lo = hi = self.const
        for v, c in self.terms:
            span = c * (extents[v] - 1)
            lo += min(0, span)
            hi += max(0, span)
        return lo, hi

    def evaluate(self, env: Mapping[str, "int | np.ndarray"]):
        """Value for integer or numpy-array loop variables (broadcasting)."""
        out = self.const
        for v, c in self.terms:
            out = out + c * env[v]
        return out

    def __str__(self) -> str:
        parts: list[str] = []
        for v, c in self.terms:
            mag = abs(c)
            body = v if mag == 1 else f"{v}*{mag}"
            if not parts:
                parts.append(body if c > 0 else f"-{body}")
            else:
                parts.append(f"+ {body}" if c > 0 else f"- {body}")
        if self.const or not parts:
            if not parts:
                parts.append(str(self.const))
            else:
                parts.append(f"+ {self.const}" if self.const > 0 else f"- {-self.const}")
        return " ".join(parts)


@dataclass(frozen=True)
class Atom:
    """``lo <= expr < hi``; either bound may be ``None`` (unbounded)."""

    expr: Aff
    lo: int | None = None
    hi: int | None = None

    def holds(self, env: Mapping[str, "int | np.ndarray"]):
        val = self.expr.evaluate(env)
        ok = True
        if self.lo is not None:
            ok = ok & (val >= self.lo)
        if self.hi is not None:
            ok = ok & (val < self.hi)
        return ok

    def subst(self, mapping: Mapping[str, Aff]) -> "Atom":
        return Atom(self.expr.subst(mapping), self.lo, self.hi)

    def canonical(self) -> "Atom":
        """One spelling per atom (terms sorted by variable name), so equal atoms compare equal."""
        return Atom(Aff(tuple(sorted(self.expr.terms)), self.expr.const), self.lo, self.hi)

    def __str__(self) -> str:
        s = str(self.expr)
        if self.lo is not None and self.hi is not None:
            return f"{self.lo} <= {s} < {self.hi}"
        if self.lo is not None:
            return f"{self.lo} <= {s}"
        return f"{s} < {self.hi}"


Guard = tuple[Atom, ...]


def guard_holds(guard: Guard, env: Mapping[str, "int | np.ndarray"]):
    ok = True
    for atom in guard:
        ok = ok & atom.holds(env)
    return ok


def guard_str(guard: Guard) -> str:
    return " & ".join(f"({a})" for a in guard)
