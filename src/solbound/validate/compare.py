"""Neutral validation: tolerances, relative errors, the input scale a cancellation is
judged against, the run's cost estimate, the comparison of IR outputs with reference
values. A frontend's reference (``frontends/torch/reference.py``,
``frontends/jax/reference.py``) runs the original program and calls these."""

from __future__ import annotations

import math

import numpy as np

from ..ir.classify import classify
from ..ir.affine import Aff
from ..ir.model import EXTERNAL_ROLES, Program, accesses, kernel_reads, per_iteration_loops

EPS = {"f64": 2.2e-16, "f32": 1.19e-7, "bf16": 7.8e-3, "f16": 9.8e-4}
DEFAULT_MAX_BYTES = 3 * 2**30
DEFAULT_MAX_SECONDS = 60.0
EXEC_FLOPS_PER_S = 4e9     # rough numpy throughput on this class of machine, for the budget


def max_reduction(p: Program) -> int:
    k_max = 1
    for k in p.kernels:
        n = 1
        ext = k.extents
        for v in k.reduce_vars:
            n *= ext[v]
        if k.scan:
            n = max(n, ext[k.scan])
        k_max = max(k_max, n)
    return k_max


def tolerance(dtype: str, k_max: int, depth: int) -> float:
    """Scale-relative tolerance from the source dtype, the longest reduction and the depth.

    fp32/fp64: ``8 eps sqrt(K) ops^(1/4)`` (summation-order differences grow like sqrt(K)).
    bf16/fp16: ``8 eps ops^(1/4)``: both sides accumulate in fp32; what differs is the
    rounding of stored values to the narrow type, which the IR (run wide) does not do.
    """
    eps = EPS.get(dtype, 0.0)
    if eps == 0.0:
        return 0.0
    growth = math.sqrt(k_max) if dtype in ("f32", "f64") else 1.0
    return 8.0 * eps * growth * max(1.0, depth) ** 0.25


def operator_calls(p: Program) -> int:
    """Operators the program runs: an operator inside a loop of several operators (a
    rerolled layer's ``linear``, ``ir.model.per_iteration_loops``) runs once per
    iteration, as its unrolled copies did; one that is the whole loop (an LSTM) once."""
    looped = per_iteration_loops(p.kernels)
    loops_of: dict[str, set] = {}
    for k in p.kernels:
        loops_of.setdefault(k.op or k.name, set()).add(k.loop)
    return sum(next(iter(lps))[1] if len(lps) == 1 and lps <= looped else 1
               for lps in loops_of.values())


def tolerance_dtype(p: Program) -> str:
    """The coarsest floating dtype the program stores a value in (what its tolerance is set
    by): its outputs and its intermediates, since the reference rounds every value it
    stores in a narrow type and the IR, run wide, does not (``(x.half() + c).float()``
    differs by float16 roundings though its output is float32); ``f32`` for a program
    without outputs."""
    dtypes = [t.dtype for t in p.tensors if t.role == "output"]
    if not dtypes:
        return "f32"
    stored = dtypes + [t.dtype for t in p.tensors if t.role == "intermediate"]
    return max(stored, key=lambda d: EPS.get(d, 0.0))


def tolerance_rule(dtype: str) -> str:
    """:func:`tolerance`'s rule in words, for the report."""
    return (f"max|ir-ref|/max|ref| <= 8 eps({dtype})"
            + (" sqrt(longest reduction)" if dtype in ("f32", "f64") else "")
            + " operators^(1/4)")


class _InputScale:
    """Largest magnitude among the values the producer of a tensor reads: rounding in a
    reduction that cancels (the mean of normalized values) is relative to its inputs.
    Producers and magnitudes are found once per program run and kept."""

    def __init__(self, p: Program, arrays: dict):
        self.arrays = arrays
        self.reads: dict[str, set[str]] = {}
        for k in p.kernels:
            for o in k.outputs:
                self.reads.setdefault(o, set()).update(a.tensor for a in kernel_reads(k))
        self._mag: dict[str, float] = {}

    def _magnitude(self, name: str) -> float:
        if name not in self._mag:
            arr = self.arrays.get(name)
            m = 0.0
            if arr is not None and arr.size and np.issubdtype(arr.dtype, np.floating):
                fin = arr[np.isfinite(arr)]
                if fin.size:
                    m = float(np.max(np.abs(fin)))
            self._mag[name] = m
        return self._mag[name]

    def __call__(self, name: str | None) -> float:
        if name is None:
            return 0.0
        return max((self._magnitude(t) for t in self.reads.get(name, ())), default=0.0)


