"""The ``solbound`` command."""

from __future__ import annotations

import argparse
import os
import sys


def _console():
    """The console tables print to: off a terminal, whole cells (``report/tables.py``)."""
    from .report.tables import console
    return console()


def _err(msg: str, code: int = 2) -> int:
    print(f"solbound: error: {msg}", file=sys.stderr)
    return code


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", help="FILE.py (KernelBench convention: Model, get_inputs, "
                                   "get_init_inputs) or pkg.module:factory")
    _chip_args(p)
    p.add_argument("--clock", default=None, metavar="max|datasheet|MHz",
                   help="the clock every chip's compute peaks are scaled to: max (default: "
                        "each chip's highest boost clock, a bound no kernel beats), datasheet "
                        "(the vendor's rates as printed), or a sustained clock (1755MHz, "
                        "1.6GHz; a bare number is MHz); per chip: --arch h100-sxm@1755MHz")
    p.add_argument("--chip-file", action="append", default=None, metavar="TOML",
                   help="a chip of your own (the catalog's schema; every field checked); "
                        "may repeat")
    p.add_argument("--cache", default=None, metavar="SIZE|LEVEL",
                   help="on-chip capacity of the cache-aware bound: a size (4MiB, 512KiB) or "
                        "a level (l2, llc, smem, regs, vmem); default each chip's last-level "
                        "cache")
    _routing_arg(p)
    p.add_argument("--param", action="append", type=_param, default=None, metavar="NAME=VALUE",
                   help="a keyword argument of a module:factory, or a module-level constant "
                        "of a FILE.py that it replaces (an int, float or string); may repeat")
    p.add_argument("--train", action="store_true",
                   help="the training step: the forward's scalar loss (or its output's "
                        "`loss`), its backward and the optimizer's step")
    p.add_argument("--optimizer", default=None, metavar="NAME",
                   help="with --train: a torch.optim class (default: the file's "
                        "make_optimizer(model), else AdamW with its defaults)")
    _parallel_args(p)
    _agent_args(p)


def _chip_args(p: argparse.ArgumentParser) -> None:
    """``--arch`` and ``--precision-policy``, shared by every command that bounds a program."""
    p.add_argument("--arch", default=None,
                   help="comma-separated chip ids (see `solbound chips`), 'all', or a spec .toml")
    p.add_argument("--precision-policy", default=None,
                   help="default | tf32 | fp32 | matmul=tf32,conv=fp32,attention=fp32")


def _agent_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("agent (an LLM writes the IR of what no tracer reads; only IR "
                             "that validates is accepted)")
    g.add_argument("--agent", action="store_true",
                   help="translate what no frontend lowers (a numpy program; each unsupported "
                        "operator) through an OpenAI-compatible endpoint: OPENAI_BASE_URL, "
                        "OPENAI_API_KEY")
    g.add_argument("--llm-model", default=None, metavar="NAME",
                   help="the endpoint's model (default $SOLBOUND_LLM_MODEL)")
    g.add_argument("--agent-rounds", type=_positive_int, default=6, metavar="N",
                   help="tries per translation, each fed the last one's failure (default 6)")
    g.add_argument("--agent-cache", default=None, metavar="DIR",
                   help="where accepted translations are kept (default the user's cache "
                        "directory, solbound/agent)")


def _agent(a):
    """The agent the command line asks for, or None."""
    if not getattr(a, "agent", False):
        for flag in ("llm_model", "agent_cache"):
            if getattr(a, flag, None):
                raise _Usage(f"--{flag.replace('_', '-')} configures the agent: add --agent")
        return None
    from .frontends.agent.translate import Agent
    opts = _vopts(a)
    return Agent(model=a.llm_model, rounds=a.agent_rounds, cache_dir=a.agent_cache,
                 max_bytes=opts.get("max_bytes"), max_seconds=opts.get("max_seconds"))


class _Usage(Exception):
    """A combination of options that does not go together (one line, exit 2)."""


def _parallel_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--world-size", type=int, default=None, metavar="N",
                   help="the program is written per rank (torch.distributed collectives): "
                        "trace it as rank 0 of N under a fake process group; counts and "
                        "bounds are per rank, with the collectives' link time")
    p.add_argument("--tp", type=_degrees, default=None, metavar="N",
                   help="shard a transformers model N ways by its own tensor-parallel plan "
                        "(base_model_tp_plan); per-rank counts and bounds (project and "
                        "provision take a list: 1,2,4,8)")
    p.add_argument("--ep", type=int, default=None, metavar="N",
                   help="shard a transformers mixture of experts N ways by its own "
                        "expert-parallel plan (base_model_ep_plan): each rank its own batch "
                        "and E/N experts, tokens sent to their experts all-to-all under "
                        "--routing; per-rank counts and bounds")
    p.add_argument("--dp", type=int, default=None, metavar="N",
                   help="with --train: the step of one of N data-parallel ranks, each "
                        "gradient averaged by an all-reduce before the optimizer")
    p.add_argument("--fsdp", type=int, default=None, metavar="N",
                   help="with --train: the step of one of N fully sharded data-parallel "
                        "ranks (each parameter all-gathered where used, each gradient "
                        "reduce-scattered, the optimizer on 1/N)")


