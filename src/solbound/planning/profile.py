"""What a plan search needs of one traced training step: per layer and for the layers'
outside (the first stage's embedding, the last stage's norm, head and loss), the work of
the forward (F), input gradient (B), weight gradient (W) and optimizer (O), the state a
rank holds (parameters, gradients, optimizer state) and the activations the backward
reads (saved for backward, but attention's scores and probabilities, which a fused
attention kernel recomputes instead of storing), all from the step's program (``schedules.stages.parts`` for
the work; the state and the saved tensors by the dataflow).

A profile is one microbatch of ``microbatch`` sequences at one tensor-parallel degree:
plans with other pipeline and data-parallel degrees, microbatch counts, ZeRO stages and
recompute are composed from it without tracing again (``planning.search``).

Where a tensor lives: a tensor a layer-loop kernel touches is per layer (stacked over the
loop: ``1 / trip`` of it a layer); a parameter outside the loops belongs to the first
stage when a forward kernel before the layers reads it, to the last when one after them
does, to both when both do (tied embeddings: the last stage keeps a copy, as Megatron
does); its gradient and optimizer state go with it (tensors one optimizer kernel touches
together); a saved activation outside the loops to the side of the layers it is written on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..analysis.training import _nbytes, saved_for_backward
from ..ir.model import kernel_reads
from ..schedules.stages import Part, parts

WHERE = ("loop", "first", "last")


@dataclass
class Profile:
    """One microbatch's step at one TP degree, ready to be composed into plans."""
    tp: int
    microbatch: int            # sequences a microbatch
    seq: int                   # tokens a sequence
    layers: int                # the layer loop's trip
    pieces: dict[tuple, Part]  # (F|B|W|O, loop|first|last) -> work; loop: per layer
    state: dict[tuple, float]  # (parameters|gradients|optimizer_state, where) -> bytes
    saved: dict[str, float]    # where -> activation bytes the backward reads, a microbatch
    #                            (attention's score-shaped ones left out: ``saved_scores``)
    hidden_bytes: float        # the hidden states a microbatch sends between stages
    hidden: int = 0            # the model's width (the TP all-reduces' rows)
    act_itemsize: int = 2      # bytes of an activation element
    model_macs: float = 0.0    # MACs of F + B + W of the whole step, a microbatch
    tensor_flops: float = 0.0  # of those, the FLOPs on tensor-core pipes
    saved_scores: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    kv_bytes: float = 0.0      # one layer's keys and values of a microbatch, every token
    q_bytes: float = 0.0       # one layer's queries (or attention output) of a microbatch
    heads: int = 0             # query and key-value heads a rank (Ulysses splits them)
    kv_heads: int = 0
    cp: int = 1                # context-parallel degree (``planning.context``)

    def state_at(self, what: str, layers: int, first: bool, last: bool) -> float:
        """Bytes of ``what`` a stage of ``layers`` layers holds (the first and last stage
        with the layers' outside)."""
        b = self.state.get((what, "loop"), 0.0) * layers
        b += self.state.get((what, "first"), 0.0) if first else 0.0
        b += self.state.get((what, "last"), 0.0) if last else 0.0
        return b

    def saved_at(self, layers: int, first: bool, last: bool) -> float:
        b = self.saved.get("loop", 0.0) * layers
        b += self.saved.get("first", 0.0) if first else 0.0
        b += self.saved.get("last", 0.0) if last else 0.0
        return b


def hidden_bytes(program, counts) -> float:
    """Bytes a stage sends per microbatch: the most a kernel after the first layer loop
    reads of what the loop wrote (the hidden states leaving the layers, read by the final
    norm: the elements read, one layer's slice of a stacked tensor)."""
    ks = program.kernels
    first = next((k.loop[0] for k in ks if k.loop is not None), None)
    out = {o for k in ks if k.loop is not None and k.loop[0] == first for o in k.outputs}
    tm = program.tensor_map
    sizes = [sum(fp.elements for _, fp in kc.reads[t]) * tm[t].itemsize
             for k, kc in zip(ks, counts.kernels) if k.loop is None
             for t in {a.tensor for a in kernel_reads(k)} if t in out and t in kc.reads]
    return float(max(sizes, default=0))


def _sides(program, phase_of) -> tuple[dict[str, set], int, int]:
    """Per tensor, the sides of the layers (``first``/``last``) its forward readers are
    on; the index of the first and the last forward loop kernel."""
    ks = program.kernels
    fwd_loop = [i for i, k in enumerate(ks) if k.loop is not None
                and phase_of.get(k.op, "forward") == "forward"]
    lo, hi = (fwd_loop[0], fwd_loop[-1]) if fwd_loop else (len(ks), len(ks))
    sides: dict[str, set] = {}
    for i, k in enumerate(ks):
        if k.loop is not None or phase_of.get(k.op, "forward") != "forward":
            continue
        for t in {a.tensor for a in kernel_reads(k)}:
            sides.setdefault(t, set()).add("first" if i < lo else "last")
    return sides, lo, hi


