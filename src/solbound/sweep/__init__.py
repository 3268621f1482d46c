"""Sweeps: many analyses of one program (a grid of its parameters, many chips) as Ray
tasks (``engine.py``), from a TOML file (``spec.py``), with CSV/JSON/HTML output
(``run.py``, ``html.py``). KernelBench's runner schedules its problems on the same engine.
"""

from .engine import Engine, EngineError, Outcome  # noqa: F401
from .spec import Sweep, SweepError, load  # noqa: F401
