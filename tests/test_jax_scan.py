"""``lax.scan`` lowered to a sequential loop and validated against JAX on the CPU: several
carries, stacked outputs of several shapes, reversed scans, pytrees of carries and scanned
inputs, and recurrences long enough that rounding differences grow (validated one
iteration at a time from JAX's own carries). MACs are derived by hand: a step's ``x @ w``
of ``[B, D] x [D, H]`` is ``B*D*H`` multiply-adds, times the trip count."""

import numpy as np
import pytest

import solbound

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
S = jax.ShapeDtypeStruct
F32 = jnp.float32
T, B, D, H = 6, 2, 3, 4


def _passed(rep):
    assert rep.lowered.unsupported == [], rep.lowered.unsupported
    assert rep.validation["status"] == "passed", rep.validation
    return rep


def test_several_carries_and_stacked_outputs_of_several_shapes():
    def f(w, u, xs, h0, c0):
        def step(carry, x):
            h, c, n = carry
            a = x @ w + h @ u                                   # [B, H]
            c = 0.5 * c + jnp.tanh(a)
            h = jnp.tanh(c)
            return (h, c, n + 1), (h, c.sum(-1), a[:, :2], n)   # [B,H], [B], [B,2], []
        return jax.lax.scan(step, (h0, c0, jnp.int32(0)), xs)
    rep = _passed(solbound.analyze(f, (S((D, H), F32), S((H, H), F32), S((T, B, D), F32),
                                       S((B, H), F32), S((B, H), F32)), validate=True))
    assert [o["shape"] for o in rep.validation["outputs"]] == \
        [[B, H], [B, H], [], [T, B, H], [T, B], [T, B, 2], [T]]
    assert rep.counts.macs == T * B * (D * H + H * H)           # x @ w and h @ u per step


def test_reversed_scans_stack_their_outputs_in_input_order():
    def f(w, xs, h0):
        def step(h, x):
            h = jnp.tanh(x @ w + h)
            return h, (h * 2.0, x.sum())
        return jax.lax.scan(step, h0, xs, reverse=True)
    rep = _passed(solbound.analyze(f, (S((D, H), F32), S((T, B, D), F32), S((B, H), F32)),
                                   validate=True))
    assert rep.counts.macs == T * B * D * H

    # a running sum from the end: ys[t] = sum of xs[t:], so the order is checked exactly
    def suffix(xs):
        def step(c, x):
            s = c + x
            return s, s
        return jax.lax.scan(step, jnp.zeros(B), xs, reverse=True)
    rep = _passed(solbound.analyze(suffix, (S((T, B), F32),), validate=True))
    assert rep.counts.macs == 0
    assert rep.counts.flops["vector"] == T * B       # one add per element


def test_scans_over_pytrees_of_carries_and_inputs():
    def f(p, xs, h0):
        def step(c, x):
            h = jnp.tanh(x["a"] @ p["w"] + c["h"] @ p["u"] + x["b"])
            return {"h": h, "s": c["s"] + h.sum()}, {"h": h, "pair": (h[0], x["b"].sum())}
        return jax.lax.scan(step, {"h": h0, "s": jnp.float32(0)}, xs)
    params = {"w": S((D, H), F32), "u": S((H, H), F32)}
    xs = {"a": S((T, B, D), F32), "b": S((T, B, H), F32)}
    rep = _passed(solbound.analyze(f, (params, xs, S((B, H), F32)), validate=True))
    assert rep.counts.macs == T * B * (D * H + H * H)
    # a tuple carry and a tuple of scanned inputs, no stacked output
    def g(u, xs, ys, h0):
        def step(c, xy):
            h, k = c
            x, y = xy
            return (jnp.tanh(h @ u + x), k + y), None
        return jax.lax.scan(step, (h0, jnp.zeros(B)), (xs, ys))[0]
    rep = _passed(solbound.analyze(g, (S((H, H), F32), S((T, B, H), F32), S((T, B), F32),
                                       S((B, H), F32)), validate=True))
    assert rep.counts.macs == T * B * H * H


def test_a_scan_without_scanned_inputs_runs_its_length():
    def f(u, h0):
        return jax.lax.scan(lambda h, _: (jnp.tanh(h @ u), h), h0, None, length=T)
    rep = _passed(solbound.analyze(f, (S((H, H), F32), S((B, H), F32)), validate=True))
    assert rep.counts.macs == T * B * H * H


