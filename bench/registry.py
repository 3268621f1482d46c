"""Every architecture transformers registers, as a user calls it: built small from its own
config class (``solbound.zoo``: one generic shrinker), random weights, the default call;
analyzed with nothing unsupported, then validated against the library's forward.

    python bench/registry.py                          # causal-LM registry, 2 workers
    python bench/registry.py --task masked-lm --task vision
    python bench/registry.py --task audio --task ctc --task detection --task segmentation --task video
    python bench/registry.py --only llama,mamba --jsonl out.jsonl
    python bench/registry.py --markdown              # the coverage table for docs/zoo.md

Each architecture runs in a subprocess of its own (a time limit, no state shared), prints
one JSON line, and the summary counts tried / analyzed (nothing unsupported) / validated,
with every failure named by its stage and one-line cause.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
# solbound.zoo.TASKS' keys (not imported here: the parent process stays light)
TASK_NAMES = ("causal-lm", "masked-lm", "seq2seq", "vision", "audio", "ctc", "detection",
              "segmentation", "video")


def one(task: str, model_type: str, validate: bool = True) -> dict:
    """Build, analyze and validate one architecture (in this process)."""
    import warnings
    warnings.simplefilter("ignore")
    import solbound
    from solbound import zoo
    from solbound.frontends.loading import oneline
    rec: dict = {"task": task, "model_type": model_type, "arch": "", "stage": "build"}
    t0 = time.perf_counter()
    try:
        b = zoo.build(model_type, task)
    except Exception as e:  # noqa: BLE001
        rec.update(status="error", error=oneline(e), upstream=getattr(e, "default_broken", False))
        return rec
    rec["arch"] = b.arch
    rec["stage"] = "analyze"
    try:
        rep = solbound.analyze(b.model, b.inputs, source=b.arch, arch="h100-sxm")
    except Exception as e:  # noqa: BLE001
        rec.update(status="error", error=oneline(e), seconds=time.perf_counter() - t0)
        # is it the model's own default call that fails (in eager PyTorch too)?
        import torch
        try:
            with torch.no_grad():
                b.model(*b.inputs)
        except Exception as e2:  # noqa: BLE001
            rec.update(stage="eager", error=f"the shrunk model's default call fails in eager PyTorch too: "
                                            f"{oneline(e2)}")
            # ... and so does transformers' own default config at full size (on the meta
            # device: no memory), the same way? Then no shrinking can make it run
            try:
                dcfg = zoo.user_default(b.default, task)
                with torch.device("meta"):
                    full = type(b.model)(dcfg).eval()
                # the inputs the full-size model takes (an image as wide as its config's)
                args = tuple(None if x is None else torch.zeros(x.shape, dtype=x.dtype, device="meta")
                             for x in zoo._inputs(task, dcfg, full))
                with torch.no_grad():
                    full(*args)
            except Exception as e3:  # noqa: BLE001
                if type(e3) is type(e2) and str(e3).split("\n")[0] == str(e2).split("\n")[0]:
                    rec.update(stage="upstream", upstream=True,
                               error=f"transformers' own default config, full size, fails the "
                                     f"same way: {oneline(e2)}")
        return rec
    rec.update(macs=rep.counts.macs, flops=sum(rep.counts.flops.values()),
               fused_bytes=rep.counts.fused.bytes, kernels=len(rep.program.kernels),
               unsupported=sorted({u.operator for u in rep.unsupported}),
               notes=[n for n in rep.to_dict()["notes"] if "dense" in n or "mask" in n][:4],
               outputs=[o["path"] for o in rep.to_dict()["outputs"]],
               analyze_seconds=time.perf_counter() - t0)
    rec["status"] = "unsupported" if rec["unsupported"] else "analyzed"
    if validate and not rec["unsupported"]:
        rec["stage"] = "validate"
        try:
            from solbound.frontends.torch.reference import validate_report
            v = validate_report(rep, b.model, b.inputs)
        except Exception as e:  # noqa: BLE001
            v = {"status": "error", "reason": f"internal: {oneline(e)}"}
        rec["validation"] = v.get("status")
        rec["validation_reason"] = v.get("reason") or ""
        if v.get("status") == "failed":
            rec["validation_reason"] = v.get("summary", "")[:300]
    rec["seconds"] = time.perf_counter() - t0
    return rec


def run_all(tasks, only=None, jobs=2, timeout=300, validate=True, jsonl=None):
    from solbound import zoo
    todo = [(t, mt) for t in tasks for mt, _ in zoo.registry(t)
            if not only or mt in only]
    out = open(jsonl, "a") if jsonl else None
    done: list[dict] = []

    def run(item):
        task, mt = item
        cmd = [sys.executable, os.path.abspath(__file__), "--one", task, mt]
        if not validate:
            cmd.append("--no-validate")
        t0 = time.perf_counter()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            line = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
            if line:
                return json.loads(line[-1])
            err = (p.stderr.strip().splitlines() or ["no output"])[-1]
            return {"task": task, "model_type": mt, "status": "error", "stage": "crash",
                    "error": f"the worker died (rc {p.returncode}): {err[:200]}"}
        except subprocess.TimeoutExpired:
            return {"task": task, "model_type": mt, "status": "error", "stage": "timeout",
                    "error": f"over {timeout} s", "seconds": time.perf_counter() - t0}

    with ThreadPoolExecutor(jobs) as pool:
        for i, rec in enumerate(pool.map(run, todo)):
            done.append(rec)
            if out:
                out.write(json.dumps(rec) + "\n")
                out.flush()
            print(f"[{i + 1}/{len(todo)}] {rec['task']} {rec['model_type']}: {rec['status']}"
                  f" {rec.get('validation', '')} {rec.get('error', '') or rec.get('validation_reason', '')[:120]}",
                  file=sys.stderr, flush=True)
    return done


def summary(recs: list[dict]) -> str:
    lines = []
    for task in sorted({r["task"] for r in recs}):
        rs = [r for r in recs if r["task"] == task]
        analyzed = [r for r in rs if r["status"] == "analyzed"]
        validated = [r for r in analyzed if r.get("validation") == "passed"]
        lines.append(f"| {task} | {len(rs)} | {len(analyzed)} ({100 * len(analyzed) / len(rs):.0f}%) "
                     f"| {len(validated)} ({100 * len(validated) / len(rs):.0f}%) |")
    head = "| task | tried | analyzed, nothing unsupported | validated |\n|---|---|---|---|\n"
    upstream = []
    for task in sorted({r["task"] for r in recs}):
        n = sum(1 for r in recs if r["task"] == task and r.get("upstream"))
        if n:
            upstream.append(f"{task}: {n} of {sum(r['task'] == task for r in recs)} fail in "
                            f"transformers' own default config (it does not build, or its default "
                            f"call fails at full size)")
    return head + "\n".join(lines) + ("\n\n" + "\n".join(upstream) if upstream else "")


def failures(recs: list[dict]) -> str:
    rows = ["| task | model type | stage | cause |", "|---|---|---|---|"]
    for r in sorted(recs, key=lambda r: (r["task"], r["model_type"])):
        if r["status"] == "analyzed" and r.get("validation") in ("passed", None):
            continue
        if r["status"] == "error":
            cause = r.get("error", "")
        elif r["status"] == "unsupported":
            cause = "unsupported: " + ", ".join(r["unsupported"])
        else:
            cause = f"validation {r.get('validation')}: {r.get('validation_reason', '')}"
        cause = cause.replace("|", "/").replace("\n", " ")[:240]
        rows.append(f"| {r['task']} | {r['model_type']} | {r.get('stage', '')} | {cause} |")
    return "\n".join(rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", action="append", choices=sorted(TASK_NAMES))
    ap.add_argument("--only", help="comma-separated model types")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--no-validate", action="store_true")
    ap.add_argument("--jsonl", help="append one JSON line per architecture here")
    ap.add_argument("--from-jsonl", help="summarize an earlier run instead of running")
    ap.add_argument("--markdown", action="store_true", help="print the coverage and failure tables")
    ap.add_argument("--one", nargs=2, metavar=("TASK", "MODEL_TYPE"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(one(a.one[0], a.one[1], not a.no_validate)), flush=True)
        return 0
    if a.from_jsonl:
        recs = [json.loads(ln) for ln in open(a.from_jsonl) if ln.strip()]
    else:
        t0 = time.perf_counter()
        recs = run_all(a.task or ["causal-lm"], set(a.only.split(",")) if a.only else None,
                       a.jobs, a.timeout, not a.no_validate, a.jsonl)
        print(f"{len(recs)} architectures in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    print(summary(recs))
    if a.markdown:
        print()
        print(failures(recs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
