"""Frontends are registrations.

Each frontend declares what it accepts (``claims_file``: a program file's conventions,
read from its syntax tree without running it; ``claims_module``: the modules a
``pkg.module:factory``'s module imports; ``claims_object``: a Python object handed to
``solbound.analyze``) and names the functions that analyze it, by dotted path, so that
choosing a frontend imports no framework. ``solbound.api`` dispatches over this registry
and holds nothing frontend-specific.

The built-in frontends, in the order they are asked:

* ``torch``: an ``nn.Module``; a file in KernelBench's convention (``Model``,
  ``get_inputs``, ``get_init_inputs``); a factory whose module imports torch. It is the
  default: a file no frontend claims goes to its loader, which says what is missing.
* ``jax``: a file whose ``example()`` returns ``(function, args)`` and that imports JAX
  (or a library built on it); a factory whose module does; any other callable.
* ``numpy``: a file whose ``example()`` returns ``(function, args)`` with numpy arrays
  and that imports neither torch nor JAX; such a factory; a callable defined in such a
  module. No tracer reads it: the agent translates it (``--agent``).

>>> facts = FileFacts(defines={"example"}, classes=set(), imports={"numpy"})
>>> [f.name for f in FRONTENDS if f.claims_file(facts)]
['numpy']
>>> facts = FileFacts(defines={"example"}, classes=set(), imports={"jax", "numpy"})
>>> [f.name for f in FRONTENDS if f.claims_file(facts)]
['jax']
>>> facts = FileFacts(defines={"get_inputs"}, classes={"Model"}, imports={"torch"})
>>> [f.name for f in FRONTENDS if f.claims_file(facts)]
['torch']
"""

from __future__ import annotations

import ast
import importlib
import os
from dataclasses import dataclass
from typing import Callable

# modules whose programs JAX traces (a library built on JAX pulls it in)
JAX_MODULES = frozenset({"jax", "jaxlib", "flax", "optax", "equinox", "haiku", "keras",
                         "keras_hub", "jax_resnet", "gemma", "orbax", "chex"})
TORCH_MODULES = frozenset({"torch", "torchvision", "torchaudio", "transformers", "diffusers",
                           "timm", "torchao", "optimum"})


@dataclass(frozen=True)
class FileFacts:
    """What a program file's syntax tree says, without running it: the top-level
    functions it defines, its classes, and the top-level packages it imports anywhere."""

    defines: set[str]
    classes: set[str]
    imports: set[str]

    @classmethod
    def of(cls, path: str) -> "FileFacts | None":
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                tree = ast.parse(f.read())
        except (OSError, SyntaxError, ValueError):
            return None
        imports = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imports |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imports.add(node.module.split(".")[0])
        return cls({n.name for n in tree.body if isinstance(n, ast.FunctionDef)},
                   {n.name for n in tree.body if isinstance(n, ast.ClassDef)}, imports)


@dataclass(frozen=True)
class Frontend:
    name: str
    accepts: str                                    # in words, for messages and docs
    claims_file: Callable[[FileFacts], bool]
    claims_module: Callable[[set[str]], bool]
    claims_object: Callable[[object, tuple], bool]
    analyze_source: str                             # "module:function", imported when used
    analyze_object: str
    measure: str = ""                               # "module:function" for --measure

    def load(self, which: str) -> Callable:
        mod, _, fn = getattr(self, which).partition(":")
        return getattr(importlib.import_module(mod), fn)


def _example_file(f: FileFacts) -> bool:
    return "example" in f.defines and "Model" not in f.classes


# what a numpy program may import: the standard library and numerical libraries that no
# tracer reads (a sibling module or anything else may hold a torch or JAX model)
NUMPY_OK = frozenset({"numpy", "scipy", "numba", "ml_dtypes"})


def _numpy_only(names: set[str]) -> bool:
    import sys
    return "numpy" in names and all(n in NUMPY_OK or n in sys.stdlib_module_names
                                    or n == "__future__" for n in names)


def _is_torch_module(obj) -> bool:
    """An ``nn.Module`` (decided without importing torch)."""
    return any(c.__name__ == "Module" and c.__module__.startswith("torch.nn")
               for c in type(obj).__mro__)


