"""Validation against JAX: the function run by JAX on the CPU with seeded inputs (floating
leaves drawn from a normal distribution, integer leaves given or zero, boolean leaves given
or true, PRNG keys given or split from a seeded key), the IR run by the executor on the same
values with JAX's random draws replayed, every output compared with the neutral tolerance
of ``validate/compare.py``."""

from __future__ import annotations

import time

import numpy as np


def real_args(args, seed: int = 0, ones: frozenset[int] = frozenset(),
              domains: dict[int, tuple] | None = None):
    """Concrete values for ``args``: arrays kept, ``ShapeDtypeStruct`` leaves drawn (the
    leaves numbered in ``ones``, integer inputs used as masks, hold ones: a mask that keeps
    everything, as a boolean leaf does). ``domains`` (leaf number -> a domain of
    ``validate.inputs.input_domains``): an index is drawn inside its table, a value that
    must not be negative from ``|N(0, 1)|``."""
    domains = domains or {}
    import jax
    import jax.numpy as jnp
    rng = np.random.default_rng(seed)
    count = iter(range(1 << 62))

    def draw(x):
        i = next(count)
        if i in ones and isinstance(x, jax.ShapeDtypeStruct):
            return jnp.ones(x.shape, x.dtype)
        dom = domains.get(i, ())
        if not isinstance(x, jax.ShapeDtypeStruct):
            return x
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            keys = jax.random.split(jax.random.key(seed), max(1, int(np.prod(x.shape))))
            return keys.reshape(x.shape)
        dt = np.dtype(x.dtype) if x.dtype != jnp.bfloat16 else None
        if dt is None or np.issubdtype(dt, np.floating):
            v = rng.standard_normal(x.shape).astype(np.float32)
            return jnp.asarray(np.abs(v) if dom[:1] == ("nonneg",) else v, dtype=x.dtype)
        if dt == np.bool_:
            return jnp.ones(x.shape, x.dtype)      # a mask that keeps everything
        if dom[:1] == ("index",) and dom[1] > 0:
            return jnp.asarray(rng.integers(0, dom[1], x.shape), dtype=x.dtype)
        return jnp.zeros(x.shape, x.dtype)
    return jax.tree_util.tree_map(draw, args, is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))


def shrunk_args(args):
    """Smaller instances of ``args``, largest first: ``(description, args)``. Every
    dimension of a size of 32 or more, in every leaf, halves together (a width shared by
    the input and the weights stays shared), then also the leading dimension of each leaf."""
    import jax
    leaves = [x for x in jax.tree_util.tree_leaves(args) if hasattr(x, "shape")]
    sizes = sorted({n for x in leaves for n in x.shape if n >= 32})
    if not sizes:
        return
    for shift in range(1, 8):
        def small(x, shift=shift):
            if not hasattr(x, "shape") or not x.shape:
                return x
            shape = tuple(max(1, n >> shift) if n >= 32 else n for n in x.shape)
            if shape == tuple(x.shape):
                return x
            if isinstance(x, jax.ShapeDtypeStruct):
                return jax.ShapeDtypeStruct(shape, x.dtype)
            return x[tuple(slice(0, n) for n in shape)]
        yield f"dimensions of 32 or more halved {shift} time(s)", jax.tree_util.tree_map(
            small, args, is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))


def validate_within_budget(lowered, fn, args, seed: int = 0, max_bytes=None,
                           max_seconds=None) -> dict:
    """``validate``, at reduced shapes when the program is over the budget (the reduced
    program must have the same kernel structure)."""
    from ...analysis.counts import count_program
    from ...graph.einsum import build_graph
    from ...validate.compare import (DEFAULT_MAX_BYTES, DEFAULT_MAX_SECONDS, _structure,
                                     estimate_cost)
    from .lower import lower
    max_bytes = max_bytes or DEFAULT_MAX_BYTES
    max_seconds = max_seconds or DEFAULT_MAX_SECONDS

    def cost(low):
        return estimate_cost(low.program, sum(count_program(build_graph(low.program))
                                               .flops.values()))
    mem, secs = cost(lowered)
    if mem <= max_bytes and secs <= max_seconds:
        return validate(lowered, fn, args, seed)
    for desc, small in shrunk_args(args):
        try:
            low = lower(fn, small)
        except Exception:  # noqa: BLE001 - a size the function does not accept
            continue
        if _structure(low.program) != _structure(lowered.program):
            continue
        m, s = cost(low)
        if m <= max_bytes and s <= max_seconds:
            res = validate(low, fn, small, seed)
            res.update(reduced=True, reduced_by=desc)
            res["summary"] = res.get("summary", "") + f" at reduced shapes ({desc})"
            return res
    return {"status": "skipped", "seconds": 0.0,
            "reason": f"over budget (~{mem / 2**30:.1f} GiB, ~{secs:.0f} s) and no reduced "
                      f"instance keeps the kernel structure"}


