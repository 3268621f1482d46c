"""``solbound sweep SWEEP.toml``: every point of a grid analyzed as one Ray task, one row
per point, chip and fidelity.

A point that raises, whose worker dies, or that runs past its limits is a row with its
one-line error; the sweep goes on. Rows are appended to the CSV as points finish (so an
interrupted sweep loses nothing), and every output is rewritten in point order at the
end. ``--resume`` reads the rows already in the output and skips those points.
"""

from __future__ import annotations

import csv
import json
import os
import sys
import time

from .engine import Engine, EngineError, Outcome
from .spec import Sweep, SweepError, check_program, load

COLUMNS = ["arch", "mode", "seconds", "macs", "bytes", "bound", "status", "error", "engine"]
# in the JSON rows only: what the HTML's rooflines need, and how long the point took
EXTRA = ["flops", "intensity", "analysis_seconds", "comm_seconds"]


def point_item(sweep: Sweep, params: dict) -> dict:
    """What a worker needs to run one point (plain data: it crosses to the worker)."""
    program = sweep.program
    rel = os.path.relpath(program, sweep.folder) if program.endswith(".py") else program
    return {"program": rel, "folder": sweep.folder, "params": params, "archs": sweep.archs,
            "modes": sweep.modes, "policy": sweep.precision_policy, "train": sweep.train,
            "world_size": sweep.world_size}


def run_point(item: dict) -> list[dict]:
    """One point on a worker: its rows (without ``engine``), one per chip and fidelity."""
    folder = item["folder"]
    if not os.path.isdir(folder):
        folder = os.getcwd()          # on a cluster: the shipped working_dir
    if folder not in sys.path:
        sys.path.insert(0, folder)
    program = item["program"]
    if program.endswith(".py"):
        program = os.path.join(folder, program)
    from ..api import analyze_source
    t0 = time.perf_counter()
    archs = [os.path.join(folder, os.path.basename(a)) if a.endswith(".toml")
             and not os.path.exists(a) else a for a in item["archs"]]
    from .spec import PARALLEL
    params = {k: v for k, v in item["params"].items() if k not in PARALLEL}
    degrees = {k: v for k, v in item["params"].items() if k in PARALLEL}
    if item.get("world_size", 1) > 1 and "world_size" not in degrees:
        degrees["world_size"] = item["world_size"]
    rep = analyze_source(program, arch=",".join(archs), precision_policy=item["policy"],
                         train=item["train"], params=params, modes=item["modes"], **degrees)
    took = time.perf_counter() - t0
    d = rep.to_dict()
    status = "partial" if rep.unsupported else "ok"
    error = ("uncounted: " + ", ".join(sorted({f"{u.operator}@{u.source}"
                                               for u in rep.unsupported}))) \
        if rep.unsupported else ""
    rows = []
    for b in rep.bounds:
        rows.append({**item["params"], "arch": b.arch, "mode": b.mode, "seconds": b.seconds,
                     "macs": d["totals"]["macs"], "bytes": b.bytes, "bound": b.bound,
                     "status": status, "error": error, "flops": b.flops,
                     "intensity": b.intensity if b.bytes else None,
                     "analysis_seconds": round(took, 3), "comm_seconds": b.comm_seconds})
    return rows


def failed_rows(sweep: Sweep, params: dict, out: Outcome) -> list[dict]:
    """The rows of a point that gave no report: one per chip and asked fidelity."""
    from ..bounds.fidelity import FIDELITIES
    modes = sweep.modes or list(FIDELITIES)
    return [{**params, "arch": _arch_id(a), "mode": m, "seconds": None, "macs": None,
             "bytes": None, "bound": None, "status": out.status, "error": out.error}
            for a in sweep.archs for m in modes]


def _arch_id(a: str) -> str:
    return os.path.splitext(os.path.basename(a))[0] if a.endswith(".toml") else a


def _key(sweep: Sweep, row: dict) -> tuple:
    return tuple(str(row.get(k, "")) for k in sweep.names)


def read_done(sweep: Sweep, csv_path: str | None, json_path: str | None) -> list[dict]:
    """Rows already in the output (for ``--resume``): the JSON when there is one (it keeps
    every field), else the CSV."""
    if json_path and json_path != "-" and os.path.exists(json_path):
        with open(json_path) as f:
            data = json.load(f)
        return list(data.get("rows", []))
    if csv_path and os.path.exists(csv_path):
        with open(csv_path, newline="") as f:
            rows = list(csv.DictReader(f))
        missing = [c for c in sweep.names + COLUMNS if rows and c not in rows[0]]
        if missing:
            raise SweepError(f"{csv_path}: --resume: the file has no column {missing[0]!r}: "
                             f"not this sweep's output")
        return rows
    return []


def _cell(v):
    return "" if v is None else v


def write_csv(path: str, sweep: Sweep, rows: list[dict], mode: str = "w") -> None:
    cols = sweep.names + COLUMNS
    new = mode == "w" or not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, mode, newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        if new:
            w.writeheader()
        for r in rows:
            w.writerow({k: _cell(r.get(k)) for k in cols})


def to_json(sweep: Sweep, rows: list[dict], engine: str, wall: float) -> str:
    return json.dumps({"sweep": os.path.abspath(sweep.path), "program": sweep.program,
                       "parameters": sweep.names, "arch": [_arch_id(a) for a in sweep.archs],
                       "columns": sweep.names + COLUMNS + EXTRA, "engine": engine,
                       "wall_seconds": round(wall, 3), "rows": rows}, indent=1, default=str)


