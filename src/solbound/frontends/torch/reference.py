"""The PyTorch reference for validation: run the original module (or the exported graph,
replaying its random draws) on seeded inputs, re-judge a miss in float64, name the first
divergent node, reduce over-budget programs and redraw zero-initialized parameters. The
comparison itself is neutral (``validate/compare.py``)."""

from __future__ import annotations

import copy
import math
import time
from typing import Any

import numpy as np

from ...ir.execute import ExecutionError, execute
from ...ir.model import Call, walk
from ...validate.compare import (DEFAULT_MAX_BYTES, DEFAULT_MAX_SECONDS, _InputScale,
                                 _is_constant, _progress, _strided, compare,
                                 estimate_cost, f64_summary, fits_budget, max_reduction,
                                 operator_calls, rejudge_failed, rejudge_in_f64,
                                 tolerance_dtype, rel_error, tolerance, tolerance_rule)

def _to_np(t) -> np.ndarray:
    import torch
    if isinstance(t, torch.Tensor):
        t = t.detach()
        if t.is_floating_point() and t.element_size() < 4:
            t = t.float()     # bf16, fp16, fp8: numpy holds them as float32, exactly
        elif str(t.dtype).startswith("torch.float4"):
            t = t.view(torch.uint8)   # packed fp4: its bytes
        return t.cpu().numpy()
    return np.asarray(t)


class HarnessError(Exception):
    """The reference could not be produced (the model does not re-trace or run on real
    inputs): validation is inconclusive, never failed."""


def output_leaves(out) -> list:
    """A model's return value as the leaves torch.export flattened it to (tensors of
    ``ModelOutput``s, caches, tuples, dicts and nested pytrees, in pytree order)."""
    from torch.utils._pytree import tree_leaves
    return tree_leaves(out)


def _resolve(model, target: str):
    obj = model
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _feeds(lowered, inputs: tuple, state_of) -> dict[str, np.ndarray]:
    """The IR's external tensors by name: user inputs, then state (``state_of(target)``)."""
    # copies: the model may update an input in place (a cache's state), and the IR must
    # read the values from before the call
    feeds = {spec["ir"]: np.array(_to_np(val), copy=True)
             for spec, val in zip(lowered.inputs, inputs) if spec.get("ir")}
    for s in lowered.state:
        if s.get("stacked"):     # one tensor per layer of a rerolled stack
            feeds[s["ir"]] = np.stack([_to_np(state_of(t)) for t in s["target"]])
        else:
            feeds[s["ir"]] = _to_np(state_of(s["target"]))
    return feeds


def _on_cpu(x):
    """A device argument of a graph traced on the meta device, for a run on real tensors."""
    import torch
    if isinstance(x, torch.device) and x.type == "meta":
        return torch.device("cpu")
    return "cpu" if isinstance(x, str) and x == "meta" else x


def _interpreter():
    """``torch.fx.Interpreter`` for the analyzed graph on real tensors: a graph traced on
    the meta device makes its own tensors there (``arange(..., device=meta)``), which run
    on the CPU instead."""
    from torch.fx import Interpreter
    from torch.utils._pytree import tree_map

    class OnCPU(Interpreter):
        def call_function(self, target, args, kwargs):
            return super().call_function(target, tree_map(_on_cpu, args),
                                         tree_map(_on_cpu, kwargs))
    return OnCPU


def _graph_args(ep, model, inputs: tuple) -> list:
    """Arguments of the exported graph: user inputs and the model's state, in its order."""
    user_iter = iter(inputs)
    return [next(user_iter) if spec.kind.name == "USER_INPUT"
            else _state_value(model, spec.target, ep) for spec in ep.graph_signature.input_specs]


