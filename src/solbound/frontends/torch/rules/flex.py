"""``torch.ops.higher_order.flex_attention``: FlexAttention lowered through its own reference.

``flex_attention(q, k, v, score_mod, block_mask)`` computes, for every (batch, head,
query ``m``, key ``n``), ``s = score_mod(scale * q.k, b, h, m, n)`` where
``mask_mod(b, h, m, n)`` keeps the pair and ``-inf`` where it does not, then a softmax
over the keys and a product with ``v`` (PyTorch's eager ``math_attention``, which this
follows line for line: scores in float32, or float64 for float64 inputs; grouped-query
heads share their key/value head). The rule traces that definition, with the program's
own ``score_mod`` and ``mask_mod`` graphs applied over the whole grid by ``vmap`` (as
PyTorch's reference does), into ATen operators, and lowers each by its own rule, all in
the ``flex_attention`` operator's group. So a ``mask_mod`` is exactly a mask written by
hand: an affine one (causal, a sliding window, a prefix-LM, documents by block index)
becomes the guard of the work, and the work is the pairs it keeps, at any length; a
``score_mod`` is elementwise work on those pairs.

The backward (``flex_attention_backward``, in a training step) is PyTorch's own dense
backward traced the same way: the probabilities recomputed from the saved log-sum-exp (as
FlashAttention's backward recomputes them), the row sums of ``out * grad_out``, the joint
graph of the ``score_mod`` on the kept pairs, dV, dP, dQ and dK.

The block mask (``create_block_mask``'s ``kv_num_blocks``, ``kv_indices`` and their
``full_`` pair) is what a FlexAttention kernel reads to find the key blocks of each query
block: one kernel of the group (``flex_blocks``, no arithmetic) reads those tensors as
the forward kernel does, once, and passes the attention's output through, so the mask's
construction is the program's work and its tensors are read bytes (they cost nothing
more: the copy is inside the operator, never a DRAM round trip, fused or not).
"""

from __future__ import annotations

import math

from ..lower import GROUP_KEY, LoweringError, OpCtx, View, rule


def _reference(score_mod, mask_mod, scale: float, n_score: int):
    """PyTorch's ``math_attention`` (``torch/_higher_order_ops/flex_attention.py``) for
    these graphs: ``(out, logsumexp / ln 2, max / ln 2)``, the statistics in base 2 as
    the operator returns them."""
    import torch
    from torch.nn.attention.flex_attention import _vmap_for_bhqkv

    def ref(q, k, v, *buffers):
        sbuf, mbuf = buffers[:n_score], buffers[n_score:]
        g = q.size(1) // k.size(1)
        if g > 1:
            k = torch.repeat_interleave(k, g, dim=1)
            v = torch.repeat_interleave(v, g, dim=1)
        if k.size(0) != q.size(0):
            k = k.expand((q.size(0), *k.shape[1:]))
            v = v.expand((q.size(0), *v.shape[1:]))
        wp = torch.float64 if q.dtype == torch.float64 else torch.float32
        s = (q.to(wp) @ k.to(wp).transpose(-2, -1)) * scale
        b, h, m, n = (torch.arange(x, device=s.device) for x in s.shape)
        smod = _vmap_for_bhqkv(score_mod, prefix=(0,), suffix=(None,) * len(sbuf))
        mmod = _vmap_for_bhqkv(mask_mod, prefix=(), suffix=(None,) * len(mbuf))
        # the mask as an additive bias of 0 or -inf (as SDPA's boolean mask): equal to
        # ``where(mask, score, -inf)`` for every finite score, and once the mask is a guard
        # the bias is a constant the scores read, not a comparison per pair
        bias = torch.where(mmod(b, h, m, n, *mbuf), 0.0, float("-inf")).to(s.dtype)
        post = smod(s, b, h, m, n, *sbuf) + bias
        lse = torch.logsumexp(post, dim=-1)
        top = torch.amax(post, dim=-1)
        p = torch.ops.aten._safe_softmax.default(post, -1)
        out = p.to(q.dtype) @ v.to(q.dtype)
        return out, lse / math.log(2), top / math.log(2)
    return ref


def _blocks(ctx: OpCtx, out: View, tables: list[View]) -> View:
    """``out`` passed through a kernel that also reads the block mask's tables (library
    routine ``passthrough``: no arithmetic), in the operator's group."""
    from .library import emit_library
    final = ctx.output(0)
    emit_library(ctx, final, "passthrough", [out] + tables, {})
    return final