def state_by_where(program, phase_of: dict[str, str], gradients: dict[str, str],
                   optimizer_state: set[str]) -> dict[tuple, float]:
    """``(parameters|gradients|optimizer_state, where) -> bytes`` (module doc); ``loop``
    is per layer."""
    ks, tm = program.kernels, program.tensor_map
    trips = {k.loop[1] for k in ks if k.loop is not None}
    trip = max(trips) if trips else 1
    kind = {t.name: "parameters" for t in program.tensors if t.role == "parameter"}
    kind.update({g: "gradients" for g in gradients.values() if g in tm})
    kind.update({s: "optimizer_state" for s in optimizer_state if s in tm})
    looped = {a.tensor for k in ks if k.loop is not None for a in kernel_reads(k)} | \
        {o for k in ks if k.loop is not None for o in k.outputs}
    sides, _, _ = _sides(program, phase_of)
    # tensors the optimizer's kernels outside the loops connect belong together (a
    # parameter, its gradient and its optimizer state, through the update's intermediates)
    parent: dict[str, str] = {}

    def find(t):
        parent.setdefault(t, t)
        while parent[t] != t:
            parent[t] = parent[parent[t]]
            t = parent[t]
        return t
    for k in ks:
        if k.loop is not None or phase_of.get(k.op, "forward") != "optimizer":
            continue
        touched = sorted({a.tensor for a in kernel_reads(k)} | set(k.outputs))
        for t in touched[1:]:
            parent[find(t)] = find(touched[0])
    home: dict[str, set] = {}
    for t, kd in kind.items():
        if kd == "parameters" and t not in looped:
            home.setdefault(find(t), set()).update(sides.get(t, {"last"}))
    out: dict[tuple, float] = {}
    for t, kd in kind.items():
        b = _nbytes(tm[t])
        if t in looped:
            out[(kd, "loop")] = out.get((kd, "loop"), 0.0) + b / trip
            continue
        for w in sorted(home.get(find(t), {"last"})):
            out[(kd, w)] = out.get((kd, w), 0.0) + b
    return out


def saved_by_where(program, phase_of: dict[str, str], seq: int = 0, width: int = 0,
                   tp: int = 1) -> tuple[dict[str, float], dict[str, float]]:
    """Activation bytes the backward reads of the forward's, by where they are written;
    second, those of them with two axes of ``seq`` (attention's scores and probabilities,
    which a fused attention kernel never stores: it recomputes them from its log-sum-exp
    in the backward, as PyTorch's SDPA does on a GPU; the CPU's decomposition, traced,
    saves them).

    With ``tp > 1`` a tensor whose last axis is the model's ``width`` is the same on every
    rank of the TP group (the residual stream, the norms' inputs and outputs: nothing of it
    is split); Megatron's sequence parallelism splits those over the group's ranks along
    the sequence at no cost in bytes moved (each all-reduce becomes a reduce-scatter and
    an all-gather of the same payload), so a rank holds ``1 / tp`` of each."""
    ks, tm = program.kernels, program.tensor_map
    trips = {k.loop[1] for k in ks if k.loop is not None}
    trip = max(trips) if trips else 1
    _, lo, _ = _sides(program, phase_of)
    writer = {}
    for i, k in enumerate(ks):
        for o in k.outputs:
            writer.setdefault(o, (i, k.loop is not None))
    out: dict[str, float] = {}
    scores: dict[str, float] = {}
    for t, b in saved_for_backward(program, phase_of).items():
        i, in_loop = writer.get(t, (0, False))
        w = "loop" if in_loop else ("first" if i < lo else "last")
        into = scores if seq > 1 and list(tm[t].shape).count(seq) >= 2 else out
        if into is out and tp > 1 and width and tm[t].shape and tm[t].shape[-1] == width:
            b = b / tp                               # sequence parallel (above)
        into[w] = into.get(w, 0.0) + (b / trip if in_loop else b)
    return out, scores


def profile_of(rep, tp: int = 1, microbatch: int = 1, seq: int = 0, width: int = 0
               ) -> Profile:
    """The :class:`Profile` of a report of a training step (``analyze(..., train=True)``)
    whose layers were rerolled into a loop; ``width``: the model's hidden size (with
    ``tp > 1``, the activations of that width are held sequence parallel)."""
    info = rep.lowered.training
    if info is None:
        raise ValueError("a plan profile needs a training step (train=True)")
    phase_of = {op: g.get("phase", "forward") for op, g in (rep.lowered.groups or {}).items()}
    grads = info.get("gradients", {})
    pieces = parts(rep.program, rep.counts, phase_of, grads, rep.policy)
    layers = int(pieces[("trip", "")].macs)
    state = state_by_where(rep.program, phase_of, grads, set(info.get("optimizer_state", [])))
    saved, scores = saved_by_where(rep.program, phase_of, seq, width, tp)
    hb = hidden_bytes(rep.program, rep.counts)
    macs = sum(p.macs * (layers if w == "loop" else 1) for (k, w), p in pieces.items()
               if k in ("F", "B", "W"))
    tensor = sum(v * (layers if w == "loop" else 1) for (k, w), p in pieces.items()
                 if k in ("F", "B", "W") for pipe, v in p.work.items()
                 if pipe.startswith("tensor_"))
    return Profile(tp, microbatch, seq, layers, pieces, state, saved, hb,
                   model_macs=macs, tensor_flops=tensor, saved_scores=scores)