def _rnn(w, u, xs, h0):
    def step(h, x):
        h = jnp.tanh(x @ w + h @ u)
        return h, h
    return jax.lax.scan(step, h0, xs)[1]


def _rnn_args(t, b, d, h):
    return (S((d, h), F32), S((h, h), F32), S((t, b, d), F32), S((b, h), F32))


def test_a_long_tanh_rnn_validates_one_iteration_at_a_time():
    # weights drawn from N(0, 1) make this recurrence chaotic: XLA's and numpy's rounding
    # differ by an ulp in the first step (2e-7) and the difference nearly doubles every
    # step, to the full range of tanh (relative error 2) after about 28 of the 64. Each
    # iteration is therefore also checked from JAX's own carry: the IR agrees step by step
    t, b, d, h = 64, 8, 32, 64
    rep = _passed(solbound.analyze(_rnn, _rnn_args(t, b, d, h), validate=True))
    assert rep.counts.macs == t * b * (d * h + h * h) == 3_145_728
    v = rep.validation
    if "loops" in v:                  # the run straight through did not agree
        (lp,) = v["loops"]
        assert lp["iterations"] == t and lp["ok"] and lp["worst_rel_error"] <= v["tolerance"]
        assert v["unforced_worst_rel_error"] > v["tolerance"]
        assert "amplifies rounding" in v["summary"]


def test_each_iteration_from_jax_carries_checks_every_carry_and_output(monkeypatch):
    from solbound.frontends.jax import reference
    from solbound.frontends.jax.lower import lower
    from solbound.ir.execute import execute
    args = _rnn_args(T, B, D, H)
    low = lower(_rnn, args)
    (info,) = low.loop_carries.values()
    assert info["length"] == T and info["source"].startswith("test_jax_scan.py:")
    values = reference.real_args(args)
    feeds = {s["ir"]: np.asarray(v) for s, v in zip(low.inputs, jax.tree_util.tree_leaves(values))}
    outs, hists = reference.stepped_reference(low, _rnn, values)
    ((hist,),) = hists.values()                        # one loop, one carry
    assert hist.shape == (T + 1, B, H)                 # the carry before each step, and after
    ys = np.asarray(outs[0])
    assert abs(hist[1:] - ys).max() == 0               # the stacked h is the next carry
    golden, cmp, loops, _ = reference._stepped_run(low, _rnn, values, feeds, 1e-5, None)
    assert loops[0]["ok"] and cmp[0]["ok"]
    assert loops[0]["iterations"] == T
    # the IR run straight through computes the same rows (this recurrence is short)
    arrays = execute(low.program, feeds)
    assert abs(arrays[info["carries"][0]].reshape(T + 1, B, H) - hist).max() < 1e-5

    # a wrong rule inside the body is caught at the first carry it computes
    from solbound.frontends.jax import rules
    from solbound.frontends.jax.lower import RULES
    from solbound.ir.model import Call
    monkeypatch.setitem(RULES, "tanh", lambda ctx: rules._elementwise(
        ctx, lambda a: Call("sigmoid", (a,))))
    rep = solbound.analyze(_rnn, _rnn_args(64, 8, 32, 64), validate=True)
    v = rep.validation
    assert v["status"] == "failed"
    assert v["loops"][0]["first_bad_iteration"] == 1
    assert "the carry after iteration 0 differs" in v["summary"]


def test_a_long_fori_loop_validates_one_iteration_at_a_time():
    n = 48

    def f(u, h0):
        return jax.lax.fori_loop(0, n, lambda i, h: jnp.tanh(h @ u), h0)
    # bounds known to the program: a scan; as arrays: a while shaped as fori_loop
    rep = _passed(solbound.analyze(f, (S((64, 64), F32), S((8, 64), F32)), validate=True))
    assert rep.counts.macs == n * 8 * 64 * 64

    def g(u, h0):
        return jax.lax.fori_loop(jnp.int32(0), jnp.int32(n), lambda i, h: jnp.tanh(h @ u), h0)
    rep = _passed(solbound.analyze(g, (S((64, 64), F32), S((8, 64), F32)), validate=True))
    assert rep.counts.macs == n * 8 * 64 * 64
