"""Lowering rules for JAX primitives, one small function each (registered on import).

Elementwise primitives take operands of one shape (jaxprs broadcast explicitly with
``broadcast_in_dim``), or rank-0 scalars; views move no data; ``dot_general`` is one
contraction; reductions, arg-reductions and cumulative ops map to the IR's kinds.
"""

from __future__ import annotations

import math

from ...ir.affine import Aff, Atom
from ...ir.model import Access, Call, Const, Idx, Kernel, unpicked
from ...ir.passes import contiguous_strides
from .lower import Ctx, JaxLoweringError, JView, _key_shape, ir_dtype, rule


def _dims(shape, prefix: str = "d") -> list[tuple[str, int]]:
    return [(f"{prefix}{i}", int(n)) for i, n in enumerate(shape)]


def _vars(dims) -> list[Aff]:
    return [Aff.var(d) for d, _ in dims]


def _operand(ctx: Ctx, a, idx: list[Aff]):
    """An elementwise operand at the output's index (a rank-0 view or a scalar broadcasts,
    and so does a dimension of size 1)."""
    if isinstance(a, JView) and a.ndim == 0:
        return ctx.load(a, [])
    if isinstance(a, JView):
        idx = idx[len(idx) - a.ndim:]
        idx = [Aff.lit(0) if n == 1 else v for v, n in zip(idx, a.shape)]
    return ctx.load(a, idx)


def _elementwise(ctx: Ctx, body_fn) -> None:
    out = ctx.output()
    dims = _dims(out.shape)
    idx = _vars(dims)
    ops = [_operand(ctx, a, idx) for a in ctx.args]
    ctx.emit(out, dims, idx, body_fn(*ops))
    ctx.bind(out)


BINARY = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "max": "maximum",
          "min": "minimum", "pow": "pow", "rem": "mod", "eq": "eq", "ne": "ne", "lt": "lt",
          "le": "le", "gt": "gt", "ge": "ge", "and": "and", "or": "or", "xor": "xor",
          "atan2": None, "complex": "complex"}
UNARY = {"neg": "neg", "exp": "exp", "exp2": "exp2", "log": "log", "log1p": "log1p",
         "expm1": "expm1", "tanh": "tanh", "logistic": "sigmoid", "sqrt": "sqrt",
         "rsqrt": "rsqrt", "abs": "abs", "sign": "sign", "floor": "floor", "ceil": "ceil",
         "round": "round", "sin": "sin", "cos": "cos", "erf": "erf", "erf_inv": "erfinv",
         "not": "not", "is_finite": None, "real": "real", "imag": "imag"}


def _binary(op: str):
    def fn(ctx: Ctx) -> None:
        _elementwise(ctx, lambda a, b: Call(op, (a, b)))
    return fn


def _unary(op: str):
    def fn(ctx: Ctx) -> None:
        _elementwise(ctx, lambda a: Call(op, (a,)))
    return fn


for _p, _op in BINARY.items():
    if _op is not None:
        rule(_p)(_binary(_op))
for _p, _op in UNARY.items():
    if _op is not None:
        rule(_p)(_unary(_op))


@rule("is_finite")
def is_finite(ctx: Ctx) -> None:
    """``isfinite(x)`` as ``abs(x) < inf`` (false for both infinities and, a comparison
    with NaN being false, for NaN): two vector ops per element (``logsumexp`` guards its
    shift with it, and so does every softmax cross-entropy of optax)."""
    _elementwise(ctx, lambda a: Call("lt", (Call("abs", (a,)), Const(math.inf))))


@rule("add_any")
def add_any(ctx: Ctx) -> None:
    """``add_any``: JAX's transposition summing two cotangents of one value (a value read
    twice in the forward); one add per element, as ``add``."""
    _elementwise(ctx, lambda a, b: Call("add", (a, b)))


@rule("square")
def square(ctx: Ctx) -> None:
    _elementwise(ctx, lambda a: Call("mul", (a, a)))


@rule("integer_pow")
def integer_pow(ctx: Ctx) -> None:
    """``x ** n`` by repeated multiplication (``n - 1`` products; a reciprocal if n < 0)."""
    n = int(ctx.params["y"])

    def body(a):
        if n == 0:
            return Const(1.0)
        e = a
        for _ in range(abs(n) - 1):
            e = Call("mul", (e, a))
        return Call("recip", (e,)) if n < 0 else e
    _elementwise(ctx, body)


@rule("select_n")
def select_n(ctx: Ctx) -> None:
    """``select_n(p, *cases)``: case ``p`` (a boolean picks between two)."""
    if len(ctx.args) != 3:
        raise JaxLoweringError("select_n with more than two cases")
    _elementwise(ctx, lambda p, a, b: Call("select", (p, b, a)))


@rule("clamp")
def clamp(ctx: Ctx) -> None:
    _elementwise(ctx, lambda lo, x, hi: Call("minimum", (Call("maximum", (x, lo)), hi)))


@rule("convert_element_type")
def convert(ctx: Ctx) -> None:
    dt = ir_dtype(ctx.params["new_dtype"])
    _elementwise(ctx, lambda a: Call(f"to_{dt}", (a,)))


@rule("shift_right_logical")
def shift_right_logical(ctx: Ctx) -> None:
    """A logical right shift. The IR holds integers by value, so it is exact for unsigned
    and non-negative operands (``jax.random``'s bits); a negative signed one is named."""
    if str(ctx.eqn.invars[0].aval.dtype).startswith("int"):
        raise JaxLoweringError("a logical right shift of a signed integer")
    _elementwise(ctx, lambda a, b: Call("shr", (a, b)))


@rule("shift_right_arithmetic")
def shift_right_arithmetic(ctx: Ctx) -> None:
    """An arithmetic right shift of a signed integer (sign-filling: the int64 shift of its
    value); of an unsigned one it would reinterpret the top bit, which is named."""
    if str(ctx.eqn.invars[0].aval.dtype).startswith("uint"):
        raise JaxLoweringError("an arithmetic right shift of an unsigned integer")
    _elementwise(ctx, lambda a, b: Call("shr", (a, b)))


@rule("shift_left")
def shift_left(ctx: Ctx) -> None:
    """A left shift; the result wraps to its width when written (``ir.execute.wrap_int``)."""
    _elementwise(ctx, lambda a, b: Call("shl", (a, b)))


@rule("bitcast_convert_type")
def bitcast_convert_type(ctx: Ctx) -> None:
    """The float32 whose bits are a 32-bit integer's (how ``jax.random.uniform`` turns
    random bits into a number in [1, 2)); other reinterpretations are not lowered."""
    src = ctx.eqn.invars[0].aval.dtype
    if str(ctx.params["new_dtype"]) != "float32" or str(src) not in ("uint32", "int32"):
        raise JaxLoweringError(f"bitcast from {src} to {ctx.params['new_dtype']}")
    _elementwise(ctx, lambda a: Call("bitcast_f32", (a,)))


# --- random numbers -------------------------------------------------------------------
# A PRNG key array key<fry>[S] is its key data u32[S, 2] (``lower.aval_ir``). Every value a
# generator produces (random bits, a split or folded key, a seeded key) is a *draw*: one
# ``rand`` op per element, the cheapest a counter-based generator could be (threefry costs
# tens of integer ops per 32 bits: a lower bound stays a bound). Validation replays what
# JAX drew at the same equation (``reference.py``).

