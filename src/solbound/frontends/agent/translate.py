"""Generate, then verify: the agent's loop.

A :class:`Target` is what no tracer reads (a whole numpy program, one operator a frontend
cannot lower): the code shown to the model, the tensors it reads and writes, and a
``reference`` that runs the original on numpy arrays. :class:`Agent` asks the endpoint for
its IR and checks the reply, in this order, feeding back the first failure:

1. the first fenced code block of the reply (none: said so; an unclosed one: truncated);
2. the restricted parser (``ir.text.parse_program``: the text is never executed; a refusal
   is fed back with its line and reason);
3. the interface: exactly the target's inputs and outputs, no other external tensor;
4. the run: within the validation budget, the IR's outputs against the original's on
   seeded inputs (which output diverges, the largest error, where, and the kernel that
   wrote it).

Only IR that passes all four is accepted. Accepted translations are cached by the target's
source, shapes, dtypes and the model (``cache.py``): a rerun sends no request.
"""

from __future__ import annotations

import math
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ...ir.check import IRError
from ...ir.execute import ExecutionError, execute, np_dtype
from ...ir.model import EXTERNAL_ROLES, DTYPE_BYTES, FLOAT_DTYPES, Program
from ...ir.text import IRSyntaxError, parse_program
from ...validate.compare import (DEFAULT_MAX_BYTES, DEFAULT_MAX_SECONDS, estimate_cost,
                                 max_reduction, tolerance_dtype, rel_error, tolerance)
from . import prompt
from .cache import Cache, cache_key
from .endpoint import AgentError, Endpoint
from .prompt import Operand

DEFAULT_ROUNDS = 6
MAX_POINTS = 1 << 34         # points of one kernel a validation may visit
_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.S)


@dataclass
class Target:
    """One thing to translate. ``reference(arrays) -> arrays`` runs the original on the
    inputs (in order) and returns its outputs (in order); ``feeds``: the inputs to check on
    (default: seeded random values of each operand's shape and dtype)."""

    name: str
    source: str
    inputs: list[Operand]
    outputs: list[Operand]
    reference: Callable[[list[np.ndarray]], list[np.ndarray]]
    feeds: list[np.ndarray] | None = None
    params: dict = field(default_factory=dict)
    what: str = "program"
    src: str = ""


@dataclass
class Translation:
    target: str
    accepted: bool
    program: Program | None = None
    text: str = ""
    attempts: int = 0
    cached: bool = False
    feedback: list[dict] = field(default_factory=list)
    validation: dict | None = None
    seconds: float = 0.0
    src: str = ""

    def to_dict(self) -> dict:
        return {"target": self.target, "src": self.src, "accepted": self.accepted,
                "attempts": self.attempts, "cached": self.cached, "feedback": self.feedback,
                "validation": self.validation, "seconds": round(self.seconds, 3)}

    def line(self) -> str:
        """The terminal line for this translation."""
        if self.accepted:
            how = ("from the cache (no request)" if self.cached else
                   f"accepted after {self.attempts} attempt{'s' * (self.attempts != 1)}")
            v = self.validation or {}
            return (f"agent: {self.target}: {how}; validated, {v.get('summary', '')}").rstrip()
        last = self.feedback[-1]["feedback"] if self.feedback else "no reply"
        return (f"agent: {self.target}: not accepted after {self.attempts} attempt"
                f"{'s' * (self.attempts != 1)}; it stays unsupported. Last feedback: {last}")


class Rejected(Exception):
    def __init__(self, stage: str, feedback: str):
        super().__init__(feedback)
        self.stage, self.feedback = stage, feedback


def code_block(reply: str, finish_reason: str = "") -> str:
    """The first fenced code block of a reply.

    >>> code_block("Here:\\n```python\\nx = 1\\n```\\nmore")
    'x = 1\\n'
    >>> code_block("```\\nx = 1")
    Traceback (most recent call last):
    ...
    solbound.frontends.agent.translate.Rejected: the reply was cut off inside its code block (truncated): reply with the whole IR, shorter if needed
    """
    m = _FENCE.search(reply)
    if m:
        return m.group(1)
    if "```" in reply or finish_reason == "length":
        raise Rejected("reply", "the reply was cut off inside its code block (truncated): "
                                "reply with the whole IR, shorter if needed")
    raise Rejected("reply", "the reply has no fenced code block: put the whole IR in one, "
                            "between ``` lines")


