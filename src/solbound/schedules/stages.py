"""Pipeline stages of a traced training step: each stage's forward (F), input-gradient (B)
and weight-gradient (W) work and bytes, from the step's own kernels.

The step (``analyze --train``) is one microbatch's. Its decoder layers are rerolled into a
loop per phase (forward, backward, optimizer: ``Kernel.loop``, the counts totals over the
trip), so a layer's share of a loop is ``1 / trip`` of it. A stage of ``n`` layers gets
``n / trip`` of each loop; the kernels outside the loops go to the stage that holds their
operator: the forward's before the layers (embedding) and the backward's after them (its
gradient) to the first stage, the forward's after the layers (final norm, LM head, loss)
and the backward's before them to the last; the optimizer's outside the loop to the first
stage when they update an embedding, else to the last.

Backward kernels are split into B and W by the dataflow: a kernel is W when everything it
writes is a parameter's gradient or is read only by the optimizer or by W kernels (the
products ``dW = dY^T X``); the rest is B (``dX = dY W``, attention's four products, the
elementwise gradients). Bytes are the fused traffic, each DRAM tensor charged to its first
reader's part and each write to its writer's, as ``analysis.training.phase_counts`` splits
phases. A stage's time for an operation is the roofline of its part's work and bytes
(``bounds.roofline.work_bound``); the optimizer runs once per step after the flush, on every
stage at once, so the step is the schedule's makespan plus the slowest stage's optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..analysis.training import fused_bytes_by
from ..bounds.roofline import Policy, work_bound, work_of
from ..ir.model import kernel_reads
from .pipeline import ScheduleError, Stage, simulate


@dataclass
class Part:
    """Work per pipe, SFU ops, FLOPs, MACs and fused bytes of some kernels; of the bytes,
    ``fixed_bytes`` those of tensors whose size does not depend on the tokens (parameters,
    buffers, constants and gradients: the optimizer's state is a buffer)."""
    work: dict[str, float] = field(default_factory=dict)
    special: dict[str, float] = field(default_factory=dict)
    flops: float = 0.0
    macs: float = 0.0
    bytes: float = 0.0
    fixed_bytes: float = 0.0

    def add(self, other: "Part", scale: float = 1.0) -> None:
        for mine, theirs in ((self.work, other.work), (self.special, other.special)):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0.0) + scale * v
        self.flops += scale * other.flops
        self.macs += scale * other.macs
        self.bytes += scale * other.bytes
        self.fixed_bytes += scale * other.fixed_bytes

    def per_tokens(self, f: float) -> "Part":
        """This part over ``f`` times the tokens: its work and the bytes of token-sized
        tensors scaled, the fixed bytes kept.

        >>> p = Part({"tensor_bf16": 8.0}, {}, 8.0, 4.0, 10.0, 6.0).per_tokens(0.5)
        >>> p.work, p.macs, p.bytes, p.fixed_bytes
        ({'tensor_bf16': 4.0}, 2.0, 8.0, 6.0)
        """
        return Part({k: v * f for k, v in self.work.items()},
                    {k: v * f for k, v in self.special.items()}, self.flops * f,
                    self.macs * f, self.fixed_bytes + (self.bytes - self.fixed_bytes) * f,
                    self.fixed_bytes)

    def seconds(self, spec) -> float:
        return work_bound(self.work, self.special, self.bytes, int(self.flops), spec,
                          "fused").seconds


def _classify(program, phase_of: dict[str, str], gradients: dict[str, str]) -> list[str]:
    """Per kernel: ``F``, ``B``, ``W`` or ``O`` (optimizer); see the module doc."""
    ks = program.kernels
    phase = [phase_of.get(k.op, "forward") for k in ks]
    readers: dict[str, list[int]] = {}
    for i, k in enumerate(ks):
        for t in {a.tensor for a in kernel_reads(k)}:
            readers.setdefault(t, []).append(i)
    grads = set(gradients.values())
    cls = ["F" if p == "forward" else "O" if p == "optimizer" else "" for p in phase]
    for i in range(len(ks) - 1, -1, -1):
        if cls[i]:
            continue
        outs = ks[i].outputs
        w = all(t in grads or (readers.get(t) and all(cls[j] in ("O", "W")
                                                       for j in readers[t] if j != i))
                for t in outs)
        cls[i] = "W" if w else "B"
    return cls


