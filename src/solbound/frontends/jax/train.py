"""A JAX training step: the file's function *is* the step.

``solbound.analyze(step, (params, opt_state, *batch), train=True)``: the first argument's
leaves are the parameters (IR role ``parameter``), the second's the optimizer's state (role
``buffer``, as PyTorch's optimizer state is held), the rest are inputs. The step is traced
like any JAX function (``jax.value_and_grad`` or ``jax.grad`` inside it, then optax or any
hand-written update); what it returns (the loss, the updated parameters and state) are the
program's outputs, and the gradients are intermediates.

Phases come from the jaxpr itself. JAX names the equations its transposition emits
``transpose(jvp(...))`` in their name stacks: those are the backward. The equations of the
linearized forward carry ``jvp(...)``, and so does every equation the forward or the
backward reads (a batch prepared outside the differentiated function): the forward; one
that only the backward reads (the loss's cotangent seed, ``broadcast_in_dim 1.0``, carries
no name) is the backward's. The rest (optax's update, ``apply_updates``, a step counter) is
the optimizer. A step jitted as
a whole (``jax.jit(step)``) is traced as its inner jaxpr, so that its phases stay apart.

The gradient of a parameter is the backward's value of the parameter's shape and dtype
nearest (fewest equations) to an optimizer equation that reads the parameter (``p + u``,
``u = -lr * g``): the update reads it there. A parameter the loss does not depend on gets
zeros from JAX (``broadcast_in_dim 0.0`` outside the transposition): no backward value
reaches its update, and it is named ``unused`` (optax still updates it, with zeros).
"""

from __future__ import annotations

from collections import deque

from ..contract import FrontendError

JITS = ("pjit", "jit")


def unwrap(closed):
    """The inner jaxpr of a step jitted as a whole (one call equation over every argument,
    returning its results): the step's own equations, each with its own phase."""
    import jax.extend.core as jc
    while len(closed.jaxpr.eqns) == 1:
        e = closed.jaxpr.eqns[0]
        j = closed.jaxpr
        if e.primitive.name not in JITS or list(e.invars) != list(j.invars) \
                or list(e.outvars) != list(j.outvars) or j.constvars:
            break
        inner = e.params["jaxpr"]
        closed = inner if isinstance(inner, jc.ClosedJaxpr) else jc.ClosedJaxpr(inner, ())
    return closed


def _reads(eqn):
    from jax.extend.core import Literal
    return [a for a in eqn.invars if not isinstance(a, Literal)]


def phases(jaxpr) -> list[str]:
    """``forward`` | ``backward`` | ``optimizer`` for each top-level equation."""
    eqns = jaxpr.eqns
    stacks = [str(e.source_info.name_stack) for e in eqns]
    back = ["transpose(" in s for s in stacks]
    if not any(back):
        raise FrontendError("train=True: the step computes no gradient (no equation of a JAX "
                            "transposition: call jax.value_and_grad or jax.grad in it)")
    out = ["optimizer"] * len(eqns)
    fwd: set = set()               # values the forward reads
    bwd: set = set()               # values the backward reads
    for i in reversed(range(len(eqns))):
        e = eqns[i]
        if back[i]:
            out[i] = "backward"
        elif "jvp(" in stacks[i] or any(v in fwd for v in e.outvars):
            out[i] = "forward"
        elif any(v in bwd for v in e.outvars):
            out[i] = "backward"    # read by the backward only: the cotangent seed's ones
        else:
            continue
        (bwd if out[i] == "backward" else fwd).update(_reads(e))
    return out


def gradients(jaxpr, phase: list[str], param_vars: list) -> dict:
    """Parameter index -> (equation index, output index) of its gradient (module doc)."""
    eqns = jaxpr.eqns
    producer = {v: (i, j) for i, e in enumerate(eqns) for j, v in enumerate(e.outvars)}
    found = {}
    for pi, p in enumerate(param_vars):
        aval = p.aval
        start = [i for i, e in enumerate(eqns) if phase[i] == "optimizer" and p in _reads(e)]
        seen, queue = set(start), deque(start)
        while queue:
            i = queue.popleft()
            hit = None
            for a in _reads(eqns[i]):
                if a not in producer:
                    continue
                k, j = producer[a]
                if phase[k] == "backward":
                    if a.aval.shape == aval.shape and a.aval.dtype == aval.dtype and hit is None:
                        hit = (k, j)
                elif phase[k] == "optimizer" and k not in seen:
                    seen.add(k)
                    queue.append(k)
            if hit is not None:
                found[pi] = hit
                break
    return found


def optimizer_name(opt_state) -> str:
    """A name for the optimizer from its state's types (optax's ``ScaleByAdamState``,
    ``EmptyState``), or ``optax`` when the state holds nothing that names it."""
    import jax
    names = []
    for node in jax.tree_util.tree_leaves(opt_state, is_leaf=lambda x: hasattr(x, "_fields")):
        n = type(node).__name__
        if hasattr(node, "_fields") and n not in names and n != "EmptyState":
            names.append(n)
    return "optax" + (f" ({', '.join(names)})" if names else "")
