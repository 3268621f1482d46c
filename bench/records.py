"""The world's best measured kernels against their speed of light.

Each record in ``bench/data/records.toml`` is a published time (or throughput) of a real
kernel at a named shape on a named chip, with its source. This bench rebuilds each as a
PyTorch program at that shape (on meta tensors), checks solbound's counts against the
closed form, takes the fused bound on the record's chip, and prints record / bound: the
fraction of the speed of light the best kernel reached is bound / record. No bound may be
above a record (the exit status is 1 if one is).

    python bench/records.py                 # the table
    python bench/records.py --markdown      # the table for docs/records.md
    python bench/records.py --only fa4      # records whose id contains "fa4"

A published throughput is turned back into the time it was measured as, with the source's
own convention (``published_seconds``): attention papers count ``4 b s^2 h d`` FLOPs,
halved when causal; GEMM tables ``2 m n k``; bandwidth figures the bytes their script
counts.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import tomllib
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
RECORDS = os.path.join(HERE, "data", "records.toml")


def load(path: str = RECORDS) -> list[dict]:
    with open(path, "rb") as f:
        return tomllib.load(f)["record"]


def _attn_conv_flops(s: dict) -> float:
    f = 4 * s["batch"] * s["seqlen"] ** 2 * s["heads"] * s["head_dim"]
    return f / 2 if s.get("causal") else f


def published_seconds(r: dict) -> float | None:
    """The record's time, from its value and its source's convention; None where the
    published figure is not a time of the program (a hardware counter)."""
    v, unit, kind, s = r["value"], r["unit"], r["kind"], r["shape"]
    if unit == "ms":
        return v * 1e-3
    if unit == "us":
        return v * 1e-6
    if "counter" in r["convention"] or "Nsight" in r["convention"]:
        return None
    if unit == "TFLOPS":
        if kind == "attention-forward":
            work = _attn_conv_flops(s)
        elif kind == "other" and "fwdbwd" in r["id"]:
            work = 3.5 * _attn_conv_flops(s)
        elif kind == "gemm":
            work = 2 * s["m"] * s["n"] * s["k"]
        elif kind == "grouped-gemm":
            work = 2 * s["groups"] * s["m_per_group"] * s["n"] * s["k"]
        elif kind == "mla-decode":
            work = s["batch"] * s["heads_q"] * s["seqlen_q"] * (
                2 * s["head_dim_qk"] * s["topk"] + 2 * s["topk"] * s["head_dim_v"])
        else:
            raise ValueError(f"{r['id']}: no FLOP convention for {kind}")
        return work / (v * 1e12)
    if unit == "GB/s":
        if kind == "gemm":
            nbytes = s["m"] * s["k"] + s["k"] * s["n"] + 2 * s["m"] * s["n"]
        elif kind == "grouped-gemm":
            m = s["m_per_group"]
            nbytes = s["groups"] * (m * s["k"] + s["k"] * s["n"] + 2 * m * s["n"])
        elif kind == "mla-decode":
            nbytes = 2 * (s["batch"] * s["seqlen_k"] * s["heads_kv"] * s["head_dim_qk"]
                          + s["batch"] * s["seqlen_q"] * s["heads_q"]
                          * (s["head_dim_qk"] + s["head_dim_v"]))
        elif kind == "softmax":
            nbytes = 2 * s["rows"] * s["cols"] * 4
        elif kind == "other" and "sum" in r["id"]:
            nbytes = s["elements"] * 4
        else:
            raise ValueError(f"{r['id']}: no byte convention for {kind}")
        return nbytes / (v * 1e9)
    raise ValueError(f"{r['id']}: unit {unit!r}")


# --- the programs -------------------------------------------------------------------------

def _dtype(r: dict):
    import torch
    d = r["dtype"]
    return (torch.float8_e4m3fn if d.startswith("fp8") else torch.bfloat16 if "bf16" in d
            else torch.float16 if "fp16" in d else torch.float32 if "fp32" in d
            else torch.int32 if "int32" in d else None)


def build(r: dict):
    """``(module, inputs, closed form {macs, bytes})`` of the record's program, or a string
    saying why it is not rebuilt."""
    import torch
    import torch.nn.functional as F
    kind, s, dt = r["kind"], r["shape"], _dtype(r)
    meta = dict(device="meta")
    if kind == "attention-forward":
        b, n, h, d = s["batch"], s["seqlen"], s["heads"], s["head_dim"]
        hk = s.get("heads_kv", h)
        causal = bool(s.get("causal"))

        class Attention(torch.nn.Module):
            def forward(self, q, k, v):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                      enable_gqa=hk != h)
        q = torch.empty(b, h, n, d, dtype=dt, **meta)
        kv = [torch.empty(b, hk, n, d, dtype=dt, **meta) for _ in range(2)]
        pairs = n * (n + 1) // 2 if causal else n * n
        item = q.element_size()
        return Attention(), (q, *kv), {"macs": 2 * b * h * d * pairs,
                                       "bytes": (2 * b * h * n * d + 2 * b * hk * n * d) * item}
    if kind == "gemm":
        m, n, k = s["m"], s["n"], s["k"]
        if dt == torch.float8_e4m3fn and "block" in r["dtype"]:
            blk = 128

            class BlockScaled(torch.nn.Module):
                def forward(self, a, w, sa, sw):
                    return torch._scaled_mm(a, w.t(), sa, sw, out_dtype=torch.bfloat16)
            args = (torch.empty(m, k, dtype=dt, **meta), torch.empty(n, k, dtype=dt, **meta),
                    torch.empty(m, k // blk, **meta), torch.empty(k // blk, n // blk, **meta))
            return BlockScaled(), args, {
                "macs": m * n * k + m * n * (k // blk),
                "bytes": m * k + n * k + 4 * (m * k // blk + (k // blk) * (n // blk)) + 2 * m * n}
        if dt == torch.float8_e4m3fn:
            class TensorScaled(torch.nn.Module):
                def forward(self, a, w, sa, sw):
                    return torch._scaled_mm(a, w.t(), sa, sw, out_dtype=torch.bfloat16)
            args = (torch.empty(m, k, dtype=dt, **meta), torch.empty(n, k, dtype=dt, **meta),
                    torch.empty((), **meta), torch.empty((), **meta))
            return TensorScaled(), args, {"macs": m * n * k,
                                          "bytes": m * k + n * k + 8 + 2 * m * n}

        class Matmul(torch.nn.Module):
            def forward(self, a, w):
                return a @ w
        item = torch.empty((), dtype=dt).element_size()
        return Matmul(), (torch.empty(m, k, dtype=dt, **meta),
                          torch.empty(k, n, dtype=dt, **meta)), {
            "macs": m * n * k, "bytes": (m * k + k * n + m * n) * item}
    if kind == "grouped-gemm":
        g, m, n, k, blk = s["groups"], s["m_per_group"], s["n"], s["k"], 128

        class Grouped(torch.nn.Module):
            def forward(self, a, w, sa, sw):
                return torch.stack([torch._scaled_mm(a[i], w[i].t(), sa[i], sw[i],
                                                     out_dtype=torch.bfloat16)
                                    for i in range(g)])
        args = (torch.empty(g, m, k, dtype=dt, **meta), torch.empty(g, n, k, dtype=dt, **meta),
                torch.empty(g, m, k // blk, **meta), torch.empty(g, k // blk, n // blk, **meta))
        return Grouped(), args, {
            "macs": g * (m * n * k + m * n * (k // blk)),
            "bytes": g * (m * k + n * k + 4 * (m * k // blk + (k // blk) * (n // blk))
                          + 2 * m * n)}
    if kind == "mla-decode" and "topk" not in s:
        b, sq, hq, sk = s["batch"], s["seqlen_q"], s["heads_q"], s["seqlen_k"]
        dqk, dv = s["head_dim_qk"], s["head_dim_v"]

        class MLADecode(torch.nn.Module):
            """Absorbed MLA decode: every query head reads the one latent KV head (576
            wide: 512 latent + 64 rope), whose first 512 columns are the values."""

            def forward(self, q, kv):
                scores = torch.einsum("bqhd,bkd->bhqk", q, kv) * dqk ** -0.5
                p = torch.softmax(scores.float(), -1).to(q.dtype)
                return torch.einsum("bhqk,bkd->bqhd", p, kv[..., :dv])
        args = (torch.empty(b, sq, hq, dqk, dtype=dt, **meta),
                torch.empty(b, sk, dqk, dtype=dt, **meta))
        return MLADecode(), args, {
            "macs": b * hq * sq * sk * (dqk + dv),
            "bytes": 2 * (b * sq * hq * dqk + b * sk * dqk + b * sq * hq * dv)}
    if kind == "softmax":
        rows, cols = s["rows"], s["cols"]

        class Softmax(torch.nn.Module):
            def forward(self, x):
                return torch.softmax(x, -1)
        return Softmax(), (torch.empty(rows, cols, dtype=dt, **meta),), {
            "macs": 0, "bytes": 2 * rows * cols * 4}
    if kind == "other" and "sum" in r["id"]:
        n = s["elements"]

        class Sum(torch.nn.Module):
            def forward(self, x):
                return x.sum()
        # torch sums int32 into an int64 result
        return Sum(), (torch.empty(n, dtype=dt, **meta),), {"macs": 0, "bytes": 4 * n + 8}
    if kind == "attention-backward" or "fwdbwd" in r["id"]:
        return _attention_backward(r, dt, both="fwdbwd" in r["id"])
    if kind == "mla-decode":
        return _sparse_mla(r)
    return f"no program for kind {kind}"


def _sparse_mla(r: dict):
    """DeepSeek's token-level sparse MLA decode: each query reads its own ``topk`` rows of
    an fp8 latent cache (512 values in e4m3 with a float32 scale per 128, then 64 rope
    values in bf16: 656 B per token), dequantizes them to bf16 and attends over them (the
    576-wide key, the first 512 as the value). The cache holds ``topk`` tokens per query
    (every row a query selects is a distinct row: the footprint of a gather at positions
    known only at run time is one row per lookup, capped by the table)."""
    import torch
    s = r["shape"]
    b, sq, hq, k = s["batch"], s["seqlen_q"], s["heads_q"], s["topk"]
    dqk, dv = s["head_dim_qk"], s["head_dim_v"]
    rope, blk = dqk - dv, 128
    n = b * sq * k

    class SparseMLADecode(torch.nn.Module):
        def forward(self, q, nope, scale, pe, idx):
            rows = idx.reshape(-1)
            kv = nope[rows].to(torch.bfloat16).reshape(n, dv // blk, blk) \
                * scale[rows].to(torch.bfloat16)[..., None]
            kv = torch.cat([kv.reshape(n, dv), pe[rows]], -1).reshape(b, sq, k, dqk)
            scores = torch.einsum("bqhd,bqkd->bqhk", q, kv) * dqk ** -0.5
            p = torch.softmax(scores.float(), -1).to(q.dtype)
            return torch.einsum("bqhk,bqkd->bqhd", p, kv[..., :dv])
    meta = dict(device="meta")
    args = (torch.empty(b, sq, hq, dqk, dtype=torch.bfloat16, **meta),
            torch.empty(n, dv, dtype=torch.float8_e4m3fn, **meta),
            torch.empty(n, dv // blk, dtype=torch.float32, **meta),
            torch.empty(n, rope, dtype=torch.bfloat16, **meta),
            torch.empty(b, sq, k, dtype=torch.int32, **meta))
    return SparseMLADecode(), args, {
        "macs": b * sq * hq * k * (dqk + dv),
        "bytes": (2 * b * sq * hq * dqk            # queries in (bf16)
                  + n * (dv + 4 * dv // blk + 2 * rope)   # the rows read: 656 B each
                  + 4 * n                         # the indices (int32)
                  + 2 * b * sq * hq * dv)}        # outputs (bf16)


def _attention_backward(r: dict, dt, both: bool):
    """FlashAttention's backward from its saved state (``q, k, v, o, dO`` and the rows'
    log-sum-exp): the probabilities recomputed from ``q k^T`` (FlashAttention does not
    store them), then ``dV = P^T dO``, ``dP = dO V^T``, ``dS = P (dP - rowsum(dO o))``,
    ``dQ = dS K``, ``dK = dS^T Q``: five products over the kept pairs. ``both``: the
    forward and the backward of one training step (scores, log-sum-exp, ``o = P V``, then
    the backward reusing ``P``: six products)."""
    import torch
    s = r["shape"]
    b, n, h, d = s["batch"], s["seqlen"], s["heads"], s["head_dim"]
    causal = bool(s.get("causal"))
    scale = d ** -0.5

    def _keep(q):
        i = torch.arange(n, device=q.device)
        return i[:, None] >= i[None, :]

    class Backward(torch.nn.Module):
        def forward(self, q, k, v, o, do, lse):
            sc = (q @ k.transpose(-1, -2)).float() * scale
            p = torch.exp(sc - lse[..., None])
            if causal:
                p = p.masked_fill(~_keep(q), 0.0)
            return _grads(q, k, v, o, do, p)

    class ForwardBackward(torch.nn.Module):
        def forward(self, q, k, v, do):
            sc = (q @ k.transpose(-1, -2)).float() * scale
            if causal:
                sc = sc.masked_fill(~_keep(q), float("-inf"))
            p = torch.softmax(sc, -1)
            o = (p.to(q.dtype) @ v)
            return (o, *_grads(q, k, v, o, do, p))

    def _grads(q, k, v, o, do, p):
        dv = p.to(q.dtype).transpose(-1, -2) @ do
        dp = (do @ v.transpose(-1, -2)).float()
        dsum = (do.float() * o.float()).sum(-1, keepdim=True)
        ds = (p * (dp - dsum) * scale).to(q.dtype)
        return ds @ k, ds.transpose(-1, -2) @ q, dv

    t = [torch.empty(b, h, n, d, dtype=dt, device="meta") for _ in range(5)]
    pairs = n * (n + 1) // 2 if causal else n * n
    item = t[0].element_size()
    bhnd = b * h * n * d
    if both:
        return ForwardBackward(), (t[0], t[1], t[2], t[4]), {
            "macs": 6 * b * h * d * pairs + bhnd,
            "bytes": (4 + 4) * bhnd * item}          # q k v dO in; o dq dk dv out
    lse = torch.empty(b, h, n, dtype=torch.float32, device="meta")
    return Backward(), (*t, lse), {
        "macs": 5 * b * h * d * pairs + bhnd,
        "bytes": (5 + 3) * bhnd * item + 4 * b * h * n}   # q k v o dO lse in; dq dk dv out


def run(r: dict) -> dict:
    from solbound.api import analyze
    row = {"id": r["id"], "kind": r["kind"], "chip": r["chip"],
           "implementation": r.get("implementation", ""), "source": r["source"],
           "record_s": published_seconds(r)}
    built = build(r)
    if isinstance(built, str):
        return {**row, "status": "not rebuilt", "why": built}
    module, args, closed = built
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rep = analyze(module, args, arch=r["chip"])
    b = rep.bound(r["chip"], "fused")
    row.update(analysis_s=time.perf_counter() - t0, macs=rep.counts.macs,
               bytes=rep.counts.fused.bytes, closed=closed,
               exact=(rep.counts.macs == closed["macs"] and rep.counts.fused.bytes == closed["bytes"]
                      and not rep.unsupported),
               bound_s=b.seconds, binding=b.bound, unit=b.binding_unit if b.bound == "compute"
               else "dram", notes=b.notes)
    if row["record_s"] is not None:
        row["ratio"] = row["record_s"] / b.seconds
        row["status"] = "ok" if row["ratio"] >= 1 else "BOUND ABOVE RECORD"
    else:
        row["status"] = "no time published"
    if not row["exact"]:
        row["status"] = "COUNTS DIFFER"
    return row


def _t(s):
    return "-" if s is None else f"{s * 1e3:.4g} ms" if s >= 1e-4 else f"{s * 1e6:.4g} us"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="records whose id contains this text")
    ap.add_argument("--markdown", action="store_true", help="a Markdown table")
    a = ap.parse_args(argv)
    rows = [run(r) for r in load() if not a.only or a.only in r["id"]]
    bad = [r for r in rows if r["status"] in ("BOUND ABOVE RECORD", "COUNTS DIFFER")]
    if a.markdown:
        print("| record | chip | kind | record time | fused bound | binds | bound / record | "
              "counts |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            if r["status"] == "not rebuilt":
                print(f"| {r['id']} | {r['chip']} | {r['kind']} | {_t(r['record_s'])} | - | - | "
                      f"- | {r['why']} |")
                continue
            frac = f"{1 / r['ratio']:.1%}" if r.get("ratio") else "-"
            print(f"| {r['id']} | {r['chip']} | {r['kind']} | {_t(r['record_s'])} | "
                  f"{_t(r['bound_s'])} | {r['unit']} | {frac} | "
                  f"{'exact' if r['exact'] else 'DIFFER'} |")
    else:
        for r in rows:
            if r["status"] == "not rebuilt":
                print(f"{r['id']:58s} {r['chip']:12s} not rebuilt: {r['why']}")
                continue
            ratio = f"{r['ratio']:.3f}" if r.get("ratio") else "-"
            print(f"{r['id']:58s} {r['chip']:12s} record {_t(r['record_s']):>11s}  bound "
                  f"{_t(r['bound_s']):>11s} ({r['unit']:6s})  record/bound {ratio:>6s}  "
                  f"{'exact' if r['exact'] else 'COUNTS DIFFER ' + str((r['macs'], r['bytes'], r['closed']))}"
                  f"  [{r['analysis_s']:.1f} s] {r['status']}")
    ok = [r for r in rows if r.get("ratio")]
    print(f"\n{len(rows)} records: {len(ok)} timed and rebuilt, {len(bad)} defect(s) "
          f"(a bound above a record or counts off their closed form)", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
