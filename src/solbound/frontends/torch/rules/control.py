"""``torch.ops.higher_order.scan``: a sequential loop of the IR, its body lowered once.

A Python loop over steps captured as a scan (``frontends/torch/loops.py``) or a scan the
program calls itself. As for ``lax.scan`` in the JAX frontend, each carry lives in a
history tensor ``[T + 1, ...]`` (row 0 the initial value, iteration ``ts`` reads row
``ts`` and writes row ``ts + 1``) and each stacked output in ``[T, ...]``; a scanned
input is read at row ``ts``. The body's operators are lowered by their own rules, in the
loop (counting multiplies them by the trip count), each its own operator group. No copy
stands between the body and the loop's tensors where none is needed: the body's reads of
a carry or scanned row are accesses of the history or the input at row ``ts``, and the
tensor the body computes a carry or output into is that row of the history or the
stacked output itself; the unrolled loop moves the same bytes.
"""

from __future__ import annotations

from ....ir.affine import Aff
from ....ir.model import Access, Kernel, kernel_reads, map_kernel_accesses
from ..lower import TORCH_DTYPES, KernelBuilder, LoweringError, OpCtx, View, rule


def _copy(ctx: OpCtx, dst: View, prefix, src: View, loop) -> None:
    """``dst[prefix, d...] = src[d...]`` (one kernel, in ``loop`` if given)."""
    kb = KernelBuilder(ctx.low, [(f"d{i}", n) for i, n in enumerate(src.shape)])
    idx = [Aff.var(f"d{i}") for i in range(src.ndim)]
    ctx.emit(kb, dst, list(prefix) + idx, kb.load(src, idx), loop=loop)


class _Subst:
    """Accesses of stand-in tensors (``name -> (view, prefix)``) become accesses of
    ``view`` at ``prefix + index``."""

    def __init__(self, low, table: dict[str, tuple[View, list]], dims):
        self.low, self.table, self.dims = low, table, dims

    def __call__(self, a: Access) -> Access:
        if a.tensor not in self.table:
            return a
        view, prefix = self.table[a.tensor]
        kb = KernelBuilder(self.low, list(self.dims))
        got = kb.load(view, list(prefix) + list(a.index))
        if kb.dims != list(self.dims):
            raise LoweringError("a scanned input whose row is not affine in the body's loops")
        return got


