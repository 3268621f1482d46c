"""Constructors, concatenation, padding, indexing (indirect accesses), dropout."""

from __future__ import annotations


from ....ir.affine import Aff, Atom
from ....ir.model import Access, Call, Const, Idx
from ..lower import KernelBuilder, LoweringError, OpCtx, View, rule
from ._util import C, add, dims_vars, mul, operand
from .views import materialize


def _fill(ctx: OpCtx, value) -> None:
    out = ctx.output()
    kb = ctx.builder(out.shape)
    idx = dims_vars(out.ndim)
    v = value.item() if hasattr(value, "item") else value
    if isinstance(v, float) and ctx.out_dtype in ("i64", "i32", "i16", "i8", "u8"):
        v = int(v)
    if ctx.out_dtype == "bool":
        v = bool(v)
    ctx.emit(kb, out, idx, Const(v))
    ctx.bind(out)


@rule("aten.full", "aten.full_like")
def full(ctx: OpCtx) -> None:
    _fill(ctx, ctx.args[1])


@rule("aten.empty.memory_format", "aten.empty_permuted", "aten.empty_like", "aten.new_empty",
      "aten.empty_strided")
def empty(ctx: OpCtx) -> None:
    """An uninitialized tensor: written as zeros (its values are never read before the
    program overwrites them; the write is one store per element, no arithmetic)."""
    _fill(ctx, 0)


@rule("aten.scalar_tensor")
def scalar_tensor(ctx: OpCtx) -> None:
    _fill(ctx, ctx.args[0])


@rule("aten.arange.start_step", "aten.arange.start", "aten.arange.default", "aten.arange")
def arange(ctx: OpCtx) -> None:
    a = list(ctx.args)
    if len(a) == 1:
        start, step = 0, 1
    else:
        start = a[0]
        step = a[2] if len(a) > 2 else ctx.kwargs.get("step", 1)
    out = ctx.output()
    kb = ctx.builder(out.shape)
    d0 = Aff.var("d0")
    if isinstance(start, int) and isinstance(step, int):
        body = Idx(d0 * step + start)
    else:
        body = add(C(float(start)), mul(Idx(d0), C(float(step))))
    ctx.emit(kb, out, [d0], Call(f"to_{ctx.out_dtype}", (body,)))
    ctx.bind(out)


@rule("aten.cat")
def cat(ctx: OpCtx) -> None:
    """One copy kernel per input, each writing its region of the output."""
    tensors = [t for t in ctx.args[0] if isinstance(t, View)]
    dim = ctx.args[1] if len(ctx.args) > 1 else ctx.kwargs.get("dim", 0)
    out = ctx.output()
    dim %= out.ndim
    off = 0
    for t in tensors:
        if t.meta.numel() == 0:
            continue
        n = t.shape[dim]
        region = View(out.base, out.meta.narrow(dim, off, n), out.base_shape)
        kb = ctx.builder(t.shape)
        idx = dims_vars(t.ndim)
        ctx.emit(kb, region, idx, kb.load(t, idx))
        off += n
    ctx.bind(out)


