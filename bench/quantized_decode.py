"""Llama-3-8B decode, quantized: fused bytes and bounds per bit width (docs/zoo.md).

One decode step of transformers' ``LlamaForCausalLM`` (the new token against ``context - 1``
cached positions, the past keys and values program inputs, bf16), at batch 1 and 64, with the
seven linears of every decoder layer stored as:

* ``bf16``: as built;
* ``int8-wo``: torchao's ``Int8WeightOnlyConfig`` (int8 weights, a scale per output row),
  the product in bf16 after an on-chip dequantization;
* ``int4-wo-g128``: the AWQ/GPTQ reference form, two 4-bit weights per byte unpacked with
  ``& 0xF`` and ``>> 4``, a bf16 scale and zero per group of 128 inputs, the product in bf16
  (torchao's own int4 configs do not build on this machine: docs/quantized.md);
* ``fp8-w8a8``: e4m3 weights with a float32 scale per output row and activations quantized
  per token in forward (``amax / 448``), multiplied by ``torch._scaled_mm`` (rowwise scales,
  bf16 out), as torchao's ``Float8DynamicActivationFloat8WeightConfig(PerRow())`` does on a
  GPU (it refuses to quantize without one).

``lm_head`` and the embedding stay bf16, as transformers' ``TorchAoConfig`` and AWQ/GPTQ
checkpoints keep them. Everything is built on the meta device: nothing is allocated, the
counts come from the program.

    python bench/quantized_decode.py [--batch 1 64] [--context 4096] [--schemes ...]

The closed form printed beside solbound's bytes is the stored weights (each scheme's bytes
per weight and its scales), the KV cache rows read, the lm_head, the logits written and
the token ids; what solbound counts beyond it is the activations (a few MB at batch 64).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import torch
import torch.nn as nn

import solbound

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from transformers_zoo import D, F, H, HD, KV, LAYERS, V, llama_8b  # noqa: E402

G = 128                      # int4 group size
CHIPS = "h100-sxm,b200"
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


class Int4G128Linear(nn.Module):
    """4-bit weights, two per byte, a bf16 scale and zero per group of ``G`` inputs."""

    def __init__(self, n: int, k: int):
        super().__init__()
        self.n, self.k = n, k
        self.register_buffer("qw", torch.empty(n, k // 2, dtype=torch.uint8))
        self.register_buffer("scale", torch.empty(n, k // G, dtype=torch.bfloat16))
        self.register_buffer("zero", torch.empty(n, k // G, dtype=torch.bfloat16))

    def forward(self, x):
        lo, hi = self.qw & 0xF, self.qw >> 4
        w = torch.stack([lo, hi], -1).reshape(self.n, self.k // G, G).to(torch.bfloat16)
        w = (w - self.zero[..., None]) * self.scale[..., None]
        return x @ w.reshape(self.n, self.k).T


class Fp8RowwiseLinear(nn.Module):
    """e4m3 weights with a float32 scale per output row; activations quantized per token
    (the row's absolute maximum over e4m3's largest value, 448) and multiplied by
    ``torch._scaled_mm`` into bf16."""

    def __init__(self, n: int, k: int):
        super().__init__()
        self.register_buffer("w", torch.empty(n, k, dtype=torch.float8_e4m3fn))
        self.register_buffer("ws", torch.empty(1, n, dtype=torch.float32))

    def forward(self, x):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).float()
        s = x2.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 448.0
        q = (x2 / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        y = torch._scaled_mm(q, self.w.t(), s, self.ws, out_dtype=torch.bfloat16)
        return y.reshape(*shape[:-1], -1)


def _swap(m, make) -> None:
    for layer in m.model.layers:
        for path in LINEARS:
            parent_path, name = path.rsplit(".", 1)
            parent = layer.get_submodule(parent_path)
            lin = getattr(parent, name)
            with torch.device("meta"):
                setattr(parent, name, make(lin.out_features, lin.in_features))


def quantized(scheme: str):
    m = llama_8b()
    if scheme == "int8-wo":
        import torchao.quantization as tq
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tq.quantize_(m, tq.Int8WeightOnlyConfig(),
                         filter_fn=lambda mod, fqn: isinstance(mod, nn.Linear)
                         and not fqn.startswith("lm_head"))
    elif scheme == "int4-wo-g128":
        _swap(m, Int4G128Linear)
    elif scheme == "fp8-w8a8":
        _swap(m, Fp8RowwiseLinear)
    elif scheme != "bf16":
        raise SystemExit(f"unknown scheme {scheme!r}: one of {', '.join(SCHEMES)}")
    return m


SCHEMES = ("bf16", "int8-wo", "int4-wo-g128", "fp8-w8a8")


def closed_form(scheme: str, batch: int, context: int) -> dict[str, int]:
    """The bytes a decode step must move, by part: the layers' linear weights at their
    stored width with their scales, the norms, the KV rows read, lm_head, the logits
    written, the token ids, the embedding rows read and RoPE's inverse frequencies."""
    rows = 2 * D * H * HD + 2 * D * KV * HD + 3 * D * F     # weights per layer
    outs = H * HD + 2 * KV * HD + D + 2 * F + D               # output rows per layer
    per = {"bf16": 2 * rows,
           # int8 and a fp32 scale per row (torchao also stores an int8 zero point per
           # row, which its symmetric dequantization never reads)
           "int8-wo": rows + 4 * outs,
           "int4-wo-g128": rows // 2 + 2 * 2 * rows // G,    # 4 bit, bf16 scale+zero per 128
           "fp8-w8a8": rows + 4 * outs}[scheme]              # e4m3, a fp32 scale per row
    return {"weights": LAYERS * per,
            "norms": (2 * LAYERS + 1) * D * 2,
            "kv read": batch * LAYERS * 2 * KV * (context - 1) * HD * 2,
            "lm_head": V * D * 2,
            "logits": batch * V * 2,
            "ids and embedding rows": batch * 8 + batch * D * 2,
            "rope inv_freq": HD // 2 * 2}


def build(scheme: str, batch: int, context: int):
    from programs.hf import Decode
    m = quantized(scheme)
    kv = [torch.zeros(batch, KV, context - 1, HD, dtype=torch.bfloat16, device="meta")
          for _ in range(2 * LAYERS)]
    ids = torch.zeros(batch, 1, dtype=torch.long, device="meta")
    return Decode(m), (ids, *kv)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=SCHEMES)
    a = ap.parse_args()
    print("| batch | scheme | MACs | fused bytes | closed form | beyond it | h100-sxm fused | b200 fused | bound by | "
          "product pipe | analyze |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for batch in a.batch:
        for scheme in a.schemes:
            module, inputs = build(scheme, batch, a.context)
            t0 = time.perf_counter()
            rep = solbound.analyze(module, inputs, arch=CHIPS)
            dt = time.perf_counter() - t0
            if rep.lowered.unsupported:
                names = sorted({u.operator for u in rep.lowered.unsupported})
                print(f"| {batch} | {scheme} | unsupported: {', '.join(names)} |")
                continue
            cf = closed_form(scheme, batch, a.context)
            total = sum(cf.values())
            fused = rep.counts.fused.bytes
            cells = []
            for chip in CHIPS.split(","):
                b = rep.bound(chip, "fused")
                cells.append(f"{b.seconds * 1e3:.3f} ms")
            b = rep.bound("h100-sxm", "fused")
            why = f"compute ({b.binding_unit})" if b.bound == "compute" else "DRAM"
            pipes = sorted(p for p, s in b.pipe_seconds.items() if p.startswith("tensor") and s)
            print(f"| {batch} | {scheme} | {rep.counts.macs:,} | {fused:,} | {total:,} | "
                  f"{fused - total:+,} | {cells[0]} | {cells[1]} | {why} | "
                  f"{', '.join(pipes) or '-'} | {dt:.1f} s |", flush=True)


if __name__ == "__main__":
    main()
