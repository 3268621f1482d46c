"""The report: JSON (schema ``solbound.report/1``) and the terminal view."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from ..bounds.roofline import Bound, Policy, group_seconds, kernel_pipe_work, resolve_peak

SCHEMA = "solbound.report/1"


def json_default(o):
    """What ``json.dumps`` cannot write itself: numpy scalars and arrays as the Python
    numbers and lists they hold (a frontend's parameters may be numpy integers; the
    report's numbers are meant to be Python's, and the tests check that they are, but no
    report should fail to be written because one slipped through)."""
    import numpy as np
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def dumps(doc, **kw) -> str:
    """``json.dumps`` with numpy scalars written as numbers (``json_default``)."""
    return json.dumps(doc, default=json_default, **kw)


def _num(x: float) -> float | int | None:
    if isinstance(x, float) and (math.isinf(x) or math.isnan(x)):
        return None
    return x


@dataclass
class Report:
    source: str
    lowered: Any
    graph: Any
    counts: Any
    specs: list
    policy: Policy
    bounds: list[Bound]
    timings: dict = field(default_factory=dict)
    # what the JSON says: {"status": "not requested"} until validation runs
    validation: dict = field(default_factory=lambda: {"status": "not requested"})
    problem: Any = None
    keep_experts_dispatch: bool = False
    routing: str | None = None        # the routing assumption asked for (None: default)
    select_fraction: float | None = None
    sizes_assumed: bool = False       # a selection was sized by select_fraction
    world_size: int = 1               # ranks of the program (counts are one rank's)
    # the program timed on this machine (``--measure``): device, per mode median and spread
    measured: dict | None = None
    # the agent's translations (``frontends/agent``): model, requests, one entry per target
    agent: dict | None = None
    # what the fidelities computed once for this program (the cache-aware segment model)
    memo: dict = field(default_factory=dict, repr=False)
    # the frontend's capture the IR was lowered from (PyTorch: the ExportedProgram), which
    # validation runs the analyzed IR beside: one program, one verdict
    exported: Any = field(default=None, repr=False)
    # USD per chip-hour given by the user (``--price``), over the chip files' own
    prices: dict = field(default_factory=dict)

    def price_of(self, arch: str) -> tuple[float, str] | None:
        """(USD per hour, where it comes from) of a chip of the report, or None."""
        if arch in self.prices:
            return float(self.prices[arch]), "--price"
        spec = next((s for s in self.specs if s.id == arch), None)
        if spec is not None and spec.price_per_hour:
            return spec.price_per_hour, spec.source("cost.price_per_hour")
        return None

    def cost_of(self, b: Bound) -> dict | None:
        """What the bound's time costs at the chip's price (per step, per million steps)."""
        p = self.price_of(b.arch)
        if p is None:
            return None
        usd = b.seconds * p[0] / 3600
        return {"usd_per_hour": p[0], "usd": usd, "usd_per_million": usd * 1e6,
                "source": p[1]}

    # --- access -------------------------------------------------------------
    @property
    def program(self):
        return self.lowered.program

    @property
    def unsupported(self):
        return self.lowered.unsupported

    def module_of(self, op: str) -> str:
        """The module path a framework operator belongs to (``""``: the top level)."""
        return (getattr(self.lowered, "groups", {}) or {}).get(op, {}).get("module", "")

    def by_module(self, depth: int | None = None, arch: str | None = None) -> list[dict]:
        """Time (unfused, per operator on ``arch``, default the first chip), FLOPs, MACs and
        unfused bytes rolled up per module path cut at ``depth`` components (None: full
        path), like fvcore's and FlopCounterMode's per-module tables; largest time first."""
        spec = next((s for s in self.specs if arch is None or s.id == arch.lower()), None)
        times = group_seconds(self.counts, spec, self.policy) if spec else None
        rows: dict[str, dict] = {}
        for i, g in enumerate(self.counts.groups):
            path = self.module_of(g.op)
            key = ".".join(path.split(".")[:depth]) if depth and path else path
            r = rows.setdefault(key, {"module": key or "(top level)", "operators": 0,
                                      "seconds": 0.0, "macs": 0, "flops": 0, "bytes_unfused": 0})
            r["operators"] += 1
            r["seconds"] += times[i][0] if times else 0.0
            r["macs"] += g.macs
            r["flops"] += sum(g.flops.values())
            r["bytes_unfused"] += g.traffic.bytes
        return sorted(rows.values(), key=lambda r: (-r["seconds"], r["module"]))

    def module_table(self, depth: int | None = None):
        """The per-module roll-up as a ``report/tables.py`` table."""
        from .tables import Table
        arch = self.specs[0].id if self.specs else "-"
        rows = self.by_module(depth)
        return Table(f"Per module (depth {depth or 'full'}), unfused time on {arch}",
                     ["module", "operators", "time", "MACs", "FLOPs", "bytes"],
                     [[r["module"], str(r["operators"]), _t(r["seconds"]), _si(r["macs"]),
                       _si(r["flops"]), _si(r["bytes_unfused"]) + "B"] for r in rows],
                     left={0},
                     raw_columns=["module", "operators", "time (s)", "MACs", "FLOPs",
                                  "bytes (B)"],
                     raw_rows=[[r["module"], r["operators"], r["seconds"], r["macs"],
                                r["flops"], r["bytes_unfused"]] for r in rows])

    def render_modules(self, depth: int | None = None, console=None,
                       format: str = "table") -> None:
        from .tables import print_tables
        print_tables([self.module_table(depth)], format, console)

    def summary_line(self) -> str:
        """One line: operators, MACs, fused bytes, each chip's fused bound and what binds."""
        pc = self.counts
        parts = [f"{b.arch} {b.seconds * 1e3:.4g} ms ({b.binding_unit if b.bound == 'compute' else b.bound})"
                 for b in self.bounds if b.mode == "fused"]
        extra = f", {len(self.unsupported)} unsupported" if self.unsupported else ""
        val = (f", validation {self.validation.get('status')}"
               if self.validation.get("status") != "not requested" else "")
        return (f"{self.source}: {pc.macs:,} MACs, {pc.fused.bytes:,} B fused; "
                + "; ".join(parts) + extra + val)

    def bound(self, arch: str, mode: str = "fused") -> Bound:
        """The bound on chip ``arch`` (case-insensitive) in fidelity ``mode``."""
        for b in self.bounds:
            if b.arch == arch.lower() and b.mode == mode:
                return b
        have = sorted({(b.arch, b.mode) for b in self.bounds})
        raise KeyError(f"no bound for arch {arch!r}, mode {mode!r}; this report has "
                       + ", ".join(f"{a}/{m}" for a, m in have))

    def _repr_html_(self) -> str:
        """Jupyter: the bounds, top operators and a roofline per chip, inline and light
        (``report/notebook.py``)."""
        from .notebook import notebook_html
        return notebook_html(self)

    def __rich__(self):
        """rich consoles (``rich.print(report)``): the summary and the tables."""
        from .notebook import rich_renderable
        return rich_renderable(self)

    def __repr__(self) -> str:
        pc = self.counts
        first = next((b for b in self.bounds if b.mode == "fused"), None)
        sol = f", {first.arch} fused {first.seconds:.3g} s ({first.bound})" if first else ""
        return (f"<solbound.Report {self.source}: {len(pc.groups)} operators, "
                f"{pc.macs:,} MACs, {pc.fused.bytes:,} fused bytes{sol}, "
                f"{len(self.unsupported)} unsupported>")

    # --- training step ----------------------------------------------------------------
    @property
    def training(self) -> dict | None:
        """A training step's phases (forward, backward, optimizer: MACs, FLOPs per unit,
        unfused and fused bytes), its resident memory and whether it fits each chip's
        DRAM (``analysis/training.py``); None for a program that is not a step."""
        info = getattr(self.lowered, "training", None)
        if info is None:
            return None
        if not hasattr(self, "_training"):
            from ..analysis.training import phase_counts, step_memory
            phase_of = {op: g.get("phase", "forward")
                        for op, g in (self.lowered.groups or {}).items()}
            mem = step_memory(self.program, phase_of, info.get("gradients", {}),
                              set(info.get("optimizer_state", [])))
            fits = {}
            for s in self.specs:
                cap = s.entries.get("dram.capacity", {}).get("value")
                fits[s.id] = {"capacity": cap, "fits": None if cap is None else mem["total"] <= cap}
            self._training = {
                "optimizer": info.get("optimizer"),
                "optimizer_defaults": info.get("defaults", {}),
                "parameters_trained": len(info.get("trained", [])),
                "parameters_frozen": list(info.get("frozen", [])),
                "parameters_without_gradient": list(info.get("unused", [])),
                "phases": phase_counts(self.program, self.counts, phase_of),
                "memory": {**mem, "fits": fits},
            }
        return self._training

    @property
    def totals(self) -> dict:
        return self.to_dict()["totals"]

    def program_cache(self):
        """The cache-aware segment model of this program (``analysis/cache.py``), the one
        the cache-aware bounds used, built on first use otherwise."""
        if "program_cache" not in self.memo:
            from ..analysis.cache import ProgramCache
            self.memo["program_cache"] = ProgramCache(self.graph, self.counts)
        return self.memo["program_cache"]

    @property
    def opportunities(self) -> list[dict]:
        """Contraction chains in a costly order and fp32 contractions that could use tensor
        cores (``bounds/opportunities.py``), computed once."""
        if not hasattr(self, "_opportunities"):
            from ..bounds.opportunities import opportunities
            self._opportunities = opportunities(self) if self.specs else []
        return self._opportunities

    def headroom(self) -> dict:
        """Measured time over each fidelity's bound on the chip it ran on (``host``):
        ``{timing mode: {fidelity: ratio}}``."""
        if not self.measured:
            return {}
        arch = self.measured.get("arch", "host")
        out = {}
        for mode, st in self.measured.items():
            if isinstance(st, dict) and "median" in st:
                out[mode] = {b.mode: st["median"] / b.seconds for b in self.bounds
                             if b.arch == arch and b.seconds}
        return out

    # --- JSON -----------------------------------------------------------------
    def to_dict(self) -> dict:
        pc = self.counts
        tensors = self.program.tensor_map
        d: dict[str, Any] = {
            "schema": SCHEMA,
            "source": self.source,
            "program": {"kernels": len(self.program.kernels), "operators": len(pc.groups),
                        "tensors": len(self.program.tensors)},
            "precision_policy": {"fp32": dict(self.policy.fp32), "description": self.policy.describe()},
            "totals": {
                "macs": pc.macs,
                "flops": sum(pc.flops.values()),
                "flops_by_unit": dict(pc.flops),
                "bytes": {"unfused": pc.unfused.bytes, "fused": pc.fused.bytes},
                "exact": pc.unfused.exact and pc.fused.exact,
            },
            "bounds": [{
                "arch": b.arch, "mode": b.mode, "seconds": b.seconds,
                "compute_seconds": b.compute_seconds, "memory_seconds": b.memory_seconds,
                "bound": b.bound, "bytes": b.bytes, "flops": b.flops,
                "intensity": _num(b.intensity), "pipe_seconds": b.pipe_seconds,
                "unit_seconds": b.unit_seconds, "binding_unit": b.binding_unit,
                "peaks": b.peaks, "bandwidth": b.bandwidth, "notes": b.notes,
                "explanation": b.explanation,
                **({"serial_seconds": b.serial_seconds} if b.serial_seconds is not None else {}),
                **({"cache_bytes": b.cache_bytes} if b.cache_bytes is not None else {}),
                "comm_seconds": b.comm_seconds, "link_bandwidth": b.link_bandwidth,
                "emulated": b.emulated,
                **({"cost": self.cost_of(b)} if self.price_of(b.arch) else {}),
                **({"no_overlap_seconds": b.no_overlap_seconds}
                   if b.no_overlap_seconds is not None else {}),
                **({"segments": _segments(b.detail)} if b.detail is not None else {}),
            } for b in self.bounds],
            "opportunities": self.opportunities,
            **({"measured": self.measured, "headroom": {"arch": self.measured.get("arch"),
                                                        **self.headroom()}}
               if self.measured else {}),
            "archs": [{
                "id": s.id, "name": s.name,
                "bandwidth": {"value": s.bandwidth, "source": s.source("dram.bandwidth"),
                              "uncertain": s.uncertain("dram.bandwidth")},
                "peaks": {k: {"value": v, "source": s.source(k), "uncertain": s.uncertain(k)}
                          for k, v in sorted(s.peaks.items())},
                "onchip": {k: {"value": v, "source": s.source(f"onchip.{k}"),
                               "uncertain": s.uncertain(f"onchip.{k}")}
                           for k, v in sorted(s.onchip.items())},
                "dram_cache": s.dram_cache() if s.onchip else None,
                "links": {k: {"value": v, "source": s.source(f"links.{k}"),
                              "uncertain": s.uncertain(f"links.{k}")}
                          for k, v in sorted(s.links.items())},
            } for s in self.specs],
            # per rank: what each collective moves (payload per rank and call, ``calls``
            # times), over a group of ``ranks``; counts above are one rank's
            "world_size": self.world_size,
            "collectives": [{
                "kind": c.kind, "bytes": c.bytes, "ranks": c.ranks, "calls": c.calls,
                "group": list(c.group), **({"reduce": c.reduce} if c.reduce else {}),
                "kernel": c.kernel, "operator": c.op, "source": c.src,
            } for c in pc.collectives],
            "operators": [{
                "op": g.op, "name": g.opname, "module": self.module_of(g.op), "source": g.src,
                "kernels": len(g.kernels),
                "macs": g.macs, "flops": sum(g.flops.values()), "flops_by_unit": g.flops,
                "bytes_unfused": g.traffic.bytes,
            } for g in pc.groups],
            # per module (full path), time unfused on the first chip: what fvcore shows
            "modules": self.by_module(),
            "kernels": [{
                "name": k.name, "op": k.op, "kind": k.kind, "einsum": k.einsum,
                "extents": dict(self.program.kernels[i].dims), "points": k.points,
                **({"loop": {"var": self.program.kernels[i].loop[0],
                             "trip": self.program.kernels[i].loop[1]}}
                   if self.program.kernels[i].loop else {}),
                "macs": k.macs, "flops_by_unit": k.flops, "ops_per_point": k.ops_per_point,
                "matrix_class": k.matrix_class, "dtype": k.dtype,
                "reads": {t: sum(fp.elements for _, fp in lst) * tensors[t].itemsize
                          for t, lst in k.reads.items()},
                "writes": {t: fp.elements * tensors[t].itemsize for t, fp in k.writes.items()},
            } for i, k in enumerate(pc.kernels)],
            # what the program returns, leaf by leaf (a ModelOutput's logits, each tensor of
            # a returned cache): each is written to DRAM once in the fused bound
            # (a leaf of a rerolled stack is one layer's slice of the tensor the loop keeps)
            "outputs": [{
                "path": o.get("path", ""), "tensor": o["ir"],
                "shape": list(o.get("shape") or tensors[o["ir"]].shape),
                "dtype": tensors[o["ir"]].dtype,
                "bytes": math.prod(o.get("shape") or tensors[o["ir"]].shape)
                * tensors[o["ir"]].itemsize,
            } for o in (getattr(self.lowered, "outputs", None) or [])
                if o.get("kind") == "output" and o.get("ir") in tensors],
            # stacks of repeated layers traced once and run as a loop
            "rerolled": list(getattr(self.lowered, "rerolled", None) or []),
            "unsupported": [{"operator": u.operator, "source": u.source, "reason": u.reason}
                            for u in self.unsupported],
            "notes": list(self.program.notes) + pc.unfused.notes + pc.fused.notes,
            # what the counts rest on beyond the program text (each also among the notes)
            "assumptions": [n for n in list(self.program.notes) + pc.fused.notes
                            if n.startswith("assumption:") or "assumed" in n],
            "validation": self.validation,
        }
        if self.agent is not None:
            d["agent"] = self.agent
        if self.training is not None:
            d["training"] = self.training
            d["phases"] = self.training["phases"]
            d["memory"] = self.training["memory"]
        if getattr(self, "pipeline", None):
            d["pipeline"] = self.pipeline
        return d

    def to_json(self) -> str:
        return dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"

    # --- explain ----------------------------------------------------------------------
    def explain(self, kernel: str, arch: str | None = None) -> str:
        """How a kernel's numbers were derived; an operator name (``linear``, or the ATen name
        ``aten.linear``) explains every kernel of that operator, with the operator's total."""
        pc = self.counts
        spec = self.specs[0] if arch is None else next(s for s in self.specs if s.id == arch)
        # a kernel or an operator id first (``linear_1``); else every operator of that ATen
        # name (``aten.layer_norm`` or ``layer_norm``)
        hits = [i for i, k in enumerate(pc.kernels) if kernel in (k.name, k.op)] or \
            [i for i, k in enumerate(pc.kernels) if kernel in (k.opname, k.opname.replace("aten.", ""))]
        if not hits:
            raise KeyError(f"no kernel or operator named {kernel!r} (solbound explain FILE lists "
                           f"them)")
        parts = [self._explain_kernel(i, spec) for i in hits]
        if len(hits) > 1:
            ops = sorted({pc.kernels[i].op for i in hits})
            for g in pc.groups:
                if g.op in ops:
                    parts.append(f"operator {g.op} ({g.opname}, {self.module_of(g.op) or 'top level'}, "
                                 f"{g.src or '?'}): {len(g.kernels)} kernels, {g.macs:,} MACs, "
                                 f"{sum(g.flops.values()):,} FLOPs, {g.traffic.bytes:,} bytes unfused")
        return "\n\n".join(parts)

    def _explain_kernel(self, i: int, spec) -> str:
        pc = self.counts
        k = pc.kernels[i]
        ir = self.program.kernels[i]
        from ..ir.text import print_kernel
        lines = [print_kernel(ir), ""]
        origin = (getattr(self.lowered, "groups", None) or {}).get(ir.op, {}).get("agent")
        if origin:
            lines.append(f"origin      written by the agent ({origin['model']}) for "
                         f"{origin['target']}, "
                         + ("from the cache" if origin.get("cached") else
                            f"accepted after {origin['attempts']} attempt(s)")
                         + ", validated against the original")
        lines += [f"einsum      {k.einsum}",
                 f"kind        {k.kind}",
                 f"extents     {dict(ir.dims)}" + (f"  guard: {len(ir.guard)} atom(s)" if ir.guard else ""),
                 f"|I|         {k.points:,} points (exact count of the guarded loop nest)",
                 f"per point   {k.ops_per_point}  -> FLOPs {k.flops}",
                 f"MACs        {k.macs:,}"]
        for pipe, n in kernel_pipe_work(k, self.policy).items():
            used, peak, note = resolve_peak(spec, pipe)
            lines.append(f"pipe        {n:,.0f} ops on {used} @ {peak:.4g}/s "
                         f"= {n / peak:.4g} s on {spec.id}" + (f" ({note})" if note else ""))
        for t, lst in k.reads.items():
            for _, fp in lst:
                lines.append(f"read        {t}: {fp.elements:,} elements"
                             + ("" if fp.exact else " (approximate)")
                             + (f" [{fp.note}]" if fp.note else ""))
        for t, fp in k.writes.items():
            lines.append(f"write       {t}: {fp.elements:,} elements")
        c = next((c for c in pc.collectives if c.kernel == k.name), None)
        if c is not None:
            from ..bounds.comm import CommError, hops
            lines.append(f"collective  {c.kind}{f' ({c.reduce})' if c.reduce else ''} over "
                         f"{c.ranks} ranks {list(c.group)}: payload {c.bytes:,} B per rank "
                         f"and call, {c.calls} call(s)")
            try:
                for name, f, b, bw in hops(spec, c.kind, c.members, c.bytes, c.perm):
                    lines.append(f"link        {name}: {f:.4g} x {b:,} B / {bw:.4g} B/s = "
                                 f"{f * b / bw * c.calls:.4g} s on {spec.id}")
            except CommError as e:
                lines.append(f"link        {e}")
        return "\n".join(lines)

    # --- terminal ---------------------------------------------------------------------
    def header_lines(self) -> list[str]:
        """The report's first lines (console markup): the program's size, its work and its
        DRAM bytes."""
        from rich.markup import escape as e
        pc = self.counts
        return [f"[bold]solbound[/bold] {e(self.source)}: {len(pc.groups)} operators, "
                f"{len(self.program.kernels)} kernels",
                f"  MACs {_si(pc.macs)}   FLOPs {_si(sum(pc.flops.values()))} "
                f"(matrix {_si(pc.flops['matrix'])}, vector {_si(pc.flops['vector'])}, "
                f"special {_si(pc.flops['special'])})",
                f"  DRAM bytes: unfused {_si(pc.unfused.bytes)}B, fused {_si(pc.fused.bytes)}B"
                f"   policy: {e(self.policy.describe())}"]

    def tables(self, top: int = 8) -> list:
        """The report's tables as plain data (``report/tables.py``): per phase of a
        training step, collectives, the speed-of-light bounds, the top operators."""
        from .tables import Table
        pc = self.counts
        out = []
        tr = self.training
        if tr is not None:
            out.append(Table(
                f"Training step ({tr['optimizer']}): per phase",
                ["phase", "operators", "MACs", "FLOPs", "bytes unfused", "bytes fused"],
                [[name, str(ph["operators"]), _si(ph["macs"]), _si(ph["flops"]),
                  _si(ph["bytes"]["unfused"]) + "B", _si(ph["bytes"]["fused"]) + "B"]
                 for name, ph in tr["phases"].items()], left={0}))
        if pc.collectives:
            out.append(Table(
                f"Collectives per rank (rank 0 of {self.world_size})",
                ["kind", "ranks", "payload", "calls", "operator", "source"],
                [[c.kind + (f" ({c.reduce})" if c.reduce else ""), str(c.ranks),
                  _si(c.bytes) + "B", str(c.calls), c.op, c.src or "-"]
                 for c in pc.collectives], left={0, 4, 5}))
        comm = bool(pc.collectives)
        cost = any(self.price_of(b.arch) for b in self.bounds)
        cols = ["arch", "mode", "time", "compute", "memory"] + (["comm", "no overlap"] if comm
                                                                  else []) \
            + ["bytes", "bound", "FLOP/B"] + (["cost"] if cost else [])
        rows, raw = [], []
        for b in self.bounds:
            bound = f"compute ({b.binding_unit})" if b.bound == "compute" and b.binding_unit \
                else b.bound
            c = self.cost_of(b) if cost else None
            raw.append([b.arch, b.mode, b.seconds, b.compute_seconds, b.memory_seconds]
                       + ([b.comm_seconds, b.no_overlap_seconds or b.seconds] if comm else [])
                       + [b.bytes, bound, _num(b.intensity)]
                       + ([c["usd"] if c else None] if cost else []))
            row = [b.arch, b.mode, _t(b.seconds), _t(b.compute_seconds), _t(b.memory_seconds)]
            if comm:
                row += [_t(b.comm_seconds), _t(b.no_overlap_seconds or b.seconds)]
            row += [_si(b.bytes) + "B", bound,
                    f"{b.intensity:.3g}" if math.isfinite(b.intensity) else "-"]
            if cost:
                row.append(_usd(c["usd"]) if c else "-")
            rows.append(row)
        units = {"time": "time (s)", "compute": "compute (s)", "memory": "memory (s)",
                 "comm": "comm (s)", "no overlap": "no overlap (s)", "bytes": "bytes (B)",
                 "cost": "cost (USD)"}
        out.append(Table("Speed-of-light bounds" + (" per rank" if comm else ""), cols, rows,
                         left={0, 1, cols.index("bound")},
                         raw_columns=[units.get(c, c) for c in cols], raw_rows=raw))
        if self.specs:
            spec = self.specs[0]
            times = group_seconds(pc, spec, self.policy)
            order = sorted(range(len(pc.groups)), key=lambda i: -times[i][0])[:top]
            rows, raw = [], []
            for i in order:
                g = pc.groups[i]
                tm, c, m = times[i]
                rows.append([f"{g.op} ({g.opname})", self.module_of(g.op) or "-", g.src or "-",
                             _t(tm), "compute" if c >= m else "memory",
                             _si(sum(g.flops.values())), _si(g.traffic.bytes) + "B"])
                raw.append([f"{g.op} ({g.opname})", self.module_of(g.op), g.src, tm,
                            "compute" if c >= m else "memory", sum(g.flops.values()),
                            g.traffic.bytes])
            out.append(Table(f"Top operators by unfused time on {spec.id}",
                             ["operator", "module", "source", "time", "bound", "FLOPs", "bytes"],
                             rows, left={0, 1, 2, 4},
                             raw_columns=["operator", "module", "source", "time (s)", "bound",
                                          "FLOPs", "bytes (B)"], raw_rows=raw))
        return out

    def render(self, console=None, top: int = 8, format: str = "table") -> None:
        """Print the report: text lines and tables (rich, ``markdown`` or ``csv``: see
        ``report/tables.py``; csv prints the tables alone)."""
        from rich.markup import escape as e

        from .tables import console as make_console, print_tables
        console = console or make_console()
        tables = self.tables(top)
        if format == "csv":
            print_tables(tables, format, console)
            return
        if format == "markdown":
            # plain text: nothing is markup
            def say(text: str) -> None:
                console.file.write(_plain(text) + "\n")
        else:
            def say(text: str) -> None:
                console.print(text)
        for line in self.header_lines():
            say(line)
        if format == "markdown":
            console.file.write("\n")
        print_tables(tables, format, console)
        if format == "markdown":
            console.file.write("\n")
        tr = self.training
        if tr is not None:
            m = tr["memory"]
            say(f"  resident: parameters {_si(m['parameters'])}B, gradients "
                f"{_si(m['gradients'])}B, optimizer state {_si(m['optimizer_state'])}B, "
                f"saved for backward {_si(m['saved_for_backward'])}B, peak "
                f"intermediates {_si(m['peak_intermediates'])}B; total "
                f"{_si(m['total'])}B")
            over = [a for a, f in m["fits"].items() if f["fits"] is False]
            if over:
                say(f"  [red]does not fit[/red] in the DRAM of: {e(', '.join(over))}")
        for b in self.bounds:
            if b.cache_bytes is not None:
                say(f"  {e(b.arch)} {e(b.mode)}: {_si(b.bytes)}B with "
                    f"{_si(b.cache_bytes)}B on chip ({e(b.explanation)})")
        if self.measured:
            arch = self.measured.get("arch")
            for mode, ratios in self.headroom().items():
                st = self.measured[mode]
                say(f"[bold]measured[/bold] {mode} on {e(str(arch))}: "
                              f"{_t(st['median'])} median ({_t(st['min'])}-{_t(st['max'])}, "
                              f"{st['trials']} trials); headroom "
                              + ", ".join(f"{m} {r:.3g}x" for m, r in ratios.items()))
        for o in self.opportunities:
            if o["kind"] == "reorder":
                first = self.specs[0].id
                say(f"[cyan]opportunity[/cyan]: reorder {e(o['einsum'])} "
                              f"({e(', '.join(o['sources']) or ', '.join(o['kernels']))}): "
                              f"{o['macs_before']:,} -> {o['macs_after']:,} MACs "
                              f"({o['saving']:.3g}x); {first} fused bound "
                              f"{_t(o['fused_seconds_after'][first])}")
        prec = [o for o in self.opportunities if o["kind"] == "precision"
                and o["arch"] == (self.specs[0].id if self.specs else "")]
        for o in prec:
            say(f"[cyan]opportunity[/cyan]: fp32 contractions on "
                          f"{o['fp32_contractions_on']} tensor cores: {o['arch']} fused bound "
                          f"{_t(o['seconds_before'])} -> {_t(o['seconds_after'])}")
        for o in self.opportunities:
            if o["kind"] == "stored-width" and o["arch"] == self.specs[0].id:
                say(f"[cyan]opportunity[/cyan]: {o['scheme']} ({o['weights']} weight "
                              f"tensors, {o['weight_bytes_before']:,} -> "
                              f"{o['weight_bytes_after']:,} B): {o['arch']} fused bound "
                              f"{_t(o['seconds_before'])} -> {_t(o['seconds_after'])}")
        if self.unsupported:
            say(f"[red]{len(self.unsupported)} unsupported operator(s); their work is "
                          f"NOT counted:[/red]")
            for u in self.unsupported:
                say(f"  [red]{e(u.operator)}[/red] at {e(u.source or '?')}: {e(u.reason)}")
        notes = list(self.program.notes) + [n for b in self.bounds for n in b.notes]
        for n in dict.fromkeys(notes):
            say(f"[yellow]note[/yellow]: {e(n)}")
        for t in (self.agent or {}).get("translations", []):
            how = ("from the cache" if t["cached"] else f"{t['attempts']} attempt(s)")
            state = "accepted, validated" if t["accepted"] else "NOT accepted (stays unsupported)"
            say(f"agent ({e(self.agent['model'])}): {e(t['target'])} "
                          f"({e(t.get('src') or '?')}): {state}, {how}")
        if self.validation.get("status") != "not requested":
            v = self.validation
            say(f"validation: [bold]{e(str(v.get('status')))}[/bold] "
                          + e(v.get("summary") or v.get("reason") or ""))


def _segments(detail) -> list[dict]:
    """The cache-aware schedule: each segment's kernels, bytes and tiling."""
    return [{"first": s.first, "last": s.last, "bytes": s.bytes, "tiles": s.tiles,
             "order": list(s.order), "exact": s.exact}
            for s in getattr(detail, "segments", [])]


def _plain(text: str) -> str:
    """Console markup removed (``[bold]x[/bold]`` is ``x``; escaped brackets restored)."""
    import re
    return re.sub(r"(?<!\\)\[/?[a-z ]+\]", "", text).replace("\\[", "[")


def _usd(x: float) -> str:
    return f"${x:.3g}" if x >= 0.01 else f"${x:.2e}"


def _si(x: float) -> str:
    for unit, div in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


def _t(s: float) -> str:
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"