def seeded_inputs(operands: list[Operand], seed: int = 0) -> list[np.ndarray]:
    """Random values for each operand (normal floats, small non-negative integers,
    booleans), from one seed."""
    rng = np.random.default_rng(seed)
    out = []
    for o in operands:
        if o.dtype in FLOAT_DTYPES:
            a = rng.standard_normal(o.shape).astype(np_dtype(o.dtype))
        elif o.dtype == "bool":
            a = rng.random(o.shape) < 0.5
        elif o.dtype in ("c64", "c128"):
            a = (rng.standard_normal(o.shape) + 1j * rng.standard_normal(o.shape))
        else:
            a = rng.integers(0, 4, size=o.shape)
        out.append(np.asarray(a))
    return out


def check_interface(p: Program, target: Target) -> None:
    decl = p.tensor_map
    for role, want in (("input", target.inputs), ("output", target.outputs)):
        for o in want:
            t = decl.get(o.name)
            if t is None:
                raise Rejected("interface", f"the IR declares no {role} {o.decl(role)}")
            if t.role != role or t.shape != tuple(o.shape) or t.dtype != o.dtype:
                raise Rejected("interface", f"{o.name} is declared `{t.name} = {t.role}("
                                            f"{t.dtype}[{', '.join(map(str, t.shape))}])`; "
                                            f"expected `{o.decl(role)}`")
    names = {o.name for o in target.inputs} | {o.name for o in target.outputs}
    for t in p.tensors:
        if t.name in names:
            continue
        if t.role in EXTERNAL_ROLES:
            raise Rejected("interface", f"the IR declares {t.role} {t.name}, which the "
                                        f"{target.what} does not have: compute it as an "
                                        f"intermediate")
        if t.role == "output":
            raise Rejected("interface", f"the IR declares an output {t.name} the "
                                        f"{target.what} does not return: make it an "
                                        f"intermediate")


def _where(idx: tuple) -> str:
    return "[" + ", ".join(str(int(i)) for i in idx) + "]"


def _divergence(name: str, got: np.ndarray, want: np.ndarray, writer: str, err: float,
                tol: float) -> str:
    g = np.asarray(got, dtype=np.complex128 if np.iscomplexobj(want) else np.float64)
    w = np.asarray(want, dtype=g.dtype)
    fin_g, fin_w = np.isfinite(g), np.isfinite(w)
    if not np.array_equal(fin_g, fin_w):
        at = np.unravel_index(int(np.argmax(fin_g != fin_w)), w.shape)
        return (f"output {name} (written by kernel {writer}) gives {_num(g[at])} at {_where(at)} "
                f"where the original gives {_num(w[at])}")
    d = np.where(fin_w, np.abs(g - w), 0)
    at = np.unravel_index(int(np.argmax(d)), w.shape) if d.size else ()
    return (f"output {name} (written by kernel {writer}) diverges: relative error {err:.3g} "
            f"(tolerance {tol:.3g}); the largest difference is at {_where(at)}, where the IR "
            f"gives {_num(g[at])} and the original {_num(w[at])}")


def _num(v) -> str:
    v = complex(v) if np.iscomplexobj(v) else float(v)
    return f"{v:.6g}"


