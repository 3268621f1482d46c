"""``solbound validate FILE.py --ir IR_FILE``: check an IR text written elsewhere.

Exit 0 when every program output matches, 1 (with a diagnosis) when one does
not, 2 when the text is not valid IR or does not fit the program's inputs.

Tensors of the given IR are matched to the program by name first (the names
``solbound ir`` writes: forward arguments, ``p_<param>``, ``b_<buffer>``), then
by role and declaration order. Outputs are matched by name, else in order to
the program's user outputs.
"""

from __future__ import annotations

import math
import sys

import numpy as np

from ...ir.check import IRError
from ...ir.execute import ExecutionError, execute
from ...ir.text import IRSyntaxError, parse_program
from ...validate.compare import _strided, max_reduction, rel_error, tolerance


def _say(msg: str) -> None:
    print(f"solbound: {msg}", file=sys.stderr)


def check_ir_text(text: str, problem, seed: int = 0) -> tuple[int, dict]:
    """Returns (exit code, result dict)."""
    from .capture import export_program
    from .lower import lower
    from .reference import _build_real, run_original

    try:
        given = parse_program(text)
    except (IRSyntaxError, IRError) as e:
        return 2, {"status": "invalid", "reason": str(e)}
    model, inputs = _build_real(problem, seed)
    ep = export_program(model, tuple(inputs), problem.source)
    ref = lower(ep)
    gold = run_original(model, tuple(inputs), ref)
    feeds_by_ref = gold["feeds"]
    ref_decl = ref.program.tensor_map
    feeds: dict[str, np.ndarray] = {}
    # inputs/state by name, then by role order
    for role in ("input", "parameter", "buffer", "constant", "assumed"):
        want = [t for t in given.tensors if t.role == role]
        have = [t for t in ref.program.tensors if t.role == role and t.name in feeds_by_ref]
        by_order = iter(h for h in have if h.name not in {w.name for w in want})
        for t in want:
            src = t.name if t.name in feeds_by_ref else next(by_order, None)
            src = src.name if hasattr(src, "name") else src
            if src is None:
                return 2, {"status": "invalid",
                           "reason": f"{role} {t.name} matches nothing in the program"}
            val = feeds_by_ref[src]
            if val.size != t.numel:
                return 2, {"status": "invalid",
                           "reason": f"{role} {t.name}{list(t.shape)} does not fit the program's "
                                     f"{src}{list(val.shape)}"}
            feeds[t.name] = val.reshape(t.shape)
    try:
        arrays = execute(given, feeds)
    except ExecutionError as e:
        return 1, {"status": "failed", "reason": f"IR execution error: {e}"}
    outs_given = [t for t in given.tensors if t.role == "output"]
    refs = [(o, g) for o, g in zip(ref.outputs, gold["golden"]) if g is not None]
    by_name = {o.get("ir"): (o, g) for o, g in refs}
    user = [(o, g) for o, g in refs if o["kind"] == "output"]
    tol = tolerance("f32", max(max_reduction(given), max_reduction(ref.program)), len(ref.groups))
    results, order = [], iter(user)
    for t in outs_given:
        pair = by_name.get(t.name) or next(order, None)
        if pair is None:
            continue
        o, g = pair
        val = arrays[t.name]
        if val.size != np.size(g):
            results.append({"output": t.name, "ok": False, "worst_rel_error": None,
                            "reason": f"shape {list(val.shape)} vs {list(np.shape(g))}"})
            continue
        err = rel_error(val.reshape(np.shape(g)), g)
        results.append({"output": t.name, "ok": bool(err <= tol),
                        "worst_rel_error": err if math.isfinite(err) else None})
    if not results:
        return 2, {"status": "invalid", "reason": "the IR declares no output matching the program"}
    ok = all(r["ok"] for r in results)
    res = {"status": "passed" if ok else "failed", "tolerance": tol, "outputs": results}
    if not ok:
        # name the first kernel whose output differs from the reference IR's tensor of that name
        ref_arrays = execute(ref.program, feeds_by_ref)
        for k in given.kernels:
            d = ref_decl.get(k.out)
            if d is not None and d.shape == given.tensor_map[k.out].shape:
                err = rel_error(arrays[k.out], ref_arrays[k.out])
                if not err <= tol:
                    res["first_divergence"] = {"kernel": k.name, "tensor": k.out,
                                               "rel_error": err if math.isfinite(err) else None}
                    break
    return (0 if ok else 1), res


def run_validate(a) -> int:
    from .capture import load_problem
    try:
        text = open(a.ir).read()
    except OSError as e:
        _say(f"cannot read {a.ir}: {e.strerror}")
        return 2
    code, res = check_ir_text(text, load_problem(a.program), seed=a.seed)
    if code == 2:
        _say(f"{a.ir}: not valid IR for this program: {res['reason']}")
    elif code == 1:
        _say(f"{a.ir}: does NOT match {a.program}")
        for o in res.get("outputs", []):
            _say(f"  output {o['output']}: worst relative error {o['worst_rel_error']} "
                 f"(tolerance {res.get('tolerance', 0):.3g}){'' if o['ok'] else '  MISMATCH'}")
        if res.get("first_divergence"):
            fd = res["first_divergence"]
            _say(f"  first divergent kernel: {fd['kernel']} (writes {fd['tensor']}, "
                 f"relative error {fd['rel_error']})")
        if res.get("reason"):
            _say(f"  {res['reason']}")
    else:
        worst = max(o["worst_rel_error"] or 0.0 for o in res["outputs"])
        print(f"{a.ir}: matches {a.program} (worst relative error {worst:.3g}, "
              f"tolerance {res['tolerance']:.3g})")
    return code


__all__ = ["check_ir_text", "run_validate", "_strided"]
