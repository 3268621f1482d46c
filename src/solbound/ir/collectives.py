"""Collectives: the library kernels through which the ranks of a parallel program talk.

A program with collectives is the program *one rank* runs (SPMD: every rank runs the
same IR on its own data). A collective is a library kernel (``Kernel.lib``) whose
routine is one of :data:`KINDS`, with parameters

* ``ranks``: the size of the group it runs over;
* ``group``: the global ranks of that group, as a tuple (the traced rank's group);
* ``op``: the reduction (``sum``, ``avg``, ``max``, ``min``, ``product``) of an
  all-reduce or reduce-scatter;
* ``perm``: for ``permute``, the ``(source, destination)`` pairs over group positions.

Gathers, scatters and all-to-all work along dimension 0 of the operand (PyTorch's
``all_gather_into_tensor``, ``reduce_scatter_tensor`` and ``all_to_all_single`` with
equal splits; JAX's frontend moves its axis to the front first).

What a collective costs is not FLOPs but bytes over a link: its payload is the full tensor
it moves per rank and call, the larger of what it reads and what it writes (an
all-gather's gathered result, a reduce-scatter's unscattered operand;
``analysis.counts.collectives`` takes both from the kernel's footprints), and
``bounds/comm.py`` multiplies it by the kind's lower-bound factor. The adds of a reduction are not
counted as work: a switch that reduces in the network (NVLS, SHARP) does them, and
elsewhere they are ``(n - 1) / n`` adds per element, far below the link time.

A single rank cannot compute a collective: :func:`run` needs the other ranks' operands,
which :func:`solbound.ir.execute.execute_spmd` provides by running every rank's program
in lockstep.

>>> xs = [np.array([[1.0], [2.0]]), np.array([[10.0], [20.0]])]
>>> run("reduce_scatter", {"op": "sum"}, xs, 1).tolist(), run("all_gather", {}, xs, 0).shape
([[22.0]], (4, 1))
>>> check("all_gather", {"ranks": 2}, (2, 1), (3, 1))
'all_gather over 2 ranks: result (3, 1) is not 2 x (2, 1) along dim 0'
"""

from __future__ import annotations

import numpy as np

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "permute")
REDUCTIONS = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum,
              "product": np.multiply}


def is_collective(routine: str) -> bool:
    return routine in KINDS


def check(kind: str, params: dict, operand_shape: tuple[int, ...],
          out_shape: tuple[int, ...]) -> str | None:
    """Why a collective's shapes do not fit its kind, or ``None``."""
    n = params.get("ranks")
    if not isinstance(n, int) or n < 1:
        return f"{kind}: ranks must be a positive integer (got {n!r})"
    lead_in = operand_shape[0] if operand_shape else 1
    lead_out = out_shape[0] if out_shape else 1
    if kind in ("all_reduce", "all_to_all", "permute") and tuple(operand_shape) != tuple(out_shape):
        return f"{kind}: the result's shape {tuple(out_shape)} must be the operand's {tuple(operand_shape)}"
    if kind == "all_gather" and (lead_out != n * lead_in or operand_shape[1:] != out_shape[1:]):
        return f"all_gather over {n} ranks: result {tuple(out_shape)} is not {n} x {tuple(operand_shape)} along dim 0"
    if kind == "reduce_scatter" and (lead_in != n * lead_out or operand_shape[1:] != out_shape[1:]):
        return f"reduce_scatter over {n} ranks: operand {tuple(operand_shape)} is not {n} x {tuple(out_shape)} along dim 0"
    if kind == "all_to_all" and lead_in % n:
        return f"all_to_all over {n} ranks: dim 0 of {tuple(operand_shape)} does not split into {n}"
    if kind in ("all_reduce", "reduce_scatter") and params.get("op", "sum") not in REDUCTIONS:
        return f"{kind}: unknown reduction {params.get('op')!r} (known: {', '.join(REDUCTIONS)})"
    return None


def run(kind: str, params: dict, operands: list[np.ndarray], position: int) -> np.ndarray:
    """The result on the rank at ``position`` of the group, from every member's operand
    (``operands[i]``: the operand of the member at position ``i``)."""
    n = len(operands)
    if kind in ("all_reduce", "reduce_scatter"):
        op = params.get("op", "sum")
        acc = operands[0].copy()
        for x in operands[1:]:
            acc = REDUCTIONS[op](acc, x)
        if op == "avg":
            acc = acc / n
        if kind == "all_reduce":
            return acc
        return np.split(acc, n, axis=0)[position]
    if kind == "all_gather":
        return np.concatenate(operands, axis=0)
    if kind == "all_to_all":
        return np.concatenate([np.split(x, n, axis=0)[position] for x in operands], axis=0)
    if kind == "permute":
        for src, dst in params.get("perm", ()):
            if dst == position:
                return operands[src]
        return np.zeros_like(operands[position])
    raise ValueError(f"unknown collective {kind!r}")