def verify(p: Program, target: Target, feeds: list[np.ndarray], expected: list[np.ndarray],
           max_bytes: int = DEFAULT_MAX_BYTES, max_seconds: float = DEFAULT_MAX_SECONDS) -> dict:
    """Run ``p`` on ``feeds`` and compare with the original's ``expected`` outputs; the
    validation dict, or :class:`Rejected` with what diverges."""
    from ...analysis.counts import count_program
    from ...graph.einsum import build_graph
    check_interface(p, target)
    try:
        flops = sum(count_program(build_graph(p)).flops.values())
    except Exception as e:  # noqa: BLE001 - IR the parser accepts but counting cannot read
        raise Rejected("parse", f"the IR cannot be analyzed: {type(e).__name__}: "
                                f"{str(e)[:300]}") from None
    mem, secs = estimate_cost(p, flops)
    points = _points(p)
    full, rows = p, None
    if mem > max_bytes or secs > max_seconds or points > MAX_POINTS:
        # over the budget: the same IR, its outputs computed on their first rows only and
        # every intermediate held as the region those rows need
        p, rows = _sliced_within(p, target, max_bytes, max_seconds)
        if rows == 0:
            declared = sum(t.numel * max(8, DTYPE_BYTES[t.dtype]) for t in full.tensors)
            raise Rejected("budget", f"the IR declares {declared / 2**30:.2f} GiB of tensors "
                                     f"and a kernel of {points:,} points, would need about "
                                     f"{mem / 2**30:.2f} GiB and {secs:.1f} s to run, over the "
                                     f"validation budget ({max_bytes / 2**30:.2f} GiB, "
                                     f"{max_seconds:.0f} s, {MAX_POINTS:,} points), and no "
                                     f"slice of its outputs' rows fits")
    t0 = time.perf_counter()

    limit = 2 * max_seconds + 1.0            # the estimate plans; this stops a runaway

    def clock(*_):
        if time.perf_counter() - t0 > limit:
            raise Rejected("budget", f"the IR ran past twice the validation budget "
                                     f"({limit:.0f} s)")
    try:
        with np.errstate(all="ignore"):
            arrays = execute(p, {o.name: a for o, a in zip(target.inputs, feeds)},
                             on_kernel=clock, on_iteration=clock)
    except Rejected:
        raise
    except ExecutionError as e:
        if isinstance(e.__cause__, Rejected):
            raise e.__cause__ from None
        raise Rejected("run", f"the IR failed to run: {e}") from None
    except Exception as e:  # noqa: BLE001 - any failure of a model's IR is feedback
        raise Rejected("run", f"the IR failed to run: {type(e).__name__}: {e}") from None
    writers = {o: k.name for k in p.kernels for o in k.outputs}
    tol = tolerance(tolerance_dtype(full), max_reduction(full), len(full.kernels))
    outs, worst = [], 0.0
    for o, want in zip(target.outputs, expected):
        got = arrays[o.name]
        want = np.asarray(want)
        if got.shape != want.shape:
            raise Rejected("mismatch", f"output {o.name} has shape {list(got.shape)}, the "
                                       f"original's {list(want.shape)}")
        if rows is not None:                 # the rows the sliced run computed
            got, want = got[:_rows(want.shape[0], rows)], want[:_rows(want.shape[0], rows)]
        err = rel_error(got, want)
        if not err <= tol:
            raise Rejected("mismatch", _divergence(o.name, got, want,
                                                   writers.get(o.name, "?"), err, tol))
        worst = max(worst, err)
        outs.append({"output": o.name, "shape": list(want.shape), "worst_rel_error": err,
                     "ok": True})
    return {"status": "passed", "tolerance": tol, "outputs": outs,
            "reference": f"the original {target.what} on "
                         + ("its example's arguments" if target.feeds is not None
                            else "seeded random inputs"),
            "summary": f"worst relative error {worst:.3g} (tolerance {tol:.3g})"
                       + (f" on the first 1/{rows} of each output's rows" if rows else ""),
            **({"partial": f"the full-size IR over the validation budget: each output "
                           f"compared on the first 1/{rows} of its rows, its producers "
                           f"confined to what those rows read and its intermediates held "
                           f"as that region"} if rows else {}),
            "seconds": round(time.perf_counter() - t0, 3)}