def _draw_operands(ctx: Ctx, idx: list) -> tuple:
    """The generator's operands as the draw at ``idx`` reads them: a key array's words at
    the leading output coordinates, a scalar seed or fold-in value."""
    reads = []
    for a, var in zip(ctx.args, ctx.eqn.invars):
        if not isinstance(a, JView):
            continue
        if _key_shape(var.aval.dtype) is not None:
            lead = idx[:a.ndim - 1]
            reads += [ctx.load(a, lead + [Aff.lit(w)]) for w in range(a.shape[-1])]
        elif a.ndim == 0:
            reads.append(ctx.load(a, []))
    return tuple(reads)


def _draw(ctx: Ctx) -> None:
    outs = []
    for j in range(len(ctx.eqn.outvars)):
        out = ctx.output(j)
        dims = _dims(out.shape)
        idx = _vars(dims)
        ctx.emit(out, dims, idx, Call(f"to_{out.dtype}", (Call("rand", _draw_operands(ctx, idx)),)))
        ctx.low.draw(out, ctx.eqn, j)
        outs.append(out)
    ctx.bind(*outs)


rule("random_bits", "random_split", "random_fold_in", "random_seed", "threefry2x32")(_draw)


@rule("random_wrap", "random_unwrap", "random_clone", "random_clone_p")
def random_key_view(ctx: Ctx) -> None:
    """Key data and typed keys are the same words (u32[S, 2] both ways)."""
    ctx.bind(ctx.args[0])


@rule("stop_gradient", "copy", "copy_p", "reduce_precision", "optimization_barrier")
def identity(ctx: Ctx) -> None:
    ctx.bind(*ctx.args[:len(ctx.eqn.outvars)])


# --- views ---------------------------------------------------------------------------

def _view(ctx: Ctx, x: JView, shape, strides, offset) -> None:
    ctx.bind(JView(x.base, tuple(int(s) for s in shape), tuple(int(s) for s in strides),
                   offset if isinstance(offset, Aff) else int(offset), x.dtype))


def _as_view(ctx: Ctx, a) -> JView:
    if isinstance(a, JView):
        return a
    raise JaxLoweringError("a view of a scalar literal")


@rule("broadcast_in_dim")
def broadcast_in_dim(ctx: Ctx) -> None:
    x = ctx.args[0]
    shape = tuple(ctx.params["shape"])
    bd = tuple(ctx.params["broadcast_dimensions"])
    if not isinstance(x, JView):
        out = ctx.output()
        dims = _dims(shape)
        ctx.emit(out, dims, _vars(dims), Const(x))
        ctx.bind(out)
        return
    strides = []
    for d, n in enumerate(shape):
        if d in bd:
            j = bd.index(d)
            strides.append(x.strides[j] if x.shape[j] == n else 0)
        else:
            strides.append(0)
    _view(ctx, x, shape, strides, x.offset)


@rule("transpose")
def transpose(ctx: Ctx) -> None:
    x = _as_view(ctx, ctx.args[0])
    perm = ctx.params["permutation"]
    _view(ctx, x, [x.shape[p] for p in perm], [x.strides[p] for p in perm], x.offset)


@rule("reshape")
def reshape(ctx: Ctx) -> None:
    x = _as_view(ctx, ctx.args[0])
    perm = ctx.params.get("dimensions")
    if perm:
        # lax.reshape(x, sizes, dimensions): the operand transposed by ``dimensions``
        # first (a view), then reshaped (JAX's transposition of a grouped convolution)
        x = JView(x.base, tuple(x.shape[i] for i in perm), tuple(x.strides[i] for i in perm),
                  x.offset, x.dtype)
    if not x.contiguous():
        x = ctx.low._copy(x, "reshape_src")
    shape = tuple(ctx.params["new_sizes"])
    _view(ctx, x, shape, contiguous_strides(shape), x.offset)


@rule("squeeze")
def squeeze(ctx: Ctx) -> None:
    x = _as_view(ctx, ctx.args[0])
    drop = {d % x.ndim for d in ctx.params["dimensions"]}
    keep = [i for i in range(x.ndim) if i not in drop]
    _view(ctx, x, [x.shape[i] for i in keep], [x.strides[i] for i in keep], x.offset)


@rule("expand_dims")
def expand_dims(ctx: Ctx) -> None:
    x = _as_view(ctx, ctx.args[0])
    shape, strides = list(x.shape), list(x.strides)
    for d in sorted(ctx.params["dimensions"]):
        shape.insert(d, 1)
        strides.insert(d, 0)
    _view(ctx, x, shape, strides, x.offset)