@rule("scan")
def scan_rule(ctx: OpCtx) -> None:
    low = ctx.low
    node = ctx.node
    gm_node, init_nodes = node.args[:2]
    if low.scan_loop is not None:
        raise LoweringError("a scan inside a scan body")
    gm = getattr(low.ep.graph_module, gm_node.target)
    init, xs, extra = ctx.args[1], ctx.args[2], list(ctx.args[3])
    if not xs:
        raise LoweringError("a scan over no inputs")
    if not all(isinstance(v, View) for v in list(init) + list(xs)):
        raise LoweringError("a scan over a value that is not a tensor")
    steps = xs[0].shape[0]
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    ncar, nxs = len(init), len(xs)
    if len(places) != ncar + nxs + len(extra):
        raise LoweringError("internal: scan body arity")
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    outs = list(out_node.args[0])
    val = node.meta["val"]
    group = low._cur_group
    # a Python loop captured as this scan (loops.py): its operators are named by its line
    scans = [n for n in node.graph.nodes if n.op == "call_function" and n.target is node.target]
    sources = getattr(low.ep, "solbound_loop_sources", None) or []
    line = sources[scans.index(node)] if len(sources) == len(scans) else group[2]
    low._cur_group = (group[0], group[1], line)
    # histories of the carries, row 0 the initial value
    before = len(low.kernels)
    hist = [low.new_base(f"{node.name}_carry{i}", (steps + 1,) + c.shape, c.dtype)
            for i, c in enumerate(init)]
    ys = []
    for j, y in enumerate(val[ncar:]):
        ys.append(low.new_base(f"{node.name}_ys{j}", tuple(int(s) for s in y.shape),
                               TORCH_DTYPES[y.dtype]))
    loop = low.new_loop("ts", steps)
    ts = Aff.var("ts")
    # stand-ins for what the body reads per iteration
    standin: dict[str, tuple[View, list]] = {}
    for p, h in zip(places[:ncar], hist):
        s = low.new_base(f"{p.name}_row", h.shape[1:], h.dtype)
        standin[s.base] = (h, [ts])
        low.env[p] = s
    for p, x in zip(places[ncar:ncar + nxs], xs):
        s = low.new_base(f"{p.name}_row", x.shape[1:], x.dtype)
        standin[s.base] = (x, [ts])
        low.env[p] = s
    for p, e in zip(places[ncar + nxs:], extra):
        low.env[p] = e
    start = len(low.kernels)
    born = set(low.tensors)
    low.scan_loop, saved_prefix = loop, low.group_prefix
    low.group_prefix = f"{node.name}."
    low.scan_src = line
    try:
        # an operator of the body no rule lowers is named unsupported by its own node, and
        # stays in the loop as an opaque kernel (its operands read, its result written,
        # every step), as it would unrolled
        for n in gm.graph.nodes:
            if n.op == "call_function":
                low.lower_node(n)
            elif n.op == "get_attr":
                low.env[n] = getattr(gm, n.target)
    finally:
        low.scan_loop, low.group_prefix, low.scan_src = None, saved_prefix, ""
        low._cur_group = group
    # where the body's results go: the tensor it computed into, renamed to the row
    renamed: dict[str, tuple[View, list]] = {}
    copies = []
    targets = [(h, [ts + 1]) for h in hist] + [(y, [ts]) for y in ys]
    for o, (dst, prefix) in zip(outs, targets):
        v = low.env[o]
        if (isinstance(v, View) and v.is_full and v.base not in born and v.base not in standin
                and v.base not in renamed and v.base not in low.flat
                and low.tensors[v.base].role == "intermediate" and v.shape == dst.shape[1:]):
            renamed[v.base] = (dst, prefix)
        else:
            copies.append((dst, prefix, v))
    table = {**standin, **renamed}
    body = low.kernels[start:]
    del low.kernels[start:]
    for name in table:
        if name in low.flat:
            raise LoweringError("a scan body that addresses its carry as flat storage")
    for k in body:
        low.kernels.append(_in_loop(low, k, table))
    for j, (dst, prefix, v) in enumerate(copies):
        # a row the body did not compute into: its own operator, once per iteration, as
        # the unrolled loop's ``torch.stack`` of the rows (or its carry assignment) is
        low._cur_group = (f"{group[0]}.row{j}", "aten.stack", line)
        _copy(ctx, dst, prefix, v, loop)
    low._cur_group = group
    for name in table:
        low.tensors.pop(name, None)
    # last, when nothing can fail any more (a failed rule is rolled back, which cannot undo
    # this): each initial carry written into the history's row 0 by the kernels that made
    # it, or copied there in front of the loop
    low._cur_group = (group[0], group[1], line)
    for i, (c, cn, h) in enumerate(zip(init, init_nodes, hist)):
        if not _written_into(low, node, cn, c, h):
            n0 = len(low.kernels)
            _copy(ctx, h, [Aff.lit(0)], c, None)
            made = low.kernels[n0:]
            del low.kernels[n0:]
            low.kernels[before:before] = made
            before += len(made)
    low._cur_group = group
    finals = [View(h.base, h.meta[steps], h.base_shape) for h in hist]
    ctx.bind(finals + ys)


def _written_into(low, scan, init_node, c: View, h: View) -> bool:
    """An initial carry that the program computed just for the scan (``torch.zeros``): the
    kernels that wrote it write row 0 of the history instead (no copy, as the unrolled
    loop's first iteration reads the value where it was made). False for anything else:
    a program input or state, a tensor read elsewhere or addressed as flat storage."""
    base = c.base
    if (not c.is_full or c.shape != h.shape[1:] or base in low.flat
            or low.tensors[base].role != "intermediate" or len(init_node.users) != 1):
        return False
    for other, v in low.env.items():
        if other is not init_node and isinstance(v, View) and v.base == base \
                and any(u is not scan and u not in low.env for u in other.users):
            return False            # another value of the same tensor is read later
    writers = [i for i, k in enumerate(low.kernels) if base in k.outputs]
    if not writers or any(k.out2 == base or k.scatter for k in (low.kernels[i] for i in writers)):
        return False
    if any(a.tensor == base for k in low.kernels for a in kernel_reads(k)):
        return False
    for i in writers:
        k = low.kernels[i]
        low.kernels[i] = k.with_(out=h.base, out_index=(Aff.lit(0),) + tuple(k.out_index))
    low.tensors.pop(base)
    return True


def _in_loop(low, k: Kernel, table) -> Kernel:
    """A body kernel with its stand-ins and renamed tensors replaced by the loop's rows."""
    if k.out in table:
        view, prefix = table[k.out]
        if view.shape[len(prefix):] != low.tensors[k.out].shape:
            raise LoweringError("internal: a scan output row of another shape")
    if k.out2 is not None and k.out2 in table:
        raise LoweringError("a scan carry written as an arg-max's second output")
    return map_kernel_accesses(k, _Subst(low, table, k.dims))