def _degrees(text: str) -> list[int]:
    """``8`` or ``1,2,4,8``: tensor-parallel degrees."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a degree (8) or a list (1,2,4,8)") \
            from None
    if not out or any(d < 1 for d in out):
        raise argparse.ArgumentTypeError(f"{text!r}: degrees are positive integers")
    return out


def _tp(a) -> int | None:
    """The one ``--tp`` degree of a command that analyzes one program."""
    from .frontends.contract import FrontendError
    tp = getattr(a, "tp", None)
    if tp and len(tp) > 1:
        raise FrontendError(f"--tp {','.join(map(str, tp))}: this command takes one degree "
                            f"(project and provision take a list)")
    return tp[0] if tp else None


def _param(text: str) -> tuple[str, object]:
    from .frontends.contract import FrontendError
    from .frontends.loading import parse_param
    try:
        return parse_param(text)
    except FrontendError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _params(a) -> dict:
    """``--param NAME=VALUE`` values (the last of a repeated name wins)."""
    return dict(getattr(a, "param", None) or [])


def _fraction(text: str) -> float:
    try:
        f = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= f <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not in [0, 1]")
    return f


def _routing_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--select-fraction", type=_fraction, default=None, metavar="F",
                   help="the fraction of its elements a selection whose size only the data "
                        "knows keeps (nonzero, masked_select, x[mask]); stated as an assumption")
    p.add_argument("--routing", choices=("balanced", "concentrated"), default=None,
                   help="the routing assumed where a mixture-of-experts dispatch sizes tensors "
                        "or branches on routing decisions: balanced (default; T*k/E tokens per "
                        "expert) or concentrated (every token picks experts 0..k-1)")


def cmd_analyze(a) -> int:
    from .api import analyze_source
    if a.price:
        try:
            _prices(a.price, [])        # its syntax, before a long analysis
        except ValueError as e:
            if "not a chip" not in str(e):
                return _err(str(e))
    if getattr(a, "pp", None) and not a.train:
        return _err("--pp pipelines a training step: add --train")
    if getattr(a, "chunks", None) and a.schedule != "interleaved":
        return _err(f"--chunks is for --schedule interleaved, not {a.schedule}")
    if a.validate and not a.quiet and sys.stderr.isatty():
        from .validate import compare
        compare.PROGRESS = True         # a progress bar while the IR runs
    rep = analyze_source(a.program, params=_params(a), agent=_agent(a),
                         arch=_archs(a), precision_policy=a.precision_policy,
                         validate=a.validate, keep_experts_dispatch=a.keep_experts_dispatch,
                         routing=a.routing, select_fraction=a.select_fraction, cache=a.cache,
                         train=a.train, optimizer=a.optimizer,
                         reroll=not getattr(a, "no_reroll", False), world_size=a.world_size,
                         tp=_tp(a), ep=a.ep, dp=a.dp, fsdp=a.fsdp, **_vopts(a))
    if a.measure:
        from .frontends.registry import for_source
        from .measure.host import MeasureError
        if "host" not in {b.arch for b in rep.bounds}:
            return _err("--measure compares with this machine's own spec: add host to --arch "
                        "(after `solbound calibrate`)")
        modes = [m.strip() for m in a.measure.split(",") if m.strip()]
        bad = [m for m in modes if m not in ("eager", "compile", "jit")]
        if bad:
            return _err(f"--measure {a.measure!r}: modes are eager and compile (jit for JAX)")
        fe = for_source(a.program)
        if not fe.measure:
            return _err(f"--measure: a {fe.name} program has no run of its own to time")
        try:
            rep.measured = {"arch": "host", **fe.load("measure")(a.program, _params(a), modes,
                                                                 a.trials)}
        except MeasureError as e:
            return _err(str(e))
    if a.price:
        try:
            rep.prices = _prices(a.price, [b.arch for b in rep.bounds])
        except ValueError as e:
            return _err(str(e))
    if getattr(a, "pp", None):
        try:
            rep.pipeline = _pipeline(rep, a)
        except ValueError as e:
            return _err(str(e))
    if a.json:
        _write(a.json, rep.to_json())
    if a.html:
        from .report.html import render_html
        _write(a.html, render_html(rep))
        print(f"wrote {a.html}", file=sys.stderr)
    if a.json == "-":
        pass                          # standard output holds the JSON alone
    elif not a.quiet:
        rep.render(top=a.top, format=a.format)
        if a.by_module is not None:
            if a.format == "csv":
                sys.stdout.write("\n")     # a CSV block after the report's own
            rep.render_modules(a.by_module or None, format=a.format)
    else:
        print(rep.summary_line())
    for d in getattr(rep, "pipeline", None) or []:
        if a.json == "-":
            break
        print(f"pipeline {d['schedule']} on {d['arch']}: {len(d['stages'])} stages "
              f"({', '.join(str(r['layers']) for r in d['stages'])} layers), "
              f"{d['microbatches']} microbatches: {d['seconds'] * 1e3:.4g} ms a step "
              f"(bubble {d['bubble_fraction']:.1%}, optimizer "
              f"{d['optimizer_seconds'] * 1e3:.3g} ms)")
    if a.validate and rep.validation.get("status") == "failed":
        return EXIT_VALIDATION_FAILED
    if a.strict and rep.unsupported:
        print(f"solbound: --strict: {len(rep.unsupported)} operator(s) left uncounted: "
              + ", ".join(sorted({u.operator for u in rep.unsupported})), file=sys.stderr)
        return EXIT_UNCOUNTED
    return EXIT_OK


def _pipeline(rep, a) -> list[dict]:
    """``--pp``: the traced (one-microbatch) training step split into stages, on each chip,
    with each stage's peak memory under the schedule (``planning.memory``: no data
    parallelism, no recompute)."""
    from .planning.memory import schedule_memory
    from .planning.profile import profile_of
    from .schedules.stages import plan, split_layers
    split = None
    if a.stage_split:
        try:
            split = [int(x) for x in a.stage_split.split(",")]
        except ValueError:
            raise ValueError(f"--stage-split {a.stage_split!r}: layers per stage like 8,8,8,8")
    prof = profile_of(rep)
    m = a.microbatches or 2 * a.pp
    chunks = a.chunks or (2 if a.schedule == "interleaved" else 1)
    out = []
    for spec in rep.specs:
        doc = plan(prof.pieces, spec, a.pp, m, a.schedule, chunks, split, prof.hidden_bytes)
        layers = split_layers(prof.layers, a.pp, split)
        mems = schedule_memory(prof, [(n, s == 0, s == a.pp - 1) for s, n in enumerate(layers)],
                               1, 0, doc.pop("result"), chunks, "none")
        for row, mem in zip(doc["stages"], mems):      # DualPipe: the rank's two stages
            row["peak_memory_bytes"], row["memory"] = mem["total"], mem
        out.append(doc)
    return out


def _prices(text: str, archs: list[str]) -> dict[str, float]:
    """``--price``: ``h100-sxm=2.49,b200=5.5`` or one number for every chip of the report.

    >>> _prices("h100-sxm=2.49", ["h100-sxm"]), _prices("3", ["a", "b"])
    ({'h100-sxm': 2.49}, {'a': 3.0, 'b': 3.0})
    """
    out: dict[str, float] = {}
    known = list(dict.fromkeys(archs))
    for item in (x.strip() for x in text.split(",") if x.strip()):
        arch, sep, val = item.rpartition("=")
        try:
            usd = float(val)
        except ValueError:
            raise ValueError(f"--price {item!r}: a price is USD per chip-hour, a number "
                             f"(ARCH=USD or USD)") from None
        if not usd > 0:
            raise ValueError(f"--price {item!r}: a price must be positive")
        if not sep:
            out.update({x: usd for x in known})
        elif arch not in known:
            raise ValueError(f"--price {item!r}: {arch!r} is not a chip of this report "
                             f"({', '.join(known)})")
        else:
            out[arch] = usd
    return out


def _vopts(a) -> dict:
    opts = {}
    if getattr(a, "max_seconds", None) is not None:
        opts["max_seconds"] = a.max_seconds
    if getattr(a, "max_bytes", None) is not None:
        opts["max_bytes"] = int(a.max_bytes * 2**30)
    return opts


def _write(path: str, text: str) -> None:
    if path == "-":
        sys.stdout.write(text)
        return
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def cmd_ir(a) -> int:
    from .api import analyze_source
    from .ir.text import print_program
    rep = analyze_source(a.program, params=_params(a), agent=_agent(a),
                         arch=None, routing=a.routing,
                         select_fraction=a.select_fraction, world_size=a.world_size, tp=_tp(a),
                         ep=a.ep)
    text = print_program(rep.program)
    _write(a.output or "-", text)
    if rep.unsupported:
        for u in rep.unsupported:
            print(f"solbound: unsupported {u.operator} at {u.source or '?'}: {u.reason}",
                  file=sys.stderr)
    return 0


def cmd_translate(a) -> int:
    """``solbound translate FILE -o prog.ir``: the agent's accepted IR, spliced into the
    traced program where a frontend reads the rest (exit 3 when a translation was not
    accepted and its operator stays uncounted)."""
    from .api import analyze_source
    from .ir.text import print_program
    a.agent = True
    agent = _agent(a)
    rep = analyze_source(a.program, params=_params(a), agent=agent, arch=None,
                         routing=a.routing, select_fraction=a.select_fraction,
                         world_size=a.world_size, tp=_tp(a), ep=a.ep, modes=("fused",))
    _write(a.output or "-", print_program(rep.program))
    if a.output:
        print(f"wrote {a.output}", file=sys.stderr)
    if not agent.translations:
        print("solbound: nothing needed translating: the frontend lowered every operator",
              file=sys.stderr)
    for u in rep.unsupported:
        print(f"solbound: still unsupported: {u.operator} at {u.source or '?'}: {u.reason}",
              file=sys.stderr)
    return EXIT_UNCOUNTED if rep.unsupported else EXIT_OK


def cmd_explain(a) -> int:
    from .api import analyze_source
    rep = analyze_source(a.program, params=_params(a), agent=_agent(a),
                         arch=_archs(a), precision_policy=a.precision_policy,
                         routing=a.routing, select_fraction=a.select_fraction,
                         train=a.train, optimizer=a.optimizer, world_size=a.world_size,
                         tp=_tp(a), ep=a.ep)
    if not a.kernel:
        for k in rep.counts.kernels:
            print(f"{k.name:40s} {k.op:30s} {k.einsum}")
        return 0
    try:
        print(rep.explain(a.kernel))
    except KeyError as e:
        return _err(str(e.args[0]))
    return 0


def cmd_calibrate(a) -> int:
    """Measure this machine and write its spec (the catalog's schema)."""
    from .frontends.torch.calibrate import host_toml
    from .hardware.catalog import spec_from_file
    from .paths import host_spec_path
    from .measure.host import MeasureError
    path = a.output or host_spec_path()
    try:
        text = host_toml(quick=a.quick, progress=lambda m: print(m, file=sys.stderr),
                         device=a.device)
    except MeasureError as e:
        return _err(str(e))
    _write(path, text)
    spec = spec_from_file(path)           # the file follows the catalog's schema
    print(f"wrote {path}: DRAM {spec.bandwidth / 1e9:.3g} GB/s, "
          + ", ".join(f"{k} {v / 1e9:.3g} G/s" for k, v in sorted(spec.peaks.items())
                      if not spec.source(k).startswith("catalog "))
          + "; use --arch host")
    print(calibration_comparison(spec))
    return 0


def calibration_comparison(spec) -> str:
    """What calibrate measured next to the catalog entry the device matches (a GPU), or a
    line saying there is none to compare with."""
    from .hardware.catalog import compare_specs, match_device
    ref = match_device(spec.name) if spec.vendor == "nvidia" else None
    if ref is None:
        return ("no catalog entry to compare with" if spec.vendor == "host" else
                f"{spec.name}: no catalog entry matches this device")
    lines = [f"measured against the catalog's {ref.id} ({ref.name}):",
             f"  {'':16s} {'measured':>12s} {'catalog':>12s} {'ratio':>7s}"]
    for key, mine, theirs in compare_specs(spec, ref):
        scale, unit = ((2**20, "MiB") if key.startswith("onchip") else
                       (1e12, "TB/s") if key == "dram.bandwidth" else (1e12, "T/s"))
        lines.append(f"  {key:16s} {mine / scale:9.4g} {unit:<3s}{theirs / scale:9.4g} "
                     f"{unit:<3s}{mine / theirs:7.2f}")
    return "\n".join(lines)


def cmd_slope(a) -> int:
    """Traffic against on-chip capacity: the program and its heaviest kernels."""
    from .api import analyze_source
    from .report.report import dumps
    rep = analyze_source(a.program, params=_params(a), agent=_agent(a),
                         arch=_archs(a), precision_policy=a.precision_policy,
                         routing=a.routing, select_fraction=a.select_fraction,
                         train=a.train, optimizer=a.optimizer, world_size=a.world_size,
                         tp=_tp(a), ep=a.ep)
    pc = rep.program_cache()
    caps = pc.capacities()
    program = [pc.traffic(c).bytes for c in caps]
    # each kernel alone (a segment of one), the heaviest first
    kernels = []
    for i in range(pc.n):
        curve = [pc.solve(i, i, c).bytes for c in caps]
        kernels.append((i, curve))
    kernels.sort(key=lambda kc: -kc[1][0])
    kernels = kernels[:a.top]
    names = [rep.counts.kernels[i].name for i, _ in kernels]
    doc = {"schema": "solbound.slope/1", "source": rep.source, "fused_bytes": rep.counts.fused.bytes,
           "slope": {"capacities": caps, "program": program,
                     "segments": [{"kernel": n, "operator": rep.counts.kernels[i].opname,
                                   "bytes": [float(b) for b in curve]}
                                  for n, (i, curve) in zip(names, kernels)]}}
    if a.json:
        _write(a.json, dumps(doc, indent=1) + "\n")
    if a.json != "-":
        from rich.table import Table
        t = Table(title=f"{rep.source}: DRAM traffic against on-chip capacity "
                        f"(fused: {rep.counts.fused.bytes:,} B)")
        t.add_column("capacity", justify="right")
        t.add_column("program", justify="right")
        for n in names:
            t.add_column(n, justify="right")
        for j, c in enumerate(caps):
            t.add_row(_size(c), f"{program[j]:,}", *[f"{curve[j]:,.0f}" for _, curve in kernels])
        _console().print(t)
    return 0


def _size(b: int) -> str:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= div:
            return f"{b / div:g} {unit}"
    return f"{b} B"


def _archs(a) -> str | None:
    """``--arch`` plus any ``--chip-file`` (a user's own chip, checked field by field),
    each at ``--clock`` when one is given."""
    files = list(getattr(a, "chip_file", None) or [])
    base = a.arch or ""
    archs = ([x.strip() for x in base.split(",") if x.strip()] if base else []) + files
    clock = getattr(a, "clock", None)
    if clock:
        from .hardware.catalog import DEFAULT_ARCHS, catalog, parse_clock
        parse_clock(clock)                 # a malformed clock is one clear error
        if base.strip() == "all":
            archs = list(catalog()) + files
        archs = [f"{x}@{clock}" for x in (archs or list(DEFAULT_ARCHS))]
    return ",".join(archs) if archs else None


def cmd_provision(a) -> int:
    """The inverse roofline: what each resource must be to meet a latency or rate target."""
    from .api import analyze_source
    from .report.report import dumps
    from .bounds.provision import TargetError, parse_latency, parse_rate, provision
    try:
        if (a.latency is None) == (a.rate is None):
            raise TargetError("give exactly one of --latency (2ms) or --rate (500, in Hz)")
        target = parse_latency(a.latency) if a.latency is not None else parse_rate(a.rate)
    except TargetError as e:
        return _err(str(e))
    if a.tp and len(a.tp) > 1:
        return _parallel(a, target)
    rep = analyze_source(a.program, params=_params(a), agent=_agent(a),
                         arch=_archs(a) or "all", precision_policy=a.precision_policy,
                         routing=a.routing, select_fraction=a.select_fraction, cache=a.cache,
                         train=a.train, optimizer=a.optimizer, world_size=a.world_size,
                         tp=_tp(a), ep=a.ep)
    doc = provision(rep, target)
    if a.json:
        _write(a.json, dumps(doc, indent=1) + "\n")
    if a.json == "-":
        return 0
    from rich.table import Table
    con = _console()
    con.print(f"[bold]{rep.source}[/bold]: target {target * 1e3:.4g} ms "
              f"({1 / target:.4g} Hz)")
    t = Table(title="What the target needs (least resources)")
    for col in ("fidelity", "DRAM bytes", "bandwidth", "busiest pipe"):
        t.add_column(col, justify="left" if col == "fidelity" else "right")
    for r in doc["requirements"]:
        pipe = max(r["pipes"], key=r["pipes"].get) if r["pipes"] else "-"
        t.add_row(r["mode"], f"{r['bytes']:,}", f"{r['bandwidth'] / 1e9:.4g} GB/s",
                  f"{pipe} {r['pipes'].get(pipe, 0) / 1e12:.4g} T/s" if r["pipes"] else "-")
    con.print(t)
    for mode in dict.fromkeys(r["mode"] for r in doc["chips"]):
        t = Table(title=f"Chips, {mode} (factor by which each resource falls short; 1 = just enough)")
        for col in ("arch", "time", "meets", "binds", "shortfall", "bandwidth x", "compute x"):
            t.add_column(col, justify="left" if col in ("arch", "binds") else "right")
        for r in (x for x in doc["chips"] if x["mode"] == mode):
            comp = max((v for k, v in r["factors"].items() if k != "bandwidth"), default=0.0)
            t.add_row(r["arch"], f"{r['seconds'] * 1e3:.4g} ms", "yes" if r["meets"] else "no",
                      r["binding"], f"{r['shortfall']:.3g}", f"{r['factors']['bandwidth']:.3g}",
                      f"{comp:.3g}")
        con.print(t)
    if "dram_capacity" in doc:
        short = sorted({r["arch"] for r in doc["chips"] if r.get("fits_dram") is False})
        con.print(f"the training step needs {_size(doc['dram_capacity'])} of DRAM"
                  + (f"; it does not fit on: {', '.join(short)}" if short else ""))
    curve = ", ".join(f"{_size(c['capacity'])}: {c['bandwidth'] / 1e9:.4g} GB/s"
                      for c in doc["cache_curve"])
    con.print(f"cache-aware bandwidth needed by on-chip capacity: {curve}")
    return 0


def _parallel(a, target: float | None) -> int:
    """``project``/``provision`` over a list of tensor-parallel degrees: one per-rank
    analysis per degree, then per chip and degree the bound and its communication share
    (and, with a target, the least degree that meets it)."""
    from .api import analyze_source
    from .bounds.provision import parallel_projection
    from .report.report import dumps
    if a.world_size or getattr(a, "ep", None):
        return _err("--tp with a list of degrees sets the world size of each analysis: "
                    f"leave out {'--world-size' if a.world_size else '--ep'}")
    reports = {}
    for d in a.tp:
        print(f"solbound: tensor-parallel degree {d} ...", file=sys.stderr)
        reports[d] = analyze_source(a.program, params=_params(a), agent=_agent(a),
                                    arch=_archs(a) or "h100-sxm,h200,b200,gb200-nvl72,mi300x",
                                    precision_policy=a.precision_policy, routing=a.routing,
                                    select_fraction=a.select_fraction, cache=a.cache,
                                    tp=d, modes=("fused",))
    doc = parallel_projection(reports, target)
    doc["source"] = a.program
    if a.json:
        _write(a.json, dumps(doc, indent=1) + "\n")
    if a.json == "-":
        return 0
    from rich.table import Table
    from .report.report import _t as _tm
    title = f"{a.program}: fused bound per rank by tensor-parallel degree"
    if target is not None:
        title += f", target {target * 1e3:.4g} ms"
    t = Table(title=title)
    cols = ["arch", "tp", "time", "compute", "memory", "comm", "comm share", "binds",
            "per rank", "fits DRAM"] + (["meets"] if target is not None else [])
    for col in cols:
        t.add_column(col, justify="left" if col in ("arch", "binds") else "right")
    for r in doc["rows"]:
        t.add_row(r["arch"], str(r["tp"]), _tm(r["seconds"]), _tm(r["compute_seconds"]),
                  _tm(r["memory_seconds"]), _tm(r["comm_seconds"]),
                  f"{r['comm_share'] * 100:.3g}%", r["binding"], _size(r["resident_bytes"]),
                  "-" if r["fits_dram"] is None else ("yes" if r["fits_dram"] else "NO"),
                  *((("yes" if r["meets"] else "no"),) if target is not None else ()))
    con = _console()
    con.print(t)
    if target is not None:
        for arch, d in doc["least_tp"].items():
            con.print(f"{arch}: " + (f"least tensor-parallel degree that meets "
                                     f"{target * 1e3:.4g} ms: {d}" if d else
                                     f"no degree among {','.join(map(str, a.tp))} meets "
                                     f"{target * 1e3:.4g} ms"))
    return 0


def cmd_project(a) -> int:
    """One program across chips: each fidelity, the fusion benefit and the cache penalty."""
    from .api import analyze_source
    from .report.report import dumps
    from .bounds.provision import projection
    if a.tp and len(a.tp) > 1:
        return _parallel(a, None)
    rep = analyze_source(a.program, params=_params(a), agent=_agent(a),
                         arch=_archs(a) or "all", precision_policy=a.precision_policy,
                         routing=a.routing, select_fraction=a.select_fraction, cache=a.cache,
                         train=a.train, optimizer=a.optimizer, world_size=a.world_size,
                         tp=_tp(a), ep=a.ep)
    rows = projection(rep)
    if a.json:
        _write(a.json, dumps({"schema": "solbound.project/1", "source": rep.source,
                              "chips": rows}, indent=1) + "\n")
    if a.json == "-":
        return 0
    from rich.table import Table
    from .bounds.fidelity import FIDELITIES
    t = Table(title=f"{rep.source} across chips")
    t.add_column("arch")
    for m in FIDELITIES:
        t.add_column(m, justify="right")
    step = any("fits_dram" in r for r in rows)
    for col in ("fusion benefit", "cache penalty", "binds (fused)") + (("fits DRAM",) if step
                                                                       else ()):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(r["arch"], *[f"{r['seconds'][m] * 1e3:.4g} ms" if m in r["seconds"] else "-"
                               for m in FIDELITIES],
                  f"{r.get('fusion_benefit', 0):.3g}x", f"{r.get('cache_penalty', 0):.3g}x",
                  r.get("binding", "-"),
                  *((("yes" if r["fits_dram"] else "NO") if r.get("fits_dram") is not None
                     else "-",) if step else ()))
    _console().print(t)
    return 0


def cmd_chips(a) -> int:
    from .hardware.catalog import UnknownArch, catalog, load_spec
    if not a.compare:
        for s in catalog().values():
            peaks = ", ".join(f"{k}={v / 1e12:.4g}T" for k, v in sorted(s.peaks.items()))
            print(f"{s.id:12s} {s.name:40s} DRAM {s.bandwidth / 1e12:.4g} TB/s  {peaks}")
        return 0
    ids = [x.strip() for x in a.compare.split(",") if x.strip()]
    if len(ids) < 2:
        return _err(f"--compare {a.compare!r}: name two or more chips, comma-separated")
    try:
        specs = [load_spec(i) for i in ids]
    except (UnknownArch, ValueError) as e:
        return _err(str(e))
    from .report.tables import Table, print_tables
    rows, raw = [], []

    def line(label, key, value_of, unit, scale, fmt="{:.4g}"):
        vals = [value_of(s) for s in specs]
        if all(v is None for v in vals):
            return
        rows.append([label] + ["-" if v is None else fmt.format(v / scale) + unit
                               + ("*" if key and s.uncertain(key) else "")
                               for s, v in zip(specs, vals)])
        raw.append([label] + vals)
    line("DRAM bandwidth", "dram.bandwidth", lambda s: s.bandwidth, " TB/s", 1e12)
    line("DRAM capacity", "dram.capacity",
         lambda s: s.entries.get("dram.capacity", {}).get("value"), " GB", 1e9)
    for lvl in ("l2", "llc", "smem", "vmem"):
        line(f"on chip: {lvl}", f"onchip.{lvl}", lambda s, lvl=lvl: s.onchip.get(lvl),
             " MiB", 2**20)
    line("clock", "compute.clock", lambda s: s.clock, " MHz", 1e6, "{:.0f}")
    pipes = sorted({p for s in specs for p in s.peaks})
    for p in pipes:
        line(p, p, lambda s, p=p: s.peaks.get(p), " T", 1e12)
    line("price", "cost.price_per_hour", lambda s: s.price_per_hour, " USD/h", 1)
    t = Table("Chips side by side (* uncertain: see each chip file's note and source; peaks "
              "dense, at each chip's highest clock)", ["", *[s.id for s in specs]], rows,
              left={0}, raw_columns=["field", *[s.id for s in specs]], raw_rows=raw)
    print_tables([t], a.format)
    return 0


def cmd_diff(a) -> int:
    """Two JSON reports of one program: what moved, and a CI gate (``--fail-above``)."""
    import json

    from .report.diff import DiffError, diff, regressions, tables
    docs = []
    for path in (a.old, a.new):
        try:
            with open(path) as f:
                docs.append(json.load(f))
        except OSError as e:
            return _err(f"{path}: {e.strerror}")
        except json.JSONDecodeError as e:
            return _err(f"{path}: not JSON ({e.msg} at line {e.lineno}); diff reads the JSON "
                        f"report `solbound analyze PROGRAM --json FILE` writes")
    try:
        d = diff(*docs, any_program=a.any_program)
    except DiffError as e:
        return _err(str(e))
    if a.json:
        from .report.report import dumps
        _write(a.json, dumps(d, indent=1))
    if a.json != "-":
        from .report.tables import print_tables
        print_tables(tables(d, a.top), a.format)
    if a.fail_above is not None:
        bad = regressions(d, a.fail_above, a.mode)
        if bad:
            print("solbound: regressed: " + ", ".join(
                f"{b['arch']} {b['mode']} {b['change'] * 100:+.1f}%" for b in bad)
                + f" (over {a.fail_above:g}%)", file=sys.stderr)
            return EXIT_REGRESSED
    return EXIT_OK


def cmd_validate(a) -> int:
    from .frontends.torch.check_ir import run_validate
    return run_validate(a)


def cmd_kernelbench(a) -> int:
    from .kernelbench import run_cli
    return run_cli(a)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="solbound",
                                description="Speed-of-light bounds for PyTorch programs")
    from . import __version__
    p.add_argument("--version", action="version", version=f"solbound {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks of internal errors")
    sub = p.add_subparsers(dest="cmd", required=True)
    an = sub.add_parser("analyze", help="count and bound a program")
    _common(an)
    an.add_argument("--json", metavar="PATH", help="write the JSON report (- for stdout)")
    an.add_argument("--validate", action="store_true",
                    help="run the IR against the program on real inputs")
    an.add_argument("--max-seconds", type=float, default=None,
                    help="validation time budget before reduced shapes are used")
    an.add_argument("--pp", type=_positive_int, default=None, metavar="N",
                    help="with --train: pipeline the step over N stages of its layers (the "
                         "traced step is one microbatch); per-stage F/B/W work and the "
                         "schedule's makespan")
    an.add_argument("--microbatches", type=_positive_int, default=None, metavar="M",
                    help="with --pp: microbatches a step (default 2 x the stages)")
    an.add_argument("--schedule", default="1f1b",
                    choices=("gpipe", "1f1b", "interleaved", "zb", "dualpipe"),
                    help="with --pp: the pipeline schedule (default 1f1b; dualpipe: "
                         "DeepSeek's bidirectional pipeline, a rank holding two stages)")
    an.add_argument("--chunks", type=_positive_int, default=None, metavar="V",
                    help="with --schedule interleaved: layer chunks a stage (default 2)")
    an.add_argument("--stage-split", default=None, metavar="N,N,...",
                    help="with --pp: layers per stage (default: as even as the count allows)")
    an.add_argument("--max-bytes", type=float, default=None, metavar="GIB",
                    help="validation memory budget (GiB) before reduced shapes are used")
    an.add_argument("--top", type=int, default=8, help="operators listed in the top table")
    an.add_argument("--format", choices=("table", "markdown", "csv"), default="table",
                    help="how the tables print: table (default; off a terminal, whole cells, "
                         "never cut), markdown (GitHub tables and the text), csv (the tables "
                         "alone, one block each, its title the first row)")
    an.add_argument("--price", default=None, metavar="[ARCH=]USD",
                    help="USD per chip-hour (ARCH=USD,... per chip; a bare number for every "
                         "chip): each bound's cost at that price, over a chip file's "
                         "[cost] price_per_hour")
    an.add_argument("--measure", nargs="?", const="eager", default=None, metavar="MODES",
                    help="time the program on this machine (eager, or eager,compile; eager,jit "
                         "for JAX) and show headroom against --arch host")
    an.add_argument("--trials", type=int, default=10, help="timed trials for --measure")
    an.add_argument("--html", metavar="PATH", help="write a self-contained HTML report "
                                                   "(roofline per chip, tables, ski slope)")
    an.add_argument("--keep-experts-dispatch", action="store_true",
                    help="trace transformers mixture-of-experts layers with their own dispatch "
                         "(by default batched_mm: the same T*k expert evaluations, static sizes)")
    an.add_argument("--no-reroll", action="store_true",
                    help="trace every layer of a stack of identical layers and every step "
                         "of a Python loop over steps (by default two layers are traced and "
                         "a loop over steps is one scan; the IR loops over all of them)")
    an.add_argument("--by-module", nargs="?", type=int, const=0, default=None, metavar="DEPTH",
                    help="roll time, FLOPs and bytes up per module (path cut at DEPTH)")
    an.add_argument("--strict", action="store_true",
                    help="exit 3 when any work is left uncounted (unsupported operators)")
    an.add_argument("-q", "--quiet", action="store_true",
                    help="a one-line summary instead of the tables")
    an.set_defaults(fn=cmd_analyze)

    ir = sub.add_parser("ir", help="write the loop IR text")
    ir.add_argument("program")
    ir.add_argument("-o", "--output", help="output file (default stdout)")
    ir.add_argument("--param", action="append", type=_param, default=None, metavar="NAME=VALUE",
                    help="a factory's keyword argument or a file's module-level constant")
    _routing_arg(ir)
    _parallel_args(ir)
    _agent_args(ir)
    ir.set_defaults(fn=cmd_ir)

    tr = sub.add_parser("translate", help="the agent writes the IR of what no tracer reads "
                                          "(a numpy program, unsupported operators); only IR "
                                          "that validates is written")
    tr.add_argument("program")
    tr.add_argument("-o", "--output", help="the IR file to write (default stdout)")
    tr.add_argument("--param", action="append", type=_param, default=None, metavar="NAME=VALUE",
                    help="a factory's keyword argument or a file's module-level constant")
    tr.add_argument("--max-seconds", type=float, default=None,
                    help="time budget for running a translation against the original")
    tr.add_argument("--max-bytes", type=float, default=None, metavar="GIB",
                    help="memory budget (GiB) for running a translation")
    _routing_arg(tr)
    _parallel_args(tr)
    _agent_args(tr)
    tr.set_defaults(fn=cmd_translate)

    ex = sub.add_parser("explain", help="show how a kernel's numbers were derived")
    _common(ex)
    ex.add_argument("kernel", nargs="?", help="kernel or operator name (omit to list)")
    ex.set_defaults(fn=cmd_explain)

    pv = sub.add_parser("provision", help="the least resources that meet a latency or rate "
                                          "target, and each chip's shortfall")
    _common(pv)
    pv.add_argument("--latency", default=None, help="target time per run, e.g. 2ms")
    pv.add_argument("--rate", default=None, help="target runs per second, e.g. 500 (Hz)")
    pv.add_argument("--json", metavar="PATH", help="write solbound.provision/1 JSON (- for stdout)")
    pv.set_defaults(fn=cmd_provision)
    pj = sub.add_parser("project", help="one program across chips and fidelities")
    _common(pj)
    pj.add_argument("--json", metavar="PATH", help="write the table as JSON (- for stdout)")
    pj.set_defaults(fn=cmd_project)
    ca = sub.add_parser("calibrate", help="measure this machine and write its chip spec "
                                          "(then --arch host)")
    ca.add_argument("--quick", action="store_true", help="smaller sizes and fewer trials")
    ca.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="what to measure: the NVIDIA GPU where PyTorch sees one (auto), or "
                         "the CPU")
    ca.add_argument("--output", default=None, help="where to write the spec (default: the "
                                                   "config directory, printed)")
    ca.set_defaults(fn=cmd_calibrate)
    sl = sub.add_parser("slope", help="DRAM traffic against on-chip capacity (ski slope)")
    _common(sl)
    sl.add_argument("--json", metavar="PATH", help="write the curves as JSON (- for stdout)")
    sl.add_argument("--top", type=int, default=4, help="kernels shown beside the program")
    sl.set_defaults(fn=cmd_slope)
    ch = sub.add_parser("chips", help="list the hardware catalog")
    ch.add_argument("--compare", default=None, metavar="A,B[,...]",
                    help="chips side by side: memory, caches, clock, every peak, price")
    ch.add_argument("--format", choices=("table", "markdown", "csv"), default="table")
    ch.set_defaults(fn=cmd_chips)

    df = sub.add_parser("diff", help="what moved between two JSON reports of one program "
                                     "(and a CI gate)")
    df.add_argument("old", help="the earlier report (analyze --json)")
    df.add_argument("new", help="the later report")
    df.add_argument("--fail-above", type=float, default=None, metavar="PCT",
                    help="exit 4 when a bound slowed by more than PCT percent")
    df.add_argument("--mode", default=None, choices=("unfused", "fused", "cache-aware"),
                    help="with --fail-above: only this fidelity's bounds (default every one)")
    df.add_argument("--any-program", action="store_true",
                    help="compare reports of different programs (by default an error)")
    df.add_argument("--json", metavar="PATH", help="write the diff as JSON (- for stdout)")
    df.add_argument("--format", choices=("table", "markdown", "csv"), default="table")
    df.add_argument("--top", type=int, default=20, help="changed operators listed")
    df.set_defaults(fn=cmd_diff)

    va = sub.add_parser("validate", help="check an IR text against the program")
    va.add_argument("program")
    va.add_argument("--ir", required=True, help="IR text file")
    va.add_argument("--seed", type=int, default=0)
    va.set_defaults(fn=cmd_validate)

    kb = sub.add_parser("kernelbench", help="run KernelBench problems")
    kb.add_argument("root", help="a KernelBench checkout's KernelBench folder")
    kb.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    kb.add_argument("--problems", type=int, nargs="+", default=None)
    kb.add_argument("--validate", action="store_true")
    kb.add_argument("--timings", default=None, help="folder with baseline_time_torch*.json")
    kb.add_argument("--timings-date", default=None,
                    help="when the timings were taken (ISO date); default: the timings file's "
                         "commit date in its repository or in the checkout's results/timing/")
    kb.add_argument("--arch", default="h100-sxm")
    kb.add_argument("--precision-policy", default=None)
    kb.add_argument("--csv", required=True)
    kb.add_argument("--timeout", type=float, default=120.0, help="seconds per problem")
    kb.add_argument("--jobs", type=int, default=1, help="problems at once (Ray tasks on a "
                                                        "local instance)")
    kb.add_argument("--address", default=None, metavar="auto|ray://HOST:PORT",
                    help="run on an existing Ray cluster instead of a local instance")
    kb.add_argument("--summary", action="store_true", help="print the per-level table")
    kb.add_argument("--html", metavar="PATH", help="write a summary page (headroom "
                                                   "distributions per level and fidelity)")
    kb.set_defaults(fn=cmd_kernelbench)

    sw = sub.add_parser("sweep", help="analyze a grid of a program's parameters on many "
                                      "chips (each point a Ray task)")
    sw.add_argument("sweep", help="a sweep file (TOML: program, arch, [grid], and optionally "
                                  "modes, precision_policy, train, timeout, memory)")
    sw.add_argument("--csv", metavar="PATH", help="one row per point, chip and fidelity")
    sw.add_argument("--json", metavar="PATH", help="the rows as JSON (- for stdout)")
    sw.add_argument("--html", metavar="PATH", help="plots: the bound against each parameter "
                                                   "per chip, every point on each roofline")
    sw.add_argument("--jobs", type=_positive_int, default=None,
                    help="points at once on the local instance (default: every core)")
    sw.add_argument("--address", default=None, metavar="auto|ray://HOST:PORT",
                    help="run on an existing Ray cluster (the program's folder is shipped to "
                         "its workers)")
    sw.add_argument("--timeout", type=float, default=None, metavar="S",
                    help="seconds per point (default: the file's timeout, else none)")
    sw.add_argument("--memory", type=float, default=None, metavar="GIB",
                    help="memory per point (default: the file's memory, else none)")
    sw.add_argument("--resume", action="store_true",
                    help="skip the points already in the --csv/--json output")
    sw.set_defaults(fn=cmd_sweep)
    st = sub.add_parser("step", help="the speed of light of one engine step: sequences of "
                                     "NEW tokens against CTX cached ones")
    _serving_args(st)
    st.add_argument("--seqs", required=True, metavar="NEW@CTX[xCOUNT],...",
                    help="the step's sequences, e.g. 512@0,1@4095x63 (a 512-token prefill and "
                         "63 decodes at 4095 cached tokens)")
    st.set_defaults(fn=cmd_step)
    se = sub.add_parser("serve", help="lower bounds on a serving workload's makespan, "
                                      "throughput, TTFT and TPOT under an engine's limits")
    _serving_args(se)
    se.add_argument("--isl", type=_positive_int, default=None, help="prompt tokens per request")
    se.add_argument("--osl", type=_positive_int, default=None, help="output tokens per request")
    se.add_argument("--requests", type=_positive_int, default=None,
                    help="requests, all at time 0 (default 1)")
    se.add_argument("--workload", metavar="FILE",
                    help="per-request lengths and optional arrival times: .json, .jsonl or "
                         ".csv (input, output, arrival)")
    se.add_argument("--measured", metavar="FILE",
                    help="a vLLM `bench serve --save-result` JSON or SGLang `bench_serving` "
                         "output: its headroom per metric (per request with --save-detailed "
                         "/ --output-details, whose lengths are then the workload)")
    _limit_args(se)
    se.add_argument("--no-chunked-prefill", action="store_true",
                    help="a prompt is computed in one step")
    se.add_argument("--prefix-hit", type=_fraction, default=0.0, metavar="F",
                    help="the share of each prompt found in the prefix cache (default 0)")

    se.set_defaults(fn=cmd_serve)
    sp = sub.add_parser("speculate", help="speculative decoding: the bound per output token "
                                          "and the best draft length per batch size")
    _serving_args(sp)
    sp.add_argument("--draft", required=True, metavar="MODEL|layers:N",
                    help="the draft: a model as MODEL is given, or layers:N for an EAGLE/MTP-"
                         "style head (N decoder layers of the target's configuration)")
    sp.add_argument("--acceptance", required=True, metavar="A[,A2,...]",
                    help="the chance each draft token is accepted, one for every position or "
                         "one per position (the last repeats)")
    sp.add_argument("--k", default="1-8", metavar="RANGE|LIST",
                    help="draft lengths to consider (default 1-8; 0, plain decoding, always)")
    sp.add_argument("--batch", default="1,8,32,128", metavar="B,...",
                    help="sequences per step (default 1,8,32,128)")
    sp.add_argument("--ctx", type=_positive_int, default=2048,
                    help="cached tokens per sequence (default 2048)")
    sp.set_defaults(fn=cmd_speculate)
    pl = sub.add_parser("plan", help="training at cluster scale: the fastest TP x PP x DP "
                                     "plans of a model on N chips, with memory per rank")
    pl.add_argument("model", help="a transformers config: a directory with config.json, a "
                                  ".json file or a bundled name (llama-3-8b, llama-3-70b)")
    pl.add_argument("--train", action="store_true", help="plan a training step (required: "
                                                         "the plans searched are training's)")
    pl.add_argument("--chips", type=_positive_int, required=True, help="chips in all")
    pl.add_argument("--arch", required=True, help="the chip (see `solbound chips`)")
    pl.add_argument("--global-batch", type=_positive_int, required=True, metavar="B",
                    help="sequences a step (data parallel x microbatch x microbatches)")
    pl.add_argument("--seq", type=_positive_int, default=4096,
                    help="tokens a sequence (default 4096)")
    pl.add_argument("--tp", default=None, metavar="T,...",
                    help="tensor-parallel degrees to consider (default: the powers of two up "
                         "to the chip's scale-up domain that split the heads)")
    pl.add_argument("--pp", default=None, metavar="P,...",
                    help="pipeline degrees to consider (default: every divisor that fits)")
    pl.add_argument("--cp", default="1", metavar="C,...",
                    help="context-parallel degrees to consider (default 1: sequences whole; "
                         "each splits a sequence into 2C chunks, causally balanced)")
    pl.add_argument("--cp-modes", default="ring,ulysses", metavar="M,...",
                    help="how a CP group shares attention: ring (keys and values gathered) "
                         "and/or ulysses (all-to-alls over heads); default both")
    pl.add_argument("--mbs", default="1", metavar="B,...",
                    help="microbatch sizes to consider (default 1; each is traced once a TP "
                         "degree)")
    pl.add_argument("--schedules", default="1f1b,interleaved,zb", metavar="S,...",
                    help="pipeline schedules to consider (gpipe, 1f1b, interleaved, zb, "
                         "dualpipe; default 1f1b,interleaved,zb)")
    pl.add_argument("--dtype", default="bfloat16",
                    help="the parameters' dtype (default bfloat16; AdamW's state follows it)")
    pl.add_argument("--top", type=_positive_int, default=10, help="plans shown (default 10)")
    pl.add_argument("--chakra", metavar="PREFIX", default=None,
                    help="write the fastest plan's step as MLCommons Chakra execution traces, "
                         "PREFIX.RANK.et for every rank (for ASTRA-sim)")
    pl.add_argument("--jobs", type=_positive_int, default=None,
                    help="processes tracing the profiles (default: the CPUs)")
    pl.add_argument("--json", metavar="PATH", help="write the JSON (- for stdout)")
    pl.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    pl.set_defaults(fn=cmd_plan)
    fl = sub.add_parser("fleet", help="many chips: the throughput/interactivity frontier, the "
                                      "fewest chips and TP degree for targets, disaggregated "
                                      "prefill and decode, an HTML report")
    _serving_args(fl, tp=False)
    fl.add_argument("--isl", type=_positive_int, required=True, help="prompt tokens a request")
    fl.add_argument("--osl", type=_positive_int, required=True, help="output tokens a request")
    fl.add_argument("--tp", type=_degrees, default=[1, 2, 4, 8], metavar="N,...",
                    help="tensor-parallel degrees to consider (default 1,2,4,8)")
    fl.add_argument("--throughput", type=float, default=None, metavar="TOK/S",
                    help="output tokens per second the fleet must serve")
    fl.add_argument("--ttft", type=_duration, default=None, metavar="TIME",
                    help="time to first token target (e.g. 500ms)")
    fl.add_argument("--tpot", type=_duration, default=None, metavar="TIME",
                    help="time per output token target (e.g. 20ms)")
    fl.add_argument("--requests", type=_positive_int, default=1000,
                    help="requests of the offline workload a replica's throughput is bounded "
                         "on (default 1000)")
    _limit_args(fl)
    fl.add_argument("--disaggregate", action="store_true",
                    help="also bound prefill and decode on separate replicas: their ratio and "
                         "the cache each request sends")
    fl.add_argument("--html", metavar="PATH", help="write the report page")
    fl.set_defaults(fn=cmd_fleet)
    return p


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n}: at least 1")
    return n


