"""Context parallelism: a rank's share of a training step whose sequences are split over
``cp`` ranks, as Megatron-Core and Llama 3 run it.

Each sequence is cut into ``2 cp`` equal chunks and rank ``r`` holds chunks ``r`` and
``2 cp - 1 - r`` (the causal load balancing of Megatron's context parallelism and of
Llama 3's all-gather attention): a query of chunk ``j`` attends to the keys of chunks
``0 .. j``. The rank all-gathers the keys and values of its CP group before each layer's
attention (forward, and again in the backward) and reduce-scatters their gradients: at
their lower-bound bytes, the all-gather of one layer's keys and values of every token
(ring attention's ``cp - 1`` passes of a block move the same bytes).

What a rank computes is then exact from the profile of the whole sequence: every operator
but attention works on tokens, the rank holds ``1 / cp`` of them; attention's causal pairs
split evenly too (:func:`rank_pairs`: every rank holds ``S (S + 1) / (2 cp)`` of them). So
the rank's forward, input and weight gradient work is the whole sequence's over ``cp``; of
the fused bytes, those of the parameters, buffers and gradients stay whole and the rest
(tokens, the loss) is divided (``schedules.stages.Part.per_tokens``), as are the saved
activations and the hidden states sent between stages. Ulysses (DeepSpeed's all-to-all
over heads) gives a rank the same share of the work (``1 / cp`` of the heads over every
token); only its collectives differ (``planning.search.stage_times``). The optimizer and the state are the
rank's whole; gradients are reduced over the data- and context-parallel ranks together
(``planning.search``).
"""

from __future__ import annotations

import dataclasses


def rank_pairs(seq: int, cp: int, rank: int) -> int:
    """Causal (query, key) pairs of ``rank``'s queries under the balanced split (query
    ``i`` attends to keys ``0 .. i``).

    >>> [rank_pairs(16, 4, r) for r in range(4)], 16 * 17 // 2 // 4
    ([34, 34, 34, 34], 34)
    >>> rank_pairs(10, 2, 0)
    Traceback (most recent call last):
    ...
    ValueError: 10 tokens do not split into 2 x 2 equal chunks
    """
    if seq % (2 * cp):
        raise ValueError(f"{seq} tokens do not split into 2 x {cp} equal chunks")
    c = seq // (2 * cp)
    return sum(sum(j * c + k + 1 for k in range(c)) for j in (rank, 2 * cp - 1 - rank))


def ulysses_bytes(profile) -> int:
    """A layer's all-to-all payload a rank of a Ulysses group sends (the profile a rank of
    ``cp``): its share of the queries, keys, values and attention output."""
    return int((2 * profile.q_bytes + profile.kv_bytes) / profile.cp)


def context_parallel(profile, cp: int):
    """The profile of one rank of ``cp`` from the whole sequence's (module doc)."""
    if cp == 1:
        return profile
    if profile.cp != 1:
        raise ValueError(f"the profile is already a rank of cp {profile.cp}")
    rank_pairs(profile.seq, cp, 0)            # the split exists
    f = 1.0 / cp
    pieces = {k: (p.per_tokens(f) if k[0] in ("F", "B", "W") else p)
              for k, p in profile.pieces.items()}
    return dataclasses.replace(
        profile, pieces=pieces, cp=cp,
        saved={w: b * f for w, b in profile.saved.items()},
        saved_scores={w: b * f for w, b in profile.saved_scores.items()},
        hidden_bytes=profile.hidden_bytes * f)


__all__ = ["rank_pairs", "context_parallel", "ulysses_bytes"]
