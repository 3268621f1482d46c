"""Speculative decoding: a draft proposes ``K`` tokens, the target verifies ``K + 1`` at once.

One round for a batch of ``B`` sequences at context ``c`` (the verify needs the draft's
tokens, so the two run one after the other):

* the draft's ``K`` decode steps, ``B x 1@(c + i)`` for ``i = 0 .. K - 1``: a draft model, or
  an EAGLE/MTP-style head (``layers:N``: ``N`` decoder layers of the target's own
  configuration with its embedding and LM head), each a :class:`~.step.StepModel` traced
  from its own code;
* the target's verify step, ``B x (K + 1)@c`` with every new token's logits
  (``StepModel(logits="all")``: the last layer and the LM head serve all ``K + 1`` rows).

Tokens per round, in expectation: ``E(K) = 1 + sum_{j=1..K} prod_{i<=j} a_i`` with ``a_i``
the chance the ``i``-th draft token is accepted once the ones before it were (a constant
``a``: ``(1 - a^(K+1)) / (1 - a)``). The bound per output token of a sequence is the
round's time over ``E(K)``; ``K = 0`` is plain decoding (the target's ``B x 1@c`` step).
Each step's time is at least its roofline, so a round is at least the sum. The draft's
first step of a round also catches up on the tokens accepted in the round before (up to
``K + 1`` of them); it is counted as one token, and an EAGLE head's feature fusion (a
``2d x d`` projection per token) is not in ``layers:N``: both only lower the bound.

>>> expected_tokens((0.5,), 2)      # 1 + 0.5 + 0.25
1.75
>>> expected_tokens((0.9, 0.5), 3)  # 1 + 0.9 + 0.45 + 0.225 (the last rate repeats)
2.575
"""

from __future__ import annotations

from dataclasses import dataclass

from ..pipeline import specs_of
from .step import Seq, StepError, StepModel

SCHEMA = "solbound.speculative/1"


def parse_acceptance(text: str) -> tuple[float, ...]:
    """``0.8`` (every position) or ``0.9,0.8,0.7`` (per position; the last repeats).

    >>> parse_acceptance("0.9, 0.8")
    (0.9, 0.8)
    """
    out = []
    for item in str(text).split(","):
        try:
            a = float(item)
        except ValueError:
            raise StepError(f"acceptance {item.strip()!r}: not a number") from None
        if not 0 <= a <= 1:
            raise StepError(f"acceptance {a:g}: a probability in [0, 1]")
        out.append(a)
    return tuple(out)


def expected_tokens(alphas: tuple[float, ...], k: int) -> float:
    """Tokens a round yields in expectation (see the module doc)."""
    total, p = 1.0, 1.0
    for i in range(k):
        p *= alphas[min(i, len(alphas) - 1)]
        total += p
    return total


def head_model(target, layers: int):
    """An EAGLE/MTP-style draft head: ``layers`` decoder layers of ``target``'s own
    configuration (its embedding and LM head included), on the meta device."""
    import copy
    import torch
    from transformers import AutoModelForCausalLM
    if layers < 1:
        raise StepError(f"layers:{layers}: a head has at least one decoder layer")
    cfg = copy.deepcopy(target.config)
    text = getattr(cfg, "get_text_config", lambda **_: cfg)(decoder=True)
    text.num_hidden_layers = layers
    if getattr(text, "layer_types", None):
        text.layer_types = list(text.layer_types[:layers])
    dtype = next(target.parameters()).dtype
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()


@dataclass
class Speculation:
    """A target and a draft, read once each: ``round`` and ``best`` cost microseconds once
    their regions are traced."""
    target: StepModel           # logits of the last token: plain decoding (K = 0)
    verify: StepModel           # the same model, every new token's logits
    draft: StepModel

    @classmethod
    def of(cls, target_model, draft_model, **options) -> "Speculation":
        return cls(StepModel(target_model, **options),
                   StepModel(target_model, logits="all", **options),
                   StepModel(draft_model, **options))

    def round(self, batch: int, ctx: int, k: int, spec) -> dict:
        """One round's bound (seconds) on ``spec``: the draft's ``k`` steps, then the
        verify of ``k + 1`` tokens per sequence (``k = 0``: one plain decode step)."""
        if k == 0:
            t = self.target.bound([Seq(1, ctx)] * batch, spec).seconds
            return {"seconds": t, "draft_seconds": 0.0, "verify_seconds": t}
        draft = sum(self.draft.bound([Seq(1, ctx + i)] * batch, spec).seconds
                    for i in range(k))
        verify = self.verify.bound([Seq(k + 1, ctx)] * batch, spec).seconds
        return {"seconds": draft + verify, "draft_seconds": draft, "verify_seconds": verify}

    def best(self, batch: int, ctx: int, alphas: tuple[float, ...], ks, spec) -> dict:
        """The ``K`` of ``ks`` (0 always considered) with the least bound per output token."""
        rows = []
        for k in sorted(set(ks) | {0}):
            r = self.round(batch, ctx, k, spec)
            e = expected_tokens(alphas, k)
            rows.append({"k": k, "tokens_per_round": e, **r,
                         "seconds_per_token": r["seconds"] / e})
        top = min(rows, key=lambda r: (r["seconds_per_token"], r["k"]))
        plain = rows[0]["seconds_per_token"]
        return {"batch": batch, "ctx": ctx, "best_k": top["k"],
                "seconds_per_token": top["seconds_per_token"],
                "tokens_per_second_per_sequence": 1 / top["seconds_per_token"],
                "output_tokens_per_second": batch / top["seconds_per_token"],
                "speedup_over_decoding": plain / top["seconds_per_token"],
                "rounds": rows}


def speculate(sp: Speculation, batches, ctx: int, alphas, ks, arch=None) -> dict:
    """The best ``K`` per batch size on each chip of ``arch`` (schema ``solbound.speculative/1``)."""
    last = sp.target.max_positions
    if last and ctx + max(ks, default=0) + 1 > last:
        raise StepError(f"context {ctx} + {max(ks) + 1} verified tokens is beyond "
                        f"{sp.target.name}'s {last} positions")
    out = []
    for spec in specs_of(arch):
        out.append({"arch": spec.id,
                    "batches": [sp.best(b, ctx, tuple(alphas), ks, spec) for b in batches]})
    return {"schema": SCHEMA, "target": sp.target.name, "draft": sp.draft.name,
            "acceptance": list(alphas), "k": sorted(set(ks) | {0}), "ctx": ctx,
            "tp": sp.target.tp, "speculative": out}


def _check_ks(ks) -> list[int]:
    if not ks or any(k < 0 for k in ks) or max(ks) > 64 or not all(
            isinstance(k, int) for k in ks):
        raise StepError(f"draft lengths {ks}: whole numbers in 0..64")
    return list(ks)


def parse_ks(text: str) -> list[int]:
    """``1-8`` or ``1,2,4``.

    >>> parse_ks("1-4"), parse_ks("2,6")
    ([1, 2, 3, 4], [2, 6])
    """
    try:
        if "-" in text:
            a, b = (int(x) for x in text.split("-", 1))
            return _check_ks(list(range(a, b + 1)))
        return _check_ks([int(x) for x in text.split(",")])
    except ValueError:
        raise StepError(f"--k {text!r}: a range 1-8 or a list 1,2,4") from None


__all__ = ["Speculation", "expected_tokens", "head_model", "parse_acceptance", "parse_ks",
           "speculate"]