def run_original(model, inputs: tuple, lowered, ep=None) -> dict[str, Any]:
    """Golden values: IR-named inputs/state before the call, and the outputs after."""
    import torch
    before = {t: _state_value(model, t, ep).detach().clone() for s in lowered.state
              for t in (s["target"] if s.get("stacked") else [s["target"]])}
    feeds = _feeds(lowered, inputs, before.__getitem__)
    try:
        with torch.no_grad():
            out = model(*inputs)
    except Exception as e:  # noqa: BLE001 - the reference, not the IR, failed
        from ..loading import oneline
        raise HarnessError(f"running the model on real inputs failed: {oneline(e)}") from None
    outs = output_leaves(out)
    golden = []
    it = iter(outs)
    for o in lowered.outputs:
        if o["kind"] == "output":
            golden.append(_to_np(next(it)))
        elif o["kind"] == "buffer_mutation":
            golden.append(_to_np(_resolve(model, o["target"])))
        else:
            golden.append(None)
    return {"feeds": feeds, "golden": golden, "state_before": before}


def run_graph_replaying_draws(model, inputs: tuple, lowered, ep) -> dict[str, Any]:
    """Golden values of a program that draws random numbers: the exported graph run by
    ``torch.fx.Interpreter`` on the real inputs and state, recording what each random
    node drew (``draws``: IR tensor -> values) so that the IR uses the same numbers.
    A second call of the module would draw different ones, so the graph is both the
    reference and the source of the draws."""
    args = _graph_args(ep, model, inputs)
    feeds = _feeds(lowered, inputs, lambda target: _state_value(model, target, ep))
    outs, draws, recorded = replay_draws(ep, lowered, args)
    golden = [_to_np(v) if o["kind"] in ("output", "buffer_mutation") else None
              for o, v in zip(lowered.outputs, outs)]
    return {"feeds": feeds, "golden": golden, "draws": draws, "recorded": recorded}


def replay_draws(ep, lowered, args: list) -> tuple[list, dict, dict]:
    """Run the exported graph on ``args`` (``torch.fx.Interpreter``), recording each random
    node's output: (graph outputs, IR tensor -> the values drawn there, node -> value)."""
    import torch
    wanted = {node for node, _ in lowered.random_draws.values()}
    recorded: dict[str, Any] = {}

    class Recorder(_interpreter()):
        def run_node(self, n):
            val = super().run_node(n)
            if n.name in wanted:
                recorded[n.name] = val
            return val

    with torch.no_grad():
        outs = Recorder(ep.graph_module).run(*args)
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    draws = {}
    for ir, (node, index) in lowered.random_draws.items():
        val = recorded[node] if index is None else recorded[node][index]
        draws[ir] = _to_np(val)
    return outs, draws, recorded


def recheck_in_f64(lowered, ep, model, inputs, golden32: list, outs: list[dict],
                   arrays32: dict) -> None:
    """Re-judge the fp32 outputs that missed the tolerance in float64
    (``validate.compare.rejudge_in_f64``): the module (``.double()``) and the IR (run
    wide) again from the same values."""
    import torch
    if all(o["ok"] or o["worst_rel_error"] is None for o in outs):
        return
    try:
        model = copy.deepcopy(model).double()
        inputs64 = tuple(x.double() if isinstance(x, torch.Tensor) and x.is_floating_point()
                         else x for x in inputs)
        gold64 = run_original(model, inputs64, lowered, ep)
        arrays64 = execute(lowered.program, gold64["feeds"], wide=True)
    except Exception as e:  # noqa: BLE001 - a program that does not run in float64
        rejudge_failed(outs, f"{type(e).__name__}: {e}")
        return
    rejudge_in_f64(lowered, outs, golden32, gold64["golden"], arrays32, arrays64)


