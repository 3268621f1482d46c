"""solbound's cache-aware traffic next to AccelForge's on the same three workloads.

    /tmp/af/bin/python bench/accelforge_curves.py      # AccelForge (Python 3.12 venv), ~100 s
    python bench/accelforge_compare.py [bench/data/accelforge_curves.json]

The AccelForge side is computed by ``bench/accelforge_curves.py`` (its FFM mapper, one
on-chip buffer of S bytes between DRAM and compute; the stored result of a run on
2026-12-01 is ``bench/data/accelforge_curves.json``). This side builds the same workloads
as IR text and runs ``analysis/cache.py``: fp32, (1) a 1024^3 matmul, (2) a 3x3
convolution of 64 to 64 channels on a 58x58 input (valid, stride 1), (3) the chain
``T = A B`` (1024x64 by 64x1024), ``O = T D`` (by 1024x64), ``T`` an intermediate.
"""

from __future__ import annotations

import json
import os
import sys

from solbound.analysis.cache import ProgramCache
from solbound.analysis.counts import count_program
from solbound.graph.einsum import build_graph
from solbound.ir.text import parse_program

WORKLOADS = {
    "matmul": '''# solbound IR v1
a = input(f32[1024, 1024])
b = input(f32[1024, 1024])
c = output(f32[1024, 1024])

@kernel(m=1024, n=1024, k=1024)
@origin(op="mm", unit="matmul")
def k1():
    c[m, n] = sum(a[m, k] * b[k, n])
''',
    "conv": '''# solbound IR v1
x = input(f32[1, 64, 58, 58])
w = input(f32[64, 64, 3, 3])
o = output(f32[1, 64, 56, 56])

@kernel(n=1, k=64, p=56, q=56, c=64, r=3, s=3)
@origin(op="conv", unit="conv")
def k1():
    o[n, k, p, q] = sum(x[n, c, p + r, q + s] * w[k, c, r, s])
''',
    "chain": '''# solbound IR v1
a = input(f32[1024, 64])
b = input(f32[64, 1024])
d = input(f32[1024, 64])
t = intermediate(f32[1024, 1024])
o = output(f32[1024, 64])

@kernel(m=1024, j=1024, x=64)
@origin(op="ab", unit="matmul")
def k1():
    t[m, j] = sum(a[m, x] * b[x, j])

@kernel(m=1024, e=64, j=1024)
@origin(op="td", unit="matmul")
def k2():
    o[m, e] = sum(t[m, j] * d[j, e])
''',
}


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "data", "accelforge_curves.json")
    af = json.load(open(path))
    print(f"AccelForge {af['accelforge_version']} against solbound's cache-aware model "
          f"(DRAM bytes; ratio = solbound / AccelForge)\n")
    for name, text in WORKLOADS.items():
        g = build_graph(parse_program(text))
        pc = ProgramCache(g, count_program(g))
        ref = af["workloads"][name]
        print(f"### {name}\n")
        print("| capacity | AccelForge | solbound | ratio |")
        print("|---|---|---|---|")
        for cap, theirs in zip(ref["capacities"], ref["dram_bytes"]):
            ours = pc.traffic(cap).bytes
            ratio = f"{ours / theirs:.3f}" if theirs else "-"
            print(f"| {cap // 1024} KiB | {theirs:,} | {ours:,} | {ratio} |")
        print()


if __name__ == "__main__":
    main()