def _plain(v) -> np.ndarray:
    """A JAX value as numpy (a PRNG key array as its key data)."""
    import jax
    if jax.dtypes.issubdtype(getattr(v, "dtype", np.float32), jax.dtypes.prng_key):
        v = jax.random.key_data(v)
    return np.asarray(v)


def recorded_draws(lowered, fn, values) -> dict[str, np.ndarray]:
    """What JAX drew at each of the lowering's draw sites (``random_draws``: an equation
    path through inlined calls): the jaxpr evaluated equation by equation, entering the
    calls on a path to a draw."""
    import jax
    from jax.extend.core import Literal
    from .lower import CALLS
    wanted = {}
    for ir, (path, index) in lowered.random_draws.items():
        wanted.setdefault(tuple(int(i) for i in path.split("/")), []).append((ir, index or 0))
    prefixes = {p[:n] for p in wanted for n in range(1, len(p))}
    got: dict[str, np.ndarray] = {}

    def run(jaxpr, consts, args, prefix):
        env = dict(zip(jaxpr.constvars, consts))
        env.update(zip(jaxpr.invars, args))
        for j, eqn in enumerate(jaxpr.eqns):
            path = prefix + (j,)
            ins = [a.val if isinstance(a, Literal) else env[a] for a in eqn.invars]
            if path in prefixes and eqn.primitive.name in CALLS:
                p = eqn.params
                inner = p.get("jaxpr") or p.get("call_jaxpr") or p.get("fun_jaxpr")
                ij = inner.jaxpr if hasattr(inner, "jaxpr") else inner
                outs = run(ij, getattr(inner, "consts", []), ins[len(ins) - len(ij.invars):], path)
            else:
                outs = eqn.primitive.bind(*ins, **eqn.params)
                outs = outs if eqn.primitive.multiple_results else [outs]
            for var, val in zip(eqn.outvars, outs):
                env[var] = val
            for ir, index in wanted.get(path, ()):
                got[ir] = _plain(outs[index])
        return [a.val if isinstance(a, Literal) else env[a] for a in jaxpr.outvars]
    closed = jax.make_jaxpr(fn)(*values)
    run(closed.jaxpr, closed.consts, jax.tree_util.tree_leaves(values), ())
    return got


def _iterate(eqn, ins: list, run) -> tuple[list, list]:
    """A ``scan`` or ``while`` equation evaluated one iteration at a time (``run`` evaluates
    its body): its outputs and, per carry, the carry before each iteration and after the
    last."""
    import jax.numpy as jnp
    p = eqn.params
    if eqn.primitive.name == "scan":
        nc, ncar, length = p["num_consts"], p["num_carry"], p["length"]
        body, consts = p["jaxpr"], ins[:nc]
        carry, xs = list(ins[nc:nc + ncar]), ins[nc + ncar:]
        hist = [[c] for c in carry]
        ys = [[None] * length for _ in eqn.outvars[ncar:]]
        for i in range(length):
            row = length - 1 - i if p.get("reverse") else i
            out = run(body.jaxpr, body.consts, consts + carry + [x[row] for x in xs])
            carry = list(out[:ncar])
            for h, c in zip(hist, carry):
                h.append(c)
            for y, v in zip(ys, out[ncar:]):
                y[row] = v
        stacked = [jnp.stack(y) if length else jnp.zeros(v.aval.shape, v.aval.dtype)
                   for y, v in zip(ys, eqn.outvars[ncar:])]
        return carry + stacked, hist
    cj, bj = p["cond_jaxpr"], p["body_jaxpr"]
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    carry = list(ins[cn + bn:])
    hist = [[c] for c in carry]
    while bool(run(cj.jaxpr, cj.consts, ins[:cn] + carry)[0]):
        carry = list(run(bj.jaxpr, bj.consts, ins[cn:cn + bn] + carry))
        for h, c in zip(hist, carry):
            h.append(c)
    return carry, hist


