"""The import layers docs/architecture.md draws hold for every module of the package."""

import ast
import os
import re

ROOT = os.path.join(os.path.dirname(__file__), "..")
SRC = os.path.join(ROOT, "src", "solbound")
FRONTENDS = ("torch", "jax", "numpy", "agent")


def _layers() -> list[set[str]]:
    text = open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8").read()
    block = re.search(r"```layers\n(.*?)```", text, re.S).group(1)
    return [set(line.split()) for line in block.strip().splitlines()]


def _unit(mod: str) -> str:
    parts = mod.split(".")
    if len(parts) < 2:
        return "solbound"
    if parts[1] == "frontends" and len(parts) > 2 and parts[2] in FRONTENDS:
        return "frontends." + parts[2]
    return parts[1]


def _imports(src=SRC):
    """(importing unit, imported unit, file:line) for every solbound import under ``src``
    (the package folder)."""
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(dirpath, f)
            mod = "solbound." + os.path.relpath(path, src)[:-3].replace(os.sep, ".")
            pkg = mod[:-len(".__init__")] if mod.endswith(".__init__") else mod.rsplit(".", 1)[0]
            mod = pkg if mod.endswith(".__init__") else mod
            tree = ast.parse(open(path, encoding="utf-8").read())
            for n in ast.walk(tree):
                targets = []
                if isinstance(n, ast.ImportFrom) and n.level:
                    base = pkg.split(".")[:len(pkg.split(".")) - (n.level - 1)]
                    if n.module:
                        targets.append(".".join(base + [n.module]))
                    else:
                        targets += [".".join(base + [a.name]) for a in n.names]
                elif isinstance(n, ast.ImportFrom) and (n.module or "").startswith("solbound"):
                    targets.append(n.module)
                elif isinstance(n, ast.Import):
                    targets += [a.name for a in n.names if a.name.startswith("solbound")]
                for t in targets:
                    yield _unit(mod), _unit(t), f"{os.path.relpath(path, ROOT)}:{n.lineno}"


def _violations(src=SRC):
    layers = _layers()
    rank = {u: i for i, line in enumerate(layers) for u in line}
    bad, seen = [], set()
    for a, b, where in _imports(src):
        seen.add(a)
        if a == b or b == "__version__":
            continue
        assert a in rank, f"{where}: unit {a} is not in the architecture's layers"
        assert b in rank, f"{where}: unit {b} is not in the architecture's layers"
        if rank[b] >= rank[a]:
            bad.append(f"{where}: {a} imports {b}")
    return bad, seen


def test_every_import_follows_the_drawn_layers():
    bad, seen = _violations()
    assert not bad, "imports against the layers:\n" + "\n".join(bad)
    assert {"ir", "frontends.torch", "frontends.agent", "validate", "cli"} <= seen


def test_the_check_finds_a_violation(tmp_path):
    """The checker itself, on a package where validate/ imports a frontend (inside a
    function), hardware/ imports measure/, and two frontends import each other."""
    pkg = tmp_path / "solbound"
    for folder, text in {"validate": "def f():\n    from ..frontends.torch import lower\n",
                         "hardware": "from ..measure import host\n",
                         "frontends/jax": "from ..torch import capture\n",
                         "ir": "import numpy\n"}.items():
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
        (pkg / folder / "m.py").write_text(text)
    bad, _ = _violations(str(pkg))
    assert sorted(b.split(": ", 1)[1] for b in bad) == [
        "frontends.jax imports frontends.torch", "hardware imports measure",
        "validate imports frontends.torch"]
