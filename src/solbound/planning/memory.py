"""The memory one rank of a training plan holds, at least.

A rank of pipeline stage ``s`` (``layers`` layers, the first and last stage with the
layers' outside) holds its shard of the stage's state and the activations of the
microbatches in flight under the schedule:

* parameters, gradients and optimizer state: the stage's (already the tensor-parallel
  shard: the profile is traced per TP degree), divided by the data-parallel degree ``dp``
  from ZeRO stage 1 on for the optimizer state, 2 on for the gradients, 3 (FSDP) on for the
  parameters;
* activations: what the backward reads of the forward, per microbatch in flight
  (``inflight``, counted in chunks of ``1 / chunks`` of the stage for an interleaved
  schedule). With full recompute a layer keeps only its input (the hidden states), and
  one layer's saved activations exist at a time while it is recomputed.

A ZeRO-3 rank also gathers one layer's parameters at a time, and every rank needs working
memory for the operator running; neither is added, so this is a lower bound: a plan over
the chip's memory does not fit, one under it may still not.

>>> activation_bytes(saved=80.0, layers=4, inflight=3, chunks=1, recompute="none",
...                  layer_saved=20.0, layer_input=5.0)
240.0
>>> activation_bytes(saved=80.0, layers=4, inflight=3, chunks=1, recompute="full",
...                  layer_saved=20.0, layer_input=5.0)      # 3 x 4 inputs + one layer
80.0
>>> sharded(100.0, dp=4, zero=1, what="optimizer_state"), sharded(100.0, 4, 1, "gradients")
(25.0, 100.0)
"""

from __future__ import annotations

RECOMPUTE = ("none", "full")
ZERO = (0, 1, 2, 3)
_FROM = {"optimizer_state": 1, "gradients": 2, "parameters": 3}


def sharded(nbytes: float, dp: int, zero: int, what: str) -> float:
    """A rank's share of ``what`` under ZeRO stage ``zero`` over ``dp`` ranks."""
    return nbytes / dp if zero >= _FROM[what] else nbytes


def activation_bytes(saved: float, layers: int, inflight: int, chunks: int, recompute: str,
                     layer_saved: float, layer_input: float) -> float:
    """Activation bytes at the schedule's peak (module doc): ``saved``, the stage's saved
    bytes a microbatch; ``inflight``, microbatch chunks holding them at once."""
    if recompute == "none":
        return saved * inflight / chunks
    if recompute == "full":
        outside = saved - layer_saved * layers
        return (layer_input * layers + outside) * inflight / chunks + layer_saved
    raise ValueError(f"recompute {recompute!r}: one of {', '.join(RECOMPUTE)}")


def rank_memory(profile, layers: int, first: bool, last: bool, dp: int, zero: int,
                inflight: int, chunks: int, recompute: str) -> dict[str, float]:
    """The bytes a rank of a stage holds, by kind, and their ``total`` (module doc)."""
    out = {w: sharded(profile.state_at(w, layers, first, last), dp, zero, w)
           for w in ("parameters", "gradients", "optimizer_state")}
    out["activations"] = activation_bytes(
        profile.saved_at(layers, first, last), layers, inflight, chunks, recompute,
        profile.saved.get("loop", 0.0), profile.hidden_bytes)
    out["total"] = sum(out.values())
    return out


def schedule_memory(profile, stages: list[tuple[int, bool, bool]], dp: int, zero: int,
                    result, chunks: int, recompute: str) -> list[dict[str, float]]:
    """Per rank, the bytes it holds under the schedule ``result``
    (``schedules.pipeline.Result``) over ``stages`` (``(layers, first, last)`` each): rank
    ``r`` holds stage ``r`` with its peak of microbatches in flight; under DualPipe it holds
    stage ``r`` and stage ``p - 1 - r`` (both stages' parameters, gradients and optimizer
    state) and the microbatches of each at its peak (``Result.peak_pair``)."""
    p = len(stages)

    def one(s, inflight):
        layers, first, last = stages[s]
        return rank_memory(profile, layers, first, last, dp, zero, inflight, chunks, recompute)
    if result.schedule != "dualpipe":
        return [one(s, k) for s, k in enumerate(result.peak_inflight)]
    out = []
    for r, (a, b) in enumerate(result.peak_pair):
        m1, m2 = one(r, a), one(p - 1 - r, b)
        out.append({k: m1[k] + m2[k] for k in m1})
    return out
