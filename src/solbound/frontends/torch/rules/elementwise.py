"""Elementwise operators: one map kernel each, with broadcasting.

Each formula below is the scalar algorithm of the operator; its FLOPs are the
scalar ops it names (e.g. exact GELU = 0.5*x*(1+erf(x/sqrt 2)): 4 vector ops
and one special function).
"""

from __future__ import annotations

import math

from ....ir.model import Call, Const
from ..lower import OpCtx, rule
from ._util import C, add, elementwise, f, mul, sub


def _ew(*names: str, arity: int | None = None):
    """Register ``fn(ctx, *operand_exprs) -> body`` as an elementwise rule.

    Tensor operands are the positional args up to ``arity``; the rest are
    options the formula reads from ``ctx``.
    """
    def deco(fn):
        def lower(ctx: OpCtx) -> None:
            n = arity if arity is not None else len(ctx.args)
            ops = list(ctx.args[:n])
            ctx.bind(elementwise(ctx, lambda *xs: fn(ctx, *xs), ops))
        lower.rule_id = names[0]
        rule(*names)(lower)
        return fn
    return deco


def _arg(ctx: OpCtx, i: int, name: str, default=None):
    if len(ctx.args) > i:
        return ctx.args[i]
    return ctx.kwargs.get(name, default)


# --- binary arithmetic -------------------------------------------------------

@_ew("aten.add.Tensor", "aten.add.Scalar", arity=2)
def _add(ctx, a, b):
    alpha = ctx.kwargs.get("alpha", 1)
    return add(a, mul(b, C(alpha)))


@_ew("aten.sub.Tensor", "aten.sub.Scalar", "aten.rsub.Scalar", "aten.rsub.Tensor", arity=2)
def _sub(ctx, a, b):
    alpha = ctx.kwargs.get("alpha", 1)
    if "rsub" in str(ctx.node.target):
        a, b = b, a
        return sub(a, mul(b, C(alpha)))
    return sub(a, mul(b, C(alpha)))


@_ew("aten.mul.Tensor", "aten.mul.Scalar", arity=2)
def _mul(ctx, a, b):
    return f("mul", a, b)


@_ew("aten.div.Tensor", "aten.div.Scalar", "aten.div.Tensor_mode", "aten.div.Scalar_mode", arity=2)
def _div(ctx, a, b):
    mode = ctx.kwargs.get("rounding_mode")
    q = f("div", a, b)
    if mode == "floor":
        return f("floor", q)
    if mode == "trunc":
        return f("trunc", q)
    return q


@_ew("aten.remainder.Tensor", "aten.remainder.Scalar", arity=2)
def _remainder(ctx, a, b):
    return f("mod", a, b)


@_ew("aten.fmod.Tensor", "aten.fmod.Scalar", arity=2)
def _fmod(ctx, a, b):
    return sub(a, mul(f("trunc", f("div", a, b)), b))


@_ew("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow.Scalar", arity=2)
def _pow(ctx, a, b):
    if isinstance(b, Const) and b.value == 2:
        return f("mul", a, a)
    if isinstance(b, Const) and b.value == 1:
        return a
    if isinstance(b, Const) and b.value == 0.5:
        return f("sqrt", a)
    if isinstance(b, Const) and b.value == -1:
        return f("recip", a)
    return f("pow", a, b)


@_ew("aten.maximum", "aten.fmax", arity=2)
def _maximum(ctx, a, b):
    return f("maximum", a, b)


@_ew("aten.minimum", "aten.fmin", arity=2)
def _minimum(ctx, a, b):
    return f("minimum", a, b)


@_ew("aten.atan2", arity=2)
def _atan2(ctx, a, b):
    # atan(a/b), shifted by +-pi in the left half-plane
    shift = f("select", f("lt", b, C(0.0)),
              f("select", f("ge", a, C(0.0)), C(math.pi), C(-math.pi)), C(0.0))
    return add(f("atan", f("div", a, b)), shift)


@_ew("aten.copysign", arity=2)
def _copysign(ctx, a, b):
    # |a| with b's sign: a select on b < 0 (a negative zero in b counts as positive here,
    # where copysign reads its sign bit)
    m = f("abs", a)
    return f("select", f("lt", b, C(0.0)), f("neg", m), m)


for _name, _op in (("eq", "eq"), ("ne", "ne"), ("lt", "lt"), ("le", "le"), ("gt", "gt"),
                   ("ge", "ge")):
    _ew(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar", arity=2)(
        lambda ctx, a, b, _op=_op: f(_op, a, b))

for _name, _op in (("logical_and", "and"), ("logical_or", "or"), ("logical_xor", "xor"),
                   ("bitwise_and", "and"), ("bitwise_or", "or"), ("bitwise_xor", "xor")):
    _ew(f"aten.{_name}", arity=2)(lambda ctx, a, b, _op=_op: f(_op, a, b))