class Progress:
    """Points done, failed and left: a live bar on a terminal, else one line per point."""

    def __init__(self, total: int, stream=None):
        stream = stream or sys.stderr
        self.total, self.done, self.failed = total, 0, 0
        self.t0 = time.perf_counter()
        self.stream = stream
        self.bar = None
        if stream.isatty():
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as Bar,
                                       TextColumn, TimeElapsedColumn)
            self.bar = Bar(TextColumn("points"), BarColumn(), MofNCompleteColumn(),
                           TextColumn("{task.fields[state]}"), TimeElapsedColumn(),
                           console=Console(file=stream), transient=False)
            self.task = self.bar.add_task("sweep", total=total, state=self._state())
            self.bar.start()

    def _state(self) -> str:
        return f"failed {self.failed}, left {self.total - self.done}"

    def update(self, label: str, out: Outcome) -> None:
        self.done += 1
        self.failed += out.failed
        if self.bar is not None:
            self.bar.update(self.task, advance=1, state=self._state())
            if out.failed:
                self.bar.console.print(f"{label}: {out.status}: {out.error}")
        else:
            msg = f" | {out.status}: {out.error}" if out.failed else ""
            print(f"[{self.done}/{self.total} {time.perf_counter() - self.t0:.0f}s, failed "
                  f"{self.failed}, left {self.total - self.done}] {label} "
                  f"({out.seconds:.1f}s){msg}", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def run_sweep(sweep: Sweep, *, csv_path=None, json_path=None, html_path=None, jobs=None,
              address=None, timeout=None, memory=None, resume=False, stream=None
              ) -> list[dict]:
    """Every point of ``sweep`` on the engine; the rows, in point order."""
    stream = stream or sys.stderr
    check_program(sweep)
    points = sweep.points()
    done_rows = read_done(sweep, csv_path, json_path) if resume else []
    done_keys = {_key(sweep, r) for r in done_rows}
    todo = [p for p in points if _key(sweep, p) not in done_keys]
    if resume:
        print(f"solbound: --resume: {len(points) - len(todo)} of {len(points)} point(s) "
              f"already in the output, {len(todo)} to run", file=stream, flush=True)
    timeout = timeout if timeout is not None else sweep.timeout
    memory = memory if memory is not None else sweep.memory
    if csv_path and not resume:
        write_csv(csv_path, sweep, [])
    results: dict[int, list[dict]] = {}
    t0 = time.perf_counter()
    engine_name = "ray-local" if address is None else f"ray@{address}"
    if todo:
        progress = Progress(len(todo), stream)
        try:
            with Engine(jobs=jobs, address=address, working_dir=sweep.folder, timeout=timeout,
                        memory_limit=int(memory * 2**30) if memory else None) as eng:
                engine_name = eng.name
                for out in eng.map(run_point, [point_item(sweep, p) for p in todo]):
                    params = todo[out.index]
                    rows = out.value if out.status == "ok" else failed_rows(sweep, params, out)
                    for r in rows:
                        r["engine"] = engine_name
                    results[out.index] = rows
                    if csv_path:
                        write_csv(csv_path, sweep, rows, mode="a")
                    progress.update(", ".join(f"{k}={v}" for k, v in params.items()), out)
        finally:
            progress.close()
    wall = time.perf_counter() - t0
    order = {_key(sweep, p): n for n, p in enumerate(points)}
    rows = done_rows + [r for i in sorted(results) for r in results[i]]
    rows.sort(key=lambda r: order.get(_key(sweep, r), len(order)))
    if csv_path:
        write_csv(csv_path, sweep, rows)
    if json_path:
        text = to_json(sweep, rows, engine_name, wall)
        if json_path == "-":
            print(text)
        else:
            with open(json_path, "w") as f:
                f.write(text)
    if html_path:
        from .html import sweep_html
        with open(html_path, "w") as f:
            f.write(sweep_html(sweep, rows))
    return rows


def cmd_sweep(a) -> int:
    try:
        sweep = load(a.sweep)
        if not (a.csv or a.json or a.html):
            raise SweepError("give at least one output: --csv PATH, --json PATH (- for "
                             "stdout) or --html PATH")
        if a.resume and not (a.csv or (a.json and a.json != "-")):
            raise SweepError("--resume reads the rows already written: give the --csv or "
                             "--json file of the earlier run")
        t0 = time.perf_counter()
        rows = run_sweep(sweep, csv_path=a.csv, json_path=a.json, html_path=a.html,
                         jobs=a.jobs, address=a.address, timeout=a.timeout, memory=a.memory,
                         resume=a.resume)
    except (SweepError, EngineError) as e:
        print(f"solbound: error: {e}", file=sys.stderr)
        return 2
    points = {_key(sweep, r): r["status"] for r in rows}
    bad = sum(1 for s in points.values() if s not in ("ok", "partial"))
    outs = ", ".join(p for p in (a.csv, a.json if a.json != "-" else None, a.html) if p)
    print(f"{len(points)} point(s) x {len(sweep.archs)} chip(s): {len(rows)} rows in "
          f"{time.perf_counter() - t0:.1f} s; {bad} point(s) failed"
          + (f"; written to {outs}" if outs else ""), file=sys.stderr)
    return 0