def _step_model(a):
    from .serving import StepModel
    from .serving.models import load_model
    return StepModel(load_model(a.model, a.dtype), precision_policy=a.precision_policy,
                     progress=not a.quiet, tp=a.tp, weights=a.weights, kv_dtype=a.kv_dtype)


def cmd_step(a) -> int:
    from .report.report import dumps
    from .serving import parse_seqs
    seqs = parse_seqs(a.seqs)               # a malformed item fails before the model loads
    prices = _serving_prices(a)
    sm = _step_model(a)
    doc = sm.to_dict(seqs, a.arch, prices)
    if a.json:
        _write(a.json, dumps(doc, indent=2) + "\n")
    if a.json != "-":
        t = doc["totals"]
        print(f"{sm.name} step: {t['sequences']} sequences, {t['tokens']} new tokens; "
              f"{t['macs']:.4g} MACs, {t['bytes']['fused'] / 1e9:.4g} GB fused "
              f"({sm.traces} traces, regions {len(sm.regions)})")
        for b in doc["bounds"]:
            cost = f"  ${b['usd']:.3g} a step" if b["usd"] else ""
            comm = (f" (link {b['comm_seconds'] * 1e3:.4f} ms)" if b.get("comm_seconds")
                    else "")
            print(f"  {b['arch']:<14} {b['seconds'] * 1e3:10.4f} ms  {b['bound']}-bound"
                  f"{comm}{cost}")
    return 0


