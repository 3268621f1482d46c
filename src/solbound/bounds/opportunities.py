"""Where the algorithm wastes work: contraction chains in a costly order, and fp32
contractions that could run on tensor cores.

**Reorder.** A chain is a run of contractions where each one's result feeds only the next
contraction, directly or through maps that only move or scale its elements: views (a
dimension split or merge, a transpose: the IR's accesses see through them, as split loop
variables, permuted or flattened indices), contiguous copies of views, and scalings by
constants and scalar elements. The chain is one einsum over its external operands,
derived from the kernels' accesses (``_chain_einsum``: loop variables cut into mixed-radix
digits until both sides of every link agree). Its MACs in the program's order are
compared with opt_einsum's optimal path: ``q . (c W)^T`` done as ``(q W^T) . c^T`` in
DeepSeek's MLA, with the heads split between the products. A pairwise contraction over
index sets ``I`` and ``J`` costs ``prod(extents of I | J)`` MACs.

**Precision.** The fused bound if every fp32 contraction ran on TF32 tensor cores, or
on bf16 tensor cores (the operands rounded to bf16).

**Stored width.** The fused bound if the program's own contraction weights were stored as
int8 or int4 (weight-only: scales included, dequantized on chip, the products unchanged):
a decode step that reads its weights once is bound by their bytes.

>>> pairwise_macs("ij,jk,kl->il", {"i": 8, "j": 64, "k": 64, "l": 8}, [(0, 1), (0, 1)])
36864
>>> pairwise_macs("ij,jk,kl->il", {"i": 8, "j": 64, "k": 64, "l": 8}, [(1, 2), (0, 1)])
36864
"""

from __future__ import annotations

import math

from ..ir.affine import Aff
from ..ir.classify import _strip_cast, product_factors
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


def _plain(k) -> bool:
    """A loop nest an einsum describes whole: no guard, no sequential loop, no library
    routine, scatter or scan."""
    return not (k.guard or k.skip or k.loop is not None or k.lib or k.scatter or k.scan is not None)


def _contraction(k):
    """The two factors of a plain ``sum(a * b)`` over direct accesses, or None."""
    if k.reduce != "sum" or not _plain(k):
        return None
    facts = _factors(k)
    if facts is None or any(a.indirect for a in facts):
        return None
    return facts


def _is_scalar(e) -> bool:
    """A constant, or one element of a tensor (no loop variable in its index)."""
    return isinstance(e, Const) and not isinstance(e.value, bool) or (
        isinstance(e, Access) and not e.indirect and all(i.is_const for i in e.index))


def _scaled_read(e):
    """``(access, factor, scalars)`` when ``e`` is one tensor's element times constants and
    scalar elements (``c * t``, ``t / c``, ``-t``, ``t * s[()]``, casts anywhere), else None.
    ``scalars`` are ``{"op": "mul"|"div", "tensor": name, "index": [ints]}``."""
    e = _strip_cast(e)
    if isinstance(e, Access):
        return None if e.indirect or _is_scalar(e) else (e, 1.0, ())
    if not isinstance(e, Call):
        return None
    if e.op == "neg":
        r = _scaled_read(e.args[0])
        return r and (r[0], -r[1], r[2])
    if e.op not in ("mul", "div") or len(e.args) != 2:
        return None
    a, b = (_strip_cast(x) for x in e.args)
    if e.op == "mul" and _is_scalar(a) and not _is_scalar(b):
        a, b = b, a
    r = _scaled_read(a) if _is_scalar(b) else None
    if r is None:
        return None
    acc, f, by = r
    if isinstance(b, Access):
        return acc, f, by + ({"op": e.op, "tensor": b.tensor,
                              "index": [i.const for i in b.index]},)
    v = float(b.value)
    if e.op == "div":
        return (acc, f / v, by) if v != 0 else None
    return acc, f * v, by


def _move(k):
    """``(source access, factor, scalars)`` of a plain map that copies one tensor's
    elements, possibly scaled (a contiguous copy of a view, a softmax scale), else None."""
    if k.reduce is not None or not _plain(k):
        return None
    return _scaled_read(k.body)


