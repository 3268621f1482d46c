"""Demanded-region restriction: producers compute only what their consumers read."""

import doctest

import torch

import solbound
import solbound.ir.affine
import solbound.ir.demand
from helpers import Fn, r, totals

A, B = r(7, 6), r(6, 7)


def _macs_and_status(fn):
    rep = solbound.analyze(Fn(fn), (A, B), validate=True)
    return totals(rep)[0], rep.validation["status"]


def test_doctests():
    for mod in (solbound.ir.affine, solbound.ir.demand):
        res = doctest.testmod(mod)
        assert res.attempted > 0 and res.failed == 0, mod.__name__


def test_tril_of_a_product_computes_the_triangle():
    # 7x7 product, 6 terms each; tril keeps j <= i: 28 elements
    assert _macs_and_status(lambda s, a, b: torch.tril(a @ b)) == (28 * 6, "passed")
    # triu(., 2) keeps j - i >= 2: 5 + 4 + 3 + 2 + 1 = 15 elements
    assert _macs_and_status(lambda s, a, b: torch.triu(a @ b, 2)) == (15 * 6, "passed")


def test_a_slice_of_a_product_computes_the_slice():
    assert _macs_and_status(lambda s, a, b: (a @ b)[:, :3] * 2) == (7 * 3 * 6, "passed")


def test_union_of_demands_is_the_hull_and_shared_atoms():
    def two(s, a, b):
        p = a @ b
        return p[:, :3].sum() + p[:, 2:5].sum()
    assert _macs_and_status(two) == (7 * 5 * 6, "passed")
    # a consumer reading everything: no restriction
    def whole(s, a, b):
        p = a @ b
        return torch.tril(p) + p.sum()
    assert _macs_and_status(whole) == (7 * 7 * 6, "passed")
    # both consumers under the same triangle: it is shared
    def tri(s, a, b):
        p = a @ b
        return torch.tril(p) * 2 + torch.tril(p).sum()
    assert _macs_and_status(tri)[0] == 28 * 6