def _rows(n: int, denominator: int) -> int:
    return max(1, -(-n // denominator))


def sliced(p: Program, outputs: set[str], denominator: int) -> Program | None:
    """``p`` with each output computed on the first ``1/denominator`` of its rows (a guard
    on its first index) and every intermediate confined to what those rows read (the
    demand pass): the same IR at full size, less work. None when an output cannot be
    sliced so (several writers, a scatter, a library routine, a scan or loop writing it,
    a first index that is not one loop variable, an output read by another kernel)."""
    from ...ir.affine import Aff, Atom
    from ...ir.demand import restrict_to_demand
    from ...ir.model import kernel_reads
    ks = list(p.kernels)
    decl = p.tensor_map
    if any(a.tensor in outputs for k in ks for a in kernel_reads(k)):
        return None
    for o in outputs:
        pos = [i for i, k in enumerate(ks) if o in k.outputs]
        if len(pos) != 1 or not decl[o].shape:
            return None
        k = ks[pos[0]]
        first = k.out_index[0] if k.out_index else None
        if k.scatter or k.lib or k.scan or k.loop is not None or k.out2 is not None \
                or not isinstance(first, Aff) or len(first.terms) != 1 \
                or first.terms[0][1] != 1:
            return None
        ks[pos[0]] = k.with_(guard=k.guard + (Atom(first, 0, _rows(decl[o].shape[0],
                                                                      denominator)),))
    inter = {t.name for t in p.tensors if t.role == "intermediate"}
    return Program(p.tensors, tuple(restrict_to_demand(ks, inter)), p.notes)


def _points(p: Program) -> int:
    """The most points one kernel visits."""
    return max((math.prod(k.count_extents.values()) for k in p.kernels), default=0)


def compacted(p: Program, compared: dict[str, int] | None = None) -> Program:
    """``p`` with every loop its guards cut short and every intermediate declared as the
    region its kernels touch (``ir.demand.shrink_to_demand``): after :func:`sliced`, what
    the executor allocates and visits is what the outputs' ``compared`` first rows need."""
    from ...ir.demand import shrink_to_demand
    ks, ts = shrink_to_demand(list(p.kernels), list(p.tensors), compared)
    return Program(tuple(ts), tuple(ks), p.notes)


def _sliced_within(p: Program, target: Target, max_bytes: int, max_seconds: float):
    """(the sliced and compacted program, its denominator) whose estimated run fits the
    budget, or (p, 0) when none does."""
    from ...analysis.counts import count_program
    from ...graph.einsum import build_graph
    outs = {o.name for o in target.outputs}
    d = 2
    while d <= 1 << 20:
        try:
            q = sliced(p, outs, d)
            if q is None:
                return p, 0
            q = compacted(q, {o: _rows(p.tensor_map[o].shape[0], d) for o in outs})
            mem, secs = estimate_cost(q, sum(count_program(build_graph(q)).flops.values()))
        except Exception:  # noqa: BLE001 - a program slicing cannot read: not sliced
            return p, 0
        if mem <= max_bytes and secs <= max_seconds and _points(q) <= MAX_POINTS:
            return q, d
        if all(_rows(p.tensor_map[o].shape[0], d) == 1 for o in outs):
            break
        d *= 2
    return p, 0


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Agent:
    """Translates targets through one endpoint and model, with a cache. ``translations``
    lists every target it was asked for, in order (the report's ``agent`` block)."""

    def __init__(self, model: str | None = None, rounds: int = DEFAULT_ROUNDS,
                 cache_dir: str | None = None, endpoint: Endpoint | None = None,
                 say: Callable[[str], None] | None = _say, seed: int = 0,
                 max_bytes: int | None = None, max_seconds: float | None = None):
        import os
        from .endpoint import MODEL_ENV
        if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
            raise AgentError(f"--agent-rounds {rounds!r}: expected a positive integer")
        self.model = (endpoint.model if endpoint else None) or model or os.environ.get(MODEL_ENV)
        if not self.model:
            raise AgentError(f"--agent needs a model: --llm-model NAME or {MODEL_ENV}")
        self.rounds = rounds
        self.cache = Cache(cache_dir)
        self._endpoint = endpoint
        self.say = say or (lambda m: None)
        self.seed = seed
        self.max_bytes = DEFAULT_MAX_BYTES if max_bytes is None else max_bytes
        self.max_seconds = DEFAULT_MAX_SECONDS if max_seconds is None else max_seconds
        self.translations: list[Translation] = []
        self._memo: dict[str, Translation] = {}

    @property
    def endpoint(self) -> Endpoint:
        if self._endpoint is None:            # made on the first request, not for a cache hit
            self._endpoint = Endpoint(self.model)
        return self._endpoint

    def report(self) -> dict:
        return {"model": self.model, "requests": self._endpoint.requests if self._endpoint
                else 0, "translations": [t.to_dict() for t in self.translations]}

    def translate(self, target: Target) -> Translation:
        key = cache_key(target, self.model, prompt.VERSION)
        t0 = time.perf_counter()
        feeds = target.feeds if target.feeds is not None else seeded_inputs(target.inputs,
                                                                            self.seed)
        try:
            expected = [np.asarray(a) for a in target.reference([np.copy(f) for f in feeds])]
        except Exception as e:  # noqa: BLE001 - the original itself failed
            tr = Translation(target.name, False, src=target.src, feedback=[{
                "attempt": 0, "stage": "reference",
                "feedback": f"the original raised on seeded inputs: {type(e).__name__}: {e}"}])
            return self._done(key, tr, t0)
        memo = self._memo.get(key)            # the same operator traced twice (two layers)
        if memo is not None:
            if not memo.accepted:
                return memo
            try:                              # checked again: two calls may share a key
                verify(memo.program, target, feeds, expected, self.max_bytes,
                       self.max_seconds)
                return memo
            except Rejected:
                pass
        if len(expected) != len(target.outputs):
            raise AgentError(f"{target.name}: the original returned {len(expected)} "
                             f"arrays, {len(target.outputs)} expected")
        hit = self.cache.get(key)
        if hit is not None:
            try:
                p = parse_program(hit["ir"])
                val = verify(p, target, feeds, expected, self.max_bytes, self.max_seconds)
                tr = Translation(target.name, True, p, hit["ir"], hit.get("attempts", 0),
                                 True, validation=val, src=target.src)
                return self._done(key, tr, t0)
            except (IRSyntaxError, IRError, Rejected, TypeError, ValueError):
                self.cache.drop(key)           # stale: translate anew
        messages = [{"role": "system", "content": prompt.SYSTEM},
                    {"role": "user", "content": prompt.first_message(
                        target.source, target.inputs, target.outputs, target.params,
                        target.what)}]
        tr = Translation(target.name, False, src=target.src)
        for attempt in range(1, self.rounds + 1):
            self.say(f"agent: {target.name}: asking {self.model} (attempt {attempt}/"
                     f"{self.rounds})")
            reply, finish = self.endpoint.chat(messages)
            messages.append({"role": "assistant", "content": reply})
            tr.attempts = attempt
            try:
                text = code_block(reply, finish)
                try:
                    p = parse_program(text)
                except IRSyntaxError as e:
                    line = text.splitlines()[e.line - 1].strip() if 0 < e.line <= len(
                        text.splitlines()) else ""
                    raise Rejected("parse", f"the parser refused line {e.line}"
                                            f"{f' `{line[:120]}`' if line else ''}: {e.msg}")
                except IRError as e:
                    raise Rejected("parse", f"the IR is not well formed: {e}")
                except (TypeError, ValueError, RecursionError) as e:
                    raise Rejected("parse", f"the IR is not well formed: "
                                            f"{type(e).__name__}: {e}")
                tr.validation = verify(p, target, feeds, expected, self.max_bytes,
                                       self.max_seconds)
            except Rejected as r:
                tr.feedback.append({"attempt": attempt, "stage": r.stage,
                                    "feedback": r.feedback})
                if r.stage == "budget" and self._io_over(target):
                    break                    # the target's own tensors are over the budget
                messages.append({"role": "user",
                                 "content": prompt.feedback_message(attempt, r.feedback)})
                continue
            tr.accepted, tr.program, tr.text = True, p, text
            self.cache.put(key, {"ir": text, "model": self.model, "target": target.name,
                                 "attempts": attempt})
            break
        return self._done(key, tr, t0)

    def _io_over(self, target: Target) -> bool:
        """The target's inputs and outputs alone exceed the memory budget: no IR for it
        can run here, however lean."""
        io = sum(math.prod(o.shape) * 8 for o in target.inputs + target.outputs)
        return 3 * io > self.max_bytes

    def _done(self, key: str, tr: Translation, t0: float) -> Translation:
        tr.seconds = time.perf_counter() - t0
        self._memo[key] = tr
        self.translations.append(tr)
        self.say(tr.line())
        return tr


def dtype_of(arr) -> str:
    """The IR dtype of a numpy array (or dtype).

    >>> dtype_of(np.zeros(2, np.float32)), dtype_of(np.arange(3)), dtype_of(np.bool_)
    ('f32', 'i64', 'bool')
    """
    dt = arr.dtype if isinstance(arr, (np.ndarray, np.generic)) else np.dtype(arr)
    names = {"float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16",
             "int64": "i64", "int32": "i32", "uint32": "u32", "int16": "i16",
             "uint16": "u16", "int8": "i8", "uint8": "u8", "bool": "bool",
             "complex64": "c64", "complex128": "c128"}
    if dt.name not in names or names[dt.name] not in DTYPE_BYTES:
        raise AgentError(f"arrays of dtype {dt.name} have no IR dtype")
    return names[dt.name]


__all__ = ["Agent", "Target", "Translation", "Operand", "Rejected", "code_block", "verify",
           "seeded_inputs", "dtype_of"]