@rule("aten.constant_pad_nd")
def constant_pad(ctx: OpCtx) -> None:
    x, pad = ctx.args[0], list(ctx.args[1])
    value = ctx.args[2] if len(ctx.args) > 2 else 0
    out = ctx.output()
    kb = ctx.builder(out.shape)
    idx = dims_vars(out.ndim)
    xi = list(idx)
    guard = []
    for i in range(len(pad) // 2):
        dim = out.ndim - 1 - i
        lo = pad[2 * i]
        e = idx[dim] - lo
        xi[dim] = e
        lo_b, hi_b = e.bounds(kb_ext(kb))
        if lo_b < 0 or hi_b >= x.shape[dim]:
            guard.append(Atom(e, 0, x.shape[dim]))
    ctx.emit(kb, out, idx, kb.load(x, xi), guard=tuple(guard), fill=value)
    ctx.bind(out)


@rule("aten.tril", "aten.triu")
def triangle(ctx: OpCtx) -> None:
    """``tril(x, k)`` keeps ``j - i <= k`` of the last two dims, ``triu`` keeps
    ``j - i >= k``; the rest is 0. One guarded copy: no arithmetic."""
    x = ctx.args[0]
    k = int(ctx.args[1]) if len(ctx.args) > 1 else int(ctx.kwargs.get("diagonal", 0))
    out = ctx.output()
    kb = ctx.builder(out.shape)
    idx = dims_vars(out.ndim)
    diff = idx[-1] - idx[-2]
    lower = str(ctx.node.target).startswith("aten.tril")
    atom = Atom(diff, None, k + 1) if lower else Atom(diff, k, None)
    ctx.emit(kb, out, idx, kb.load(x, idx), guard=(atom,), fill=0)
    ctx.bind(out)


def kb_ext(kb: KernelBuilder) -> dict[str, int]:
    return dict(kb.dims)


def _table(ctx: OpCtx, v: View) -> View:
    return v if v.is_full else materialize(ctx, v)


@rule("aten.embedding")
def embedding(ctx: OpCtx) -> None:
    """out[..., e] = weight[ids[...], e]: an indirect access (a gather of rows)."""
    w, ids = _table(ctx, ctx.args[0]), ctx.args[1]
    out = ctx.output()
    kb = ctx.builder(out.shape)
    idx = dims_vars(out.ndim)
    ia = kb.load(ids, idx[:-1])
    ctx.emit(kb, out, idx, Access(w.base, (ia, idx[-1])))
    ctx.bind(out)


def _gather_dim(ctx: OpCtx, index_at) -> None:
    """out[i...] = x[..., index[index_at(i...)], ...] along ``dim`` (an indirect access)."""
    x, dim, index = _table(ctx, ctx.args[0]), ctx.args[1], ctx.args[2]
    dim %= x.ndim
    out = ctx.output()
    kb = ctx.builder(out.shape)
    idx = dims_vars(out.ndim)
    xi = list(idx)
    xi[dim] = kb.load(index, index_at(idx, dim))
    ctx.emit(kb, out, idx, Access(x.base, tuple(xi)))
    ctx.bind(out)


@rule("aten.index_select")
def index_select(ctx: OpCtx) -> None:
    _gather_dim(ctx, lambda idx, dim: [idx[dim]])


@rule("aten.gather")
def gather(ctx: OpCtx) -> None:
    _gather_dim(ctx, lambda idx, dim: idx)


@rule("aten.index.Tensor")
def index_tensor(ctx: OpCtx) -> None:
    """Advanced indexing ``x[..., i, j, ...]``: an indirect access per indexed dim.

    Adjacent index tensors put their broadcast dims in place; separated ones put
    them first (NumPy/PyTorch semantics). ``None`` entries are full slices.
    """
    import torch
    x, indices = _table(ctx, ctx.args[0]), list(ctx.args[1])
    indices += [None] * (x.ndim - len(indices))
    pos = [i for i, t in enumerate(indices) if t is not None]
    if not pos:
        raise LoweringError("index.Tensor without index tensors")
    ishape = tuple(int(s) for s in torch.broadcast_shapes(*[indices[i].shape for i in pos]))
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    out = ctx.output()
    kb = ctx.builder(out.shape)
    idx = dims_vars(out.ndim)
    ni = len(ishape)
    first = pos[0] if adjacent else 0
    bi = idx[first:first + ni]
    rest = iter(idx[:first] + idx[first + ni:])
    xi = []
    for i in range(x.ndim):
        if indices[i] is None:
            xi.append(next(rest))
        else:
            xi.append(operand(kb, indices[i], ishape, bi))
    ctx.emit(kb, out, idx, Access(x.base, tuple(xi)))
    ctx.bind(out)


@rule("aten._assert_tensor_metadata", "aten._assert_scalar", "aten.sym_constrain_range_for_size",
      "aten._assert_async", "aten.sym_constrain_range")
def assertion(ctx: OpCtx) -> None:
    """Runtime metadata assertions compute nothing."""
    ctx.bind(None)


@rule("aten.flip")
def flip(ctx: OpCtx) -> None:
    """A copy with reversed indices along the flipped dims (``n - 1 - i``: affine)."""
    x, dims = ctx.args[0], ctx.args[1]
    out = ctx.output()
    kb = ctx.builder(out.shape)
    idx = dims_vars(out.ndim)
    flipped = {d % x.ndim for d in dims}
    xi = [(-idx[i] + (x.shape[i] - 1)) if i in flipped else idx[i] for i in range(x.ndim)]
    ctx.emit(kb, out, idx, kb.load(x, xi))
    ctx.bind(out)


@rule("aten.native_dropout")
def dropout(ctx: OpCtx) -> None:
    """Training-mode dropout: a Bernoulli mask from a uniform draw per element,
    ``out = mask ? x / (1 - p) : 0``. The draw is the ``rand`` scalar op; validation
    replays the framework's mask (``Lowering.random_draws``)."""
    x, p, train = ctx.args[0], ctx.args[1], ctx.args[2]
    out, mask = ctx.output(0), ctx.output(1)
    kb = ctx.builder(mask.shape)
    idx = dims_vars(mask.ndim)
    if not train or p == 0:
        ctx.emit(kb, mask, idx, Const(True))
        kb = ctx.builder(out.shape)
        ctx.emit(kb, out, idx, kb.load(x, idx))
    else:
        ctx.emit(kb, mask, idx, Call("lt", (Call("rand", ()), Const(1.0 - p))))
        ctx.low.random_draws[mask.base] = (ctx.node.name, 1)
        kb = ctx.builder(out.shape)
        body = Call("select", (kb.load(mask, idx), mul(kb.load(x, idx), C(1.0 / (1.0 - p))),
                               Const(0.0)))
        ctx.emit(kb, out, idx, body)
    ctx.bind([out, mask])


@rule("aten.randn", "aten.rand", "aten.randn_like", "aten.rand_like", "aten.normal",
      "aten.uniform", "aten.bernoulli")
def random(ctx: OpCtx) -> None:
    """Random tensors: one draw per element (the ``rand`` op). Validation replays the
    framework's values (``Lowering.random_draws``)."""
    out = ctx.output()
    kb = ctx.builder(out.shape)
    ctx.emit(kb, out, dims_vars(out.ndim), Call(f"to_{ctx.out_dtype}", (Call("rand", ()),)))
    ctx.low.random_draws[out.base] = (ctx.node.name, None)
    ctx.bind(out)


@rule("aten.repeat")
def repeat(ctx: OpCtx) -> None:
    """``x.repeat(r0, r1, ...)``: a copy whose output dim of size ``r*s`` is split into
    (tile, position) loops, ``out[t*s + j] = x[j]``: affine, no modulo."""
    x, reps = ctx.args[0], [int(r) for r in ctx.args[1]]
    out = ctx.output()
    lead = len(reps) - x.ndim
    dims, out_idx, x_idx = [], [], []
    for i, r in enumerate(reps):
        if i < lead:
            dims.append((f"d{i}", r))
            out_idx.append(Aff.var(f"d{i}"))
            continue
        s = x.shape[i - lead]
        if r == 1:
            dims.append((f"d{i}", s))
            out_idx.append(Aff.var(f"d{i}"))
        else:
            dims += [(f"t{i}", r), (f"d{i}", s)]
            out_idx.append(Aff.var(f"t{i}") * s + Aff.var(f"d{i}"))
        x_idx.append(Aff.var(f"d{i}"))
    kb = KernelBuilder(ctx.low, dims)
    ctx.emit(kb, out, out_idx, kb.load(x, x_idx))
    ctx.bind(out)


@rule("aten.roll")
def roll(ctx: OpCtx) -> None:
    """``torch.roll(x, shifts, dims)``: along each rolled dimension, two slice copies
    (``out[s:] = x[:n-s]``, ``out[:s] = x[n-s:]``): data movement with affine indices, no
    index arithmetic. Several dimensions roll one after another (within the operator)."""
    x, shifts = ctx.args[0], ctx.args[1]
    dims = ctx.args[2] if len(ctx.args) > 2 else ctx.kwargs.get("dims", [])
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    out = ctx.output()
    if not dims:                                   # a roll of the flattened tensor
        if len(shifts) != 1:
            raise LoweringError("roll without dims takes one shift")
        if not x.is_full:
            x = _table(ctx, x)
        src = View(x.base, x.meta.reshape(-1), x.base_shape)
        dst = View(out.base, out.meta.reshape(-1), out.base_shape)
        _roll_copies(ctx, src, dst, shifts[0], 0)
        ctx.bind(out)
        return
    if len(shifts) != len(dims):
        raise LoweringError("roll with a different number of shifts and dims")
    cur = x
    for i, (s, d) in enumerate(zip(shifts, dims)):
        dst = out if i == len(dims) - 1 else ctx.new_tensor(x.shape, out.dtype,
                                                            f"{ctx.node.name}_step{i}")
        _roll_copies(ctx, cur, dst, s, d % x.ndim)
        cur = dst
    ctx.bind(out)


def _roll_copies(ctx: OpCtx, src: View, dst: View, shift: int, dim: int) -> None:
    n = src.shape[dim]
    s = shift % n if n else 0
    pieces = [(s, n, 0), (0, s, n - s)]            # (dst start, dst end, src start)
    for lo, hi, start in pieces:
        if hi <= lo:
            continue
        shape = tuple(hi - lo if i == dim else e for i, e in enumerate(src.shape))
        kb = ctx.builder(shape)
        idx = dims_vars(len(shape))
        oi = [v + lo if i == dim else v for i, v in enumerate(idx)]
        si = [v + start if i == dim else v for i, v in enumerate(idx)]
        ctx.emit(kb, dst, oi, kb.load(src, si))


@rule("aten._local_scalar_dense")
def local_scalar_dense(ctx: OpCtx) -> None:
    """``t.item()`` of a one-element tensor used as a number by later operators (an
    optimizer's step size, computed from its step counter): the tensor itself, read as a
    broadcast operand where the number is used. Nothing is computed."""
    x = ctx.args[0]
    if not isinstance(x, View) or any(int(s) != 1 for s in x.shape):
        raise LoweringError("item() of a tensor that is not one element")
    ctx.bind(View(x.base, x.meta.reshape(()), x.base_shape) if x.shape else x)