def cmd_speculate(a) -> int:
    from .report.report import dumps
    from .serving.models import load_model
    from .serving.speculative import (Speculation, head_model, parse_acceptance, parse_ks,
                                      speculate)
    alphas, ks = parse_acceptance(a.acceptance), parse_ks(a.k)
    try:
        batches = [int(b) for b in a.batch.split(",")]
    except ValueError:
        return _err(f"--batch {a.batch!r}: sequence counts like 1,8,32")
    if any(b < 1 for b in batches):
        return _err(f"--batch {a.batch!r}: at least one sequence")
    target = load_model(a.model, a.dtype)
    if a.draft.startswith("layers:"):
        try:
            draft = head_model(target, int(a.draft[7:]))
        except ValueError:
            return _err(f"--draft {a.draft!r}: layers:N with N a whole number")
    else:
        draft = load_model(a.draft, a.dtype)
    sp = Speculation.of(target, draft, precision_policy=a.precision_policy,
                        progress=not a.quiet, tp=a.tp, weights=a.weights, kv_dtype=a.kv_dtype)
    if a.draft.startswith("layers:"):
        sp.draft.name = f"{a.draft[7:]}-layer head of {sp.target.name}"
    doc = speculate(sp, batches, a.ctx, alphas, ks, a.arch)
    if a.json:
        _write(a.json, dumps(doc, indent=2) + "\n")
    if a.json == "-":
        return 0
    print(f"{doc['target']} with draft {doc['draft']}: acceptance "
          f"{','.join(f'{x:g}' for x in alphas)}, {a.ctx} cached tokens; per output token "
          f"of a sequence")
    for chip in doc["speculative"]:
        print(f"  {chip['arch']}")
        for r in chip["batches"]:
            print(f"    batch {r['batch']:>5}: best K {r['best_k']:>2}  "
                  f"{r['seconds_per_token'] * 1e3:.4g} ms/token  "
                  f"{r['tokens_per_second_per_sequence']:,.0f} tok/s/user  "
                  f"{r['output_tokens_per_second']:,.0f} tok/s  "
                  f"x{r['speedup_over_decoding']:.2f} over decoding")
    return 0


