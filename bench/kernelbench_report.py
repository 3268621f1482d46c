"""Per-level KernelBench table from a `solbound kernelbench` CSV.

    solbound kernelbench KernelBench/ --timings ../shared/data/kernelbench-timings/H100_Modal \
        --csv out/kb.csv --jobs 2
    python bench/kernelbench_report.py out/kb.csv
"""

import sys

from solbound.kernelbench import read_csv, summary


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python bench/kernelbench_report.py RESULTS.csv")
    rows = read_csv(sys.argv[1])
    print(summary(rows))
    bad = [r for r in rows if r["status"] not in ("ok",)]
    if bad:
        print("\nNot fully analyzed:")
        for r in bad:
            print(f"- L{r['level']} {r['name']}: {r['status']} {r['unsupported']} {r['error']}")
    viol = [r for r in rows if any(0 < float(r[k] or 0) < 1 for k in ("headroom_eager", "headroom_compile"))]
    if viol:
        print("\nFused bound above a measured time (bound or spec error to explain):")
        for r in viol:
            print(f"- L{r['level']} {r['name']}: eager x{float(r['headroom_eager'] or 0):.3g}, "
                  f"compile x{float(r['headroom_compile'] or 0):.3g}, fused bound {r['bound_fused']}")


if __name__ == "__main__":
    main()