def stepped_reference(lowered, fn, values) -> tuple[list, dict[int, list[np.ndarray]]]:
    """``fn(*values)`` evaluated by JAX equation by equation, each top-level loop of the
    lowering (``lowered.loop_carries``) one iteration at a time: the outputs' leaves, and
    per loop id the history of each carry (``[iterations + 1, ...]``, the IR's layout)."""
    import jax
    from jax.extend.core import Literal
    from .lower import CALLS
    loops = {tuple(int(i) for i in c["path"].split("/")): lid
             for lid, c in getattr(lowered, "loop_carries", {}).items()}
    prefixes = {p[:n] for p in loops for n in range(1, len(p))}
    hists: dict[int, list[np.ndarray]] = {}

    def run(jaxpr, consts, args, prefix=None):
        env = dict(zip(jaxpr.constvars, consts))
        env.update(zip(jaxpr.invars, args))
        for j, eqn in enumerate(jaxpr.eqns):
            path = prefix + (j,) if prefix is not None else None
            ins = [a.val if isinstance(a, Literal) else env[a] for a in eqn.invars]
            if path in loops:
                outs, hist = _iterate(eqn, ins, run)
                hists[loops[path]] = [_golden(np.stack([_plain(c) for c in h])) for h in hist]
            elif path in prefixes and eqn.primitive.name in CALLS:
                p = eqn.params
                inner = p.get("jaxpr") or p.get("call_jaxpr") or p.get("fun_jaxpr")
                ij = inner.jaxpr if hasattr(inner, "jaxpr") else inner
                outs = run(ij, getattr(inner, "consts", []), ins[len(ins) - len(ij.invars):],
                           path)
            else:
                outs = eqn.primitive.bind(*ins, **eqn.params)
                outs = outs if eqn.primitive.multiple_results else [outs]
            for var, val in zip(eqn.outvars, outs):
                env[var] = val
        return [a.val if isinstance(a, Literal) else env[a] for a in jaxpr.outvars]
    closed = jax.make_jaxpr(fn)(*values)
    outs = run(closed.jaxpr, closed.consts, jax.tree_util.tree_leaves(values), ())
    return outs, hists


def first_divergence(lowered, fn, values, arrays, tol: float):
    """The first top-level equation whose value the IR does not reproduce: the jaxpr is
    evaluated equation by equation on the same inputs and each value compared with the IR
    tensor that holds it (values computed only where read are skipped)."""
    import jax
    from jax.extend.core import Literal
    from ...validate.compare import _strided, rel_error
    closed = jax.make_jaxpr(fn)(*values)
    env = {}
    for var, val in zip(closed.jaxpr.invars, jax.tree_util.tree_leaves(values)):
        env[var] = val
    for var, val in zip(closed.jaxpr.constvars, closed.consts):
        env[var] = val
    for i, eqn in enumerate(closed.jaxpr.eqns):
        ins = [a.val if isinstance(a, Literal) else env[a] for a in eqn.invars]
        outs = eqn.primitive.bind(*ins, **eqn.params)
        outs = outs if eqn.primitive.multiple_results else [outs]
        for j, (var, val) in enumerate(zip(eqn.outvars, outs)):
            env[var] = val
            info = lowered.values.get((i, j))
            if info is None or info["ir"] in lowered.partial or info["ir"] not in arrays:
                continue
            ir = _strided(arrays[info["ir"]], info["shape"], info["strides"], info["offset"])
            err = rel_error(ir, np.asarray(val))
            if not err <= tol:
                return {"equation": i, "primitive": info["primitive"],
                        "source": info["source"], "rel_error": err}
    return None


def _golden(o) -> np.ndarray:
    v = _plain(o)
    return v.astype(np.float64) if v.dtype.kind in "fV" else v