def _ints(text: str | None, flag: str) -> list[int] | None:
    """``--tp 1,2,4``: positive whole numbers (None when not given)."""
    if text is None:
        return None
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise _Usage(f"{flag} {text!r}: whole numbers like 1,2,4") from None
    if not out or min(out) < 1:
        raise _Usage(f"{flag} {text!r}: whole numbers of at least 1")
    return sorted(set(out))


def cmd_plan(a) -> int:
    import time

    from .pipeline import specs_of
    from .planning.search import PlanError, Search, run
    from .planning.trace import profiles as trace_profiles
    from .planning.trace import shard_config
    from .report.report import dumps
    from .schedules.pipeline import SCHEDULES
    from .serving.models import load_config
    if not a.train:
        return _err("plan searches training plans: add --train")
    specs = specs_of(a.arch)
    if len(specs) != 1:
        return _err(f"--arch {a.arch!r}: plan one chip at a time")
    spec = specs[0]
    schedules = tuple(x.strip() for x in a.schedules.split(",") if x.strip())
    bad = [x for x in schedules if x not in SCHEDULES]
    if bad or not schedules:
        return _err(f"--schedules {a.schedules!r}: among {', '.join(SCHEDULES)}")
    cfg, _ = load_config(a.model)
    tps, pps, mbss = _ints(a.tp, "--tp"), _ints(a.pp, "--pp"), _ints(a.mbs, "--mbs")
    cps = _ints(a.cp, "--cp") or [1]
    modes = tuple(m.strip() for m in a.cp_modes.split(",") if m.strip())
    if not modes or set(modes) - {"ring", "ulysses"}:
        return _err(f"--cp-modes {a.cp_modes!r}: among ring, ulysses")
    for c in cps:
        if a.chips % c:
            return _err(f"--cp {c} does not divide {a.chips} chips")
        if a.seq % (2 * c):
            return _err(f"--cp {c}: {a.seq} tokens do not split into 2 x {c} equal chunks "
                        f"(the causal load balancing)")
    asked = None if tps is None else tuple(tps)
    if tps is None:
        domain = int(spec.links.get("scale_up_domain", 1)) if spec.links else 1
        tps = [t for t in (1, 2, 4, 8, 16, 32, 64) if t <= min(domain, a.chips)]
    if 1 not in tps:
        tps = [1] + tps           # the model's FLOPs (MFU) are the TP-1 step's, not searched
    for t in list(tps):
        if a.chips % t:
            if a.tp is not None:
                return _err(f"--tp {t} does not divide {a.chips} chips")
            tps.remove(t)
            continue
        try:
            shard_config(cfg, t)
        except PlanError as e:
            if a.tp is not None:
                return _err(str(e))
            tps.remove(t)
    layers = cfg.num_hidden_layers
    for p in pps or []:
        if a.chips % p:
            return _err(f"--pp {p} does not divide {a.chips} chips")
        if p > layers:
            return _err(f"--pp {p}: more stages than the model's {layers} layers")
    def progress(read, todo):
        if not a.quiet and todo:
            print(f"tracing the step {len(todo)} time(s) ({read} read from the cache): "
                  + ", ".join(f"tp {t} microbatch {b}" for t, b in todo)
                  + f", {a.seq} tokens ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    profiles = trace_profiles(cfg, [(t, b) for t in tps for b in mbss], a.seq, a.dtype,
                              spec.id, a.jobs, progress)
    traced = time.perf_counter() - t0
    search = Search(a.chips, a.global_batch, schedules, pp=tuple(pps) if pps else None,
                    tp=asked, cp=tuple(cps), cp_modes=modes)
    try:
        doc = run(profiles, spec, search)
    except PlanError as e:
        return _err(str(e))
    doc = {"schema": "solbound.plan/1", "model": a.model, "seq": a.seq, "dtype": a.dtype,
           **doc, "profile_seconds": traced}
    doc["plans"] = doc["plans"][:a.top]
    if a.chakra:
        from .planning.chakra import export
        from .planning.search import Plan
        best = Plan(**doc["plans"][0]["plan"])
        from .schedules.pipeline import ScheduleError
        try:
            paths = export(best, profiles[(best.tp, best.microbatch)], spec, a.chakra, search)
        except ScheduleError as e:
            return _err(f"--chakra {best.label()}: {e}")
        doc["chakra"] = {"plan": best.label(), "files": len(paths),
                         "pattern": f"{a.chakra}.RANK.et"}
        if not a.quiet:
            print(f"wrote {len(paths)} Chakra traces of {best.label()}: {a.chakra}.RANK.et",
                  file=sys.stderr)
    if a.json:
        _write(a.json, dumps(doc, indent=2) + "\n")
    if a.json == "-":
        return 0
    print(f"{a.model} training on {a.chips} x {spec.id}: global batch {a.global_batch} x "
          f"{a.seq} tokens; {doc['searched']:,} plans searched in "
          f"{doc['search_seconds']:.1f} s ({len(profiles)} profiles traced or read in "
          f"{traced:.1f} s), {doc['fitting']:,} fit")
    w = max([46] + [len(r["label"]) for r in doc["plans"]])
    print(f"  {'plan':<{w}} {'step':>10} {'MFU':>6} {'memory/rank':>12} {'bubble':>7}")
    for r in doc["plans"]:
        print(f"  {r['label']:<{w}} {r['seconds'] * 1e3:>8.4g}ms {r['mfu'] * 100:>5.1f}% "
              f"{_size(int(r['memory_bytes'])):>12} {r['bubble_fraction'] * 100:>6.1f}%")
    print("  Pareto of step time and memory: " + "; ".join(
        f"{r['label']} ({r['seconds'] * 1e3:.4g} ms, {_size(int(r['memory_bytes']))})"
        for r in doc["pareto"][:6]))
    return 0