def first_divergence(ep, lowered, model, inputs, arrays, tol: float,
                     replay: dict | None = None, scale: _InputScale | None = None,
                     args: list | None = None) -> dict | None:
    """Run the decomposed graph on the same real inputs and find the first node
    whose IR value differs (by node order), naming its kernel and source.

    Random nodes return the values in ``replay`` (node name -> value) that the golden
    run drew; tensors computed only where read (``lowered.partial``) are not compared."""
    import torch

    scale = scale or _InputScale(lowered.program, arrays)
    args = args if args is not None else _graph_args(ep, model, inputs)
    produced: dict[str, str] = {}
    for k in lowered.program.kernels:
        produced.setdefault(k.out, k.name)

    class Probe(_interpreter()):
        def __init__(self, gm):
            super().__init__(gm)
            self.found = None

        def run_node(self, n):
            val = replay[n.name] if replay and n.name in replay else super().run_node(n)
            if self.found is None and n.name in lowered.values and isinstance(val, torch.Tensor):
                info = lowered.values[n.name]
                if info["ir"] in arrays and info["ir"] in produced \
                        and info["ir"] not in lowered.partial:
                    mine = _strided(arrays[info["ir"]], info["shape"], info["strides"],
                                    info["offset"])
                    err = rel_error(mine, _to_np(val), scale(info["ir"]))
                    if not err <= tol:
                        self.found = {"node": n.name, "kernel": produced[info["ir"]],
                                      "operator": str(n.target), "source": info.get("src", ""),
                                      "rel_error": err if math.isfinite(err) else None}
            return val

    # the exported graph runs on meta-built parameters; feed real ones
    gm = ep.graph_module
    probe = Probe(gm)
    with torch.no_grad():
        try:
            probe.run(*args)
        except Exception:  # noqa: BLE001 - diagnosis is best effort
            return None
    return probe.found


def _state_value(model, target: str, ep=None):
    """A parameter/buffer of the model, or a constant torch.export lifted out of forward
    (e.g. ``torch.tensor(...)``), which lives in the exported program. A value the
    analyzed trace holds only on the meta device (or as a fake tensor) is taken from the
    real program (:func:`_real_value`)."""
    val = _lookup(model, target, ep)
    if _is_abstract(val):
        val = _real_value(ep, target, val)
    return val


def _lookup(model, target: str, ep):
    try:
        return _resolve(model, target)
    except AttributeError:
        if ep is not None and target in ep.constants:
            return ep.constants[target]
        # a tensor subclass parameter (torchao's quantized weights) that export unwrapped
        # into its inner tensors (``w.parametrizations.weight.original0``...): the exported
        # program holds their values
        if ep is not None and target in ep.state_dict:
            return ep.state_dict[target]
        # a DTensor parameter (a tensor-parallel shard) unwrapped to its local tensor
        import re
        m = re.fullmatch(r"(.*)\.parametrizations\.(\w+)\.original0", target)
        if m:
            val = _resolve(model, f"{m.group(1)}.{m.group(2)}")
            return val.to_local() if hasattr(val, "to_local") else val
        raise


def _is_abstract(val) -> bool:
    """A tensor with no values: on the meta device, or a fake tensor of a trace."""
    import torch
    if not isinstance(val, torch.Tensor):
        return False
    from torch._subclasses.fake_tensor import FakeTensor
    return val.device.type == "meta" or isinstance(val, FakeTensor)


def _real_value(ep, target: str, val):
    """The value of a constant or unwrapped parameter that the analyzed trace holds
    without values: a literal it was made from (``torch.tensor(-1e4)``, kept on the meta
    tensor), a routing decision's shadow, else the same state of the real program's own
    export (``ep.solbound_real_export``, made on first use: state is named by module path,
    which does not depend on the device), checked for shape and dtype."""
    import torch
    from .capture import LITERAL_ATTR
    from .routing import VALUE_ATTR
    lit = getattr(val, LITERAL_ATTR, None)
    if lit is not None:
        return torch.tensor(lit, dtype=val.dtype).expand(val.shape)
    ref = getattr(val, VALUE_ATTR, None)
    if ref is not None:
        return ref
    real = getattr(ep, "solbound_real_export", None)
    got = None
    if real is not None:
        real_ep = real()
        got = real_ep.constants.get(target, real_ep.state_dict.get(target))
    if got is None or _is_abstract(got) or tuple(got.shape) != tuple(val.shape) \
            or got.dtype != val.dtype:
        raise HarnessError(f"the analyzed program's {target} ({val.dtype}, "
                           f"{list(val.shape)}) was traced without values, and the real "
                           f"program holds none like it")
    return got