def ir_feeds(lowered, values) -> dict[str, np.ndarray]:
    """The IR's external tensors from the function's argument values (leaves in order)
    and the constants it closes over."""
    import jax
    leaves = jax.tree_util.tree_leaves(values)
    feeds = {spec["ir"]: np.asarray(_plain(v), dtype=np.float64
                                    if _plain(v).dtype.kind == "V" else None)
             for spec, v in zip(lowered.inputs, leaves) if spec.get("ir")}
    for st in lowered.state:
        feeds[st["ir"]] = np.asarray(st["value"])
    return feeds


def _stepped_run(lowered, fn, values, feeds, tol, on_kernel, wide: bool = False):
    """The IR run with each iteration of every top-level loop started from JAX's carries
    (``stepped_reference``): a recurrence that amplifies rounding is checked one step at a
    time. Before each iteration (and after the last) the IR's carry, which its previous
    iteration (or the initial copy) computed, is compared with JAX's and then replaced by
    it. Returns (reference outputs, the comparison of outputs, one entry per loop (with
    ``diffs``, the largest absolute difference of the carries per iteration), the IR's
    arrays). ``wide``: the IR in float64 (for ``values`` given in float64 under x64)."""
    from ...ir.execute import execute
    from ...validate.compare import _max_abs_diff, compare, rel_error
    outs, hists = stepped_reference(lowered, fn, values)
    golden = [_golden(o) for o in outs]
    loops: dict[int, dict] = {}

    def force(loop, it, arrays):
        info, ref = lowered.loop_carries.get(loop[2]), hists.get(loop[2])
        if info is None or ref is None:
            return
        st = loops.setdefault(loop[2], {"source": info["source"], "iterations": loop[1],
                                        "worst_rel_error": 0.0, "ok": True,
                                        "first_bad_iteration": None, "bad": [], "diffs": {}})
        for name, h in zip(info["carries"], ref):
            if name is None or h.shape[0] != loop[1] + 1 or arrays[name].size != h.size:
                continue
            a, r = arrays[name].reshape(h.shape[0], -1), h.reshape(h.shape[0], -1)
            if name not in lowered.partial:
                err = rel_error(a[it], r[it])
                st["worst_rel_error"] = max(st["worst_rel_error"], err)
                st["diffs"][it] = max(st["diffs"].get(it, 0.0), _max_abs_diff(a[it], r[it]))
                if not err <= tol:
                    st["bad"].append(it)
                    if st["ok"]:
                        st["ok"], st["first_bad_iteration"] = False, it
            a[it] = r[it]
    arrays = execute(lowered.program, feeds, on_kernel=on_kernel, on_iteration=force,
                     wide=wide)
    return golden, compare(lowered, arrays, golden, tol), list(loops.values()), arrays


def _stepped_f64(lowered, fn, values, feeds, golden32, outs, loops, arrays32, tol) -> None:
    """Re-judge a stepped run's misses in float64 (``validate.compare.rejudge_in_f64``):
    the same stepped run under x64 with the floating inputs widened and the IR wide. A
    loop's iteration whose carries missed the tolerance passes when their difference
    shrinks ``F64_SHRINK`` times; so do the outputs."""
    from ...validate.compare import F64_SHRINK, rejudge_failed, rejudge_in_f64
    try:
        with _x64():
            golden64, _, loops64, arrays64 = _stepped_run(lowered, fn, _widened(values),
                                                          feeds, tol, None, wide=True)
    except Exception as e:  # noqa: BLE001 - a function that does not run in float64
        rejudge_failed(outs, f"{type(e).__name__}: {e}")
        return
    rejudge_in_f64(lowered, outs, golden32, golden64, arrays32, arrays64)
    for lp, lp64 in zip(loops, loops64):
        if lp["ok"]:
            continue
        shrunk = all(it in lp64["diffs"] and lp64["diffs"][it] <= F64_SHRINK * lp["diffs"][it]
                     for it in lp["bad"])
        lp["f64_check"] = {"ran": True, "iterations": len(set(lp["bad"])),
                           "f32_max_abs_diff": max(lp["diffs"][it] for it in lp["bad"]),
                           "f64_max_abs_diff": max((lp64["diffs"].get(it, float("inf"))
                                                    for it in lp["bad"]), default=0.0)}
        if shrunk:
            lp["ok"], lp["first_bad_iteration"] = True, None


