"""The one-call Python API: ``solbound.analyze(module, inputs, arch=...)`` and
``solbound.analyze_source("FILE.py")``.

Both dispatch over the frontend registry (``frontends/registry.py``): the frontend that
claims the object or file analyzes it (capture, lowering, the pipeline after it, and
validation against its own reference). Nothing here is specific to a frontend.
"""

from __future__ import annotations

from typing import Sequence

from .frontends.registry import for_object, for_source
from .pipeline import analyze_lowered
from .report.report import Report


def analyze(module, inputs: Sequence, arch=None, precision_policy: str | None = None,
            source: str | None = None, validate: bool = False, agent=None,
            **options) -> Report:
    """Analyze ``module(*inputs)``: an ``nn.Module``, a JAX function, or (with ``agent``)
    a numpy function. ``arch``: a comma-separated string of catalog ids, a list of
    ids/specs, or ``None`` for the default set. ``agent``: a
    :class:`solbound.frontends.agent.translate.Agent` that writes the IR of what no
    tracer reads. The other options are the frontend's
    (``frontends/torch/frontend.analyze_module``: ``train``, ``optimizer``, ``routing``,
    ``select_fraction``, ``cache``, ``reroll``, ``modes``, ``dp``, ...;
    ``frontends/jax/frontend.analyze_function``)."""
    args = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    fe = for_object(module, args)
    rep = fe.load("analyze_object")(module, args, arch=arch, precision_policy=precision_policy,
                                    source=source, validate=validate, agent=agent, **options)
    if agent is not None:
        rep.agent = agent.report()
    return rep


def analyze_source(spec: str, arch=None, precision_policy: str | None = None,
                   validate: bool = False, agent=None, **options) -> Report:
    """``FILE.py`` or ``pkg.module:factory``, read by the frontend that claims it (a
    KernelBench-style file is PyTorch; a file whose ``example()`` returns
    ``(function, args)`` is JAX or, importing neither, numpy). Options as
    :func:`analyze`, plus ``params`` (a factory's keyword arguments or a file's
    module-level constants) and, for PyTorch, ``world_size``, ``tp``, ``dp``, ``fsdp``
    (``frontends/torch/frontend.analyze_source``)."""
    fe = for_source(spec)
    rep = fe.load("analyze_source")(spec, arch=arch, precision_policy=precision_policy,
                                    validate=validate, agent=agent, **options)
    if agent is not None:
        rep.agent = agent.report()
    return rep


__all__ = ["analyze", "analyze_source", "analyze_lowered"]
