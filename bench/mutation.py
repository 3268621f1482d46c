"""Wrong still fails: the kill rate of validation over mutated lowering rules.

Every kernel a lowering rule produced for a program of the differential corpus is
mutated in turn, one mutation at a time, and the mutated IR is validated against the
framework exactly as a user's IR is (the PyTorch corpus of
``tests/test_rules_differential.py``, every rule's first shape; with ``--jax``, the JAX
twins of ``tests/test_jax.py``). A mutation is what a wrong rule would write:

* ``drop-term``: one operand of a sum, difference or product in the body left out;
* ``index+1``: one affine index of a read off by one (a read past the end is a failure
  of its own, counted as killed: the executor refuses it);
* ``const*1.001``: one non-zero constant of the body off by 0.1%;
* ``reduction``: sum <-> max, max <-> min, prod -> sum.

A mutant is killed when validation says ``failed``. A survivor is then run beside the
unmutated IR, both in float64, on five further draws of every floating input and parameter
(three more N(0, 1) draws, one scaled by 10 and shifted by 3, one by 100) and classified
(:func:`classify`): ``equivalent`` (the same function written otherwise: ``sum((x - a)(x -
m)) = sum((x - m)^2)`` for any row constant ``a``), ``overflow`` (the same but where one side
overflows at the largest draw: a softmax shifted by its row minimum), ``below-resolution``
(never apart by more than the program's tolerance: a norm's epsilon of 1e-5 moved by
0.1% changes outputs by 1e-8) or ``missed`` (a wrong IR the validation draw could not tell).
The kill rate is given over all mutants and over those that compute another function;
``docs/validation.md`` lists what survives and why.

    python bench/mutation.py                 # the PyTorch corpus
    python bench/mutation.py --jax           # and the JAX corpus
    python bench/mutation.py --limit 40      # the first 40 cases, for a quick look
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from solbound.ir.affine import Aff  # noqa: E402
from solbound.ir.model import Access, Call, Const  # noqa: E402

SWAP = {"sum": "max", "max": "min", "min": "max", "prod": "sum"}


def _subexprs(e, path=()):
    yield path, e
    if isinstance(e, Call):
        for i, a in enumerate(e.args):
            yield from _subexprs(a, path + (i,))


def _replace_at(e, path, new):
    if not path:
        return new
    args = list(e.args)
    args[path[0]] = _replace_at(args[path[0]], path[1:], new)
    return Call(e.op, tuple(args))


def mutants(k):
    """(description, mutated kernel) for every mutation of ``k`` (module doc)."""
    body = k.body
    if k.lib:
        return
    for path, e in _subexprs(body):
        if isinstance(e, Call) and e.op in ("add", "sub", "mul") and len(e.args) == 2:
            for keep in (0, 1):
                if e.op == "sub" and keep == 1:
                    continue
                yield f"drop-term {e.op}@{path}", replace(k, body=_replace_at(body, path,
                                                                           e.args[keep]))
        if isinstance(e, Const) and isinstance(e.value, float) and e.value not in (0.0,) \
                and abs(e.value) != float("inf") and e.value == e.value:
            yield (f"const*1.001 {e.value!r}@{path}",
                   replace(k, body=_replace_at(body, path, Const(e.value * 1.001))))
        if isinstance(e, Access):
            for d, i in enumerate(e.index):
                if isinstance(i, Aff) and i.terms:
                    new = Access(e.tensor, tuple(i + 1 if j == d else i
                                                 for j, i in enumerate(e.index)))
                    yield (f"index+1 {e.tensor}[{d}]@{path}",
                           replace(k, body=_replace_at(body, path, new)))
                    break          # one index per read
    if k.reduce in SWAP and not k.scatter:
        yield f"reduction {k.reduce}->{SWAP[k.reduce]}", replace(k, reduce=SWAP[k.reduce])


def torch_cases(limit: int | None):
    from test_rules_differential import CASES, lowered_for
    for c in CASES[:limit]:
        name, fn, shapes_list, mods, make = c
        yield name, lambda c=c: lowered_for(c[0], c[1], c[2][0], c[3], c[4])


def _draws(feeds: dict, program) -> list[dict]:
    """Further values of the floating external tensors (module doc)."""
    import numpy as np
    ext = {t.name for t in program.tensors if t.role in ("input", "parameter", "buffer")}
    out = []
    for i, (scale, shift) in enumerate(((1, 0), (1, 0), (1, 0), (10, 3), (100, 0))):
        rng = np.random.default_rng(100 + i)
        d = {}
        for n, v in feeds.items():
            v = np.asarray(v)
            if n in ext and np.issubdtype(v.dtype, np.floating):
                v = rng.standard_normal(v.shape).astype(v.dtype) * scale + shift
            d[n] = v
        out.append(d)
    return out


def classify(low, mutant, feeds: dict, tol: float) -> str:
    """What a survivor is (module doc), from the unmutated IR and the mutant run in float64
    on further draws: ``equivalent`` (the same outputs on every draw), ``overflow`` (the
    same but where one side overflows at the largest draw: a softmax without its max
    subtracted), ``below-resolution`` (never apart by more than the program's float32
    tolerance: an epsilon of 1e-5 moved by 0.1%), or ``missed``."""
    import numpy as np
    from solbound.ir.execute import execute
    from solbound.validate.compare import rel_error
    outs = [t.name for t in low.program.tensors if t.role == "output"]
    worst, overflow = 0.0, False
    for d in _draws(feeds, low.program):
        with np.errstate(all="ignore"):
            try:
                a = execute(low.program, d, wide=True)
            except Exception:  # noqa: BLE001 - a draw the unmutated IR cannot take
                continue
            try:
                b = execute(mutant.program, d, wide=True)
            except Exception:  # noqa: BLE001
                return "missed"
        for o in outs:
            e = rel_error(b[o], a[o])
            if not np.isfinite(e) and not (np.all(np.isfinite(a[o]))
                                           and np.all(np.isfinite(b[o]))):
                overflow = True
                continue
            worst = max(worst, e)
    if worst <= 1e-9:
        return "overflow" if overflow else "equivalent"
    return "below-resolution" if worst <= tol and not overflow else "missed"


def run(cases, validate, feeds_of) -> tuple[int, int, list]:
    total = killed = 0
    survivors = []
    for name, get in cases:
        try:
            env = get()
        except Exception as e:  # noqa: BLE001 - a case that does not build here
            print(f"  {name}: not built ({type(e).__name__})")
            continue
        low = env[-1]
        if low.unsupported:
            continue
        base = validate(env, low)
        if base != "passed":
            print(f"  {name}: the unmutated IR is {base}; skipped")
            continue
        n = k_ = 0
        for i, k in enumerate(low.program.kernels):
            for desc, mk in mutants(k):
                ks = list(low.program.kernels)
                ks[i] = mk
                mut = replace(low, program=replace(low.program, kernels=tuple(ks)))
                try:
                    status = validate(env, mut)
                except Exception as e:  # noqa: BLE001 - a mutant the harness cannot run
                    status = f"error {type(e).__name__}"
                n += 1
                if status != "passed":
                    k_ += 1
                else:
                    kind = classify(low, mut, feeds_of(env, low), tolerance_of(low))
                    survivors.append((name, k.name, k.opname or k.op, desc, kind))
        total += n
        killed += k_
        print(f"  {name}: {k_}/{n} killed", flush=True)
    return total, killed, survivors


def tolerance_of(low) -> float:
    """The tolerance validation holds the program to (its coarsest stored dtype's)."""
    from solbound.validate.compare import (max_reduction, operator_calls, tolerance,
                                           tolerance_dtype)
    p = low.program
    return tolerance(tolerance_dtype(p), max_reduction(p), operator_calls(p))


def torch_feeds(env, low) -> dict:
    from solbound.frontends.torch.reference import run_original
    m, inputs, ep, _ = env
    return run_original(m, tuple(inputs), low, ep)["feeds"]


def jax_feeds(env, low) -> dict:
    from solbound.frontends.jax.reference import ir_feeds, real_args
    fn, args, _ = env
    return ir_feeds(low, real_args(args, 0))


def torch_validate(env, low):
    from solbound.frontends.torch.reference import validate_lowered
    m, inputs, ep, _ = env
    return validate_lowered(low, ep, m, tuple(inputs))["status"]


def jax_programs() -> dict:
    """A JAX corpus over the primitives the JAX rules lower: elementwise (unary and
    binary), dot_general, convolution, reductions, cumulative sums, gathers, a softmax, a
    layer norm and a scan; random N(0, 1) inputs of distinct, non-power-of-two extents."""
    import jax
    import jax.numpy as jnp
    f32 = jnp.float32
    S = jax.ShapeDtypeStruct

    def attn(q, k, v):
        s = q @ k.T / jnp.sqrt(q.shape[-1])
        return jax.nn.softmax(jnp.where(jnp.tril(jnp.ones(s.shape, bool)), s, -1e9)) @ v

    def layer_norm(x, g, b):
        m = x.mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b

    def rnn(w, h0, xs):
        return jax.lax.scan(lambda h, x: (jnp.tanh(h @ w + x),) * 2, h0, xs)

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (2, 1), ((1, 1), (0, 2)))

    return {
        "unary": (lambda x: jnp.exp(x) + jnp.tanh(x) * jax.nn.sigmoid(x) - jnp.sin(x)
                  + jnp.log1p(jnp.abs(x)) + jax.nn.gelu(x) + jnp.maximum(x, 0.3),
                  (S((5, 7), f32),)),
        "binary": (lambda a, b: (a * b - a / (jnp.abs(b) + 0.5)) ** 2 + jnp.minimum(a, b),
                   (S((3, 7), f32), S((7,), f32))),
        "matmul": (lambda a, b, c: a @ b + c, (S((5, 6), f32), S((6, 3), f32), S((3,), f32))),
        "batched": (lambda a, b: jnp.einsum("bij,bjk->bik", a, b),
                    (S((2, 3, 5), f32), S((2, 5, 4), f32))),
        "conv": (conv, (S((1, 3, 9, 7), f32), S((4, 3, 3, 2), f32))),
        "reduce": (lambda x: x.sum(0) + x.max(0) - x.min(0) + x.mean(0) + jnp.prod(x * 0.5, 0),
                   (S((6, 5), f32),)),
        "cumsum": (lambda x: jnp.cumsum(x, 1) * 0.5, (S((4, 7), f32),)),
        "gather": (lambda t, i: jnp.take(t, i, axis=0) * 1.5, (S((11, 3), f32),
                                                                 S((6,), jnp.int32))),
        "softmax-attention": (attn, (S((9, 4), f32), S((9, 4), f32), S((9, 5), f32))),
        "layer-norm": (layer_norm, (S((5, 12), f32), S((12,), f32), S((12,), f32))),
        "scan": (rnn, (S((6, 6), f32), S((2, 6), f32), S((7, 2, 6), f32))),
    }


