"""A sweep file (TOML): the program, the chips, and the grid of parameters its factory is
called with. Everything is checked before any point runs; each mistake is one line that
names the key.

>>> s = parse({"program": "pkg.models:mlp", "arch": ["h100-sxm"],
...            "grid": {"b": [1, 2], "s": [8]}}, "sweep.toml")
>>> [p for p in s.points()]
[{'b': 1, 's': 8}, {'b': 2, 's': 8}]
>>> parse({"program": "pkg.models:mlp", "arch": "h100-sxm", "gird": {}}, "sweep.toml")
Traceback (most recent call last):
...
solbound.sweep.spec.SweepError: sweep.toml: unknown key 'gird' (keys: arch, grid, memory, modes, precision_policy, program, timeout, train, world_size)
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

KEYS = {"program", "arch", "grid", "modes", "precision_policy", "train", "world_size",
        "timeout", "memory"}


# grid names that are parallel degrees of the analysis (``--tp``, ``--dp``,
# ``--world-size``), not parameters of the program
PARALLEL = {"tp", "dp", "world_size"}


class SweepError(Exception):
    """A sweep file that cannot run (one line naming the key)."""


@dataclass
class Sweep:
    path: str                               # the sweep file
    program: str                            # FILE.py (absolute) or module:factory
    folder: str                             # where the program is resolved from
    archs: list[str]
    grid: dict[str, list]
    modes: list[str] | None = None          # None: every fidelity
    precision_policy: str | None = None
    train: bool = False
    timeout: float | None = None            # seconds per point
    memory: float | None = None             # GiB per point
    world_size: int = 1                     # ranks of a per-rank program (every point)

    @property
    def names(self) -> list[str]:
        """The grid's parameters, in the file's order (the first varies slowest)."""
        return list(self.grid)

    def points(self) -> list[dict]:
        """Every combination of the grid's values, the first parameter varying slowest."""
        keys = list(self.grid)
        return [dict(zip(keys, vals)) for vals in itertools.product(*self.grid.values())]


def _scalar_list(key: str, v, path: str) -> list:
    vals = v if isinstance(v, list) else [v]
    if not vals:
        raise SweepError(f"{path}: grid.{key} is an empty list")
    for x in vals:
        if not isinstance(x, (int, float, str)) or isinstance(x, bool):
            raise SweepError(f"{path}: grid.{key}: {x!r} is not an int, float or string")
    return vals


def parse(data: dict, path: str) -> Sweep:
    unknown = sorted(set(data) - KEYS)
    if unknown:
        raise SweepError(f"{path}: unknown key {unknown[0]!r} (keys: {', '.join(sorted(KEYS))})")
    if "program" not in data or not isinstance(data["program"], str) or not data["program"]:
        raise SweepError(f"{path}: 'program' is required: a FILE.py or module:factory")
    folder = os.path.dirname(os.path.abspath(path))
    program = data["program"]
    if program.endswith(".py") or os.sep in program:
        program = os.path.normpath(os.path.join(folder, program))
        if not os.path.exists(program):
            raise SweepError(f"{path}: program {data['program']!r}: no such file in {folder}")
    elif ":" not in program:
        raise SweepError(f"{path}: program {program!r}: expected FILE.py or module:factory")
    arch = data.get("arch")
    if arch is None:
        raise SweepError(f"{path}: 'arch' is required: a list of chip ids (see `solbound chips`)")
    archs = [arch] if isinstance(arch, str) else arch
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        raise SweepError(f"{path}: 'arch' must be a list of chip ids")
    from ..hardware.catalog import catalog
    known = catalog()
    if archs == ["all"]:
        archs = list(known)
    for a in archs:
        if a not in known and not (a.endswith(".toml") and os.path.exists(os.path.join(folder, a))):
            raise SweepError(f"{path}: arch {a!r} is not a chip of the catalog (see `solbound "
                             f"chips`) nor a spec file")
    archs = [os.path.join(folder, a) if a.endswith(".toml") else a for a in archs]
    grid = data.get("grid", {})
    if not isinstance(grid, dict):
        raise SweepError(f"{path}: 'grid' must be a table (name = [values])")
    grid = {k: _scalar_list(k, v, path) for k, v in grid.items()}
    reserved = {"arch", "mode", "seconds", "macs", "bytes", "bound", "status", "error", "engine"}
    clash = sorted(set(grid) & reserved)
    if clash:
        raise SweepError(f"{path}: grid parameter {clash[0]!r} is also an output column; "
                         f"rename it")
    modes = data.get("modes")
    if modes is not None:
        from ..bounds.fidelity import FIDELITIES
        modes = [modes] if isinstance(modes, str) else modes
        bad = [m for m in modes if m not in FIDELITIES]
        if not isinstance(modes, list) or not modes or bad:
            raise SweepError(f"{path}: modes: {bad[0] if bad else modes!r} is not a fidelity "
                             f"({', '.join(FIDELITIES)})")
    policy = data.get("precision_policy")
    if policy is not None:
        from ..bounds.roofline import Policy
        try:
            Policy.parse(policy)
        except Exception as e:  # noqa: BLE001
            raise SweepError(f"{path}: precision_policy {policy!r}: {e}") from None
    train = data.get("train", False)
    if not isinstance(train, bool):
        raise SweepError(f"{path}: 'train' must be true or false")
    ws = data.get("world_size", 1)
    if isinstance(ws, bool) or not isinstance(ws, int) or ws < 1:
        raise SweepError(f"{path}: world_size {ws!r}: a positive integer (the ranks a "
                         f"per-rank program runs on; grid names tp, dp and world_size vary "
                         f"the degree per point)")
    for name in PARALLEL & set(grid):
        bad = [v for v in grid[name] if isinstance(v, bool) or not isinstance(v, int) or v < 1]
        if bad:
            raise SweepError(f"{path}: grid.{name}: {bad[0]!r} is not a positive integer")
    for key in ("timeout", "memory"):
        v = data.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0):
            raise SweepError(f"{path}: {key!r} must be a positive number "
                             f"({'seconds' if key == 'timeout' else 'GiB'} per point)")
    return Sweep(path, program, folder, archs, grid, modes, policy, train,
                 data.get("timeout"), data.get("memory"), ws)


def load(path: str) -> Sweep:
    import tomllib
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise SweepError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as e:
        raise SweepError(f"{path}: not TOML: {e}") from None
    return parse(data, path)


def check_program(sweep: Sweep) -> None:
    """The program imports and takes every grid parameter (before any point runs)."""
    from ..frontends.contract import FrontendError
    names = {k: sweep.grid[k][0] for k in sweep.grid if k not in PARALLEL}
    try:
        check_params(sweep.program, names, sweep.folder)
    except FrontendError as e:
        raise SweepError(f"{sweep.path}: {e}") from None


def check_params(spec: str, params: dict, folder: str) -> None:
    import importlib
    import sys
    from ..frontends.contract import FrontendError
    from ..frontends.loading import check_params as check, import_file
    if spec.endswith(".py"):
        check(spec, import_file(spec), params, module_names=True)
        return
    modname, _, attr = spec.partition(":")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        mod = importlib.import_module(modname)
    except Exception as e:  # noqa: BLE001
        raise FrontendError(f"module {modname} does not import from {folder}: "
                            f"{type(e).__name__}: {e}") from None
    factory = getattr(mod, attr, None)
    if not callable(factory):
        raise FrontendError(f"{modname} has no callable {attr}")
    check(spec, factory, params)