def cmd_fleet(a) -> int:
    from .report.report import dumps
    from .pipeline import specs_of
    from .serving import StepError, StepModel
    from .serving.fleet import (SCHEMA, breakdown, decode_context, disaggregate, fleet_html,
                                frontier, provision)
    from .serving.models import load_model
    from .serving.step import Seq
    from .serving.workload import Limits, uniform
    tps = sorted(set(a.tp))
    prices = _serving_prices(a)
    limits = Limits(a.max_batched_tokens, a.max_seqs, True, 0.0, a.memory_fraction)
    model = load_model(a.model, a.dtype)
    models: dict = {}
    for tp in tps:
        try:
            models[tp] = StepModel(model, precision_policy=a.precision_policy,
                                   progress=not a.quiet, tp=tp, weights=a.weights,
                                   kv_dtype=a.kv_dtype)
        except StepError as e:
            models[tp] = str(e)
        if not a.quiet:
            print(f"TP {tp}: {'ready' if not isinstance(models[tp], str) else models[tp]}",
                  file=sys.stderr, flush=True)
    doc = {"schema": SCHEMA, "model": type(model).__name__,
           "workload": {"isl": a.isl, "osl": a.osl},
           "targets": {k: v for k, v in (("throughput", a.throughput), ("ttft_seconds", a.ttft),
                                         ("tpot_seconds", a.tpot)) if v is not None},
           "frontier": [], "breakdown": []}
    for spec in specs_of(a.arch):
        for tp, sm in models.items():
            if isinstance(sm, str):
                continue
            try:
                rows = frontier(sm, spec, a.isl, a.osl, limits)
            except StepError as e:
                doc["frontier"].append({"arch": spec.id, "tp": tp, "rows": [],
                                        "reason": str(e)})
                continue
            doc["frontier"].append({"arch": spec.id, "tp": tp, "rows": rows})
            b = rows[-1]["batch"]
            doc["breakdown"].append({"arch": spec.id, "tp": tp, "batch": b,
                                     **breakdown(sm, [Seq(1, decode_context(a.isl, a.osl))] * b)})
    doc["frontier"] = [f for f in doc["frontier"] if f["rows"]] + \
        [f for f in doc["frontier"] if not f["rows"]]
    if a.throughput:
        doc["provision"] = provision(models, a.isl, a.osl, a.arch, throughput=a.throughput,
                                     ttft=a.ttft, tpot=a.tpot, limits=limits,
                                     requests=a.requests, price=prices)
    if a.disaggregate:
        doc["disaggregated"] = [d for sm in models.values() if not isinstance(sm, str)
                                for d in disaggregate(sm, uniform(a.isl, a.osl, a.requests),
                                                      a.arch, limits)]
    if a.json:
        _write(a.json, dumps(doc, indent=2) + "\n")
    if a.html:
        _write(a.html, fleet_html(doc))
    if a.json == "-":
        return 0
    print(f"{doc['model']}: {a.isl} prompt and {a.osl} output tokens a request "
          f"(speeds of light: throughputs at most, chips at least)")
    for f in doc["frontier"]:
        if not f["rows"]:
            print(f"  {f['arch']} TP {f['tp']}: {f['reason']}")
            continue
        ends = f["rows"][0], f["rows"][-1]
        print(f"  {f['arch']} TP {f['tp']}: frontier from {ends[0]['tokens_per_second_per_user']:,.0f} "
              f"tok/s/user at {ends[0]['output_tokens_per_second_per_chip']:,.0f} tok/s/chip "
              f"(batch 1) to {ends[1]['tokens_per_second_per_user']:,.0f} at "
              f"{ends[1]['output_tokens_per_second_per_chip']:,.0f} (batch {ends[1]['batch']})")
    for r in doc.get("provision", []):
        if r["feasible"]:
            cost = (f", >= ${r['usd_per_million_output_tokens']:.3g}/M tokens"
                    if r.get("usd_per_million_output_tokens") else "")
            print(f"  provision {r['arch']} TP {r['tp']}: >= {r['chips']} chips "
                  f"({r['replicas']} replicas of <= {r['replica_output_tokens_per_second']:,.0f} "
                  f"tok/s){cost}{'  <- fewest' if r.get('fewest_chips') else ''}")
        else:
            print(f"  provision {r['arch']} TP {r['tp']}: infeasible: {r['reason']}")
    for d in doc.get("disaggregated", []):
        links = ", ".join(f"{k} {v * 1e3:.3g} ms" for k, v in
                          d["transfer_seconds_per_request"].items())
        print(f"  disaggregated {d['arch']} TP {d['tp']}: prefill:decode replicas "
              f"{d['prefill_to_decode_replicas']:.3g}; "
              f"{d['kv_bytes_per_request']['mean'] / 1e6:.4g} MB of cache a request ({links})")
    return 0