def jax_cases(limit):
    from solbound.frontends.jax.lower import lower
    for name, (fn, args) in list(jax_programs().items())[:limit]:
        yield name, lambda fn=fn, args=args: (fn, args, lower(fn, tuple(args)))


def jax_validate(env, low):
    from solbound.frontends.jax.reference import validate
    fn, args, _ = env
    return validate(low, fn, tuple(args))["status"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=None, help="the first N cases only")
    ap.add_argument("--jax", action="store_true", help="also the JAX corpus")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = [("pytorch", *run(torch_cases(a.limit), torch_validate, torch_feeds))]
    if a.jax:
        rows.append(("jax", *run(jax_cases(a.limit), jax_validate, jax_feeds)))
    for corpus, total, killed, survivors in rows:
        kinds = {k: sum(s[-1] == k for s in survivors)
                 for k in ("equivalent", "overflow", "below-resolution", "missed")}
        same = kinds["equivalent"] + kinds["overflow"]
        print(f"\n{corpus}: {killed}/{total} mutants killed "
              f"({100 * killed / max(total, 1):.2f}%); of the {total - same} that compute "
              f"another function, {100 * killed / max(total - same, 1):.2f}% killed; "
              f"survivors: " + ", ".join(f"{n} {k}" for k, n in kinds.items()))
        for s in sorted(survivors, key=lambda s: s[-1]):
            print("  survivor:", " | ".join(map(str, s)))
    print(f"\n{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