def reorder_opportunities(report, min_saving: float = 1.0) -> list[dict]:
    """Contraction chains whose optimal order needs fewer MACs than the program's.

    Each entry: the contractions (``kernels``), the maps the chain passes through
    (``through``: copies and scalings), the einsum over the external operands with the
    strided view each one is (``operands``: tensor, letters, shape, strides and offset in
    elements; ``result`` the same for the last contraction's output), the constant factor
    and scalar elements the chain multiplies or divides by (``scale``, ``scale_by``: the
    chain's result is the einsum times both), and the MACs in the program's order and in
    opt_einsum's optimal one."""
    import opt_einsum
    g = report.graph
    tensors = g.program.tensor_map
    nodes = g.nodes

    def next_link(i):
        """The contraction that alone consumes kernel i's result, through copies and
        scalings: (node, the maps passed, their factor, their scalars), or None."""
        t, through, scale, by = nodes[i].kernel.out, [], 1.0, ()
        while True:
            cs = g.consumers.get(t, [])
            if tensors[t].role != "intermediate" or len(g.producers.get(t, [])) != 1 \
                    or len(cs) != 1:
                return None
            k = nodes[cs[0]].kernel
            facts = _contraction(k)
            if facts is not None:
                return (cs[0], through, scale, by) if [a.tensor for a in facts].count(t) == 1 \
                    else None
            m = _move(k)
            if m is None or m[0].tensor != t or any(x["tensor"] == t for x in m[2]):
                return None
            through, scale, by, t = through + [cs[0]], scale * m[1], by + m[2], k.out
    out, used = [], set()
    for start, n in enumerate(nodes):
        if start in used or _contraction(n.kernel) is None:
            continue
        links = [([start], 1.0, ())]          # per contraction: the maps before it and it
        while True:
            nxt = next_link(links[-1][0][-1])
            if nxt is None:
                break
            c, through, scale, by = nxt
            links.append((through + [c], scale, by))
        res = None
        while len(links) >= 2:                # the longest prefix that is one einsum
            res = _chain_einsum(g, [i for ms, _, _ in links for i in ms])
            if res is not None:
                break
            links.pop()
        if res is None:
            continue
        chain = [ms[-1] for ms, _, _ in links]
        through = [i for ms, _, _ in links for i in ms[:-1]]
        eq, shapes, ext, views, result = res
        before = sum(math.prod(e for _, e in nodes[i].kernel.dims) for i in chain)
        # opt_einsum's exhaustive search up to 8 operands, its dynamic programme beyond
        path, _ = opt_einsum.contract_path(eq, *shapes, shapes=True,
                                           optimize="optimal" if len(shapes) <= 8 else "dp")
        mine = program_path(len(shapes))
        after = pairwise_macs(eq, ext, path)
        if after * min_saving < before and after < before:
            used.update(chain)
            out.append({"kind": "reorder", "kernels": [nodes[i].kernel.name for i in chain],
                        "through": [nodes[i].kernel.name for i in through],
                        "sources": sorted({nodes[i].kernel.src for i in chain if nodes[i].kernel.src}),
                        "einsum": eq, "operands": views, "result": result,
                        "scale": math.prod(s for _, s, _ in links),
                        "scale_by": [x for _, _, by in links for x in by],
                        "macs_before": before, "macs_after": after,
                        "saving": before / after,
                        "einsum_before": steps(eq, mine), "einsum_after": steps(eq, path),
                        "order_after": [list(p) for p in path]})
    return out


def _places(const: int, digits, size: int):
    """The place values of a coordinate's digits and the dimension's size, if the digits
    are one mixed-radix number covering exactly ``0 .. size-1`` (else None)."""
    if const != 0:
        return None
    at, places = 1, []
    for c, e, _ in sorted(digits):
        if c != at:
            return None
        places.append(c)
        at *= e
    return places + [size] if at == size else None


