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


QUOT = "//"


def quot(var: str, c: int) -> str:
    """The name of the quotient variable ``var // c`` (a block index: ``i // 64``).

    >>> quot("d1", 64), split_quot("d1//64"), split_quot("d1")
    ('d1//64', ('d1', 64), None)
    """
    return f"{var}{QUOT}{int(c)}"


def split_quot(name: str) -> tuple[str, int] | None:
    base, sep, c = name.partition(QUOT)
    return (base, int(c)) if sep else None


class QuotientError(ValueError):
    """A quotient variable ``v // c`` whose ``v`` is substituted by an expression whose
    quotient is not a variable."""


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
            if v in mapping:
                out = out + mapping[v] * c
                continue
            q = split_quot(v)
            if q is not None and q[0] in mapping:
                # v//k with v renamed to a variable w is w//k; v replaced by any other
                # expression has no quotient variable (the caller keeps the mask as data)
                m = mapping[q[0]]
                w = m.single_var()
                if w is not None:
                    out = out + Aff.var(quot(w, q[1])) * c
                    continue
                if m.is_const:                   # a sequential loop's bound iteration
                    out = out + (m.const // q[1]) * c
                    continue
                raise QuotientError(f"{v} with {q[0]} = {m}: not an affine quotient")
            out = out + Aff(((v, c),), 0)
        return out

    def rename(self, mapping: Mapping[str, str]) -> "Aff":
        return self.subst({k: Aff.var(v) for k, v in mapping.items()})

    def bounds(self, extents: Mapping[str, int]) -> tuple[int, int]:
        """Inclusive [min, max] of the expression over the box ``0 <= v < extent``."""
        lo = hi = self.const
        for v, c in self.terms:
            span = c * (quot_extent(v, extents) - 1)
            lo += min(0, span)
            hi += max(0, span)
        return lo, hi

    def evaluate(self, env: Mapping[str, "int | np.ndarray"]):
        """Value for integer or numpy-array loop variables (broadcasting); a quotient
        variable ``v//c`` is ``env[v] // c``."""
        out = self.const
        for v, c in self.terms:
            if v in env:
                out = out + c * env[v]
            else:
                q = split_quot(v)
                if q is None:
                    raise KeyError(v)
                out = out + c * (env[q[0]] // q[1])
        return out

    @property
    def has_quot(self) -> bool:
        return any(QUOT in v for v, _ in self.terms)

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


def quot_extent(v: str, extents: Mapping[str, int]) -> int:
    """The extent of a variable, or of a quotient variable ``w//c`` (``ceil(ext(w) / c)``)."""
    if v in extents:
        return extents[v]
    q = split_quot(v)
    if q is None:
        raise KeyError(v)
    return -(-extents[q[0]] // q[1])


def split_quotients(extents: Mapping[str, int], guard: Guard, exprs=()):
    """Strip-mine every variable a quotient of the guard divides: ``w = c*(w//c) + w%c``,
    so that the guard is affine in plain variables (``w//c`` and ``w%c`` each a variable of
    its own, ``c*q + r < ext(w)`` added where ``c`` does not divide the extent). Returns
    ``(extents, guard, exprs, fused)``: ``exprs`` (affine expressions over the old
    variables) rewritten, ``fused`` the ``(block, offset, added atom or None)`` of each
    split, by old variable (the added atom bounds the split's points to the old extent).

    >>> g = (Atom(Aff.var("i//4") - Aff.var("j//4"), 0, 1),)
    >>> ext, g2, _, _ = split_quotients({"i": 8, "j": 8}, g)
    >>> sorted(ext.items()), [str(a) for a in g2]
    ([('i%4', 4), ('i//4', 2), ('j%4', 4), ('j//4', 2)], ['0 <= i//4 - j//4 < 1'])
    """
    divs: dict[str, int] = {}
    for a in guard:
        for v, _ in a.expr.terms:
            q = split_quot(v)
            if q is not None and v not in extents:      # not split already
                if divs.setdefault(q[0], q[1]) != q[1]:
                    raise QuotientError(f"{q[0]} divided by {divs[q[0]]} and by {q[1]}")
    if not divs:
        return dict(extents), tuple(guard), tuple(exprs), {}
    ext = {v: n for v, n in extents.items() if v not in divs}
    sub: dict[str, Aff] = {}
    extra = []
    fused = {}
    for w, c in divs.items():
        qn, rn = quot(w, c), f"{w}%{c}"
        ext[qn], ext[rn] = -(-extents[w] // c), min(c, extents[w])
        sub[w] = Aff.var(qn) * c + Aff.var(rn)
        bound = Atom(Aff.var(qn) * c + Aff.var(rn), None, extents[w]) if extents[w] % c else None
        fused[w] = (qn, rn, bound)
        if bound is not None:
            extra.append(bound)
    def rw(e: Aff) -> Aff:
        out = Aff.lit(e.const)
        for v, k in e.terms:
            out = out + (sub[v] * k if v in sub else Aff(((v, k),), 0))
        return out
    new_guard = tuple(Atom(rw(a.expr), a.lo, a.hi) for a in guard) + tuple(extra)
    return ext, new_guard, tuple(rw(e) for e in exprs), fused


def guard_holds(guard: Guard, env: Mapping[str, "int | np.ndarray"]):
    ok = True
    for atom in guard:
        ok = ok & atom.holds(env)
    return ok


def guard_str(guard: Guard) -> str:
    return " & ".join(f"({a})" for a in guard)