def validate_lowered(lowered, ep, model, inputs, *, seed: int = 0) -> dict:
    """Compare the IR against ``model(*inputs)`` (real tensors)."""
    t0 = time.perf_counter()
    p = lowered.program
    if lowered.unsupported:
        names = sorted({u.operator for u in lowered.unsupported})
        return {"status": "skipped", "seconds": 0.0,
                "reason": f"unsupported operators ({', '.join(names)}): the IR does not compute "
                          f"the whole program, so there is nothing whole to compare"}
    random_kernels = [k.name for k in p.kernels if k.out not in lowered.random_draws
                      and any(isinstance(e, Call) and e.op == "rand" for e in walk(k.body))]
    if random_kernels:
        return {"status": "skipped", "reason": f"kernel {random_kernels[0]} draws random numbers "
                                               f"that cannot be replayed: not comparable",
                "seconds": 0.0}
    routing = getattr(ep, "solbound_routing", None)
    import contextlib
    with _constant_params_redrawn(model, seed) as redrawn:
        if routing:
            from .routing import ForcedRouting
            ctx = ForcedRouting(routing)  # the model runs under the routing it was traced with
        else:
            ctx = contextlib.nullcontext()
        with ctx:
            res = _validate_lowered(lowered, ep, model, inputs, seed, t0)
    if redrawn:
        res["redrawn"] = redrawn
        res["summary"] = (res.get("summary", "") + f"; {len(redrawn)} parameter(s) holding one "
                          f"value each drawn around it for the check "
                          f"({', '.join(redrawn[:3])}{', ...' if len(redrawn) > 3 else ''})")
    return res


def _validate_lowered(lowered, ep, model, inputs, seed, t0) -> dict:
    p = lowered.program
    try:
        model_copy = copy.deepcopy(model)     # the state before the call (it updates buffers)
    except RuntimeError:
        # a tensor subclass that cannot be copied (optimum-quanto's weights): the float64
        # re-check and the first-divergence search run on the model itself, which then
        # holds the state after the call (the same, for a program that updates none)
        model_copy = model
    hook = None
    if lowered.random_draws:
        if ep is None:
            return {"status": "skipped", "reason": "random draws need the exported program "
                                                   "to be replayed", "seconds": 0.0}
        gold = run_graph_replaying_draws(model, inputs, lowered, ep)
        draws = gold["draws"]

        def hook(k, arrays):
            if k.out in draws:
                arrays[k.out][...] = draws[k.out].reshape(arrays[k.out].shape)
    else:
        gold = run_original(model, inputs, lowered, ep)
    src_dtype = tolerance_dtype(p)
    tol = tolerance(src_dtype, max_reduction(p), operator_calls(p))
    try:
        with _progress(len(p.kernels)) as tick:
            def on_kernel(k, arrays, hook=hook):
                if hook is not None:
                    hook(k, arrays)
                tick()
            arrays = execute(p, gold["feeds"], on_kernel=on_kernel)
    except ExecutionError as e:
        return {"status": "failed", "reason": f"IR execution error: {e}", "tolerance": tol,
                "seconds": time.perf_counter() - t0}
    scale = _InputScale(p, arrays)
    outs = compare(lowered, arrays, gold["golden"], tol, scale)
    if not all(o["ok"] for o in outs) and src_dtype == "f32" and not lowered.random_draws:
        recheck_in_f64(lowered, ep, model_copy, inputs, gold["golden"], outs, arrays)
    ok = all(o["ok"] for o in outs)
    res = {"status": "passed" if ok else "failed", "tolerance": tol,
           "tolerance_rule": tolerance_rule(src_dtype),
           "outputs": outs,
           "reference": "the module's forward" if not lowered.random_draws else
                        "the exported graph, its random draws replayed into the IR",
           "shapes": {i["name"]: list(np.shape(gold["feeds"].get(i["ir"])))
                      for i in lowered.inputs if i.get("ir")}}
    if not ok and ep is not None:
        fd = first_divergence(ep, lowered, model_copy, inputs, arrays, tol,
                              gold.get("recorded"), scale)
        res["first_divergence"] = fd
    # the program's own outputs (a buffer update such as a running variance may well be
    # constant while the output proves the rest)
    constant = [o["output"] for o, g in zip(outs, [g for g in gold["golden"] if g is not None])
                if o["kind"] == "output" and np.size(g) > 1 and _is_constant(g)]
    if ok and constant:
        res["status"] = "inconclusive"
        res["reason"] = (f"output {', '.join(map(str, constant))} is constant (or nowhere finite) "
                         f"in the reference run "
                         f"(e.g. a zero-initialized head): agreeing with it proves little")
    res["seconds"] = time.perf_counter() - t0
    worst = max((math.inf if o["worst_rel_error"] is None else o["worst_rel_error"]
                 for o in outs), default=0.0)
    res["summary"] = f"worst relative error {worst:.3g} (tolerance {tol:.3g})"
    res["summary"] += f64_summary(outs)
    return res


