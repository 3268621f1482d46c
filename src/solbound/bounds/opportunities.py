"""Where the algorithm wastes work: contraction chains in a costly order, and fp32
contractions that could run on tensor cores.

**Reorder.** A chain is a run of contractions where each one's result feeds only the next
contraction, directly or through scalar scalings (a map multiplying by a constant) and views
(the IR's accesses already see through transposes and reshapes of whole coordinates). The
chain is one einsum over the chain's external operands. Its MACs in the program's order are
compared with opt_einsum's optimal path: ``q . (c W)^T`` done as ``(q W^T) . c^T`` in DeepSeek's
MLA. A pairwise contraction over index sets ``I`` and ``J`` costs ``prod(extents of I | J)``
MACs.

**Precision.** The fused bound if every fp32 contraction ran on TF32 tensor cores, or
on bf16 tensor cores (the operands rounded to bf16).

>>> pairwise_macs("ij,jk,kl->il", {"i": 8, "j": 64, "k": 64, "l": 8}, [(0, 1), (0, 1)])
36864
>>> pairwise_macs("ij,jk,kl->il", {"i": 8, "j": 64, "k": 64, "l": 8}, [(1, 2), (0, 1)])
36864
"""

from __future__ import annotations

import math

from ..ir.classify import product_factors
from ..ir.model import Access, Call, Const

LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def pairwise_macs(eq: str, ext: dict[str, int], path: list[tuple[int, ...]]) -> int:
    """MACs of contracting ``eq``'s operands pairwise along ``path`` (opt_einsum's format:
    positions in the current operand list; the result goes to the end)."""
    ins, out = eq.split("->")
    ops = ins.split(",")
    total = 0
    for step in path:
        step = sorted(step, reverse=True)
        picked = [ops.pop(i) for i in step]
        union = set("".join(picked))
        total += math.prod(ext[c] for c in union)
        rest = set("".join(ops)) | set(out)
        ops.append("".join(sorted(c for c in union if c in rest)))
    return total


def steps(eq: str, path: list[tuple[int, ...]]) -> list[str]:
    """The pairwise einsums of contracting ``eq`` along ``path``.

    >>> steps("ab,bc,cd->ad", [(1, 2), (0, 1)])
    ['bc,cd->bd', 'ab,bd->ad']
    """
    ins, out = eq.split("->")
    ops = ins.split(",")
    res = []
    for step in path:
        picked = [ops[i] for i in sorted(step)]
        for i in sorted(step, reverse=True):
            ops.pop(i)
        rest = set("".join(ops)) | set(out)
        seen = dict.fromkeys("".join(picked))
        r = "".join(c for c in seen if c in rest) if ops else out
        res.append(",".join(picked) + "->" + r)
        ops.append(r)
    return res


def program_path(n_operands: int) -> list[tuple[int, int]]:
    """The program's order of a chain einsum (operands listed as the chain reads them): the
    first two, then the running result with each next operand."""
    path, m = [(0, 1)], n_operands - 1
    for _ in range(n_operands - 2):
        path.append((0, m - 1))
        m -= 1
    return path


def _factors(k):
    """The two tensors of a contraction kernel's ``sum(a * b)`` (casts stripped), or None."""
    facts = product_factors(k)
    if facts is None or not all(isinstance(a, Access) for a in facts):
        return None
    return list(facts)


def _scale_source(g, i: int):
    """If kernel ``i`` is ``out = c * t`` (or ``t * c``, ``t / c``) over the whole of ``t``
    with identity indices: the tensor ``t``."""
    k = g.nodes[i].kernel
    if k.reduce is not None or k.lib or k.scatter:
        return None
    b = k.body
    if isinstance(b, Call) and b.op in ("mul", "div") and len(b.args) == 2:
        a, c = b.args
        if b.op == "mul" and isinstance(a, Const):
            a, c = c, a
        if isinstance(a, Access) and isinstance(c, Const) and a.index == k.out_index:
            return a.tensor
    return None


def reorder_opportunities(report, min_saving: float = 1.0) -> list[dict]:
    """Contraction chains whose optimal order needs fewer MACs than the program's."""
    import opt_einsum
    g = report.graph
    tensors = g.program.tensor_map
    nodes = g.nodes
    producer = {}
    for i, n in enumerate(nodes):
        for o in n.kernel.outputs:
            producer[o] = i

    def only_consumer(t):
        cs = g.consumers.get(t, [])
        return cs[0] if len(cs) == 1 and tensors[t].role == "intermediate" else None

    def next_contraction(i):
        """The contraction that alone consumes kernel i's result (through scalings)."""
        t = nodes[i].kernel.out
        c = only_consumer(t)
        while c is not None and _factors(nodes[c].kernel) is None:
            src = _scale_source(g, c)
            if src != t:
                return None, None
            t = nodes[c].kernel.out
            c = only_consumer(t)
        return c, t
    out, used = [], set()
    for start, n in enumerate(nodes):
        if start in used or _factors(n.kernel) is None or n.kernel.reduce != "sum":
            continue
        chain, links = [start], []
        while True:
            c, t = next_contraction(chain[-1])
            if c is None or _factors(nodes[c].kernel) is None or nodes[c].kernel.reduce != "sum":
                break
            chain.append(c)
            links.append(t)
        if len(chain) < 2:
            continue
        res = _chain_einsum(g, chain, links)
        if res is None:
            continue
        eq, shapes, ext = res
        before = sum(math.prod(e for _, e in nodes[i].kernel.dims) for i in chain)
        path, _ = opt_einsum.contract_path(eq, *shapes, shapes=True, optimize="optimal")
        mine = program_path(len(shapes))
        after = pairwise_macs(eq, ext, path)
        if after * min_saving < before and after < before:
            used.update(chain)
            out.append({"kind": "reorder", "kernels": [nodes[i].kernel.name for i in chain],
                        "sources": sorted({nodes[i].kernel.src for i in chain if nodes[i].kernel.src}),
                        "einsum": eq, "macs_before": before, "macs_after": after,
                        "saving": before / after,
                        "einsum_before": steps(eq, mine), "einsum_after": steps(eq, path),
                        "order_after": [list(p) for p in path]})
    return out


