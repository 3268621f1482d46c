"""The Llama-3-8B training step (seq 4096, micro-batch 1) against the formulas and counters
teams use: 6ND, Megatron-LM's ``num_floating_point_operations`` (dense GQA, SwiGLU branch,
megatron/training/training.py), llm-analysis (``get_num_flops_fwd_total`` with its
backward as 2x the forward), PyTorch's ``FlopCounterMode`` (run here on the meta device,
forward and ``loss.backward()``), and solbound's step.

solbound's numbers come from ``bench/train_llama3_8b.py --json`` runs: one at 32 layers,
or two at 1 and 2 layers (the layers are identical, so every count is affine in the layer
count and the 32-layer value is ``c(1) + 31 (c(2) - c(1))``, exactly).

    python bench/train_anchors.py --ours /tmp/b32.json
    python bench/train_anchors.py --ours /tmp/b1.json /tmp/b2.json
"""

from __future__ import annotations

import argparse
import json

D, L, H, KV, HD, F, V, S, B = 4096, 32, 32, 8, 128, 14336, 128256, 4096, 1


def params() -> int:
    attn = D * (H * HD) + 2 * D * (KV * HD) + (H * HD) * D
    mlp = 3 * D * F
    return L * (attn + mlp + 2 * D) + 2 * V * D + D


def megatron() -> int:
    """Megatron-LM's formula, dense GQA branch (3 GEMM passes x 2 FLOPs per MAC)."""
    q, kv = HD * H, HD * KV
    attn = 3 * 2 * (D * (q + 2 * kv) + q * S / 2 * 2 + q * D)
    return int(B * S * (3 * 2 * D * (F * 3) * L + attn * L + 3 * 2 * D * V))


def llm_analysis() -> int:
    """llm-analysis: attention 4bsh^2 + 4bsh^2/groups + 4bs^2h (dense scores), MLP 16bsh^2
    (an ungated 4h MLP whatever the config), logits 2bshV; backward = 2 x forward."""
    groups = H // KV
    fwd = L * (4 * B * S * D**2 + 4 * B * S * D**2 / groups + 4 * B * S**2 * D
               + 16 * B * S * D**2) + 2 * B * S * D * V
    return int(3 * fwd)


def flop_counter() -> tuple[int, int]:
    """FlopCounterMode's forward and forward+backward FLOPs on the meta device."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                      num_key_value_heads=KV, intermediate_size=F, vocab_size=V,
                      max_position_embeddings=8192, attn_implementation="sdpa")
    with torch.device("meta"):
        m = LlamaForCausalLM(cfg)
    ids = torch.zeros(B, S, dtype=torch.long, device="meta")
    fc = FlopCounterMode(display=False)
    with fc:
        loss = m(input_ids=ids, labels=ids).loss
    fwd = fc.get_total_flops()
    with fc:
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
    return fwd, fc.get_total_flops()


def ours(paths: list[str]) -> dict:
    docs = [json.load(open(p)) for p in paths]
    if len(docs) == 1:
        d = docs[0]
        assert d["layers"] == L, "one run must be the 32-layer model"
        return {"macs": d["macs"], **{ph: v["macs"] for ph, v in d["training"]["phases"].items()}}
    a, b = sorted(docs, key=lambda d: d["layers"])
    n = b["layers"] - a["layers"]

    def ext(x, y):
        assert (y - x) % n == 0
        return x + (L - a["layers"]) * (y - x) // n
    out = {"macs": ext(a["macs"], b["macs"])}
    for ph in ("forward", "backward", "optimizer"):
        out[ph] = ext(a["training"]["phases"][ph]["macs"], b["training"]["phases"][ph]["macs"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", nargs="+", required=True)
    ap.add_argument("--no-flop-counter", action="store_true")
    a = ap.parse_args()
    n = params()
    six = 6 * n * B * S
    o = ours(a.ours)
    rows = [("6ND", six), ("Megatron-LM", megatron()), ("llm-analysis", llm_analysis())]
    if not a.no_flop_counter:
        fwd, total = flop_counter()
        rows.append(("FlopCounterMode (fwd+bwd)", total))
        rows.append(("FlopCounterMode (fwd only)", fwd))
    mine = 2 * o["macs"]
    print(f"Llama-3-8B, {n:,} parameters, seq {S}, micro-batch {B}")
    print(f"solbound step: {o['macs']:,} MACs = {mine:,} product FLOPs "
          f"(forward {o['forward']:,}, backward {o['backward']:,} MACs: "
          f"{o['backward'] / o['forward']:.4f} x forward)")
    for name, v in rows:
        print(f"  {name:28s} {v:>22,}  {v / mine:.4f} x solbound")


if __name__ == "__main__":
    main()