def _pct(d: dict, scale: float = 1e3) -> str:
    return "  ".join(f"{k} {v * scale:.4g}" if v is not None else f"{k} -"
                     for k, v in d.items() if k.startswith("p"))


def _serving_prices(a) -> dict[str, float] | None:
    """``--price`` of step and serve, per chip of ``--arch`` (checked before the model
    loads)."""
    if not a.price:
        return None
    from .pipeline import specs_of
    try:
        return _prices(a.price, [s.id for s in specs_of(a.arch)])
    except ValueError as e:
        raise _Usage(str(e)) from None


def cmd_serve(a) -> int:
    from .report.report import dumps
    from .serving.workload import Limits, read_workload, serve, uniform
    from .serving.measured import headroom, read_run
    if a.workload and (a.isl or a.osl or a.requests):
        return _err("give --workload FILE or --isl/--osl/--requests, not both")
    run = read_run(a.measured) if a.measured else None
    if a.workload:
        reqs = read_workload(a.workload)
    elif a.isl and a.osl:
        reqs = uniform(a.isl, a.osl, a.requests or 1)
    elif run is not None and run.detailed:
        reqs = run.requests
    elif run is not None:
        return _err(f"{a.measured} has no per-request lengths (vLLM: --save-detailed; SGLang: "
                    f"--output-details): give them with --workload or --isl/--osl/--requests")
    else:
        return _err("serve needs a workload: --isl N --osl N [--requests N], --workload FILE "
                    "or --measured FILE")
    limits = Limits(a.max_batched_tokens, a.max_seqs, not a.no_chunked_prefill, a.prefix_hit,
                    a.memory_fraction)
    prices = _serving_prices(a)
    sm = _step_model(a)
    per_request = run is not None and run.detailed and reqs is run.requests
    doc = serve(sm, reqs, a.arch, limits, prices,
                order_statistics=run is None or run.all_at_once, per_request=per_request)
    if run is not None:
        doc["measured"] = {"file": run.path, "all_at_once": run.all_at_once,
                           "headroom": headroom(run, doc)}
        if per_request:
            for e in doc["serving"]:
                e.pop("requests", None)
    if a.json:
        _write(a.json, dumps(doc, indent=2) + "\n")
    if a.json == "-":
        return 0
    w = doc["workload"]
    print(f"{sm.name}: {w['requests']} requests, {w['input_tokens']} prompt and "
          f"{w['output_tokens']} output tokens ({'offline' if w['offline'] else 'arrivals'}); "
          f"max {limits.max_batched_tokens} tokens and {limits.max_seqs} sequences a step")
    print("lower bounds under these limits (throughput: an upper bound); ms")
    for e in doc["serving"]:
        cost = (f", >= ${e['usd_per_million_output_tokens']:.4g} per million output tokens"
                if e["usd_per_million_output_tokens"] else "")
        per_chip = (f" ({e['output_tokens_per_second_per_chip']:,.0f} per chip of TP "
                    f"{e['tp']})" if e["tp"] > 1 else "")
        print(f"  {e['arch']}: makespan {e['makespan_seconds']:.4g} s, <= "
              f"{e['output_tokens_per_second']:,.0f} output tok/s{per_chip} ({e['bound']}){cost}")
        print(f"    TTFT  {_pct(e['ttft_seconds'])}")
        print(f"    TPOT  {_pct(e['tpot_seconds'])}")
        print(f"    memory: {e['max_concurrent_sequences']} sequences of "
              f"{e['memory']['longest_tokens']} tokens fit next to "
              f"{e['memory']['weights_bytes'] / 1e9:.3g} GB of weights"
              f"{' per chip' if e['tp'] > 1 else ''}")
    for h in doc.get("measured", {}).get("headroom", []):
        print(f"  measured ({doc['measured']['file']}) on {h['arch']}: headroom = measured / "
              f"bound (throughput: bound / measured)")
        if "output_tokens_per_second" in h:
            t = h["output_tokens_per_second"]
            print(f"    output tok/s  {t['measured']:,.0f} of <= {t['bound']:,.0f}: "
                  f"{t['headroom']:.2f}x")
        for name in ("ttft", "tpot"):
            rows = h[f"{name}_seconds"]
            line = "  ".join(f"{k} {v['headroom']:.2f}x" for k, v in rows.items()
                             if k != "per_request")
            if "per_request" in rows:
                r = rows["per_request"]
                line += f"  per request min {r['min']:.2f}x median {r['p50']:.2f}x"
                if r["broken"]:
                    line += f"  BELOW THE BOUND: requests {r['broken']}"
            print(f"    {name.upper():<5} {line}")
    for n in doc["notes"]:
        print(f"note: {n}")
    return 0


