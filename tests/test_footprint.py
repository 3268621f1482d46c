"""Exact counting: brute force agrees with the closed forms and bitmaps."""

import itertools
import random

from solbound.analysis.footprint import access_footprint, domain_size, values_count
from solbound.ir.affine import Aff, Atom
from solbound.ir.model import Access


def test_values_count_matches_brute_force():
    rng = random.Random(1)
    for _ in range(400):
        terms = [(f"v{i}", rng.randint(-6, 6)) for i in range(rng.randint(1, 3))]
        ranges = {v: (0, rng.randint(0, 7)) for v, _ in terms}
        const, lo, hi = rng.randint(-5, 5), rng.randint(-3, 3), rng.randint(0, 40)
        seen = set()
        for pt in itertools.product(*[range(a, b + 1) for a, b in ranges.values()]):
            x = const + sum(c * p for (_, c), p in zip(terms, pt))
            if lo <= x < hi:
                seen.add(x)
        assert values_count(terms, const, ranges, lo, hi) == len(seen)


def test_domain_size_matches_brute_force():
    rng = random.Random(2)
    names = ["a", "b", "c"]
    for _ in range(200):
        ext = {v: rng.randint(1, 6) for v in names}
        guard = []
        for _ in range(rng.randint(0, 3)):
            e = Aff(tuple((v, rng.randint(-2, 2)) for v in rng.sample(names, 2)), rng.randint(-3, 3))
            e = Aff._build(dict(e.terms), e.const)
            guard.append(Atom(e, rng.choice([None, 0, 1]), rng.choice([None, 2, 5])))
        guard = tuple(guard)
        count = sum(all(a.holds(dict(zip(names, pt))) for a in guard)
                    for pt in itertools.product(*[range(ext[v]) for v in names]))
        assert domain_size(ext, guard) == count


def test_causal_domain_is_triangular():
    n = 1000
    assert domain_size({"i": n, "j": n}, (Atom(Aff.var("i") - Aff.var("j"), 0, None),)) == n * (n + 1) // 2


def test_padded_conv_footprint_clips_to_the_input():
    p, r = Aff.var("p"), Aff.var("r")
    acc = Access("x", (p * 2 + r - 1,))
    fp = access_footprint(acc, (9,), {"p": 5, "r": 3}, (Atom(p * 2 + r - 1, 0, 9),))
    assert fp.elements == 9 and fp.exact


def test_diagonal_footprint_enumerates_coupled_dims():
    i = Aff.var("i")
    fp = access_footprint(Access("x", (i, i)), (5, 5), {"i": 5}, ())
    assert fp.elements == 5 and fp.exact


def test_strided_slice_footprint():
    i = Aff.var("i")
    fp = access_footprint(Access("x", (i * 3 + 1,)), (20,), {"i": 6}, ())
    assert fp.elements == 6


def test_projection_of_unused_variables_is_exact():
    from solbound.analysis.footprint import access_footprint
    i, j, w, k, c = (Aff.var(x) for x in "ijwkc")
    # (tril(A) @ B)[:3]: B[k, c] under k <= i < 3 touches rows 0..2 only
    fp = access_footprint(Access("B", (k, c)), (8, 8), {"i": 8, "c": 8, "k": 8},
                          (Atom(k - i, None, 1), Atom(i, None, 3)))
    assert (fp.elements, fp.exact) == (24, True)
    # j >= i and j <= i + w - 5 with w < 4: no point exists, nothing is touched
    fp = access_footprint(Access("x", (i,)), (4,), {"i": 4, "j": 8, "w": 4},
                          (Atom(j - i, 0, None), Atom(i + w - j - 5, 0, None)))
    assert (fp.elements, fp.exact) == (0, True)
    # the triangle of an upper-triangular factor: A[i, k] under i <= k <= j
    fp = access_footprint(Access("A", (i, k)), (6, 6), {"i": 6, "j": 6, "k": 6},
                          (Atom(k - i, 0, None), Atom(j - k, 0, None)))
    assert (fp.elements, fp.exact) == (21, True)


def test_values_count_agrees_with_enumeration_on_random_affine_forms():
    """Distinct values of ``sum(c*v) + const`` in a clip window: every fast path (interval,
    mixed radix) and the bitmap agree with brute force on seeded random forms."""
    import itertools
    import random

    from solbound.analysis.footprint import values_count
    rng = random.Random(1)
    for _ in range(300):
        terms = [(f"v{i}", rng.choice([1, 2, 3, 5, 7, 8, 16, -4, -9, 40]))
                 for i in range(rng.randint(2, 3))]
        ranges = {v: (rng.randint(0, 2), rng.randint(2, 6)) for v, _ in terms}
        const, lo = rng.randint(-20, 20), rng.randint(-50, 10)
        hi = lo + rng.randint(1, 200)
        seen = {const + sum(c * p for (_, c), p in zip(terms, pt))
                for pt in itertools.product(*[range(a, b + 1) for a, b in
                                              (ranges[v] for v, _ in terms)])}
        want = len({x for x in seen if lo <= x < hi})
        assert values_count(terms, const, ranges, lo, hi) == want, (terms, ranges, const, lo, hi)


def test_a_guarded_domain_past_the_enumeration_block_is_counted_exactly(monkeypatch):
    """Domain sizes enumerate all but one variable in blocks of ENUM_LIMIT points: past one
    block the count is the same, exact (it used to stop with an internal OverflowError)."""
    import solbound.analysis.footprint as fp
    from solbound.ir.affine import Aff, Atom
    g = (Atom(Aff.var("i") - Aff.var("j") + Aff.var("k"), 0, None),)
    n = 300
    want = sum(min(n, i + k + 1) for i in range(n) for k in range(3))
    assert fp.domain_size({"i": n, "j": n, "k": 3}, g) == want
    monkeypatch.setattr(fp, "ENUM_LIMIT", 7)
    assert fp.domain_size({"i": n, "j": n, "k": 3}, g) == want
