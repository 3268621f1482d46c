"""The sweep engine's own cost: starting a local Ray instance, and the overhead per task
(submission, scheduling on a reused worker, the result's way back) measured on tasks that
do nothing, so that what a sweep or `solbound kernelbench` spends beyond the analyses
themselves is known.

    python bench/sweep_engine.py [--tasks 400] [--jobs 2]
"""

from __future__ import annotations

import argparse
import time


def noop(item):
    return item


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=400)
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    from solbound.sweep.engine import Engine
    t0 = time.perf_counter()
    with Engine(jobs=a.jobs) as eng:
        t1 = time.perf_counter()
        # the first tasks start the workers (Python and solbound's import): timed apart
        list(eng.map(noop, range(a.jobs)))
        t2 = time.perf_counter()
        outs = list(eng.map(noop, range(a.tasks)))
        t3 = time.perf_counter()
    t4 = time.perf_counter()
    assert sorted(o.value for o in outs) == list(range(a.tasks))
    print(f"local Ray instance: start {t1 - t0:.2f} s, shutdown {t4 - t3:.2f} s")
    print(f"first task on each of {a.jobs} workers (worker start): {t2 - t1:.2f} s")
    print(f"{a.tasks} empty tasks on {a.jobs} workers: {t3 - t2:.2f} s, "
          f"{(t3 - t2) / a.tasks * 1e3:.2f} ms per task of wall time")


if __name__ == "__main__":
    main()