def _duration(text: str) -> float:
    """``20ms``, ``1.5s``, ``300us`` or seconds (``bounds.provision.parse_latency``)."""
    from .bounds.provision import TargetError, parse_latency
    try:
        return parse_latency(text)
    except TargetError:
        raise argparse.ArgumentTypeError(f"{text!r}: a time like 20ms or 1.5s, above 0") \
            from None


def _limit_args(p: argparse.ArgumentParser) -> None:
    """An engine's limits a serving workload runs under (serve, fleet)."""
    p.add_argument("--max-batched-tokens", type=_positive_int, default=8192,
                   help="new tokens per step at most (default 8192)")
    p.add_argument("--max-seqs", type=_positive_int, default=256,
                   help="sequences per step at most (default 256)")
    p.add_argument("--memory-fraction", type=_fraction, default=0.9, metavar="F",
                   help="the share of the chip's memory for weights and cache (vLLM's "
                        "gpu_memory_utilization; default 0.9)")


def _serving_args(p: argparse.ArgumentParser, tp: bool = True) -> None:
    p.add_argument("model", help="a transformers config: a directory with config.json, a "
                                 ".json file or a bundled name (llama-3-8b, mistral-7b); or "
                                 "pkg.module:factory returning a causal LM")
    _chip_args(p)
    p.add_argument("--dtype", default=None,
                   help="the weights' and cache's dtype (default: the config's torch_dtype, "
                        "else bfloat16)")
    if tp:
        p.add_argument("--tp", type=_positive_int, default=1, metavar="N",
                       help="tensor parallelism: the model sharded N ways by its own plan "
                            "(transformers' base_model_tp_plan); counts and bounds are one "
                            "rank's, with its all-reduces over the chip's link (default 1)")
    p.add_argument("--weights", choices=("fp8",), default=None,
                   help="fp8: the linear layers as an FP8 engine runs them (e4m3 weights with a "
                        "scale per row, activations quantized per token, the product on FP8 "
                        "tensor cores; the LM head kept)")
    p.add_argument("--kv-dtype", choices=("fp8", "quantized-fp8"), default=None,
                   help="fp8: the cache stores e4m3 rows (vLLM's --kv-cache-dtype fp8); "
                        "quantized-fp8: transformers' QuantizedCache(backend='fp8'), e4m3 "
                        "rows with a per-tensor scale, dequantized whole each step")
    p.add_argument("--json", metavar="PATH", help="write the JSON (- for stdout)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    p.add_argument("--price", default=None, metavar="[ARCH=]USD",
                   help="USD per chip-hour (ARCH=USD,... per chip; a bare number for every "
                        "chip): the cost of a step, of a million output tokens (default: the "
                        "chip's [cost] price_per_hour, where it has one)")


def cmd_sweep(a) -> int:
    from .sweep.run import cmd_sweep as run
    return run(a)


# exit codes (documented in the README)
EXIT_OK, EXIT_VALIDATION_FAILED, EXIT_BAD_INPUT, EXIT_UNCOUNTED, EXIT_INTERNAL = 0, 1, 2, 3, 70
EXIT_REGRESSED = 4       # solbound diff --fail-above: a bound slowed by more than allowed


#: loggers of libraries a program imports that warn about their own build or API at import
#: time (torchao's kernels built for another Python, torch's pytree deprecations when
#: torchao registers its enums): nothing about the user's program, printed before the answer
IMPORT_TIME_LOGGERS = ("torchao", "torch.utils._pytree")


def _quiet_import_warnings() -> None:
    import logging
    for name in IMPORT_TIME_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    # a JAX shard_map program is validated on a mesh of CPU devices: ask XLA for eight
    # host devices before JAX starts (no effect once it has, nor on accelerators)
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   " --xla_force_host_platform_device_count=8").strip()
    args = build_parser().parse_args(argv)
    _quiet_import_warnings()
    if getattr(args, "optimizer", None) and not getattr(args, "train", False):
        return _err("--optimizer chooses the training step's optimizer: add --train")
    from .frontends.torch.capture import FrontendError
    from .hardware.catalog import UnknownArch
    from .bounds.roofline import PolicyError
    from .ir.text import IRSyntaxError
    from .bounds.fidelity import CacheOptionError
    from .hardware.catalog import SpecError
    from .bounds.comm import CommError
    from .frontends.torch.distributed import WorldError
    from .analysis.counts import CountError
    from .serving.step import StepError
    try:
        return args.fn(args)
    except _Usage as e:
        return _err(str(e))
    except (FrontendError, UnknownArch, PolicyError, IRSyntaxError, CacheOptionError,
            SpecError, CommError, WorldError, CountError, StepError) as e:
        return _err(str(e))
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - no input ever ends in a traceback
        if args.debug:
            raise
        import traceback
        tb = traceback.extract_tb(e.__traceback__)
        where = f"{os.path.basename(tb[-1].filename)}:{tb[-1].lineno}" if tb else "?"
        msg = str(e).strip().splitlines()
        print(f"solbound: internal error (a bug in solbound, please report it): "
              f"{type(e).__name__}: {msg[0] if msg else ''} at {where}; --debug shows the "
              f"traceback", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