@rule("flex_attention")
def flex_attention(ctx: OpCtx) -> None:
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from ..capture import _decomp_table
    node, low = ctx.node, ctx.low
    gm = node.graph.owning_module
    q, k, v = ctx.args[:3]
    block_mask = node.args[4]
    scale = ctx.args[5]
    sbuf = list(ctx.args[7]) if len(ctx.args) > 7 else []
    mbuf = list(ctx.args[8]) if len(ctx.args) > 8 else []
    if not all(isinstance(x, View) for x in (q, k, v, *sbuf, *mbuf)):
        raise LoweringError("flex_attention over a value that is not a tensor")
    score_mod = getattr(gm, node.args[3].target)
    mask_mod = getattr(gm, block_mask[-1].target)
    vals = node.meta["val"]

    table = {op: fn for op, fn in _decomp_table().items()
             if op is not torch.ops.aten._safe_softmax.default}
    try:
        traced = make_fx(_reference(score_mod, mask_mod, float(scale), len(sbuf)),
                         decomposition_table=table, tracing_mode="fake")(
            *_fakes(low, (q, k, v, *sbuf, *mbuf)))
        _constants_as_nodes(traced)
    except LoweringError:
        raise
    except Exception as e:  # noqa: BLE001 - a score_mod or mask_mod vmap cannot batch
        raise LoweringError(f"its score_mod or mask_mod does not trace over the grid: "
                            f"{type(e).__name__}: {str(e).splitlines()[0][:200]}") from None
    got = [n.meta.get("val") for n in traced.graph.output_node().args[0]]
    for i, (want, have) in enumerate(zip(vals, got)):
        if want is not None and have is not None and tuple(want.shape) != tuple(have.shape) \
                and want.numel():
            raise LoweringError(f"internal: flex_attention output {i} of shape "
                                f"{tuple(have.shape)}, expected {tuple(want.shape)}")
    outs = list(_lower_traced(ctx, traced, (q, k, v, *sbuf, *mbuf)))
    tables = [t for t in ctx.args[4][2:6] if isinstance(t, View)]
    if tables:
        outs[0] = _blocks(ctx, outs[0], tables)
    for i, want in enumerate(vals):
        if want is not None and not want.numel():
            outs[i] = ctx.output(i)
    ctx.bind(outs)


def _fakes(low, views) -> list:
    """Fake CPU tensors of the views' shapes and dtypes to trace a reference on: not meta
    ones, since the reference and the program's graphs make constants on their inputs'
    device or on the CPU (``torch.tensor(-inf, device=scores.device)``, a mask_mod's
    ``torch.ones(())``), and a meta constant has no value while a CPU one beside meta
    inputs is refused."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..lower import IR_TO_TORCH
    with FakeTensorMode(allow_non_fake_inputs=True):
        return [torch.empty(x.shape, dtype=IR_TO_TORCH[low.tensors[x.base].dtype])
                for x in views]


def _constants_as_nodes(gm) -> None:
    """Each 0-d tensor constant of a traced graph (``torch.tensor(0)`` in PyTorch's
    reference) as a ``full`` node, so that every node has a rule."""
    import torch
    g = gm.graph
    for n in list(g.nodes):
        if n.op != "get_attr":
            continue
        val = getattr(gm, n.target)
        if not isinstance(val, torch.Tensor) or val.dim() != 0:
            raise LoweringError(f"internal: a constant tensor of shape {tuple(val.shape)} in "
                                f"flex_attention's reference")
        with g.inserting_before(n):
            new = g.call_function(torch.ops.aten.full.default, ([], val.item()),
                                  {"dtype": val.dtype, "device": torch.device("meta")})
        new.meta["val"] = torch.empty((), dtype=val.dtype, device="meta")
        n.replace_all_uses_with(new)
        g.erase_node(n)
    for n in list(g.nodes):     # lift_fresh_copy of what is now a full: the full itself
        if n.op == "call_function" and "lift_fresh" in str(n.target):
            n.replace_all_uses_with(n.args[0])
            g.erase_node(n)
    # an output buffer made empty and filled by a copy (functionalized ``copy_``): the
    # copied value itself, when it has the buffer's shape
    for n in list(g.nodes):
        if n.op == "call_function" and n.target is torch.ops.aten.copy.default:
            dst, src = n.args[:2]
            if getattr(dst, "op", "") == "call_function" and "empty" in str(dst.target) \
                    and tuple(dst.meta["val"].shape) == tuple(src.meta["val"].shape) \
                    and dst.meta["val"].dtype == src.meta["val"].dtype:
                n.replace_all_uses_with(src)
                g.erase_node(n)
    g.eliminate_dead_code()
    g.lint()


def _lower_traced(ctx: OpCtx, traced, inputs) -> list:
    """Lower a traced reference's nodes in this operator's group; its outputs' values."""
    low = ctx.low
    group = low._cur_group
    places = [n for n in traced.graph.nodes if n.op == "placeholder"]
    for p, x in zip(places, inputs):
        low.env[p] = x
    for n in traced.graph.nodes:
        if n.op == "call_function":
            n.meta[GROUP_KEY] = group
            low.lower_node(n)
        elif n.op == "get_attr":
            raise LoweringError("internal: a constant in flex_attention's reference")
    low._cur_group = group

    def value(a):
        if isinstance(a, (list, tuple)):
            return type(a)(value(x) for x in a)
        return low.env[a] if a is not None else None
    return value(traced.graph.output_node().args[0])