def _build_real(problem, seed: int):
    import torch
    torch.manual_seed(seed)
    np.random.seed(seed)
    return problem.build("cpu")


class _constant_params_redrawn:
    """Parameters whose elements are all one value ``c`` (a norm's weight of ones and bias of
    zeros, a zero-initialized head or router) hold ``c + 0.02 max(1, |c|) N(0, 1)`` inside
    the block, restored on exit; yields their names. Left at ``c``, a rule that drops a
    norm's bias or weight computes the same values and passes; and a zero head makes every
    output constant. The IR does not depend on parameter values, so the check is the same
    program's."""

    def __init__(self, model, seed: int):
        self.model, self.seed, self.saved = model, seed, []

    def __enter__(self) -> list[str]:
        import torch
        g = torch.Generator().manual_seed(self.seed + 1)
        names = []
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                if not (p.is_floating_point() and p.numel() > 0 and p.device.type == "cpu"
                        and type(p.data) is torch.Tensor):
                    continue
                c = p.reshape(-1)[0]
                if not bool(torch.all(p == c)):
                    continue
                self.saved.append((p, p.detach().clone()))
                noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
                p.copy_((c.float() + 0.02 * max(1.0, abs(float(c))) * noise).to(p.dtype))
                names.append(name)
        return names

    def __exit__(self, *exc):
        import torch
        with torch.no_grad():
            for p, old in self.saved:
                p.copy_(old)
        return False


def _on_meta(model, inputs) -> bool:
    import torch
    return any(t.device.type == "meta" for t in list(model.parameters()) + list(model.buffers())) \
        or any(isinstance(x, torch.Tensor) and x.device.type == "meta" for x in inputs)


def _input_plans(inputs):
    """Smaller inputs cut from real ones, largest first: ``(description, inputs)``. The
    batch (dimension 0) alone, then every dimension of 32 or more as well (a sequence, an
    image side), each size halved ``shift`` times; dimensions of one size shrink together
    (ids and their attention mask)."""
    import torch
    tensors = [x for x in inputs if isinstance(x, torch.Tensor) and x.dim() > 0]
    if not tensors:
        return
    seen = set()
    for large in (False, True):
        for shift in range(1, 8):
            def new_size(n, d, large=large, shift=shift):
                if (d == 0 and n >= 2) or (large and n >= 32):
                    return max(1, n >> shift)
                return n
            out, changes = [], {}
            for x in inputs:
                if not isinstance(x, torch.Tensor) or x.dim() == 0:
                    out.append(x)
                    continue
                y = x
                for d, n in enumerate(x.shape):
                    m = new_size(n, d)
                    if m != n:
                        y = y.narrow(d, 0, m)
                        changes[(d, n)] = m
                out.append(y.contiguous())
            key = tuple(tuple(y.shape) for y in out if isinstance(y, torch.Tensor))
            if not changes or key in seen:
                continue
            seen.add(key)
            desc = "inputs " + ", ".join(f"dim {d}: {n}->{m}" for (d, n), m in sorted(changes.items()))
            yield desc, tuple(out)


DRAWS = 3     # draws of a problem's parameters and inputs before a verdict is inconclusive


