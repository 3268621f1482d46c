"""A Llama-style decoder written in plain JAX, analyzed at 7B size on abstract parameters,
next to XLA's own ``cost_analysis()``.

    python bench/jax_llama.py                       # Llama-2-7B shapes, prefill 2048, bf16
    python bench/jax_llama.py --tokens 512 --layers 4

Two forms of the same model: the layers unrolled by a Python loop, and the layers stacked and
run by ``lax.scan`` (as MaxText does). Prints analyze time, peak memory, MACs against the closed
form, the fused bound on h100-sxm, and cost_analysis's FLOPs, which count a scan body once.
"""

from __future__ import annotations

import argparse
import resource
import time

import jax
import jax.numpy as jnp

import solbound


def layer(x, p, mask, cos, sin, heads, kv_heads):
    b, t, d = x.shape
    hd = d // heads

    def rms(v, w):
        return v * jax.lax.rsqrt((v * v).mean(-1, keepdims=True) + 1e-6) * w

    def rope(v):
        half = v.shape[-1] // 2
        rot = jnp.concatenate([-v[..., half:], v[..., :half]], axis=-1)
        return v * cos + rot * sin
    h = rms(x, p["n1"])
    q = rope((h @ p["wq"]).reshape(b, t, heads, hd))
    k = rope((h @ p["wk"]).reshape(b, t, kv_heads, hd))
    v = (h @ p["wv"]).reshape(b, t, kv_heads, hd)
    k = jnp.repeat(k, heads // kv_heads, axis=2)
    v = jnp.repeat(v, heads // kv_heads, axis=2)
    s = jnp.einsum("bthd,bshd->bhts", q, k) * (hd ** -0.5)
    s = jnp.where(mask, s, -jnp.inf)
    o = jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(s, axis=-1), v)
    x = x + o.reshape(b, t, d) @ p["wo"]
    h = rms(x, p["n2"])
    return x + (jax.nn.silu(h @ p["wg"]) * (h @ p["wu"])) @ p["wd"]


def make(d, layers, heads, kv_heads, ffn, vocab, tokens, scan, dtype=jnp.bfloat16):
    s = jax.ShapeDtypeStruct
    hd = d // heads
    shapes = {"n1": (d,), "wq": (d, d), "wk": (d, kv_heads * hd), "wv": (d, kv_heads * hd),
              "wo": (d, d), "n2": (d,), "wg": (d, ffn), "wu": (d, ffn), "wd": (ffn, d)}
    if scan:
        stack = {k: s((layers,) + v, dtype) for k, v in shapes.items()}
    else:
        stack = [{k: s(v, dtype) for k, v in shapes.items()} for _ in range(layers)]
    params = {"embed": s((vocab, d), dtype), "layers": stack, "norm": s((d,), dtype),
              "head": s((d, vocab), dtype)}

    def model(params, ids):
        t = ids.shape[1]
        x = params["embed"][ids]
        mask = jnp.tril(jnp.ones((t, t), bool))
        pos = jnp.arange(t)[:, None] / (10000.0 ** (jnp.arange(hd // 2) * 2 / hd))
        ang = jnp.concatenate([pos, pos], axis=-1)[None, :, None, :]
        cos, sin = jnp.cos(ang).astype(dtype), jnp.sin(ang).astype(dtype)
        if scan:
            x, _ = jax.lax.scan(lambda x, p: (layer(x, p, mask, cos, sin, heads, kv_heads), None),
                                x, params["layers"])
        else:
            for p in params["layers"]:
                x = layer(x, p, mask, cos, sin, heads, kv_heads)
        x = x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * params["norm"]
        return x @ params["head"]
    ids = s((1, tokens), jnp.int32)
    t, hd = tokens, d // heads
    proj = t * d * d * 2 + 2 * t * d * kv_heads * hd + 3 * t * d * ffn
    norms = 2 * t * d
    pairs = t * (t + 1) // 2
    closed = layers * (proj + norms + 2 * heads * hd * pairs) + t * d + t * d * vocab
    return model, (params, ids), closed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=32)
    a = ap.parse_args()
    cfg = dict(d=4096, layers=a.layers, heads=32, kv_heads=32, ffn=11008, vocab=32000,
               tokens=a.tokens)
    print("| form | analyze | peak RSS | MACs | closed form | 2*MACs + vector + special FLOPs "
          "| XLA cost_analysis FLOPs | h100-sxm fused |")
    print("|---|---|---|---|---|---|---|---|")
    for scan in (False, True):
        fn, args, closed = make(scan=scan, **cfg)
        t0 = time.perf_counter()
        rep = solbound.analyze(fn, args, arch="h100-sxm")
        dt = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        ours = sum(rep.counts.flops.values())
        xla = jax.jit(fn).lower(*args).compile().cost_analysis()
        xla = xla[0] if isinstance(xla, list) else xla
        f = rep.bound("h100-sxm", "fused")
        print(f"| {'lax.scan over layers' if scan else 'unrolled layers'} | {dt:.1f} s | "
              f"{peak:.2f} GiB | {rep.counts.macs:,} | {closed:,} "
              f"({'equal' if rep.counts.macs == closed else 'DIFFERENT'}) | {ours:,} | "
              f"{int(xla.get('flops', 0)):,} | {f.seconds * 1e3:.2f} ms ({f.bound}) |")
        if rep.lowered.unsupported:
            print("unsupported:", sorted({u.operator for u in rep.lowered.unsupported}))


if __name__ == "__main__":
    main()