@rule("flex_attention_backward")
def flex_attention_backward(ctx: OpCtx) -> None:
    """The gradients of ``flex_attention`` through PyTorch's own dense backward
    (``sdpa_dense_backward``: the probabilities recomputed from the saved log-sum-exp, the
    row sums of ``out * grad_out``, the joint graph of the ``score_mod`` for the scores'
    gradient, the mask), traced as the forward is (see the module doc)."""
    import torch
    from torch._higher_order_ops.flex_attention import sdpa_dense_backward
    from torch.fx.experimental.proxy_tensor import make_fx

    from ..capture import _decomp_table
    node, low = ctx.node, ctx.low
    gm = node.graph.owning_module
    q, k, v, out, lse, dout, dlse = ctx.args[:7]
    fw = getattr(gm, node.args[7].target)
    joint = getattr(gm, node.args[8].target)
    mask = getattr(gm, node.args[9][-1].target)
    scale, options = ctx.args[10], dict(ctx.args[11] or {})
    sbuf = list(ctx.args[12]) if len(ctx.args) > 12 else []
    mbuf = list(ctx.args[13]) if len(ctx.args) > 13 else []
    tensors = [x for x in (q, k, v, out, lse, dout, dlse) if x is not None] + sbuf + mbuf
    if not all(isinstance(x, View) for x in tensors):
        raise LoweringError("flex_attention_backward over a value that is not a tensor")
    has = [x is not None for x in (dout, dlse)]
    want = list(node.meta["val"][3]) if len(node.meta["val"]) > 3 else []
    if any(g is not None for g in want):
        # PyTorch's dense backward computes a captured tensor's gradient only for one that
        # requires gradients, which a traced function cannot ask for
        raise LoweringError("a score_mod whose captured tensors are trained (a learned "
                            "bias): their gradient is not lowered yet")

    def ref(q, k, v, out, lse, *rest):
        rest = list(rest)
        dout = rest.pop(0) if has[0] else None
        dlse = rest.pop(0) if has[1] else None
        sb, mb = rest[:len(sbuf)], rest[len(sbuf):]
        gq, gk, gv, gb = sdpa_dense_backward(q, k, v, out, lse, dout, dlse, fw, joint,
                                             (mask,), float(scale), options, tuple(sb),
                                             tuple(mb))
        return gq, gk, gv, tuple(gb)

    table = {op: fn for op, fn in _decomp_table().items()
             if op is not torch.ops.aten._safe_softmax.default}
    try:
        traced = make_fx(torch.func.functionalize(ref, remove="mutations_and_views"),
                         decomposition_table=table, tracing_mode="fake")(*_fakes(low, tensors))
        _constants_as_nodes(traced)
    except LoweringError:
        raise
    except Exception as e:  # noqa: BLE001 - a score_mod's joint graph that does not batch
        raise LoweringError(f"its dense backward does not trace over the grid: "
                            f"{type(e).__name__}: {str(e).splitlines()[0][:200]}") from None
    gq, gk, gv, gb = _lower_traced(ctx, traced, tensors)
    ctx.bind([gq, gk, gv, tuple(gb)])