def made_once(make, what: str):
    """A getter of ``make()``, called on first use and kept; a failure is the harness's
    (``HarnessError``, naming ``what``), never the IR's."""
    made = []

    def get():
        if not made:
            try:
                made.append(make())
            except Exception as e:  # noqa: BLE001 - the harness, not the IR
                from ..loading import oneline
                raise HarnessError(f"{what} failed: {oneline(e)}") from None
        return made[0]
    return get


def _real_export(model, inputs: tuple, source: str, keep: bool, routing, reroll: bool):
    """The real program's own export, made once on first use: the source of values for
    state the analyzed trace holds without them (never of the program that is run).
    Decomposed as the analysis's was: that is where a tensor subclass parameter is
    unwrapped into the parts the analyzed program names."""
    def make():
        from .capture import export_program
        from .loops import capturing
        with capturing(reroll):
            return export_program(model, inputs, source, keep_experts=keep, routing=routing)
    return made_once(make, "exporting the real program for the values of its constants")


def validate_report(rep, model=None, inputs=None, *, problem=None, seed: int = 0,
                    max_bytes: int = DEFAULT_MAX_BYTES, max_seconds: float = DEFAULT_MAX_SECONDS) -> dict:
    """Fill ``rep.validation``; reduce shapes when the program is over budget. A real
    program that does not fit this machine's memory is ``skipped`` (no verdict), not an
    error of the analysis."""
    try:
        return _validate_report(rep, model, inputs, problem=problem, seed=seed,
                                max_bytes=max_bytes, max_seconds=max_seconds)
    except (MemoryError, RuntimeError) as e:
        # torch's CPU allocator says "can't allocate memory" in a RuntimeError
        if isinstance(e, RuntimeError) and "allocate memory" not in str(e):
            raise
        rep.validation = {"status": "skipped",
                          "reason": "the real program (its weights and inputs) does not fit this "
                                    "machine's memory: no reference to compare with"}
        return rep.validation