def module_imports(mod) -> set[str]:
    """Top-level packages a loaded module holds as globals: the modules it imported and
    those of the classes and functions it imported from them."""
    own = getattr(mod, "__name__", "")
    names = set()
    for v in vars(mod).values():
        if type(v).__name__ == "module":
            names.add(getattr(v, "__name__", "").split(".")[0])
        elif isinstance(v, type) or callable(v):
            m = getattr(v, "__module__", None)
            if isinstance(m, str) and m != own:
                names.add(m.split(".")[0])
    names.discard("")
    return names


def _numpy_object(obj, args) -> bool:
    import inspect
    import sys
    if _is_torch_module(obj) or not callable(obj):
        return False
    mod = inspect.getmodule(obj)
    if mod is None or mod is sys.modules.get("__main__") and not hasattr(mod, "__file__"):
        return False
    names = module_imports(mod)
    np_ = sys.modules.get("numpy")
    arrays = [a for a in args if np_ is not None and isinstance(a, np_.ndarray)]
    return _numpy_only(names) and bool(arrays) \
        and all(np_ is not None and isinstance(a, (np_.ndarray, np_.generic, int, float, bool))
                for a in args)


FRONTENDS: list[Frontend] = [
    Frontend("torch", "an nn.Module; a file with Model, get_inputs and get_init_inputs "
                      "(KernelBench's convention); a factory returning (module, inputs)",
             claims_file=lambda f: "Model" in f.classes or "get_inputs" in f.defines,
             claims_module=lambda names: "torch" in names,
             claims_object=lambda obj, args: _is_torch_module(obj),
             analyze_source="solbound.frontends.torch.frontend:analyze_source",
             analyze_object="solbound.frontends.torch.frontend:analyze_module",
             measure="solbound.frontends.torch.frontend:measure"),
    Frontend("numpy", "a file whose example() returns (function, args) with numpy arrays, "
                      "importing neither torch nor JAX (translated by the agent: --agent)",
             claims_file=lambda f: _example_file(f) and _numpy_only(f.imports),
             claims_module=_numpy_only,
             claims_object=_numpy_object,
             analyze_source="solbound.frontends.numpy.frontend:analyze_source",
             analyze_object="solbound.frontends.numpy.frontend:analyze_function"),
    Frontend("jax", "a file whose example() returns (function, args), importing JAX; a JAX "
                    "function",
             claims_file=lambda f: _example_file(f) and not f.imports & TORCH_MODULES,
             claims_module=lambda names: bool(names & JAX_MODULES) and "torch" not in names,
             claims_object=lambda obj, args: callable(obj) and not _is_torch_module(obj),
             analyze_source="solbound.frontends.jax.frontend:analyze_source",
             analyze_object="solbound.frontends.jax.frontend:analyze_function",
             measure="solbound.frontends.jax.frontend:measure"),
]
DEFAULT = "torch"


def register(fe: Frontend, first: bool = False) -> None:
    """Add a frontend (``first``: asked before the built-in ones)."""
    FRONTENDS[:] = [f for f in FRONTENDS if f.name != fe.name]
    FRONTENDS.insert(0, fe) if first else FRONTENDS.append(fe)


def by_name(name: str) -> Frontend:
    return next(f for f in FRONTENDS if f.name == name)


def for_source(spec: str) -> Frontend:
    """The frontend of ``FILE.py`` or ``pkg.module:factory``."""
    if ":" in spec and not spec.endswith(".py"):
        names = _factory_imports(spec)
        if names is not None:
            for f in FRONTENDS:
                if f.claims_module(names):
                    return f
        return by_name(DEFAULT)
    facts = FileFacts.of(spec) if spec.endswith(".py") and os.path.exists(spec) else None
    if facts is not None:
        for f in FRONTENDS:
            if f.claims_file(facts):
                return f
    return by_name(DEFAULT)


def _factory_imports(spec: str) -> set[str] | None:
    import sys
    modname = spec.partition(":")[0]
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(modname)
    except Exception:  # noqa: BLE001 - the default frontend's loader reports it
        return None
    return module_imports(mod) | ({modname.split(".")[0]} & (JAX_MODULES | TORCH_MODULES))


def for_object(obj, args: tuple) -> Frontend:
    for f in FRONTENDS:
        if f.claims_object(obj, args):
            return f
    from .contract import FrontendError
    raise FrontendError(f"solbound.analyze: {type(obj).__name__} is not a program any frontend "
                        f"reads (" + "; ".join(f"{f.name}: {f.accepts}" for f in FRONTENDS) + ")")
