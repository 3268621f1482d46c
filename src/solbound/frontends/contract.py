"""The contract between a frontend and the rest of the pipeline.

A frontend (PyTorch, JAX) turns a program into a :class:`LoweredProgram`: the loop IR plus
what validation and the report need to know about the original program (its inputs, state,
outputs, framework operators, unsupported operators with source lines, random draws).
Nothing here depends on a framework.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.model import Program


class FrontendError(RuntimeError):
    """A program that cannot be loaded or traced; the message is one line."""


@dataclass
class Unsupported:
    operator: str
    source: str
    reason: str
    node: str


@dataclass
class LoweredProgram:
    """The IR plus what the frontend learned that the IR itself does not hold."""

    program: Program
    unsupported: list[Unsupported]
    # graph output position -> (kind, name, view meta) for validation
    outputs: list[dict]
    inputs: list[dict]           # user inputs in order: {"name", "ir"}
    state: list[dict]            # parameters/buffers: {"target", "ir", "role"}
    groups: dict[str, dict]      # op id -> {"name", "src"}
    # FX node name -> where its (first) tensor value lives in the IR, for diagnosis
    values: dict[str, dict] = field(default_factory=dict)
    rules_used: set[str] = field(default_factory=set)
    # IR tensor holding a random draw -> (where the framework drew it: an FX node, or a
    # JAX equation path such as "3/0/2" through inlined calls; output index or None):
    # validation replays the framework's draw there
    random_draws: dict[str, tuple[str, int | None]] = field(default_factory=dict)
    # intermediates the demand pass confined to the elements their readers use
    partial: set[str] = field(default_factory=set)
    # where a draw that cannot be replayed was made (inside a loop or a branch), or ""
    draws_unreplayable: str = ""
    # a training step (frontends/torch/train.py): {"optimizer", "gradients": {parameter:
    # IR tensor}, "optimizer_state": [IR tensors], "trained", "frozen", "unused"}; the
    # phase of each operator is in ``groups[op]["phase"]``
    training: dict | None = None
    # stacks of repeated layers traced once and run as a sequential loop
    # (frontends/torch/stacks.py): {"module", "layers", "period", "traced", "trip", ...}
    rerolled: list[dict] = field(default_factory=list)
    # a program of one rank among ``world_size`` (collectives; ``ir/collectives.py``); a
    # JAX shard_map also records its mesh ({axis: size}) and each input's and output's
    # partition spec, for validation on every device
    world_size: int = 1
    mesh: dict | None = None
