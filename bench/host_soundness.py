"""No fused bound on the calibrated host may be above a measured time: KernelBench L1-L2
on this machine, at sizes that fit.

    solbound calibrate
    python bench/host_soundness.py /path/to/KernelBench/KernelBench [--levels 1 2] [--out F.csv]

Each problem is shrunk (its size constants scaled down, ``Problem.shrink``) until its inputs
and parameters take at most ``--max-mib`` (64 MiB by default), analyzed on ``--arch host``
and timed eager (``frontends/torch/timing.py``: warm-up, trials with a cache flush before
each, the median). It prints bound/measured per problem; a ratio above 1 is a bug in a count,
in calibrate or in the model, and must be explained.
"""

from __future__ import annotations

import argparse
import csv
import os
import time
import warnings


def _size(problem) -> int:
    model, inputs = problem.build("meta")
    n = sum(p.numel() * p.element_size() for p in model.parameters())
    return n + sum(x.numel() * x.element_size() for x in inputs if hasattr(x, "numel"))


def main() -> None:
    warnings.filterwarnings("ignore")
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--max-mib", type=float, default=64)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--out", default="host_soundness.csv")
    a = ap.parse_args()
    import solbound
    from solbound.frontends.torch.capture import load_problem
    from solbound.kernelbench import list_problems
    from solbound.frontends.torch.timing import measure_problem
    from solbound.hardware.catalog import load_spec
    spec = load_spec("host")
    rows = []
    t_start = time.perf_counter()
    for lv, _num, path in list_problems(a.root, a.levels):
        name = os.path.basename(path)
        row = {"level": lv, "name": name}
        try:
            prob = load_problem(path)
            shrunk = ""
            if _size(prob) > a.max_mib * 2**20:
                for desc, small in prob.shrink():
                    if _size(small) <= a.max_mib * 2**20:
                        prob, shrunk = small, desc
                        break
                else:
                    raise RuntimeError("no instance small enough")
            rep = solbound.analyze(*prob.build_for_capture()[:2], arch=[spec], source=path)
            if rep.unsupported:
                raise RuntimeError("unsupported operators")
            bound = rep.bound("host", "fused").seconds
            meas = measure_problem(prob, ("eager",), trials=a.trials, warmup=1)["eager"]
            row.update(status="ok", shrunk=shrunk, bound_s=bound, measured_s=meas["median"],
                       ratio=bound / meas["median"])
        except Exception as e:  # noqa: BLE001 - one line per problem
            msg = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
            row.update(status="skipped", error=msg)
        rows.append(row)
        r = row.get("ratio")
        print(f"L{lv} {name}: " + (f"bound/measured {r:.3f}" if r else row.get("error", "")),
              flush=True)
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["level", "name", "status", "shrunk", "bound_s",
                                          "measured_s", "ratio", "error"])
        w.writeheader()
        w.writerows(rows)
    ok = sorted((r for r in rows if r.get("ratio")), key=lambda r: r["ratio"])
    above = [r for r in ok if r["ratio"] > 1]
    print(f"\n{len(ok)} problems timed in {time.perf_counter() - t_start:.0f} s; bound/measured "
          f"median {ok[len(ok) // 2]['ratio']:.3f}, max {ok[-1]['ratio']:.3f}; above 1: "
          f"{len(above)}")
    for r in above:
        print(f"  above 1: L{r['level']} {r['name']} {r['ratio']:.3f}")


if __name__ == "__main__":
    main()