def _validate_report(rep, model=None, inputs=None, *, problem=None, seed: int = 0,
                     max_bytes: int = DEFAULT_MAX_BYTES,
                     max_seconds: float = DEFAULT_MAX_SECONDS) -> dict:
    from .stacks import export_and_lower

    keep = getattr(rep, "keep_experts_dispatch", False)
    reroll = getattr(rep, "reroll", True)
    routing = getattr(rep, "routing", None)
    if getattr(rep, "train", None) is not None:
        from .train import validate_step
        rep.validation = validate_step(rep, model, inputs, problem=problem, seed=seed,
                                       max_bytes=max_bytes, max_seconds=max_seconds)
        return rep.validation
    if getattr(rep, "sizes_assumed", False):
        rep.validation = {"status": "skipped",
                          "reason": "selection sizes were assumed (--select-fraction): the run "
                                    "selects what its data says, so the two do not compare"}
        return rep.validation
    flops = sum(rep.counts.flops.values())
    mem, secs = estimate_cost(rep.program, flops)
    lowered = rep.lowered
    reduced = None
    meta_module = problem is None and model is not None and _on_meta(model, inputs)
    if (mem > max_bytes or secs > max_seconds) and not meta_module:
        traced: list = []

        def fits(m, inp) -> bool:
            """The instance traces, keeps the kernel structure and is within budget; its
            trace is kept (``traced``): it is the reduced program that is validated."""
            try:
                ep_r, low_r = export_and_lower(m, tuple(inp), rep.source, keep_experts=keep,
                                               routing=routing, reroll_layers=reroll)
            except Exception:  # noqa: BLE001 - a size the program does not accept
                return False
            if not fits_budget(low_r.program, lowered.program, max_bytes, max_seconds):
                return False
            traced[:] = [ep_r, low_r]
            return True

        found = None
        # sizes in the file's constants, then sizes in the inputs themselves (literals in
        # get_inputs, __init__ defaults, a factory's or the caller's tensors)
        for factor, new_problem in (problem.shrink() if hasattr(problem, "shrink") else ()):
            try:
                m, inp, _ = new_problem.build_for_capture()
            except Exception:  # noqa: BLE001
                continue
            if fits(m, inp):
                found = ("problem", new_problem, factor)
                break
        # the weights alone: smaller inputs cannot bring them under the budget, so the real
        # model is not built to try them (gpt-neo-2.7B in fp32 is 10.6 GB)
        weights = sum(t.nbytes for t in rep.program.tensors if t.role in ("parameter", "buffer"))
        if found is None and weights <= max_bytes:
            if problem is not None:
                base = _build_real(problem, seed)
            elif model is not None and not _on_meta(model, inputs):
                base = (model, tuple(inputs))
            else:
                base = None
            for desc, inp in (_input_plans(base[1]) if base is not None else ()):
                if fits(base[0], inp):
                    found = ("inputs", (base[0], inp), desc)   # the reduced inputs run
                    break
        if found is None:
            rep.validation = {"status": "skipped",
                              "reason": f"over budget (~{mem / 2**30:.1f} GiB, ~{secs:.0f} s) and no "
                                        f"reduced instance (smaller size constants or inputs) keeps "
                                        f"the kernel structure"}
            return rep.validation
        if found[0] == "problem":
            problem, reduced = found[1], found[2]
        else:
            problem, (model, inputs), reduced = None, found[1], found[2]
    if problem is not None:
        model, inputs = _build_real(problem, seed)
    elif model is None:
        raise ValueError("validation needs the module and real inputs")
    else:
        import torch
        on_meta = [n for n, t in list(model.named_parameters()) + list(model.named_buffers())
                   if t.device.type == "meta"]
        on_meta += [f"input {i}" for i, x in enumerate(inputs)
                    if isinstance(x, torch.Tensor) and x.device.type == "meta"]
        if on_meta:
            rep.validation = {"status": "skipped",
                              "reason": f"the module or its inputs live on the meta device "
                                        f"({on_meta[0]}, ...): no real values to run; analyze a "
                                        f"file or factory (built on the CPU to validate), or pass "
                                        f"real tensors"}
            return rep.validation
    if reduced is None:
        # one program, one verdict: the IR that was analyzed runs on the real module's
        # values (its parameters, buffers and inputs by name); a constant the analyzed
        # trace holds without values comes from the real program's own export
        if getattr(rep, "exported", None) is None:
            rep.validation = {"status": "skipped", "reason": "the capture the IR was lowered "
                                                             "from is not at hand"}
            return rep.validation
        ep, low = rep.exported, lowered
        ep.solbound_real_export = _real_export(model, tuple(inputs), rep.source, keep,
                                               routing, reroll)
    else:
        # a reduced instance is a program of its own (its kernel structure is the analyzed
        # one's: ``fits`` checked). The trace ``fits`` made is the one run, on the real
        # module's values, as at full size: no second trace (with real tensors torch.export
        # records strides the CPU kernels chose: GPT-2's attention output from the CPU's
        # SDPA is already contiguous, so its ``.contiguous()`` is dropped and the view after
        # it fails once SDPA is decomposed)
        ep, low = traced
        ep.solbound_real_export = _real_export(model, tuple(inputs), rep.source, keep,
                                               routing, reroll)
    try:
        res = validate_lowered(low, ep, model, tuple(inputs), seed=seed)
    except HarnessError as e:
        rep.validation = {"status": "skipped", "reason": f"the reference could not run: {e}"}
        return rep.validation
    if res["status"] == "inconclusive" and problem is not None:
        # inconclusive only when every draw the harness can make agrees: the program
        # built again from other seeds (its parameters and get_inputs drawn anew)
        for s in range(seed + 1, seed + DRAWS):
            try:
                m2, inp2 = _build_real(problem, s)
                again = validate_lowered(low, ep, m2, tuple(inp2), seed=s)
            except HarnessError:
                break
            if again["status"] != "inconclusive":
                res = again
                res["summary"] += f"; inputs and parameters drawn with seed {s}"
                break
        else:
            res["reason"] += f" (for each of {DRAWS} draws of the inputs and parameters)"
    res["reduced"] = reduced is not None
    if reduced is not None:
        res["reduced_by"] = reduced
        res["summary"] = res.get("summary", "") + f" at reduced shapes ({reduced})"
    rep.validation = res
    return res

