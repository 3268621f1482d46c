"""Validation entry points (kept for imports): the neutral comparison lives in
``validate/compare.py``, the PyTorch reference in ``frontends/torch/reference.py``."""

from __future__ import annotations

from .compare import *  # noqa: F401,F403
from .compare import (DEFAULT_MAX_BYTES, DEFAULT_MAX_SECONDS, EPS, compare,  # noqa: F401
                      estimate_cost, max_reduction, rel_error, tolerance)


def validate_report(*args, **kwargs) -> dict:
    """Fill ``rep.validation`` for a PyTorch report (see frontends/torch/reference.py)."""
    from ..frontends.torch.reference import validate_report as run
    return run(*args, **kwargs)


def validate_lowered(*args, **kwargs) -> dict:
    """Compare a lowered PyTorch program with its module (frontends/torch/reference.py)."""
    from ..frontends.torch.reference import validate_lowered as run
    return run(*args, **kwargs)