def _chain_einsum(g, chain: list[int], links: list[str]):
    """The chain as one einsum over its external operands (None if an index is not a
    single loop variable per coordinate)."""
    letters: dict[tuple[int, str], str] = {}
    ext: dict[str, int] = {}
    pool = iter(LETTERS)

    def letter(i, v):
        key = (i, v)
        if key not in letters:
            letters[key] = next(pool)
            ext[letters[key]] = dict(g.nodes[i].kernel.dims)[v]
        return letters[key]
    operands, shapes, result = [], [], ""
    link_of: dict[str, tuple[int, list[str]]] = {}
    for pos, i in enumerate(chain):
        k = g.nodes[i].kernel
        out_vars = []
        for e in k.out_index:
            v = e.single_var() if not isinstance(e, Access) else None
            if v is None:
                return None
            out_vars.append(v)
        facts = _factors(k)
        if pos > 0:                      # the link first: its letters are the producer's
            facts = sorted(facts, key=lambda a: a.tensor != links[pos - 1])
        for a in facts:
            idx = []
            for e in a.index:
                v = e.single_var() if not isinstance(e, Access) else None
                if v is None:
                    return None
                idx.append(v)
            if pos > 0 and a.tensor == links[pos - 1]:
                prev, prev_letters = link_of[links[pos - 1]]
                for v, L in zip(idx, prev_letters):
                    if (i, v) in letters and letters[(i, v)] != L:
                        return None
                    letters[(i, v)] = L
                continue
            operands.append("".join(letter(i, v) for v in idx))
            shapes.append(tuple(dict(k.dims)[v] for v in idx))
        out_letters = [letter(i, v) for v in out_vars]
        if pos < len(links):
            link_of[links[pos]] = (i, out_letters)
        else:
            result = "".join(out_letters)
    return ",".join(operands) + "->" + result, shapes, ext


def with_reorder(report, opp: dict) -> dict[str, float]:
    """Per chip: the fused bound with the chain contracted in the optimal order (its
    kernels' work scaled by ``macs_after / macs_before``; traffic unchanged)."""
    from .roofline import _compute, kernel_pipe_work
    names = set(opp["kernels"])
    scale = opp["macs_after"] / opp["macs_before"]
    out = {}
    for spec in report.specs:
        work: dict[str, float] = {}
        for k in report.counts.kernels:
            f = scale if k.name in names else 1.0
            for p, n in kernel_pipe_work(k, report.policy).items():
                work[p] = work.get(p, 0.0) + n * f
        t_c = _compute(work, spec, [])[0]
        fused = report.bound(spec.id, "fused")
        out[spec.id] = max(t_c, fused.memory_seconds)
    return out


def opportunities(report) -> list[dict]:
    """Every opportunity the report has: reorders (with each chip's fused bound after) and
    precision."""
    out = []
    for o in reorder_opportunities(report):
        o["fused_seconds_after"] = with_reorder(report, o)
        out.append(o)
    return out + precision_opportunities(report)


def precision_opportunities(report) -> list[dict]:
    """Per chip: the fused bound with every fp32 contraction on TF32, or on bf16, tensor
    cores, where that differs from the bound under the report's policy."""
    from .roofline import CLASSES, Policy, program_bounds
    if not any(k.flops.get("matrix") and k.dtype == "f32" for k in report.counts.kernels):
        return []
    out = []
    for spec in report.specs:
        now = report.bound(spec.id, "fused").seconds
        for target in ("tf32", "bf16"):
            pol = Policy({c: target for c in CLASSES})
            b = next(b for b in program_bounds(report.counts, spec, pol) if b.mode == "fused")
            if b.seconds < now * (1 - 1e-9):
                out.append({"kind": "precision", "arch": spec.id, "fp32_contractions_on": target,
                            "seconds_before": now, "seconds_after": b.seconds,
                            "saving": now / b.seconds})
    return out


__all__ = ["opportunities", "reorder_opportunities", "precision_opportunities",
           "pairwise_macs", "with_reorder"]