def _x64():
    """JAX with 64-bit types enabled, inside the block."""
    import jax
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64       # JAX before 0.7
    return enable_x64()


def _widened(values):
    """``values`` with every floating leaf in float64 (call under :func:`_x64`)."""
    import jax
    import jax.numpy as jnp

    def wide(v):
        if hasattr(v, "dtype") and jnp.issubdtype(v.dtype, jnp.floating):
            return jnp.asarray(np.asarray(v, dtype=np.float64))
        return v
    return jax.tree_util.tree_map(wide, values)


def _recheck_in_f64(lowered, fn, values, feeds, golden32, outs, arrays32) -> None:
    """Re-judge the outputs that missed the tolerance in float64
    (``validate.compare.rejudge_in_f64``): ``fn`` under ``enable_x64`` with its floating
    arguments widened (JAX computes in the inputs' type where the program does not cast
    itself), and the IR run wide, from the same values."""
    import jax
    from ...ir.execute import execute
    from ...validate.compare import rejudge_failed, rejudge_in_f64

    try:
        with _x64():
            values64 = _widened(values)
            golden64 = [_golden(o) for o in jax.tree_util.tree_leaves(fn(*values64))]
        arrays64 = execute(lowered.program, feeds, wide=True)
    except Exception as e:  # noqa: BLE001 - a function that does not run in float64
        rejudge_failed(outs, f"{type(e).__name__}: {e}")
        return
    rejudge_in_f64(lowered, outs, golden32, golden64, arrays32, arrays64)