def rel_error(a: np.ndarray, b: np.ndarray, floor: float = 0.0) -> float:
    """max|a-b| / max(max|b|, floor) (scale-relative; NaN/inf must match exactly).

    ``floor`` is the magnitude of the producing kernel's inputs, so an output that is
    a cancellation of large values (ideally ~0) is judged against those values."""
    wide = np.float64 if np.asarray(b).dtype == np.float64 else np.float32
    a = np.asarray(a, dtype=wide)
    b = np.asarray(b, dtype=wide)
    if a.shape != b.shape:
        return math.inf
    if a.size == 0:
        return 0.0
    fin = np.isfinite(b)
    if not np.array_equal(np.isfinite(a), fin):
        return math.inf
    if not fin.all():
        if not np.array_equal(a[~fin], b[~fin], equal_nan=True):
            return math.inf
    if not fin.any():
        return 0.0
    scale = max(float(np.max(np.abs(b[fin]))), floor, 1e-30)
    return float(np.max(np.abs(a[fin] - b[fin]))) / scale


def fits_budget(p: Program, analyzed: Program, max_bytes: int, max_seconds: float) -> bool:
    """A reduced instance ``p`` can stand in for the ``analyzed`` program in validation:
    the same kernel structure, and within the budget."""
    from ..analysis.counts import count_program
    from ..graph.einsum import build_graph
    if _structure(p) != _structure(analyzed):
        return False
    mem, secs = estimate_cost(p, sum(count_program(build_graph(p)).flops.values()))
    return mem <= max_bytes and secs <= max_seconds


def estimate_cost(p: Program, flops: int) -> tuple[int, float]:
    """(bytes, seconds) a validation needs, roughly: the IR's arrays (every tensor, all
    alive at once) with a quarter more for temporaries, two more copies of the inputs and
    state (the framework's model and the copy kept for diagnosis), and the largest
    contraction operand (im2col). On 11_VGG16 at batch 5 it estimates 3.7 GiB where the
    measured peak resident size is 2.7 GiB (interpreter and torch included): conservative."""
    def size(t):
        return t.numel * (8 if t.dtype in ("f64", "i64") else 4)
    mem = sum(size(t) for t in p.tensors) * 5 // 4 \
        + 2 * sum(size(t) for t in p.tensors if t.role in EXTERNAL_ROLES)
    # an einsum over strided views may materialize an operand's whole view (im2col)
    peak = 0
    for k in p.kernels:
        if classify(k) == "contraction":
            ext = k.extents
            for a in accesses(k.body):
                used = {v for i in a.index if isinstance(i, Aff) for v in i.vars}
                peak = max(peak, math.prod(ext[v] for v in used if v in ext) * 4 * 2)
    return mem + peak, flops / EXEC_FLOPS_PER_S


def _strided(arr: np.ndarray, shape, strides, offset) -> np.ndarray:
    from numpy.lib.stride_tricks import as_strided
    flat = np.ascontiguousarray(arr).reshape(-1)
    item = flat.itemsize
    if flat.size == 0:
        return np.zeros(shape, dtype=flat.dtype)
    return as_strided(flat[offset:], shape=tuple(shape), strides=tuple(s * item for s in strides))


def compare(lowered, arrays: dict[str, np.ndarray], golden: list, tol: float,
            scale: _InputScale | None = None) -> list[dict]:
    scale = scale or _InputScale(lowered.program, arrays)
    res = []
    for o, g in zip(lowered.outputs, golden):
        if g is None:
            continue
        if o.get("ir") is None:
            val = np.asarray(o.get("value"))
        else:
            val = _strided(arrays[o["ir"]], o["shape"], o["strides"], o["offset"])
        err = rel_error(val, g, scale(o.get("ir")))
        res.append({"output": o.get("target") or o.get("ir"), "kind": o["kind"],
                    "shape": list(np.shape(g)), "worst_rel_error": err if math.isfinite(err) else None,
                    "ok": bool(err <= tol)})
    return res


F64_SHRINK = 1e-3