@rule("slice")
def slice_(ctx: Ctx) -> None:
    x = _as_view(ctx, ctx.args[0])
    start, limit = ctx.params["start_indices"], ctx.params["limit_indices"]
    step = ctx.params.get("strides") or [1] * x.ndim
    off = x.offset + sum(a * s for a, s in zip(start, x.strides))
    shape = [max(0, -(-(hi - lo) // st)) for lo, hi, st in zip(start, limit, step)]
    _view(ctx, x, shape, [s * st for s, st in zip(x.strides, step)], off)


@rule("rev")
def rev(ctx: Ctx) -> None:
    x = _as_view(ctx, ctx.args[0])
    dims = set(ctx.params["dimensions"])
    off = x.offset + sum((x.shape[d] - 1) * x.strides[d] for d in dims)
    _view(ctx, x, x.shape, [-s if i in dims else s for i, s in enumerate(x.strides)], off)


# --- data movement ------------------------------------------------------------------

@rule("concatenate")
def concatenate(ctx: Ctx) -> None:
    out = ctx.output()
    axis = ctx.params["dimension"]
    pos = 0
    for a in ctx.args:
        a = _as_view(ctx, a)
        dims = _dims(a.shape)
        idx = _vars(dims)
        oi = [v + pos if i == axis else v for i, v in enumerate(idx)]
        ctx.emit(out, dims, oi, ctx.load(a, idx))
        pos += a.shape[axis]
    ctx.bind(out)


@rule("stack")
def stack(ctx: Ctx) -> None:
    """``jnp.stack`` (a primitive since JAX 0.10): operand ``i`` written at position ``i``
    of a new axis."""
    out = ctx.output()
    axis = ctx.params["axis"] % out.ndim
    for i, a in enumerate(ctx.args):
        shape = ctx.eqn.invars[i].aval.shape
        dims = _dims(shape)
        idx = _vars(dims)
        oi = idx[:axis] + [Aff.lit(i)] + idx[axis:]
        body = ctx.load(a, idx) if isinstance(a, JView) else Const(a)
        ctx.emit(out, dims, oi, body)
    ctx.bind(out)


@rule("tile")
def tile(ctx: Ctx) -> None:
    """``jnp.tile`` (a primitive since JAX 0.10; ``reps`` one per operand dimension): one
    copy whose tiled dimensions are a repetition digit and the operand's index,
    ``out[r * n + v] = x[v]``."""
    x = ctx.args[0]
    out = ctx.output()
    shape = ctx.eqn.invars[0].aval.shape
    dims, oi, xi = [], [], []
    for d, (n, r) in enumerate(zip(shape, ctx.params["reps"])):
        v = Aff.var(f"d{d}")
        dims.append((f"d{d}", int(n)))
        if int(r) > 1:
            dims.append((f"t{d}", int(r)))
            oi.append(Aff.var(f"t{d}") * int(n) + v)
        else:
            oi.append(v)
        xi.append(v)
    body = ctx.load(x, xi) if isinstance(x, JView) else Const(x)
    ctx.emit(out, dims, oi, body)
    ctx.bind(out)


@rule("pad")
def pad(ctx: Ctx) -> None:
    """``lax.pad``: the padding value everywhere, then the operand's elements at ``v *
    (interior + 1) + lo``. A negative ``lo``/``hi`` crops (JAX's transposition of a
    strided convolution or window whose last positions are not read): only the operand
    elements that land in the output are copied. A pad that only crops is a view."""
    x, value = _as_view(ctx, ctx.args[0]), ctx.args[1]
    cfg = [(int(lo), int(hi), int(it)) for lo, hi, it in ctx.params["padding_config"]]
    out_shape = tuple(ctx.eqn.outvars[0].aval.shape)
    # per dimension: the first operand element kept and how many
    first, count = [], []
    for n, m, (lo, _, it) in zip(x.shape, out_shape, cfg):
        a = max(0, -(lo // (it + 1)))                  # ceil(-lo / (it + 1)) for lo < 0
        b = min(n - 1, (m - 1 - lo) // (it + 1)) if m > 0 else -1
        first.append(a)
        count.append(max(0, b - a + 1))
    if all(lo <= 0 and hi <= 0 and (it == 0 or n <= 1) for (lo, hi, it), n in zip(cfg, x.shape)):
        off = x.offset + sum(a * st for a, st in zip(first, x.strides))
        _view(ctx, x, count, x.strides, off)
        return
    out = ctx.output()
    dims = _dims(out.shape)
    ctx.emit(out, dims, _vars(dims), ctx.load(value, []) if isinstance(value, JView) else Const(value))
    if all(count):
        dims = _dims(count)
        idx = _vars(dims)
        xi = [v + a for v, a in zip(idx, first)]
        oi = [(v + a) * (it + 1) + lo for v, a, (lo, _, it) in zip(idx, first, cfg)]
        ctx.emit(out, dims, oi, ctx.load(x, xi))
    ctx.bind(out)


@rule("iota")
def iota(ctx: Ctx) -> None:
    out = ctx.output()
    dims = _dims(out.shape)
    d = ctx.params["dimension"]
    ctx.emit(out, dims, _vars(dims), Call(f"to_{out.dtype}", (Idx(Aff.var(f"d{d}")),)))
    ctx.bind(out)


# --- contractions and reductions ---------------------------------------------------

@rule("dot_general")
def dot_general(ctx: Ctx) -> None:
    """``out[batch, lhs free, rhs free] = sum over contracted dims of lhs * rhs``."""
    a, b = _as_view(ctx, ctx.args[0]), _as_view(ctx, ctx.args[1])
    (lc, rc), (lb, rb) = ctx.params["dimension_numbers"]
    out = ctx.output()
    lf = [i for i in range(a.ndim) if i not in lc and i not in lb]
    rf = [i for i in range(b.ndim) if i not in rc and i not in rb]
    dims = _dims(out.shape) + [(f"r{j}", a.shape[i]) for j, i in enumerate(lc)]
    ov = _vars(dims[:out.ndim])
    ai, bi = [None] * a.ndim, [None] * b.ndim
    k = 0
    for i, j in zip(lb, rb):
        ai[i], bi[j] = ov[k], ov[k]
        k += 1
    for i in lf:
        ai[i] = ov[k]
        k += 1
    for j in rf:
        bi[j] = ov[k]
        k += 1
    for r, (i, j) in enumerate(zip(lc, rc)):
        ai[i] = bi[j] = Aff.var(f"r{r}")
    body = Call("mul", (ctx.load(a, ai), ctx.load(b, bi)))
    if a.dtype != out.dtype or b.dtype != out.dtype:
        body = Call("mul", (Call(f"to_{out.dtype}", (ctx.load(a, ai),)),
                            Call(f"to_{out.dtype}", (ctx.load(b, bi),))))
    unit = "matmul" if lc and not _exact(ctx) else ""
    ctx.emit(out, dims, ov, body, reduce="sum" if lc else None, unit=unit)
    ctx.bind(out)


def _exact(ctx: Ctx) -> bool:
    """``precision=HIGHEST`` (or the ``F32_F32_F32`` algorithm) in the program: true fp32,
    the FP32 vector pipe, whatever the default policy."""
    p = ctx.params.get("precision")
    text = str(p).upper()
    return "HIGHEST" in text or "F32_F32_F32" in text


def _reduce(op: str):
    def fn(ctx: Ctx) -> None:
        x = _as_view(ctx, ctx.args[0])
        axes = set(ctx.params["axes"])
        out = ctx.output()
        dims = [(f"d{i}", n) if i not in axes else (f"r{i}", n) for i, n in enumerate(x.shape)]
        xi = _vars(dims)
        oi = [v for i, v in enumerate(xi) if i not in axes]
        if not axes:
            ctx.emit(out, dims, oi, ctx.load(x, xi))
        else:
            ctx.emit(out, dims, oi, ctx.load(x, xi), reduce=op)
        ctx.bind(out)
    return fn


for _p, _op in (("reduce_sum", "sum"), ("reduce_max", "max"), ("reduce_min", "min"),
                ("reduce_prod", "prod"), ("reduce_and", "all"), ("reduce_or", "any")):
    rule(_p)(_reduce(_op))


def _argreduce(op: str):
    def fn(ctx: Ctx) -> None:
        x = _as_view(ctx, ctx.args[0])
        (axis,) = ctx.params["axes"]
        out = ctx.output()
        dims = [(f"d{i}", n) if i != axis else ("r0", n) for i, n in enumerate(x.shape)]
        xi = _vars(dims)
        ctx.emit(out, dims, [v for i, v in enumerate(xi) if i != axis], ctx.load(x, xi),
                 reduce=op)
        ctx.bind(out)
    return fn


rule("argmax")(_argreduce("argmax"))
rule("argmin")(_argreduce("argmin"))


@rule("top_k")
def top_k(ctx: Ctx) -> None:
    """``lax.top_k(x, k)`` along ``axis`` (the last by default): ``k`` selection passes,
    pass ``i`` an arg-max over the elements the earlier passes did not pick, writing
    position ``i`` of the indices and of the values (largest first, ties to the lower
    index), as PyTorch's ``topk`` rule does: the selection algorithm for a router's small
    k, k*n comparisons (a row holding -inf among its top k can repeat an index)."""
    x = _as_view(ctx, ctx.args[0])
    k = int(ctx.params["k"])
    axis = int(ctx.params.get("axis", x.ndim - 1)) % x.ndim
    vals, idxs = ctx.output(0), ctx.output(1)
    dims = [(f"d{i}", n) if i != axis else ("r0", n) for i, n in enumerate(x.shape)]
    xi = _vars(dims)
    for i in range(k):
        body = unpicked(ctx.load(x, xi), lambda pi: ctx.load(idxs, pi), xi, axis, i,
                        -math.inf)
        oi = list(xi)
        oi[axis] = Aff.lit(i)
        ctx.emit(idxs, dims, oi, body, reduce="argmax", out2=vals.base)
    ctx.bind(vals, idxs)


def _cumulative(op: str):
    def fn(ctx: Ctx) -> None:
        """An inclusive scan along ``axis``. ``reverse=True`` (what JAX's transposition of
        a cumulative sum emits) scans from the end: the same scan of the operand read
        backwards, into a base that the result views backwards (as PyTorch's
        ``flip(cumsum(flip(x)))`` is lowered); the same ops per element."""
        x = _as_view(ctx, ctx.args[0])
        axis = ctx.params["axis"] % max(x.ndim, 1)
        rev = bool(ctx.params.get("reverse"))
        if rev:
            x = JView(x.base, x.shape, tuple(-s if i == axis else s for i, s in enumerate(x.strides)),
                      x.offset + (x.shape[axis] - 1) * x.strides[axis], x.dtype)
        out = ctx.output()
        dims = _dims(x.shape)
        idx = _vars(dims)
        ctx.emit(out, dims, idx, ctx.load(x, idx), reduce=op, scan=f"d{axis}")
        if rev:
            st = out.strides
            out = JView(out.base, out.shape, tuple(-s if i == axis else s for i, s in enumerate(st)),
                        (out.shape[axis] - 1) * st[axis], out.dtype)
        ctx.bind(out)
    return fn


for _p, _op in (("cumsum", "sum"), ("cumprod", "prod"), ("cummax", "max"), ("cummin", "min")):
    rule(_p)(_cumulative(_op))


@rule("erfc")
def erfc(ctx: Ctx) -> None:
    _elementwise(ctx, lambda a: Call("sub", (Const(1.0), Call("erf", (a,)))))


# --- convolutions and pooling ------------------------------------------------------

def _window_index(out_v: Aff, k_v: Aff, stride: int, dil: int, lo: int):
    return out_v * stride + k_v * dil - lo


@rule("conv_general_dilated")
def conv_general_dilated(ctx: Ctx) -> None:
    """A grouped, strided, dilated convolution in any layout: ``out[n, g*Co/G + o, y...] =
    sum over c, k... of lhs[n, g*Ci/G + c, y*s + k*d - lo...] * rhs[g*Co/G + o, c, k...]``,
    the taps that land on padding guarded away (not work).

    An input dilation ``D`` (``lhs_dilation``: a transposed convolution, ``conv_transpose``)
    reads the input at dilated position ``m = y*s + k*d - lo`` only where ``D`` divides
    it. Outputs and taps split into residue classes ``y = D*yq + yr``, ``k = D*kq + kr``:
    in class ``yr`` only the taps ``kr`` with ``yr*s + kr*d - lo = 0 (mod D)`` land on an
    input element (one ``kr`` when ``d`` and ``D`` are coprime), ``x[s*yq + d*kq + c]``
    with ``c = (yr*s + kr*d - lo) / D``: one kernel per class (per combination of the
    spatial dimensions' classes), each writing its own outputs, the zeros between the
    input elements never multiplied.

    Batch groups ``G`` (``batch_group_count``: what JAX's transposition emits for the
    kernel gradient of a grouped convolution) split the input's batch instead of its
    features: ``out[n, g*Co/G + o, y...] = sum over c, k... of lhs[g*N/G + n, c, ...] *
    rhs[g*Co/G + o, c, k...]``, the output batch ``N/G``."""
    lhs, rhs = _as_view(ctx, ctx.args[0]), _as_view(ctx, ctx.args[1])
    p = ctx.params
    dn = p["dimension_numbers"]
    ls, rs, os_ = dn.lhs_spec, dn.rhs_spec, dn.out_spec
    Gb = int(p["batch_group_count"])
    G = int(p["feature_group_count"]) * Gb         # XLA allows one of the two above 1
    out = ctx.output()
    nsp = len(ls) - 2
    n = out.shape[os_[0]]
    co = out.shape[os_[1]]
    ci_g = rhs.shape[rs[1]]
    sp_out = [out.shape[os_[2 + i]] for i in range(nsp)]
    ksz = [rhs.shape[rs[2 + i]] for i in range(nsp)]
    D = [int(x) for x in (p["lhs_dilation"] or [1] * nsp)]
    S, R = p["window_strides"], p["rhs_dilation"]
    if any(Di > 1 and math.gcd(R[i], Di) != 1 for i, Di in enumerate(D)):
        raise JaxLoweringError("an input dilation sharing a factor with the kernel dilation")
    # per spatial dimension, its classes: (yr, kr or None when no tap lands, c)
    classes = []
    for i in range(nsp):
        Di, s, d, lo = D[i], S[i], R[i], p["padding"][i][0]
        cl = []
        for yr in range(min(Di, sp_out[i])):
            kr = next((k for k in range(Di) if (yr * s + k * d - lo) % Di == 0), None)
            if kr is not None and kr >= ksz[i]:
                kr = None
            cl.append((yr, kr, None if kr is None else (yr * s + kr * d - lo) // Di))
        classes.append(cl)
    V = Aff.var
    import itertools
    for combo in itertools.product(*classes):
        ydims = [(f"y{i}", -(-(sp_out[i] - yr) // D[i])) for i, (yr, _, _) in enumerate(combo)]
        li, ri, oi = [None] * lhs.ndim, [None] * rhs.ndim, [None] * out.ndim
        oi[os_[0]] = V("d0")
        oi[os_[1]] = V("g") * (co // G) + V("o")
        for i, (yr, _, _) in enumerate(combo):
            oi[os_[2 + i]] = V(f"y{i}") * D[i] + yr
        lead = [("d0", n), ("g", G), ("o", co // G)]
        if any(kr is None for _, kr, _ in combo):
            # no tap of this class lands on an input element: zeros
            ctx.emit(out, lead + ydims, oi, Const(0.0))
            continue
        kdims = [(f"k{i}", -(-(ksz[i] - kr) // D[i])) for i, (_, kr, _) in enumerate(combo)]
        # batch groups (the kernel gradient of a grouped convolution): output feature
        # group g reads the input's batch group g, lhs batch g*(N/G) + n
        li[ls[0]] = V("g") * n + V("d0") if Gb > 1 else V("d0")
        ri[rs[0]] = V("g") * (co // G) + V("o")
        li[ls[1]] = V("c") if Gb > 1 else V("g") * ci_g + V("c")
        ri[rs[1]] = V("c")
        guard = []
        for i, (yr, kr, c) in enumerate(combo):
            e = _window_index(V(f"y{i}"), V(f"k{i}"), S[i], R[i], -c)
            li[ls[2 + i]] = e
            ri[rs[2 + i]] = V(f"k{i}") * D[i] + kr
            size = lhs.shape[ls[2 + i]]
            lo_b, hi_b = e.bounds({f"y{i}": ydims[i][1], f"k{i}": kdims[i][1]})
            if lo_b < 0 or hi_b >= size:
                guard.append(Atom(e, 0, size))
        body = Call("mul", (ctx.load(lhs, li), ctx.load(rhs, ri)))
        ctx.emit(out, lead + ydims + [("c", ci_g)] + kdims, oi, body, reduce="sum",
                 unit="" if _exact(ctx) else "conv", guard=tuple(guard))
    ctx.bind(out)


def _reduce_window(op: str, identity):
    def fn(ctx: Ctx) -> None:
        x = _as_view(ctx, ctx.args[0])
        p = ctx.params
        if any(d != 1 for d in p["base_dilation"]):
            raise JaxLoweringError("reduce_window with base dilation")
        out = ctx.output()
        dims = [(f"d{i}", n) for i, n in enumerate(out.shape)] + \
            [(f"w{i}", w) for i, w in enumerate(p["window_dimensions"])]
        xi, guard = [], []
        for i in range(x.ndim):
            e = Aff.var(f"d{i}") * p["window_strides"][i] \
                + Aff.var(f"w{i}") * p["window_dilation"][i] - p["padding"][i][0]
            xi.append(e)
            lo, hi = e.bounds({f"d{i}": out.shape[i], f"w{i}": p["window_dimensions"][i]})
            if lo < 0 or hi >= x.shape[i]:
                guard.append(Atom(e, 0, x.shape[i]))
        ctx.emit(out, dims, [Aff.var(f"d{i}") for i in range(out.ndim)], ctx.load(x, xi),
                 reduce=op, guard=tuple(guard))
        ctx.bind(out)
    return fn


@rule("select_and_scatter_add")
def select_and_scatter_add(ctx: Ctx) -> None:
    """The gradient of a max (``select_prim`` ``ge``) or min (``le``) window reduction:
    ``out`` is zero, and each source element ``src[y]`` is added at the operand element
    its window selects, the first maximum (minimum) in window order as XLA's select keeps
    the current choice when ``ge`` holds; taps on padding are never selected. Three
    steps: an arg-max (arg-min) over each window (one comparison per tap on the operand,
    the forward pool's work), per windowed dimension the selected element's coordinate
    ``y*s - lo + digit`` (a ``floordiv`` and/or ``mod`` of the window position and an
    ``add`` per source element), and a scatter-add of the source into the zeroed output
    (one add per source element)."""
    src, x = _as_view(ctx, ctx.args[0]), _as_view(ctx, ctx.args[1])
    p = ctx.params
    name = getattr(p["select_prim"], "name", str(p["select_prim"]))
    if name not in ("ge", "le"):
        raise JaxLoweringError(f"select_and_scatter_add selecting with {name}")
    win = [int(w) for w in p["window_dimensions"]]
    st = [int(s) for s in p["window_strides"]]
    lo = [int(a) for a, _ in p["padding"]]
    # the selected tap: flat position in the window of its windowed (size > 1) dimensions
    wd = [i for i, w in enumerate(win) if w > 1]
    sel = ctx.low.new_base("select_pos", src.shape, "i64")
    dims = [(f"d{i}", n) for i, n in enumerate(src.shape)] + [(f"w{i}", win[i]) for i in wd]
    xi, guard = [], []
    ext = dict(dims)
    for i in range(x.ndim):
        e = Aff.var(f"d{i}") * st[i] - lo[i] + (Aff.var(f"w{i}") if i in wd else 0)
        xi.append(e)
        a, b = e.bounds(ext)
        if a < 0 or b >= x.shape[i]:
            guard.append(Atom(e, 0, x.shape[i]))
    ctx.emit(sel, dims, _vars(dims[:src.ndim]), ctx.load(x, xi),
             reduce="argmax" if name == "ge" else "argmin", guard=tuple(guard))
    # the selected element's coordinate in each windowed dimension
    sdims = _dims(src.shape)
    sv = _vars(sdims)
    oi = []
    for i in range(x.ndim):
        base = sv[i] * st[i] - lo[i]
        if i not in wd:
            oi.append(base)
            continue
        inner = math.prod(win[j] for j in wd if j > i)
        digit = ctx.load(sel, sv)
        if inner > 1:
            digit = Call("floordiv", (digit, Const(inner)))
        if i != wd[0]:
            digit = Call("mod", (digit, Const(win[i])))
        pos = ctx.low.new_base(f"select_coord{i}", src.shape, "i64")
        ctx.emit(pos, sdims, sv, Call("add", (Idx(base), digit)))
        oi.append(ctx.load(pos, sv))
    out = ctx.output()
    odims = _dims(out.shape)
    ctx.emit(out, odims, _vars(odims), Const(0.0))
    ctx.low.add_kernel(Kernel(name=ctx.low.kernel_name(), dims=tuple(sdims), out=out.base,
                              out_index=tuple(oi), body=ctx.load(src, sv), reduce="sum"))
    ctx.bind(out)


rule("reduce_window_max")(_reduce_window("max", None))
rule("reduce_window_min")(_reduce_window("min", None))
rule("reduce_window_sum")(_reduce_window("sum", 0))


@rule("split")
def split(ctx: Ctx) -> None:
    """``split(x, sizes, axis)``: consecutive slices along ``axis`` (views)."""
    x = _as_view(ctx, ctx.args[0])
    axis, pos, outs = ctx.params["axis"], 0, []
    for n in ctx.params["sizes"]:
        shape = list(x.shape)
        shape[axis] = n
        outs.append(JView(x.base, tuple(shape), x.strides, x.offset + pos * x.strides[axis],
                          x.dtype))
        pos += n
    ctx.bind(*outs)


# --- gathers, dynamic slices ----------------------------------------------------------

def _indexed_coords(ctx: Ctx, ndim: int, ind: JView, batch: list, window, index_map,
                    inserted) -> list:
    """Operand coordinates of a gather or a scatter: a dimension in ``index_map`` is read
    from the index tensor at the batch position (its component ``m``: an indirect index),
    an inserted (collapsed) one is 0, the others walk the window."""
    coords = []
    for d in range(ndim):
        if d in index_map:
            m = index_map.index(d)
            coords.append(ctx.load(ind, batch + [Aff.lit(m)]) if ind.ndim == len(batch) + 1
                          else ctx.load(ind, batch))
        elif d in inserted:
            coords.append(Aff.lit(0))
        else:
            coords.append(next(window))
    return coords


@rule("gather")
def gather(ctx: Ctx) -> None:
    """``gather`` in the modes jnp indexing, ``take``, ``take_along_axis`` and vmapped
    dynamic slices emit. Per operand dimension: a batching dimension follows its paired
    index batch dimension; an indexed (start-mapped) one is read through the index tensor,
    one element when collapsed, or a window from a run-time start (coordinates from a small
    index tensor ``clamp(start) + w``, clamped as JAX clamps); any other dimension is
    walked by the window from 0. Collapsed indices are assumed in bounds."""
    x, ind = _as_view(ctx, ctx.args[0]), _as_view(ctx, ctx.args[1])
    dn = ctx.params["dimension_numbers"]
    sizes = [int(n) for n in ctx.params["slice_sizes"]]
    out = ctx.output()
    dims = _dims(out.shape)
    ov = _vars(dims)
    offset_dims = [int(d) for d in dn.offset_dims]
    batch_pos = [i for i in range(out.ndim) if i not in offset_dims]
    bvars = [ov[i] for i in batch_pos]
    window = iter(ov[i] for i in offset_dims)
    smap = [int(d) for d in dn.start_index_map]
    collapsed = {int(d) for d in dn.collapsed_slice_dims}
    obatch = [int(d) for d in dn.operand_batching_dims]
    ibatch = [int(d) for d in dn.start_indices_batching_dims]
    vec = ind.ndim == len(bvars) + 1            # a trailing index-vector dimension

    def start(m):
        return ctx.load(ind, bvars + [Aff.lit(m)]) if vec else ctx.load(ind, bvars)
    if not x.is_full(ctx.low.tensors[x.base].shape):
        x = ctx.low._copy(x, "gather_src")
    xi = []
    for d in range(x.ndim):
        if d in obatch:
            xi.append(bvars[ibatch[obatch.index(d)]])
        elif d in smap and d in collapsed:
            xi.append(start(smap.index(d)))
        elif d in smap:
            w = next(window)
            k, n = sizes[d], x.shape[d]
            # the window's coordinates: one per (batch point, window offset)
            bshape = [ctx.eqn.outvars[0].aval.shape[i] for i in batch_pos]
            m = smap.index(d)
            pos = _window_coords(ctx, bshape, lambda b, m=m: ctx.load(ind, b + [Aff.lit(m)])
                                if vec else ctx.load(ind, b), n, k)
            xi.append(ctx.load(pos, bvars + [w]))
        elif d in collapsed:
            xi.append(Aff.lit(0))
        else:
            xi.append(next(window))
    ctx.emit(out, dims, ov, Access(x.base, tuple(xi)))
    ctx.bind(out)


def _static_starts(ctx: Ctx, starts) -> list[int]:
    vals = []
    for s in starts:
        if isinstance(s, JView):
            raise JaxLoweringError("a dynamic slice at a position known only at run time")
        vals.append(int(s))
    return vals


def _window_coords(ctx: Ctx, lead: list[int], start, n: int, k: int) -> JView:
    """A small index tensor ``[*lead, k]`` of the coordinates of a window of ``k`` at a
    run-time start, clamped as JAX clamps it: ``clamp(start(lead vars), 0, n - k) + w``
    (``start`` maps the leading loop variables to the start's expression)."""
    pos = ctx.low.new_base("window_index", tuple(lead) + (k,), "i64")
    pd = [(f"d{i}", int(nb)) for i, nb in enumerate(lead)] + [("w", k)]
    pv = _vars(pd)
    clamped = Call("minimum", (Call("maximum", (start(pv[:-1]), Const(0))), Const(n - k)))
    ctx.emit(pos, pd, pv, Call("add", (Call("to_i64", (clamped,)), Idx(Aff.var("w")))))
    return pos


def _runtime_index(ctx: Ctx, starts, sizes, extents, dvars: list) -> list | None:
    """The operand index of a dynamic slice (or update) at ``dvars``: a static start is an
    offset (clamped as JAX clamps it); a run-time start of a one-wide window (a decode
    step's cache row) is read from its tensor (an indirect index); a wider window (a
    prefill chunk) reads its coordinates from a small index tensor ``clamp(start) + v``,
    computed first. ``None`` for a start that is not a scalar."""
    entries = []
    for s, k, n, v in zip(starts, sizes, extents, dvars):
        if not isinstance(s, JView):
            entries.append(v + min(max(int(s), 0), n - k))
        elif s.ndim != 0:
            return None
        elif k == 1:
            entries.append(ctx.load(s, []))
        else:
            pos = _window_coords(ctx, [], lambda _, s=s: ctx.load(s, []), n, k)
            entries.append(ctx.load(pos, [v]))
    return entries


@rule("dynamic_slice")
def dynamic_slice(ctx: Ctx) -> None:
    """A slice at start indices the program knows (a view); run-time starts are named."""
    x = _as_view(ctx, ctx.args[0])
    sizes = ctx.params["slice_sizes"]
    if any(isinstance(s, JView) for s in ctx.args[1:]):
        if not x.is_full(ctx.low.tensors[x.base].shape):
            x = ctx.low._copy(x, "dslice_src")
        out = ctx.output()
        dims = _dims(out.shape)
        ov = _vars(dims)
        xi = _runtime_index(ctx, ctx.args[1:], sizes, x.shape, ov)
        if xi is None:
            raise JaxLoweringError("a dynamic slice at a start that is not a scalar")
        ctx.emit(out, dims, ov, Access(x.base, tuple(xi)))
        ctx.bind(out)
        return
    starts = _static_starts(ctx, ctx.args[1:])
    starts = [min(max(s, 0), n - k) for s, n, k in zip(starts, x.shape, sizes)]   # JAX clamps
    off = x.offset + sum(s * st for s, st in zip(starts, x.strides))
    _view(ctx, x, sizes, x.strides, off)


@rule("dynamic_update_slice")
def dynamic_update_slice(ctx: Ctx) -> None:
    """``cache.at[...].set(update)`` at a known position: a copy of the operand (in the
    operator) and the update written into its region (a KV-cache write)."""
    x, upd = _as_view(ctx, ctx.args[0]), ctx.args[1]
    if any(isinstance(s, JView) for s in ctx.args[2:]):
        # a row at a run-time position (a KV cache written at the decode position): a
        # scatter into a copy of the operand
        upd = _as_view(ctx, upd)
        var = ctx.eqn.invars[0]
        base = ctx.low.tensors[x.base]
        if ctx.low.read_vars.get(var, 0) == 1 and x.is_full(base.shape) \
                and base.role in ("input", "intermediate") and ctx.low.loop is None:
            out = x          # the old value is read nowhere else: updated in place
        else:
            out = ctx.output()
            ctx.low._copy_into(x, out)
        dims = _dims(upd.shape)
        uv = _vars(dims)
        oi = _runtime_index(ctx, ctx.args[2:], upd.shape, x.shape, uv)
        if oi is None:
            raise JaxLoweringError("an update at a start that is not a scalar")
        ctx.low.add_kernel(Kernel(name=ctx.low.kernel_name(), dims=tuple(dims), out=out.base,
                                  out_index=tuple(oi), body=ctx.load(upd, uv)))
        ctx.bind(out)
        return
    starts = _static_starts(ctx, ctx.args[2:])
    out = ctx.output()
    ctx.low._copy_into(x, out)
    upd = _as_view(ctx, upd)
    starts = [min(max(s, 0), n - k) for s, n, k in zip(starts, x.shape, upd.shape)]
    off = sum(s * st for s, st in zip(starts, out.strides))
    region = JView(out.base, upd.shape, out.strides, off, out.dtype)
    ctx.low._copy_into(upd, region)
    ctx.bind(out)


# lax.FftType: the library routine's kind, direction and normalization (JAX's inverse
# transforms divide by n, ``norm`` 2 as the routine's PyTorch convention numbers it)
_FFT = {"FFT": ("c2c", True, 0), "IFFT": ("c2c", False, 2), "RFFT": ("r2c", True, 0),
        "IRFFT": ("c2r", False, 2)}


@rule("fft")
def fft(ctx: Ctx) -> None:
    """``lax.fft`` over the trailing ``len(fft_lengths)`` dimensions: the library FFT
    (``5 N log2 N`` FLOPs per complex transform, half for a real input or output)."""
    x = _as_view(ctx, ctx.args[0])
    if not x.is_full(ctx.low.tensors[x.base].shape):
        x = ctx.low._copy(x, "fft_src")
    lengths = [int(n) for n in ctx.params["fft_lengths"]]
    kind, forward, norm = _FFT[getattr(ctx.params["fft_type"], "name", "")]
    params = {"kind": kind, "dims": tuple(range(x.ndim - len(lengths), x.ndim)),
              "norm": norm, "forward": forward}
    if kind == "r2c":
        params["onesided"] = True
    if kind == "c2r":
        params["last_size"] = lengths[-1]
    out = ctx.output()
    dims = _dims(out.shape)
    ops_dims = [(f"a0_{i}", n) for i, n in enumerate(x.shape)]
    ctx.emit_library(out, dims + ops_dims, _vars(dims), ctx.load(x, _vars(ops_dims)),
                     ("fft", tuple(params.items())))
    ctx.bind(out)


@rule("sort")
def sort(ctx: Ctx) -> None:
    """``lax.sort`` along ``dimension`` with one key: a library sort (n ceil(log2 n)
    comparisons per row, charged once); further operands (``argsort``'s iota) are permuted
    along with the key, a gather through the sort's indices."""
    if ctx.params.get("num_keys", 1) != 1:
        raise JaxLoweringError("sort with several keys")
    ops = [_as_view(ctx, a) for a in ctx.args]
    key = ops[0]
    if not key.is_full(ctx.low.tensors[key.base].shape):
        key = ctx.low._copy(key, "sort_key")
    dim = ctx.params["dimension"] % key.ndim
    used = [i for i, v in enumerate(ctx.eqn.outvars) if v in ctx.low.read_vars]
    outs = [None] * len(ops)
    dims = _dims(key.shape)
    ops_dims = [(f"a0_{i}", n) for i, n in enumerate(key.shape)]
    kidx = [Aff.var(d) for d, _ in ops_dims]
    first = True

    def routine(out, output):
        nonlocal first
        params = (("dim", dim), ("descending", False), ("output", output), ("cost", first))
        ctx.emit_library(out, dims + ops_dims, _vars(dims), ctx.load(key, kidx), ("sort", params))
        first = False
    if 0 in used:
        outs[0] = ctx.output(0)
        routine(outs[0], 0)
    if any(i > 0 for i in used):
        order = ctx.low.new_base("sort_order", key.shape, "i64")
        routine(order, 1)
        for i in range(1, len(ops)):
            if i not in used:
                continue
            src = ops[i]
            if not src.is_full(ctx.low.tensors[src.base].shape):
                src = ctx.low._copy(src, "sort_payload")
            outs[i] = ctx.output(i)
            idx = _vars(dims)
            xi = list(idx)
            xi[dim] = ctx.load(order, idx)
            ctx.emit(outs[i], dims, idx, Access(src.base, tuple(xi)))
    ctx.bind(*outs)


def _scatter(combine):
    def fn(ctx: Ctx) -> None:
        """``x.at[idx].set/add/max/min(v)`` as jnp emits it, vmapped updates (operand
        batching dimensions) and windows at run-time starts (a vmapped
        ``dynamic_update_slice``, its start clamped as JAX clamps it): a scatter kernel
        writes (or combines) every update element into a copy of the operand (indices of
        single elements assumed in bounds)."""
        x, ind, upd = (_as_view(ctx, a) if isinstance(a, JView) else a for a in ctx.args[:3])
        dn = ctx.params["dimension_numbers"]
        out = ctx.output()
        ctx.low._copy_into(x, out)
        if not isinstance(upd, JView):
            upd_shape = tuple(ctx.eqn.invars[2].aval.shape)
        else:
            upd_shape = upd.shape
        dims = _dims(upd_shape)
        uv = _vars(dims)
        wdims = [int(i) for i in dn.update_window_dims]
        bpos = [i for i in range(len(upd_shape)) if i not in wdims]
        batch = [uv[i] for i in bpos]
        smap = [int(d) for d in dn.scatter_dims_to_operand_dims]
        inserted = {int(d) for d in dn.inserted_window_dims}
        obatch = [int(d) for d in dn.operand_batching_dims]
        ibatch = [int(d) for d in dn.scatter_indices_batching_dims]
        vec = ind.ndim == len(batch) + 1            # a trailing index-vector dimension

        def start(b, m):
            return ctx.load(ind, b + [Aff.lit(m)]) if vec else ctx.load(ind, b)
        # per operand dimension: a batching dimension follows its paired index dimension
        # (a vmapped update); an inserted one is one element at an index read from the
        # index tensor; a window at a run-time start (a vmapped dynamic_update_slice: a
        # KV-cache row per sequence) walks clamp(start) + w; any other is the window from 0
        window = iter(zip(wdims, (uv[i] for i in wdims)))
        oi = []
        for d in range(out.ndim):
            if d in obatch:
                oi.append(batch[ibatch[obatch.index(d)]])
            elif d in smap and d in inserted:
                oi.append(start(batch, smap.index(d)))
            elif d in inserted:
                oi.append(Aff.lit(0))
            elif d in smap:
                wi, w = next(window)
                pos = _window_coords(ctx, [upd_shape[i] for i in bpos],
                                     lambda b, m=smap.index(d): start(b, m), out.shape[d],
                                     upd_shape[wi])
                oi.append(ctx.load(pos, batch + [w]))
            else:
                oi.append(next(window)[1])
        body = ctx.load(upd, uv) if isinstance(upd, JView) else Const(upd)
        k_dims = tuple((d, n) for d, n in dims)
        k = Kernel(name=ctx.low.kernel_name(), dims=k_dims, out=out.base, out_index=tuple(oi),
                   body=body, reduce=combine)
        ctx.low.add_kernel(k)
        ctx.bind(out)
    return fn


rule("scatter")(_scatter(None))
rule("scatter-add", "scatter_add")(_scatter("sum"))
rule("scatter-mul", "scatter_mul")(_scatter("prod"))
rule("scatter-max", "scatter_max")(_scatter("max"))
rule("scatter-min", "scatter_min")(_scatter("min"))


# --- collectives inside shard_map (ir/collectives.py) -----------------------------------

def _group(ctx: Ctx, names) -> tuple[int, tuple[int, ...]]:
    """(size, global ranks of rank 0's group) of a collective over mesh ``names``; ranks
    number the mesh's devices row-major over its axes."""
    mesh = ctx.low.mesh
    if not mesh:
        raise JaxLoweringError("a collective outside shard_map (pmap and named axes of vmap "
                               "are not modelled)")
    names = tuple(names) if isinstance(names, (tuple, list)) else (names,)
    unknown = [n for n in names if str(n) not in mesh]
    if unknown:
        raise JaxLoweringError(f"axis {unknown[0]!r} is not an axis of the mesh "
                               f"({', '.join(mesh)})")
    if ctx.params.get("axis_index_groups") is not None:
        raise JaxLoweringError("axis_index_groups: only groups over whole mesh axes are modelled")
    axes = list(mesh.items())
    strides, acc = {}, 1
    for a, n in reversed(axes):
        strides[a] = acc
        acc *= n
    ranks = [0]
    for a in (str(n) for n in names):
        ranks = [r + i * strides[a] for r in ranks for i in range(mesh[a])]
    return len(ranks), tuple(sorted(ranks))


def _moved(ctx: Ctx, v: JView, shape: tuple, index) -> JView:
    """A fresh tensor of ``shape`` whose element at the loop variables ``d*`` is ``v`` at
    ``index(vars)`` (a copy in the collective's own operator)."""
    out = ctx.low.new_base("shard", tuple(int(n) for n in shape), ctx.low.tensors[v.base].dtype)
    dims = _dims(out.shape)
    ctx.emit(out, dims, _vars(dims), ctx.load(v, index(_vars(dims))))
    return out


def _front(ctx: Ctx, x: JView, dim: int, insert: bool = False) -> JView:
    """``x`` with dimension ``dim`` first (``insert``: a new leading dimension of 1)."""
    shape = tuple(x.shape)
    if insert:
        return _moved(ctx, x, (1,) + shape, lambda v: v[1:])
    if dim == 0 and x.is_full(ctx.low.tensors[x.base].shape):
        return x
    new = (shape[dim],) + shape[:dim] + shape[dim + 1:]
    return _moved(ctx, x, new, lambda v: v[1:dim + 1] + [v[0]] + v[dim + 1:])


def _back(ctx: Ctx, y: JView, dim: int) -> JView:
    """``y`` (its first dimension the moved one) with that dimension put back at ``dim``."""
    if dim == 0:
        return y
    shape = tuple(y.shape)
    new = shape[1:dim + 1] + (shape[0],) + shape[dim + 1:]
    return _moved(ctx, y, new, lambda v: [v[dim]] + v[:dim] + v[dim + 1:])


def _collective(ctx: Ctx, kind: str, x: JView, lead: int, params: dict) -> JView:
    """The collective on ``x`` (dimension 0 the one it works along) with a result whose
    first dimension is ``lead``."""
    from ...ir.collectives import check
    out = ctx.low.new_base(kind, (int(lead),) + tuple(x.shape[1:]),
                           ctx.low.tensors[x.base].dtype)
    why = check(kind, params, tuple(x.shape), tuple(out.shape))
    if why:
        raise JaxLoweringError(why)
    dims = _dims(out.shape)
    ops_dims = [(f"a0_{i}", n) for i, n in enumerate(x.shape)]
    ctx.emit_library(out, dims + ops_dims, _vars(dims), ctx.load(x, _vars(ops_dims)),
                     (kind, tuple({**params, "cost": True}.items())))
    return out


@rule("psum", "psum_invariant", "pmax", "pmin")
def psum(ctx: Ctx) -> None:
    """``lax.psum`` (``pmax``, ``pmin``) over mesh axes: an all-reduce of each operand."""
    n, group = _group(ctx, ctx.params.get("axes", ctx.params.get("axis_name", ())))
    op = {"pmax": "max", "pmin": "min"}.get(ctx.eqn.primitive.name, "sum")
    outs = []
    for a in ctx.args:
        x = _as_view(ctx, a)
        if not x.shape:
            x = _front(ctx, x, 0, insert=True)
            y = _collective(ctx, "all_reduce", x, 1, {"ranks": n, "group": group, "op": op})
            outs.append(_moved(ctx, y, (), lambda v: [0]))
            continue
        x = _front(ctx, x, 0)
        outs.append(_collective(ctx, "all_reduce", x, x.shape[0],
                                {"ranks": n, "group": group, "op": op}))
    ctx.bind(*outs)


@rule("all_gather")
def all_gather(ctx: Ctx) -> None:
    """``lax.all_gather`` along ``all_gather_dimension`` (tiled: concatenated along it;
    otherwise stacked on a new dimension there)."""
    n, group = _group(ctx, ctx.params["axis_name"])
    dim, tiled = int(ctx.params["all_gather_dimension"]), ctx.params.get("tiled", False)
    x = _as_view(ctx, ctx.args[0])
    if tiled:
        y = _collective(ctx, "all_gather", _front(ctx, x, dim), n * x.shape[dim],
                        {"ranks": n, "group": group})
    else:
        y = _collective(ctx, "all_gather", _front(ctx, x, dim, insert=True), n,
                        {"ranks": n, "group": group})
    ctx.bind(_back(ctx, y, dim))


@rule("reduce_scatter")
def reduce_scatter(ctx: Ctx) -> None:
    """``lax.psum_scatter`` along ``scatter_dimension`` (tiled: that dimension split in
    ``n`` blocks; otherwise its size is ``n`` and it disappears)."""
    n, group = _group(ctx, ctx.params["axis_name"])
    dim, tiled = int(ctx.params["scatter_dimension"]), ctx.params.get("tiled", False)
    x = _as_view(ctx, ctx.args[0])
    y = _collective(ctx, "reduce_scatter", _front(ctx, x, dim), x.shape[dim] // n,
                    {"ranks": n, "group": group, "op": "sum"})
    if tiled:
        ctx.bind(_back(ctx, y, dim))
    else:                                  # y is (1, ...): drop that dimension
        ctx.bind(_moved(ctx, y, tuple(y.shape[1:]), lambda v: [0] + v))


@rule("all_to_all")
def all_to_all(ctx: Ctx) -> None:
    """``lax.all_to_all`` with ``split_axis == concat_axis`` (tiled): block ``j`` of every
    rank's operand goes to rank ``j``."""
    n, group = _group(ctx, ctx.params["axis_name"])
    split, concat = int(ctx.params["split_axis"]), int(ctx.params["concat_axis"])
    if split != concat or not ctx.params.get("tiled", False):
        raise JaxLoweringError("all_to_all with split_axis != concat_axis or untiled: only "
                               "the tiled exchange along one axis is modelled")
    x = _as_view(ctx, ctx.args[0])
    y = _collective(ctx, "all_to_all", _front(ctx, x, split), x.shape[split],
                    {"ranks": n, "group": group})
    ctx.bind(_back(ctx, y, split))


@rule("ppermute")
def ppermute(ctx: Ctx) -> None:
    """``lax.ppermute``: each rank sends its operand to one other and receives one (pairs
    ``(source, destination)`` over positions along the axis)."""
    names = ctx.params["axis_name"]
    names = tuple(names) if isinstance(names, (tuple, list)) else (names,)
    if len(names) != 1:
        raise JaxLoweringError("ppermute over several mesh axes")
    n, group = _group(ctx, names)
    perm = tuple((int(a), int(b)) for a, b in ctx.params["perm"])
    outs = []
    for a in ctx.args:
        x = _as_view(ctx, a)
        if not x.shape:
            raise JaxLoweringError("ppermute of a scalar")
        x = _front(ctx, x, 0)
        outs.append(_collective(ctx, "permute", x, x.shape[0],
                                {"ranks": n, "group": group, "perm": perm}))
    ctx.bind(*outs)


@rule("pvary", "pbroadcast")
def pvary(ctx: Ctx) -> None:
    """``pvary``: shard_map's type-level mark that a value varies over mesh axes
    (``check_vma``); the value itself is unchanged."""
    ctx.bind(*ctx.args)
