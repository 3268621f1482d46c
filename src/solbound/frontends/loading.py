"""Loading the user's program files, for every frontend: a file imported as ``python
file.py`` would (its own folder importable), any failure reported in one line that names
the file and line."""

from __future__ import annotations

import importlib.util
import os
import sys
import traceback

from .contract import FrontendError


def where(exc: BaseException, path: str | None = None) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    frames = [f for f in tb if path is None or os.path.abspath(f.filename) == os.path.abspath(path)]
    f = (frames or tb or [None])[-1]
    return f"{os.path.basename(f.filename)}:{f.lineno}" if f is not None else "?"


def oneline(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0] if msg else ''}".rstrip(": ")


def import_file(path: str):
    if not os.path.exists(path):
        raise FrontendError(f"{path}: no such file")
    name = "solbound_user_" + "".join(c if c.isalnum() else "_" for c in os.path.abspath(path))
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise FrontendError(f"{path}: not a Python file")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    # as `python file.py` does: the file's own directory is importable (sibling modules)
    here = os.path.dirname(os.path.abspath(path))
    if here not in sys.path:
        sys.path.insert(0, here)
    try:
        spec.loader.exec_module(mod)
    except SyntaxError as e:
        raise FrontendError(f"{path}:{e.lineno}: does not import: SyntaxError: {e.msg}") from None
    except Exception as e:  # noqa: BLE001 - any import failure is reported as one line
        raise FrontendError(f"{path} ({where(e, path)}): does not import: {oneline(e)}") from None
    return mod


def parse_param(text: str) -> tuple[str, object]:
    """``NAME=VALUE`` from the command line: an int, else a float, else the string.

    >>> parse_param("batch=8"), parse_param("lr=1e-3"), parse_param("act=gelu")
    (('batch', 8), ('lr', 0.001), ('act', 'gelu'))
    """
    name, eq, value = text.partition("=")
    name = name.strip()
    if not eq or not name.isidentifier():
        raise FrontendError(f"--param {text!r}: expected NAME=VALUE with NAME a Python name")
    return name, scalar(value.strip())


def scalar(value: str):
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def check_params(spec: str, target, params: dict, *, module_names: bool = False) -> None:
    """Each parameter must be one ``target`` takes: a keyword of a factory, or (with
    ``module_names``, a program file) a module-level name it overrides. One line naming
    the first parameter that is not."""
    if not params:
        return
    if module_names:
        bad = [k for k in params if not hasattr(target, k)]
        if bad:
            raise FrontendError(f"{spec}: parameter {bad[0]!r} is not a module-level name of "
                                f"the file (a file's parameters override its module-level "
                                f"constants; a module:factory takes keyword arguments)")
        return
    import inspect
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return
    names = {n for n, p in sig.parameters.items()
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    bad = [k for k in params if k not in names]
    if bad:
        took = ", ".join(sorted(names)) or "no parameters"
        raise FrontendError(f"{spec}: the factory takes no parameter {bad[0]!r} (it takes "
                            f"{took})")


def factory_of(spec: str):
    """The function ``pkg.module:name`` names, imported from the current directory as
    ``python -c`` would; each failure one line naming it."""
    import importlib
    modname, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(modname)
    except Exception as e:  # noqa: BLE001
        raise FrontendError(f"{spec}: does not import: {oneline(e)}") from None
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise FrontendError(f"{spec}: {modname} has no function {attr!r}")
    return fn


def example_of(spec: str, params: dict | None = None) -> tuple:
    """``(function, args)`` from a file whose ``example()`` returns them (``params``
    replace its module-level constants) or from a ``pkg.module:factory`` (``params``: its
    keyword arguments); each failure one line naming the file."""
    if ":" in spec and not spec.endswith(".py"):
        fn = factory_of(spec)
        check_params(spec, fn, params or {})
        what, call = "factory", lambda: fn(**(params or {}))
    else:
        mod = import_file(spec)
        if params:
            check_params(spec, mod, params, module_names=True)
            for k, v in params.items():
                setattr(mod, k, v)
        if not callable(getattr(mod, "example", None)):
            raise FrontendError(f"{spec}: defines no example() returning (function, args)")
        what, call = "example()", mod.example
    try:
        res = call()
    except Exception as e:  # noqa: BLE001 - one line for the user
        raise FrontendError(f"{spec}: {what} failed: {type(e).__name__}: {e}") from None
    if not (isinstance(res, tuple) and len(res) == 2 and callable(res[0])):
        raise FrontendError(f"{spec}: {what} must return (function, args)")
    return res
