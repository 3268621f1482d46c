"""Recurrent layers (LSTM, GRU, Elman RNN) as a loop over time steps.

Per layer and direction: one contraction for the input projection of every
time step at once (``X W_ih^T``, as cuDNN does), then a sequential loop
(``for ts in range(T)``) whose body is the recurrent contraction
``h_{t-1} W_hh^T`` and the gate arithmetic. The body is analyzed once with the
step as an outer loop variable, so counts are the body's times the trip count,
exactly; nothing is unrolled. Hidden and cell states live in history tensors
``[T+1, B, H]`` (row 0 is the initial state).
"""

from __future__ import annotations

from ....ir.affine import Aff
from ..lower import KernelBuilder, LoweringError, OpCtx, View, rule
from ._util import C, add, f, mul, sub

GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


def _v(name: str) -> Aff:
    return Aff.var(name)


def _kernel(ctx: OpCtx, dims: list[tuple[str, int]]) -> KernelBuilder:
    return KernelBuilder(ctx.low, dims)


def _rnn(ctx: OpCtx, kind: str) -> None:
    (x, hx, params, has_bias, num_layers, dropout, train, bidirectional,
     batch_first) = ctx.args[:9]
    if train and dropout:
        raise LoweringError("dropout between recurrent layers in training mode")
    hx = list(hx) if isinstance(hx, (list, tuple)) else [hx]
    h0 = hx[0]
    c0 = hx[1] if kind == "lstm" else None
    ng = GATES[kind]
    nd = 2 if bidirectional else 1
    per = 4 if has_bias else 2
    if batch_first:
        bsz, steps = x.shape[0], x.shape[1]
    else:
        steps, bsz = x.shape[0], x.shape[1]
    hid = h0.shape[-1]
    outs = [ctx.output(i) for i in range(3 if kind == "lstm" else 2)]
    out, h_n = outs[0], outs[1]
    c_n = outs[2] if kind == "lstm" else None
    layer_in = x
    layer_in_bf = batch_first
    for layer in range(num_layers):
        last = layer == num_layers - 1
        y = out if last else ctx.new_tensor((steps, bsz, nd * hid), out.dtype,
                                            f"{ctx.node.name}_l{layer}")
        y_bf = batch_first if last else False
        for d in range(nd):
            base = (layer * nd + d) * per
            w_ih, w_hh = params[base], params[base + 1]
            b_ih, b_hh = (params[base + 2], params[base + 3]) if has_bias else (None, None)
            feat = layer_in.shape[-1]
            tag = f"{ctx.node.name}_l{layer}{'r' if d else ''}"
            # 1. input projection for all steps: xg[t, b, g] = sum_k x[t, b, k] w_ih[g, k] (+ biases)
            xg = ctx.new_tensor((steps, bsz, ng * hid), out.dtype, tag + "_xg")
            kb = _kernel(ctx, [("t", steps), ("b", bsz), ("g", ng * hid), ("k", feat)])
            xi = [_v("b"), _v("t"), _v("k")] if layer_in_bf else [_v("t"), _v("b"), _v("k")]
            ctx.emit(kb, xg, [_v("t"), _v("b"), _v("g")],
                     mul(kb.load(layer_in, xi), kb.load(w_ih, [_v("g"), _v("k")])),
                     reduce="sum", unit="matmul")
            if has_bias:
                xgb = ctx.new_tensor(xg.shape, out.dtype, tag + "_xgb")
                kb = _kernel(ctx, [("t", steps), ("b", bsz), ("g", ng * hid)])
                body = add(kb.load(xg, [_v("t"), _v("b"), _v("g")]), kb.load(b_ih, [_v("g")]))
                if kind != "gru":   # GRU keeps b_hh inside the reset gate
                    body = add(body, kb.load(b_hh, [_v("g")]))
                ctx.emit(kb, xgb, [_v("t"), _v("b"), _v("g")], body)
                xg = xgb
            # 2. state histories, row 0 = initial state
            hs = ctx.new_tensor((steps + 1, bsz, hid), out.dtype, tag + "_h")
            idx0 = layer * nd + d
            kb = _kernel(ctx, [("b", bsz), ("j", hid)])
            ctx.emit(kb, hs, [Aff.lit(0), _v("b"), _v("j")], kb.load(h0, [Aff.lit(idx0), _v("b"), _v("j")]))
            cs = None
            if kind == "lstm":
                cs = ctx.new_tensor((steps + 1, bsz, hid), out.dtype, tag + "_c")
                kb = _kernel(ctx, [("b", bsz), ("j", hid)])
                ctx.emit(kb, cs, [Aff.lit(0), _v("b"), _v("j")],
                         kb.load(c0, [Aff.lit(idx0), _v("b"), _v("j")]))
            # 3. the time loop
            loop = ctx.low.new_loop("ts", steps)
            t_of = (-_v("ts") + (steps - 1)) if d else _v("ts")     # reverse direction
            hg = ctx.new_tensor((bsz, ng * hid), out.dtype, tag + "_hg")
            kb = _kernel(ctx, [("b", bsz), ("g", ng * hid), ("k", hid)])
            ctx.emit(kb, hg, [_v("b"), _v("g")],
                     mul(kb.load(hs, [_v("ts"), _v("b"), _v("k")]), kb.load(w_hh, [_v("g"), _v("k")])),
                     reduce="sum", unit="matmul", loop=loop)
            kb = _kernel(ctx, [("b", bsz), ("j", hid)])

            def pre(gate: int, with_hh_bias: bool = False):
                xv = kb.load(xg, [t_of, _v("b"), _v("j") + gate * hid])
                hv = kb.load(hg, [_v("b"), _v("j") + gate * hid])
                if with_hh_bias and has_bias:
                    hv = add(hv, kb.load(b_hh, [_v("j") + gate * hid]))
                return xv, hv
            nxt = [_v("ts") + 1, _v("b"), _v("j")]
            if kind == "lstm":
                gi = f("sigmoid", add(*pre(0)))
                gf = f("sigmoid", add(*pre(1)))
                gg = f("tanh", add(*pre(2)))
                cprev = kb.load(cs, [_v("ts"), _v("b"), _v("j")])
                ctx.emit(kb, cs, nxt, add(mul(gf, cprev), mul(gi, gg)), loop=loop)
                kb = _kernel(ctx, [("b", bsz), ("j", hid)])
                go = f("sigmoid", add(*pre(3)))
                ctx.emit(kb, hs, nxt, mul(go, f("tanh", kb.load(cs, nxt))), loop=loop)
            elif kind == "gru":
                xr, hr = pre(0, True)
                xz, hz = pre(1, True)
                xn, hn = pre(2, True)
                r = f("sigmoid", add(xr, hr))
                z = f("sigmoid", add(xz, hz))
                n = f("tanh", add(xn, mul(r, hn)))
                hprev = kb.load(hs, [_v("ts"), _v("b"), _v("j")])
                ctx.emit(kb, hs, nxt, add(mul(sub(C(1.0), z), n), mul(z, hprev)), loop=loop)
            else:
                act = "tanh" if kind == "rnn_tanh" else None
                s = add(*pre(0))
                ctx.emit(kb, hs, nxt, f(act, s) if act else f("maximum", s, C(0.0)), loop=loop)
            # 4. outputs: y[t, b, d*H + j] = h[step(t) + 1], final states
            kb = _kernel(ctx, [("t", steps), ("b", bsz), ("j", hid)])
            step = (-_v("t") + (steps - 1)) if d else _v("t")
            yi = [_v("b"), _v("t"), _v("j") + d * hid] if y_bf else [_v("t"), _v("b"), _v("j") + d * hid]
            ctx.emit(kb, y, yi, kb.load(hs, [step + 1, _v("b"), _v("j")]))
            kb = _kernel(ctx, [("b", bsz), ("j", hid)])
            ctx.emit(kb, h_n, [Aff.lit(idx0), _v("b"), _v("j")],
                     kb.load(hs, [Aff.lit(steps), _v("b"), _v("j")]))
            if kind == "lstm":
                kb = _kernel(ctx, [("b", bsz), ("j", hid)])
                ctx.emit(kb, c_n, [Aff.lit(idx0), _v("b"), _v("j")],
                         kb.load(cs, [Aff.lit(steps), _v("b"), _v("j")]))
        layer_in, layer_in_bf = y, y_bf
    ctx.bind(outs)


@rule("aten.lstm.input")
def lstm(ctx: OpCtx) -> None:
    _rnn(ctx, "lstm")


@rule("aten.gru.input")
def gru(ctx: OpCtx) -> None:
    _rnn(ctx, "gru")


@rule("aten.rnn_tanh.input")
def rnn_tanh(ctx: OpCtx) -> None:
    _rnn(ctx, "rnn_tanh")


@rule("aten.rnn_relu.input")
def rnn_relu(ctx: OpCtx) -> None:
    _rnn(ctx, "rnn_relu")


__all__ = ["View"]