def _chain_einsum(g, members: list[int]):
    """The chain as one einsum over its external operands, or None where its accesses do
    not make one exactly.

    ``members``: the chain's kernels in order (contractions, and the copies and scalings
    between them), each after the first reading the one before's output (its *link*).
    Every loop variable is cut into mixed-radix digits (``v = vh*F + vl``) until, in every
    coordinate of every link, the writer's digits and the reader's are one mixed-radix
    number covering the dimension at the same place values: digits with the same place
    value are then one einsum index. A view that splits or merges dimensions (attention's
    head split, a flatten) becomes digits, a transpose permutes them, a flattened base is
    one coordinate of many digits. A link must be written whole by a bijective index and
    read whole; an external operand is the strided view of its tensor that its access
    reads, whatever the affine index. Returns the equation, the operands' shapes, the
    letters' extents, the operands' views and the result's view."""
    ks = [g.nodes[i].kernel for i in members]
    tensors = g.program.tensor_map
    cuts = {(p, v): [1, e] for p, k in enumerate(ks) for v, e in k.dims}
    links, externals = [], []
    for p, k in enumerate(ks):
        facts = _contraction(k)
        reads = facts if facts is not None else [_move(k)[0]]
        for a in reads:
            if p > 0 and a.tensor == ks[p - 1].out:
                links.append((p - 1, p, a.index, tensors[a.tensor].shape))
            else:
                externals.append((p, a))

    def digits(p, e):
        """(constant, [(place value, extent, digit)]) of coordinate ``e`` of kernel p."""
        ds = []
        for v, c in e.terms:
            cs = cuts[(p, v)]
            ds += [(c * lo, hi // lo, (p, v, lo)) for lo, hi in zip(cs, cs[1:]) if hi > lo]
        return e.const, ds

    def pairs():
        for w, r, index, shape in links:
            for ew, er, size in zip(ks[w].out_index, index, shape):
                yield (w, ew), (r, er), size
    changed = True
    while changed:                        # cut digits until both sides of a link agree
        changed = False
        for (w, ew), (r, er), size in pairs():
            dw, dr = digits(w, ew), digits(r, er)
            pw, pr = _places(*dw, size), _places(*dr, size)
            if pw is None or pr is None:
                return None
            bounds = sorted(set(pw) | set(pr))
            if any(b % a for a, b in zip(bounds, bounds[1:])):
                return None
            for c, e, (p, v, lo) in dw[1] + dr[1]:
                for b in bounds:
                    if c < b < c * e and lo * b // c not in cuts[(p, v)]:
                        cuts[(p, v)] = sorted(cuts[(p, v)] + [lo * b // c])
                        changed = True
    parent: dict = {}

    def find(x):
        while parent.get(x, x) != x:
            x = parent[x]
        return x
    for (w, ew), (r, er), _ in pairs():
        for a, b in zip(sorted(digits(w, ew)[1]), sorted(digits(r, er)[1])):
            parent[find(a[2])] = find(b[2])
    for w, _, _, _ in links:              # a link is written whole, each element once
        k = ks[w]
        keys = [d[2] for e in k.out_index for d in digits(w, e)[1]]
        free = {d[2] for v, _ in k.dims if v in k.out_vars
                for d in digits(w, Aff.var(v))[1]}
        if len(keys) != len(set(keys)) or set(keys) != free \
                or (k.reduce is None and free != {d[2] for v, _ in k.dims
                                                  for d in digits(w, Aff.var(v))[1]}):
            return None
    letter: dict = {}
    ext: dict[str, int] = {}

    def view(p, tensor, index):
        """Letters, shape, strides and offset (elements) of the view ``tensor[index]``."""
        shape = tensors[tensor].shape
        rs = [math.prod(shape[j + 1:]) for j in range(len(shape))]
        order, stride, off = [], {}, 0
        for e, s in zip(index, rs):
            const, ds = digits(p, e)
            off += const * s
            for c, n, key in sorted(ds, reverse=True):
                root = find(key)
                if root not in letter:
                    if len(letter) == len(LETTERS):
                        raise _TooMany
                    letter[root] = LETTERS[len(letter)]
                    ext[letter[root]] = n
                L = letter[root]
                if L not in stride:
                    order.append(L)
                    stride[L] = 0
                stride[L] += c * s
        return {"tensor": tensor, "letters": "".join(order),
                "shape": [ext[L] for L in order], "strides": [stride[L] for L in order],
                "offset": off}
    try:
        views = [view(p, a.tensor, a.index) for p, a in externals]
        last = ks[-1]
        result = view(len(ks) - 1, last.out, last.out_index)
    except _TooMany:
        return None
    out_keys = [d[2] for e in last.out_index for d in digits(len(ks) - 1, e)[1]]
    if len(set(result["letters"])) != len(out_keys):
        return None                        # the result is not a view of distinct elements
    every = {find(d[2]) for p, k in enumerate(ks) for v, _ in k.dims
             for d in digits(p, Aff.var(v))[1]}
    if every - set(letter):
        return None                        # an index no operand carries (a broadcast summed)
    eq = ",".join(v["letters"] for v in views) + "->" + result["letters"]
    return eq, [tuple(v["shape"]) for v in views], ext, views, result


class _TooMany(Exception):
    """More einsum indices than letters."""


def with_reorder(report, opp: dict) -> dict[str, float]:
    """Per chip: the fused bound with the chain contracted in the optimal order (its
    kernels' work scaled by ``macs_after / macs_before``; traffic unchanged)."""
    from .roofline import _compute, work_of
    names = set(opp["kernels"])
    scale = opp["macs_after"] / opp["macs_before"]
    out = {}
    for spec in report.specs:
        work, special = work_of(report.counts.kernels, report.policy,
                                {n: scale for n in names})
        t_c = _compute(work, spec, [], special)[0]
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
    return out + precision_opportunities(report) + stored_width_opportunities(report)


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


# weight-only schemes: bytes per weight element, and the bytes of the scales a weight of
# shape (rows, cols) carries (int8: one fp32 scale per output row; int4: a bf16 scale and a
# bf16 zero point per group of 128 consecutive inputs, the AWQ/GPTQ/torchao layout)
WEIGHT_SCHEMES = {
    "int8 weight-only": (1.0, lambda shape, n: shape[0] * 4),
    "int4 weight-only": (0.5, lambda shape, n: -(-n // 128) * 4),
}


def quantizable_weights(report) -> dict[str, object]:
    """The weights a weight-only scheme would store narrower: parameters and buffers of
    two or more dimensions, wider than a byte, read as an operand of a contraction."""
    g = report.graph
    if g is None:
        return {}
    tensors = g.program.tensor_map
    out = {}
    for node in g.nodes:
        if node.kind != "contraction":
            continue
        for acc in node.operands:
            d = tensors[acc.tensor]
            if d.role in ("parameter", "buffer") and len(d.shape) >= 2 and d.itemsize > 1:
                out[d.name] = d
    return out


def stored_width_opportunities(report) -> list[dict]:
    """Per chip and weight-only scheme: the fused bound with the program's own contraction
    weights stored at that width (plus their scales) and dequantized on chip, the products
    still in the activations' dtype (so compute is unchanged): what a decode step bound by
    reading its weights gains from int8 or int4 storage."""
    weights = quantizable_weights(report)
    if not weights:
        return []
    now_bytes = sum(d.nbytes for d in weights.values())
    out = []
    for spec in report.specs:
        fused = report.bound(spec.id, "fused")
        for scheme, (per, scales) in WEIGHT_SCHEMES.items():
            new = sum(math.ceil(d.numel * per) + scales(d.shape, d.numel)
                      for d in weights.values())
            if new >= now_bytes:
                continue
            nbytes = fused.bytes - now_bytes + new
            after = max(fused.compute_seconds, nbytes / spec.bandwidth)
            if after < fused.seconds * (1 - 1e-9):
                out.append({"kind": "stored-width", "arch": spec.id, "scheme": scheme,
                            "weights": len(weights), "weight_bytes_before": now_bytes,
                            "weight_bytes_after": new, "fused_bytes_after": nbytes,
                            "seconds_before": fused.seconds, "seconds_after": after,
                            "saving": fused.seconds / after})
    return out


__all__ = ["opportunities", "reorder_opportunities", "precision_opportunities",
           "stored_width_opportunities", "quantizable_weights", "pairwise_macs",
           "with_reorder"]
