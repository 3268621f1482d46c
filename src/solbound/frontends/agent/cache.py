"""Accepted translations, kept between runs.

One JSON file per translation under the cache directory (``--agent-cache DIR``, else
``$SOLBOUND_CACHE_DIR/agent``, ``$XDG_CACHE_HOME/solbound/agent`` or
``~/.cache/solbound/agent``), named by the key: a hash of the target's source, its
operands' names, shapes and dtypes, its non-tensor arguments, the model and the prompt's
version. A cached IR is checked again before it is used (parsed and run against the
original); one that no longer passes is dropped and translated anew.
"""

from __future__ import annotations

import hashlib
import json
import os

from ...paths import cache_dir


def cache_key(target, model: str, version: int) -> str:
    """A stable key for a target and model.

    >>> from types import SimpleNamespace as NS
    >>> from solbound.frontends.agent.prompt import Operand
    >>> t = NS(source="def f(x): return x", inputs=[Operand("x", (2,), "f32")],
    ...        outputs=[Operand("y", (2,), "f32")], params={}, what="program")
    >>> cache_key(t, "m", 1) == cache_key(t, "m", 1), cache_key(t, "m", 1) == cache_key(t, "n", 1)
    (True, False)
    """
    doc = {"source": hashlib.sha256(target.source.encode()).hexdigest(),
           "inputs": [(o.name, list(o.shape), o.dtype) for o in target.inputs],
           "outputs": [(o.name, list(o.shape), o.dtype) for o in target.outputs],
           "params": repr(sorted((target.params or {}).items())), "what": target.what,
           "model": model, "prompt": version}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]


class Cache:
    def __init__(self, root: str | None = None):
        self.root = root or os.path.join(cache_dir(), "agent")

    def _path(self, key: str) -> str:
        return os.path.join(self.root, key + ".json")

    def get(self, key: str) -> dict | None:
        try:
            with open(self._path(key), encoding="utf-8") as f:
                rec = json.load(f)
        except (OSError, ValueError):
            return None
        return rec if isinstance(rec, dict) and isinstance(rec.get("ir"), str) else None

    def put(self, key: str, record: dict) -> None:
        try:
            os.makedirs(self.root, exist_ok=True)
            tmp = self._path(key) + f".{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(record, f, indent=1)
            os.replace(tmp, self._path(key))
        except OSError:
            pass                  # a cache that cannot be written only costs a rerun

    def drop(self, key: str) -> None:
        try:
            os.remove(self._path(key))
        except OSError:
            pass
