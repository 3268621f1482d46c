"""A training step's counts per phase and its resident memory.

The step's program (forward, backward and optimizer in one ``Program``) is counted like any
other; this module splits those counts by phase and derives what the step keeps in DRAM.
Phases are a fact of the frontend (which framework operator belongs to which phase), given
as ``phase_of``: operator id -> ``forward`` | ``backward`` | ``optimizer``.

Per phase: MACs, FLOPs per unit, unfused bytes (the round trips of its operators) and fused
bytes (each DRAM tensor charged to the phase that first reads it, each output to the phase
that writes it; the phases add up to the step's fused bytes).

Resident memory, from the program and its order:

* ``parameters`` and ``buffers``: the model's state; ``optimizer_state``: the optimizer's
  (updated in place: the new values need no second copy);
* ``gradients``: the gradient tensors (intermediates of the step, alive from the backward
  operator that makes them to the optimizer that reads them);
* ``saved_for_backward``: tensors the forward writes and the backward reads;
* ``peak_intermediates``: the largest sum of live intermediates over the program's order
  (a tensor lives from its first write to its last read), gradients and saved activations
  included;
* ``total`` = parameters + buffers + optimizer state + inputs + peak intermediates.

>>> from solbound.ir.model import Access, Kernel, Program, TensorDecl
>>> from solbound.ir.affine import Aff
>>> i = Aff.var("i")
>>> t = (TensorDecl("x", (4,), "f32", "input"), TensorDecl("a", (4,), "f32", "intermediate"),
...      TensorDecl("b", (4,), "f32", "intermediate"), TensorDecl("y", (4,), "f32", "output"))
>>> ks = (Kernel("k1", (("i", 4),), "a", (i,), Access("x", (i,)), op="f"),
...       Kernel("k2", (("i", 4),), "b", (i,), Access("a", (i,)), op="g"),
...       Kernel("k3", (("i", 4),), "y", (i,), Access("b", (i,)), op="h"))
>>> peak_live(Program(t, ks))
32
>>> saved_for_backward(Program(t, ks), {"f": "forward", "g": "backward", "h": "backward"})
{'a': 16}
"""

from __future__ import annotations

from ..ir.model import MATRIX, SPECIAL, VECTOR, Program, kernel_reads

PHASES = ("forward", "backward", "optimizer")


def _nbytes(t) -> int:
    return t.numel * t.itemsize


def peak_live(program: Program) -> int:
    """The largest number of bytes of intermediates alive at once, over kernel order."""
    tensors = program.tensor_map
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, k in enumerate(program.kernels):
        for o in k.outputs:
            if tensors[o].role == "intermediate":
                first.setdefault(o, i)
                last[o] = max(last.get(o, i), i)
        for a in kernel_reads(k):
            if tensors[a.tensor].role == "intermediate":
                last[a.tensor] = i
    delta = [0] * (len(program.kernels) + 1)
    for t, i in first.items():
        delta[i] += _nbytes(tensors[t])
        delta[last[t] + 1] -= _nbytes(tensors[t])
    peak = live = 0
    for d in delta:
        live += d
        peak = max(peak, live)
    return peak


def saved_for_backward(program: Program, phase_of: dict[str, str]) -> dict[str, int]:
    """Intermediates the forward writes and the backward reads: tensor -> bytes."""
    tensors = program.tensor_map
    fwd = {o for k in program.kernels if phase_of.get(k.op) == "forward" for o in k.outputs
           if tensors[o].role == "intermediate"}
    read = {a.tensor for k in program.kernels if phase_of.get(k.op) == "backward"
            for a in kernel_reads(k)}
    return {t: _nbytes(tensors[t]) for t in sorted(fwd & read)}


def phase_counts(program: Program, counts, phase_of: dict[str, str]) -> dict[str, dict]:
    """MACs, FLOPs per unit, unfused and fused bytes of each phase."""
    out = {p: {"macs": 0, "flops": 0, "flops_by_unit": {MATRIX: 0, VECTOR: 0, SPECIAL: 0},
               "bytes": {"unfused": 0, "fused": 0}, "operators": 0} for p in PHASES}
    for g in counts.groups:
        p = out[phase_of.get(g.op, "forward")]
        p["operators"] += 1
        p["macs"] += g.macs
        for u, v in g.flops.items():
            p["flops_by_unit"][u] = p["flops_by_unit"].get(u, 0) + v
        p["bytes"]["unfused"] += g.traffic.bytes
    for p in out.values():
        p["flops"] = sum(p["flops_by_unit"].values())
    labels = [phase_of.get(k.op, "forward") for k in program.kernels]
    for ph, b in fused_bytes_by(counts, labels, "forward").items():
        out[ph]["bytes"]["fused"] += b
    return out


def fused_bytes_by(counts, labels: list, default=None, only=None) -> dict:
    """The fused DRAM bytes split by a label per kernel (``labels[i]`` for kernel ``i``):
    each tensor's read charged to its first reader's label, each write to its (last)
    writer's, a tensor no kernel touches to ``default``; ``only``: of these tensors alone."""
    first_reader: dict[str, object] = {}
    writer: dict[str, object] = {}
    for lab, kc in zip(labels, counts.kernels):
        for t in kc.reads:
            first_reader.setdefault(t, lab)
        for t in kc.writes:
            writer[t] = lab
    out: dict = {}
    for t, b in counts.fused.reads.items():
        if only is not None and t not in only:
            continue
        lab = first_reader.get(t, default)
        out[lab] = out.get(lab, 0) + b
    for t, b in counts.fused.writes.items():
        if only is not None and t not in only:
            continue
        lab = writer.get(t, default)
        out[lab] = out.get(lab, 0) + b
    return out


def step_memory(program: Program, phase_of: dict[str, str], gradients: dict[str, str],
                optimizer_state: set[str]) -> dict:
    """Resident bytes of the step (module doc). ``gradients``: parameter -> IR tensor of
    its gradient; ``optimizer_state``: the IR tensors holding the optimizer's state."""
    tensors = program.tensor_map
    params = sum(_nbytes(t) for t in program.tensors if t.role == "parameter")
    state = sum(_nbytes(tensors[n]) for n in optimizer_state if n in tensors)
    buffers = sum(_nbytes(t) for t in program.tensors
                  if t.role in ("buffer", "constant") and t.name not in optimizer_state)
    inputs = sum(_nbytes(t) for t in program.tensors if t.role == "input")
    grads = sum(_nbytes(tensors[n]) for n in set(gradients.values()) if n in tensors)
    saved = sum(saved_for_backward(program, phase_of).values())
    peak = peak_live(program)
    return {"parameters": params, "buffers": buffers, "optimizer_state": state,
            "inputs": inputs, "gradients": grads, "saved_for_backward": saved,
            "peak_intermediates": peak, "total": params + buffers + state + inputs + peak}