def parts(program, counts, phase_of: dict[str, str], gradients: dict[str, str],
          policy: Policy) -> dict[tuple, Part]:
    """``(kind, where) -> Part`` with kind F/B/W/O and where ``loop`` (per layer: the loop
    totals over the trip), ``first`` or ``last`` (the stage it belongs to)."""
    ks, kcs = program.kernels, counts.kernels
    cls = _classify(program, phase_of, gradients)
    first_loop: dict[str, int] = {}
    for i, k in enumerate(ks):
        if k.loop is not None:
            first_loop.setdefault(cls[i] if cls[i] in ("F", "O") else "BW", i)
    trips = {k.loop[1] for k in ks if k.loop is not None}
    if len(trips) > 1:
        raise ScheduleError(f"the step has layer loops of {sorted(trips)} trips: a pipeline "
                            f"split needs one stack of layers")
    trip = trips.pop() if trips else 0
    where = []
    for i, k in enumerate(ks):
        c = cls[i]
        if k.loop is not None:
            where.append("loop")
        elif c == "F":
            where.append("first" if i < first_loop.get("F", len(ks)) else "last")
        elif c in ("B", "W"):
            where.append("last" if i < first_loop.get("BW", len(ks)) else "first")
        else:
            names = " ".join(a.tensor for a in kernel_reads(k))
            where.append("first" if "embed" in names or "wte" in names else "last")
    labels = list(zip(cls, where))
    out: dict[tuple, Part] = {}
    for lab, kc in zip(labels, kcs):
        w, s = work_of([kc], policy)
        out.setdefault(lab, Part()).add(Part(w, s, float(sum(kc.flops.values())),
                                             float(kc.macs)))
    for lab, b in fused_bytes_by(counts, labels).items():
        if lab is not None:
            out.setdefault(lab, Part()).bytes += b
    fixed = {t.name for t in program.tensors
             if t.role in ("parameter", "buffer", "constant", "assumed")}
    fixed |= set(gradients.values())
    for lab, b in fused_bytes_by(counts, labels, only=fixed).items():
        if lab is not None:
            out.setdefault(lab, Part()).fixed_bytes += b
    if trip:
        for key, p in out.items():
            if key[1] == "loop":
                per = Part()
                per.add(p, 1.0 / trip)
                out[key] = per
    out[("trip", "")] = Part(macs=trip)
    return out


def split_layers(layers: int, stages: int, split: list[int] | None = None) -> list[int]:
    """Layers per stage: ``split`` as given, else as even as the count allows (the first
    stages one more).

    >>> split_layers(10, 4), split_layers(8, 2, [3, 5])
    ([3, 3, 2, 2], [3, 5])
    """
    if split is not None:
        if len(split) != stages or sum(split) != layers or min(split) < 0:
            raise ScheduleError(f"stage split {split}: {stages} stages holding all "
                                f"{layers} layers")
        return list(split)
    if stages > layers:
        raise ScheduleError(f"{stages} pipeline stages for {layers} layers: at least one "
                            f"layer a stage")
    q, r = divmod(layers, stages)
    return [q + (1 if s < r else 0) for s in range(stages)]


def stage_parts(pieces: dict[tuple, Part], layers: int, first: bool, last: bool
                ) -> dict[str, Part]:
    """F, B, W and O of a stage of ``layers`` layers (the first and last stage with the
    layers' outside)."""
    acc = {k: Part() for k in "FBWO"}
    for (kind, where), p in pieces.items():
        if kind not in acc:
            continue
        if where == "loop":
            acc[kind].add(p, layers)
        elif (where == "first" and first) or (where == "last" and last):
            acc[kind].add(p)
    return acc


def plan(pieces: dict[tuple, Part], spec, stages: int, microbatches: int,
         schedule: str = "1f1b", chunks: int = 1, split: list[int] | None = None,
         p2p_bytes: float = 0.0) -> dict:
    """The pipelined step on ``spec``: per stage its layers, MACs and F/B/W seconds per
    microbatch, the schedule's makespan over ``microbatches`` (with ``p2p_bytes`` sent per
    microbatch between stages over the chip's scale-up link), the optimizer, the bubble."""
    trip = int(pieces[("trip", "")].macs)
    if not trip:
        raise ScheduleError("the step has no rerolled stack of layers to split into stages")
    layers = split_layers(trip, stages, split)
    rows, times = [], []
    for s, n in enumerate(layers):
        acc = stage_parts(pieces, n, s == 0, s == stages - 1)
        t = {k: acc[k].seconds(spec) for k in "FBWO"}
        times.append(Stage(t["F"], t["B"], t["W"]))
        rows.append({"stage": s, "layers": n,
                     "macs": int(round(sum(acc[k].macs for k in "FBW"))),
                     "optimizer_macs": int(round(acc["O"].macs)),
                     "seconds": {"forward": t["F"], "input_gradient": t["B"],
                                 "weight_gradient": t["W"], "optimizer": t["O"]}})
    link = spec.links.get("scale_up") if spec.links else None
    p2p = p2p_bytes / float(link) if link and p2p_bytes else 0.0
    r = simulate(schedule, times, microbatches, p2p=p2p, chunks=chunks)
    opts = [row["seconds"]["optimizer"] for row in rows]
    if schedule == "dualpipe":            # rank s steps the optimizer of both its stages
        opts = [a + b for a, b in zip(opts, opts[::-1])]
    opt = max(opts)
    for s, (row, peak) in enumerate(zip(rows, r.peak_inflight)):
        row["peak_microbatches"] = peak
        if schedule == "dualpipe":        # rank s holds stages s and p - 1 - s
            row["rank_stages"] = [s, stages - 1 - s]
            row["peak_microbatches_by_stage"] = list(r.peak_pair[s])
    return {"schedule": schedule, "stages": rows, "microbatches": microbatches,
            "chunks": chunks, "arch": spec.id, "makespan_seconds": r.makespan,
            "optimizer_seconds": opt, "seconds": r.makespan + opt,
            "bubble_fraction": r.bubble_fraction, "p2p_seconds": p2p,
            "p2p_bytes": p2p_bytes, "result": r}