def validate(lowered, fn, args, seed: int = 0) -> dict:
    """Compare the IR with ``fn(*args)`` run by JAX (a result dict as validation's)."""
    import jax
    from ...ir.execute import ExecutionError, execute
    from ...validate.compare import (compare, f64_summary, max_reduction, tolerance_dtype,
                                     tolerance)
    from ...validate.inputs import input_domains

    t0 = time.perf_counter()
    if lowered.unsupported:
        names = sorted({u.operator for u in lowered.unsupported})
        return {"status": "skipped", "seconds": 0.0,
                "reason": f"unsupported operators ({', '.join(names)}): the IR does not compute "
                          f"the whole program, so there is nothing whole to compare"}
    if getattr(lowered, "branch_assumed", False):
        return {"status": "skipped", "seconds": 0.0,
                "reason": "a branch known only at run time was chosen for the bound (see the "
                          "notes): the run takes the branch its data says"}
    if getattr(lowered, "draws_unreplayable", ""):
        return {"status": "skipped", "seconds": 0.0,
                "reason": f"a random draw inside a loop or a branch "
                          f"({lowered.draws_unreplayable}) cannot be replayed: not comparable"}
    masks = set(getattr(lowered, "mask_inputs", ()))
    ones = frozenset(i for i, spec in enumerate(lowered.inputs) if spec.get("ir") in masks)
    by_ir = input_domains(lowered.program)
    domains = {i: by_ir[spec["ir"]] for i, spec in enumerate(lowered.inputs)
               if spec.get("ir") in by_ir}
    # a draw whose reference is not finite, or constant, says little: draw again (and say so)
    from ...validate.compare import _is_constant
    redraws: list[str] = []
    for attempt in range(DRAWS):
        values = real_args(args, seed + attempt, ones, domains)
        golden = [_golden(o) for o in jax.tree_util.tree_leaves(fn(*values))]
        bad = _not_finite(golden)
        const = [i for i, g in enumerate(golden) if np.size(g) > 1 and _is_constant(g)]
        if not bad and not const:
            break
        redraws.append(f"draw {attempt + 1}: output {(bad or const)[0]} "
                       + ("not finite" if bad else "constant"))
    feeds = ir_feeds(lowered, values)
    draws = recorded_draws(lowered, fn, values) if lowered.random_draws else {}

    def replay(k, arrays):
        if k.out in draws:
            arrays[k.out][...] = draws[k.out].reshape(arrays[k.out].shape)
    p = lowered.program
    src_dtype = tolerance_dtype(p)
    tol = tolerance(src_dtype, max_reduction(p), len(lowered.groups))
    try:
        arrays = execute(p, feeds, on_kernel=replay if draws else None)
    except ExecutionError as e:
        return {"status": "failed", "reason": f"IR execution error: {e}", "tolerance": tol,
                "seconds": time.perf_counter() - t0}
    outs = compare(lowered, arrays, golden, tol)
    if not all(o["ok"] for o in outs) and not draws:
        _recheck_in_f64(lowered, fn, values, feeds, golden, outs, arrays)
    ok = all(o["ok"] for o in outs)
    worst = max((o["worst_rel_error"] or 0.0 for o in outs), default=0.0)
    reference, extra, summary = "the function run by JAX on the CPU", {}, f64_summary(outs)
    if not ok and getattr(lowered, "loop_carries", None):
        # a recurrence may amplify rounding (a tanh RNN with drawn weights doubles a one-ulp
        # difference every few steps): each iteration again, from JAX's own carries
        try:
            golden_f, outs_f, loops, arrays_f = _stepped_run(lowered, fn, values, feeds, tol,
                                                             replay if draws else None)
        except ExecutionError:
            loops = []
        if loops and not draws and not (all(o["ok"] for o in outs_f)
                                        and all(lp["ok"] for lp in loops)):
            _stepped_f64(lowered, fn, values, feeds, golden_f, outs_f, loops, arrays_f, tol)
        for lp in loops:
            del lp["bad"], lp["diffs"]
        if loops:
            unforced = worst
            golden, outs = golden_f, outs_f
            ok = all(o["ok"] for o in outs) and all(lp["ok"] for lp in loops)
            worst = max([o["worst_rel_error"] or 0.0 for o in outs]
                        + [lp["worst_rel_error"] for lp in loops])
            reference = ("the function run by JAX on the CPU, its loops one iteration at a "
                         "time, each IR iteration started from JAX's carries")
            extra = {"loops": loops, "unforced_worst_rel_error": unforced}
            bad = [lp for lp in loops if not lp["ok"]]
            if bad:
                it = bad[0]["first_bad_iteration"]
                summary = (f"; loop at {bad[0]['source']}: " + (
                    "the initial carry differs" if it == 0 else
                    f"the carry after iteration {it - 1} differs"))
            elif not ok:
                summary = "; every loop carry agrees from JAX's carries, an output does not"
            else:
                summary = (f"; every loop iteration agrees from JAX's carries (run through "
                           f"without them, the recurrence amplifies rounding to "
                           f"{unforced:.3g})")
                rounding = sum(lp.get("f64_check", {}).get("iterations", 0) for lp in loops)
                if rounding:
                    summary += (f"; {rounding} iteration(s) over the tolerance are rounding "
                                f"(their difference shrinks in float64)")
            summary += f64_summary(outs)
    res = {"status": "passed" if ok else "failed", "tolerance": tol, "outputs": outs, **extra,
           **({} if ok else {"first_divergence": first_divergence(lowered, fn, values,
                                                                  arrays, tol)}),
           "reference": reference,
           "summary": f"worst relative error {worst:.3g} (tolerance {tol:.3g}){summary}",
           "seconds": time.perf_counter() - t0}
    if redraws:
        res["redraws"] = redraws
        res["summary"] += (f"; inputs drawn {len(redraws) + (not bad and not const)} times "
                           f"({redraws[0]})")
    if ok and (bad or const):
        res["status"] = "inconclusive"
        res["reason"] = (f"output {(bad or const)[0]} is "
                         + ("not finite" if bad else "constant")
                         + f" in the reference run for each of {DRAWS} draws of the inputs"
                         + ("" if bad else " (a constant result)")
                         + ": agreeing with it proves little; pass real values to check")
    return res


DRAWS = 3         # draws of the inputs tried before a non-finite reference is inconclusive


def _not_finite(golden: list) -> list[int]:
    """The reference outputs with a value that is not finite."""
    return [i for i, g in enumerate(golden)
            if np.issubdtype(np.asarray(g).dtype, np.floating) and not np.all(np.isfinite(g))]