def rejudge_in_f64(lowered, outs: list[dict], golden32: list, golden64: list,
                   arrays32: dict, arrays64: dict) -> None:
    """Re-judge the outputs that missed the tolerance from a second run of the reference
    and of the IR in float64, both from the same values (each frontend makes that run:
    PyTorch ``module.double()``, JAX under ``enable_x64``).

    Two computations of one real-valued function differ by rounding, and rounding
    shrinks with the unit roundoff (float32 to float64: about 5e8 times smaller),
    whatever the conditioning of the output: a softmax over long rows, a 100-step
    recurrence, a cancellation. A wrong rule computes another function and its
    difference does not shrink. So an output passes when ``max|ir-ref|`` in float64 is at
    most ``F64_SHRINK`` times its float32 value; each re-judged output records
    ``f64_check`` with both differences. ``outs`` has one entry per output with a golden
    value (see :func:`compare`)."""
    entries = [j for j, g in enumerate(golden32) if g is not None]
    for i, o in enumerate(outs):
        if o["ok"] or o["worst_rel_error"] is None:
            continue
        j = entries[i]
        spec, g32, g64 = lowered.outputs[j], golden32[j], golden64[j]
        if spec.get("ir") is None or g64 is None:
            continue
        view = (spec["shape"], spec["strides"], spec["offset"])
        d32 = _max_abs_diff(_strided(arrays32[spec["ir"]], *view), g32)
        d64 = _max_abs_diff(_strided(arrays64[spec["ir"]], *view), g64)
        o["f64_check"] = {"ran": True, "f32_max_abs_diff": d32, "f64_max_abs_diff": d64,
                          "framework_f32_vs_f64": _max_abs_diff(g32, g64)}
        if math.isfinite(d32) and d64 <= F64_SHRINK * d32:
            o["ok"] = True


def rejudge_failed(outs: list[dict], reason: str) -> None:
    """The float64 run could not be made: say so on every output it was for."""
    for o in outs:
        if not o["ok"] and o["worst_rel_error"] is not None:
            o["f64_check"] = {"ran": False, "reason": reason[:200]}


def f64_summary(outs: list[dict]) -> str:
    """The summary's clause on the outputs re-judged in float64 (empty when none were)."""
    rechecked = [o for o in outs if o.get("f64_check", {}).get("ran")]
    if not rechecked:
        return ""
    passed = sum(o["ok"] for o in rechecked)
    return (f"; {passed} of {len(rechecked)} outputs over it are rounding "
            f"(their difference shrinks in float64)")


def _max_abs_diff(a, b) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return math.inf
    d = np.abs(a - b)
    return float(np.max(d)) if d.size else 0.0


def _structure(p: Program) -> list[tuple]:
    """What must not change between the analyzed trace and the one validated: the
    kernels, their kind and loop structure. Not the operator grouping: which framework
    operator a decomposed node is attributed to is provenance metadata, and may differ
    between a trace on meta tensors and one on real tensors under ``no_grad``."""
    return [(classify(k), k.reduce, k.scan is not None, k.loop is not None)
            for k in p.kernels]


PROGRESS = False


def in_notebook() -> bool:
    """Running in a Jupyter kernel (rich renders live progress there)."""
    import sys
    if "ipykernel" not in sys.modules:
        return False
    try:
        from rich.console import Console
        return Console().is_jupyter
    except Exception:  # noqa: BLE001 - no rich console: no progress
        return False


class _progress:
    """A transient progress bar on stderr over the IR's kernels; a no-op unless PROGRESS
    (the command line on a terminal) or in a notebook."""

    def __init__(self, total: int):
        self.total, self.bar = total, None

    def __enter__(self):
        if not (PROGRESS or in_notebook()):
            return lambda: None
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
        self.bar = Progress("validating: running the IR", BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=Console(stderr=True), transient=True)
        self.bar.start()
        task = self.bar.add_task("ir", total=self.total)
        return lambda: self.bar.advance(task)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False


def _is_constant(g) -> bool:
    """One value everywhere, or no finite value at all: agreeing with it proves little."""
    a = np.asarray(g)
    if a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.number):
        return False
    flat = a.reshape(-1)
    if np.issubdtype(a.dtype, np.floating) and flat.size and not np.isfinite(flat).any():
        return True
    return bool(np.all(flat == flat[0]))




def per_rank_result(per_rank: list[list[dict]], tol: float, reference: str,
                    seconds: float, **extra) -> dict:
    """The validation of a program run on every rank at once (``per_rank[r]``: rank ``r``'s
    compared outputs): passed when every output of every rank is; rank 0's outputs listed,
    the failing ranks named, the worst error over all of them."""
    n = len(per_rank)
    ok = all(o["ok"] for outs in per_rank for o in outs)
    worst = max((math.inf if o["worst_rel_error"] is None else o["worst_rel_error"]
                 for outs in per_rank for o in outs), default=0.0)
    return {"status": "passed" if ok else "failed", "tolerance": tol, **extra,
            "outputs": per_rank[0] if per_rank else [], "ranks": n,
            "failed_ranks": [r for r, outs in enumerate(per_rank)
                             if not all(o["ok"] for o in outs)],
            "reference": reference,
            "summary": f"worst relative error {worst:.3g} over {n} ranks (tolerance {tol:.3g})",
            "seconds": seconds}
