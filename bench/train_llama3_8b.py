"""The Llama-3-8B training step (seq 4096, micro-batch 1): fp32 master weights, bf16
products under ``torch.autocast``, AdamW with fp32 state; built under a FakeTensorMode on
the CPU (nothing allocated; autocast does not apply to meta tensors, it does to fake CPU
ones).

Prints the analysis time and peak memory of this process, the step's MACs per phase, its
resident memory, the fused and cache-aware bounds per chip, and the bound's
MFU-equivalent next to 6ND's: the fraction of a chip's bf16 peak that a run at the bound
would show if its FLOPs were counted the way MFU counts them (6 N D, or the step's own
FLOPs). ``--layers N`` analyzes N layers (the others are identical: the counts of the
32-layer model are linear in N, which the closed forms in docs/training.md use).

    python bench/train_llama3_8b.py [--layers 32] [--tokens 4096] [--no-reroll] [--dp 8]

``--dp N``: the step of one of N data-parallel ranks (each gradient averaged by an
all-reduce before AdamW); prints the collectives' payload and link time per chip.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import torch

import solbound

D, H, KV, HD, F, V = 4096, 32, 8, 128, 14336, 128256
CHIPS = "h100-sxm,h200,b200,mi300x"


class Step(torch.nn.Module):
    """``model(ids, labels=ids).loss`` with bf16 autocast products."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, labels):
        with torch.autocast(ids.device.type, dtype=torch.bfloat16):
            return self.model(input_ids=ids, labels=labels).loss


def build(layers: int, tokens: int):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=D, num_hidden_layers=layers, num_attention_heads=H,
                      num_key_value_heads=KV, intermediate_size=F, vocab_size=V,
                      max_position_embeddings=8192, attn_implementation="sdpa")
    with FakeTensorMode(shape_env=ShapeEnv(tracked_fakes=[]), allow_non_fake_inputs=True):
        return LlamaForCausalLM(cfg), torch.zeros(1, tokens, dtype=torch.long)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--json", default=None)
    ap.add_argument("--dp", type=int, default=None, help="data-parallel ranks")
    ap.add_argument("--no-reroll", action="store_true",
                    help="trace every layer (by default two are traced and rerolled)")
    a = ap.parse_args()
    model, ids = build(a.layers, a.tokens)
    n_params = sum(p.numel() for p in model.parameters())
    t0 = time.perf_counter()
    rep = solbound.analyze(Step(model), (ids, ids), arch=CHIPS, train=True,
                           reroll=not a.no_reroll, dp=a.dp)
    secs = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    tr = rep.training
    print(f"Llama-3-8B step, {a.layers} layers, {a.tokens} tokens: analyzed in {secs:.1f} s "
          f"(export {rep.timings.get('export_s', 0):.1f} s, lower {rep.timings.get('lower_s', 0):.1f} s, "
          f"analysis {rep.timings.get('analysis_s', 0):.1f} s), peak RSS {rss:.2f} GiB; "
          f"{len(rep.unsupported)} unsupported")
    print(f"parameters {n_params:,}; MACs {rep.counts.macs:,}")
    for ph, c in tr["phases"].items():
        print(f"  {ph:9s} MACs {c['macs']:,}  FLOPs {c['flops']:,}  bytes unfused "
              f"{c['bytes']['unfused']:,} fused {c['bytes']['fused']:,}")
    m = tr["memory"]
    print("  resident: " + ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in m.items()
                                      if k != "fits"))
    six_nd = 6 * n_params * a.tokens
    flops = sum(rep.counts.flops.values())
    print(f"6ND {six_nd:,} FLOPs; the step's {flops:,} ({flops / six_nd:.4f} x 6ND)")
    for b in rep.bounds:
        if b.mode in ("fused", "cache-aware"):
            peak = b.peaks.get("tensor_bf16") or next(
                (v for k, v in b.peaks.items() if "bf16" in k and "tensor" in k), None)
            mfu = (f"; MFU at the bound: 6ND {six_nd / b.seconds / peak:.3f}, the step's "
                   f"products (2 x MACs) {2 * rep.counts.macs / b.seconds / peak:.3f}"
                   if peak else "")
            fits = m["fits"].get(b.arch, {}).get("fits")
            comm = (f"; link {b.comm_seconds * 1e3:.2f} ms, without overlap "
                    f"{b.no_overlap_seconds * 1e3:.2f} ms" if b.comm_seconds else "")
            print(f"  {b.arch:10s} {b.mode:11s} {b.seconds * 1e3:9.2f} ms ({b.bound}){mfu}"
                  f"{comm}{'' if fits is not False else '; does NOT fit in DRAM'}")
    if rep.counts.collectives:
        total = sum(c.bytes * c.calls for c in rep.counts.collectives)
        kinds = sorted({(c.kind, c.reduce) for c in rep.counts.collectives})
        print(f"  collectives: {len(rep.counts.collectives)} ({kinds}), payload {total:,} B "
              f"per rank per step")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"layers": a.layers, "tokens": a.tokens, "seconds": secs, "rss_gib": rss,
                       "params": n_params, "macs": rep.counts.macs, "training": tr,
                       "bounds": [{"arch": b.arch, "mode": b.mode, "seconds": b.seconds}
                                  for b in rep.bounds]}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