def _block(a: np.ndarray, spec: tuple, axes: dict, coords: dict) -> np.ndarray:
    """The block of global array ``a`` a device at mesh ``coords`` holds under partition
    ``spec`` (one entry per leading dimension: ``None``, an axis, or a tuple of axes)."""
    a = np.asarray(a)
    for d, entry in enumerate(spec):
        if entry is None:
            continue
        names = entry if isinstance(entry, tuple) else (entry,)
        parts, idx = 1, 0
        for name in names:
            idx = idx * axes[name] + coords[name]
            parts *= axes[name]
        size = a.shape[d] // parts
        a = np.take(a, range(idx * size, (idx + 1) * size), axis=d)
    return a


def validate_shard_map(lowered, fn, args, seed: int = 0) -> dict:
    """A ``shard_map`` program (one device's IR) against the function run by JAX on a
    mesh of real CPU devices: every device's block of the inputs fed to its rank's IR, the
    ranks run at once (``execute_spmd``), each rank's outputs compared with its block of
    JAX's outputs (``in_specs``/``out_specs`` say which block)."""
    import jax
    from ...ir.execute import ExecutionError, execute_spmd
    from ...validate.compare import (compare, max_reduction, tolerance_dtype, per_rank_result,
                                     tolerance)
    t0 = time.perf_counter()
    mesh_info = lowered.mesh
    axes = mesh_info["axes"]
    n = lowered.world_size
    devs = jax.devices()
    if len(devs) < n:
        return {"status": "skipped", "seconds": 0.0,
                "reason": f"the mesh has {n} devices and JAX sees {len(devs)}: run with "
                          f"XLA_FLAGS=--xla_force_host_platform_device_count={n} (set before "
                          f"JAX starts) to validate on CPU devices"}
    if lowered.unsupported:
        return {"status": "skipped", "seconds": 0.0, "reason": "unsupported operators"}
    values = real_args(args, seed)
    leaves = [np.asarray(_plain(v)) for v in jax.tree_util.tree_leaves(values)]
    mesh = jax.sharding.Mesh(np.array(devs[:n]).reshape(tuple(axes.values())), tuple(axes))
    try:
        flat, tree = jax.tree_util.tree_flatten(values)
        placed = [jax.device_put(v, jax.sharding.NamedSharding(
            mesh, jax.sharding.PartitionSpec(*s))) for v, s in zip(flat, mesh_info["in_specs"])]
        with jax.sharding.use_mesh(mesh) if hasattr(jax.sharding, "use_mesh") else mesh:
            out = fn(*jax.tree_util.tree_unflatten(tree, placed))
    except Exception as e:  # noqa: BLE001 - the reference, not the IR, failed
        return {"status": "skipped", "seconds": time.perf_counter() - t0,
                "reason": f"running the function on a mesh of {n} CPU devices failed: "
                          f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    outs = [np.asarray(_plain(o)) for o in jax.tree_util.tree_leaves(out)]
    names = list(axes)
    feeds, golden = [], []
    for r in range(n):
        coords, rest = {}, r
        for name in reversed(names):
            coords[name] = rest % axes[name]
            rest //= axes[name]
        feeds.append({spec["ir"]: _block(v, s, axes, coords)
                      for spec, v, s in zip(lowered.inputs, leaves, mesh_info["in_specs"])
                      if spec.get("ir")})
        golden.append([_golden(_block(o, s, axes, coords))
                       for o, s in zip(outs, mesh_info["out_specs"])])
    p = lowered.program
    src_dtype = tolerance_dtype(p)
    tol = tolerance(src_dtype, max_reduction(p), len(lowered.groups))
    try:
        arrays = execute_spmd(p, feeds)
    except ExecutionError as e:
        return {"status": "failed", "reason": f"IR execution error: {e}", "tolerance": tol,
                "seconds": time.perf_counter() - t0}
    return per_rank_result([compare(lowered, a, g, tol) for a, g in zip(arrays, golden)], tol,
                           f"the function run by JAX on a mesh of {n} CPU devices, each "
                           f"rank's IR against its device's blocks", time.perf_counter() - t0)