# shifts of integer tensors (unpacking packed 4-bit weights: ``(q >> 4) & 0xF``): one vector
# op each, as any integer arithmetic
for _name, _op in (("__rshift__", "shr"), ("bitwise_right_shift", "shr"),
                   ("__lshift__", "shl"), ("bitwise_left_shift", "shl")):
    _ew(f"aten.{_name}", arity=2)(lambda ctx, a, b, _op=_op: f(_op, a, b))


@_ew("aten.logical_not", "aten.bitwise_not", arity=1)
def _not(ctx, a):
    return f("not", a)


@_ew("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar",
     arity=3)
def _where(ctx, c, a, b):
    return f("select", c, a, b)


# --- unary ------------------------------------------------------------------------

for _name, _op in (("exp", "exp"), ("exp2", "exp2"), ("log", "log"), ("log2", "log2"),
                   ("log1p", "log1p"), ("expm1", "expm1"), ("tanh", "tanh"), ("erf", "erf"),
                   ("sqrt", "sqrt"), ("rsqrt", "rsqrt"), ("sigmoid", "sigmoid"), ("sin", "sin"),
                   ("cos", "cos"), ("abs", "abs"), ("neg", "neg"), ("floor", "floor"),
                   ("ceil", "ceil"), ("round", "round"), ("trunc", "trunc"), ("sign", "sign"),
                   ("reciprocal", "recip"), ("atan", "atan"), ("erfinv", "erfinv"),
                   ("acos", "acos"), ("asin", "asin"),
                   ("isnan", "isnan")):
    _ew(f"aten.{_name}", arity=1)(lambda ctx, a, _op=_op: f(_op, a))


@_ew("aten.log10", arity=1)
def _log10(ctx, a):
    return mul(f("log", a), C(1.0 / math.log(10.0)))


@_ew("aten.relu", arity=1)
def _relu(ctx, a):
    return f("maximum", a, C(0.0))


@_ew("aten.gelu", arity=1)
def _gelu(ctx, a):
    if ctx.kwargs.get("approximate", "none") == "tanh":
        inner = mul(C(math.sqrt(2.0 / math.pi)),
                    add(a, mul(C(0.044715), mul(a, mul(a, a)))))
        return mul(mul(C(0.5), a), add(C(1.0), f("tanh", inner)))
    return mul(mul(C(0.5), a), add(C(1.0), f("erf", mul(a, C(1.0 / math.sqrt(2.0))))))


@_ew("aten.elu", arity=1)
def _elu(ctx, a):
    alpha = _arg(ctx, 1, "alpha", 1.0)
    scale = _arg(ctx, 2, "scale", 1.0)
    in_scale = _arg(ctx, 3, "input_scale", 1.0)
    neg = mul(C(alpha * scale), f("expm1", mul(a, C(in_scale))))
    return f("select", f("gt", a, C(0.0)), mul(a, C(scale)), neg)


@_ew("aten.hardtanh", arity=1)
def _hardtanh(ctx, a):
    lo, hi = _arg(ctx, 1, "min_val", -1.0), _arg(ctx, 2, "max_val", 1.0)
    return f("minimum", f("maximum", a, C(lo)), C(hi))


@rule("aten.clamp", "aten.clamp.Tensor")
def _clamp(ctx: OpCtx) -> None:
    """max(x, lo) then min(., hi); bounds may be numbers or tensors (broadcast)."""
    lo, hi = _arg(ctx, 1, "min", None), _arg(ctx, 2, "max", None)
    ops = [ctx.args[0]] + [b for b in (lo, hi) if b is not None]

    def body(a, *bs):
        it = iter(bs)
        out = a
        if lo is not None:
            out = f("maximum", out, next(it))
        if hi is not None:
            out = f("minimum", out, next(it))
        return out
    ctx.bind(elementwise(ctx, body, ops))


@_ew("aten.leaky_relu", arity=1)
def _leaky(ctx, a):
    slope = _arg(ctx, 1, "negative_slope", 0.01)
    return f("select", f("gt", a, C(0.0)), a, mul(a, C(slope)))


# --- copies and casts -----------------------------------------------------------------

@_ew("aten.clone", "aten.contiguous", "aten.lift_fresh_copy", "aten.alias_copy.default",
     "aten.detach_copy", arity=1)
def _clone(ctx, a):
    return a


@_ew("aten._to_copy", "aten.to.dtype", "aten._to_dtype", arity=1)
def _to_copy(ctx, a):
    return Call(f"to_{ctx.out_dtype}", (a,))



@rule("aten.copy")
def _copy(ctx: OpCtx) -> None:
    """copy(dst, src): dst's shape and dtype, src's values (broadcast). The copy of a
    collective's result back into the tensor it was called on (``dist.all_reduce(x)``
    traced functionally) is that result: the collective wrote in place."""
    src = ctx.node.args[1]
    if (getattr(src, "target", None) is not None
            and str(src.target).startswith("_c10d_functional.wait_tensor")
            and tuple(src.meta["val"].shape) == tuple(ctx.val.shape)
            and src.meta["val"].dtype == ctx.val.dtype):
        ctx.bind(ctx.args[1])
        return
    ctx.bind(elementwise(ctx, lambda v: Call(f"to_{ctx.out_dtype}", (v,)), [ctx.args[1]]))
