"""Where solbound keeps files of its own: the host spec ``calibrate`` writes (config) and
the agent's accepted translations (cache). Neutral: imports nothing of solbound."""

from __future__ import annotations

import os

CONFIG_ENV = "SOLBOUND_CONFIG_DIR"
CACHE_ENV = "SOLBOUND_CACHE_DIR"


def config_dir() -> str:
    """``$SOLBOUND_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/solbound``, else
    ``~/.config/solbound``."""
    if os.environ.get(CONFIG_ENV):
        return os.environ[CONFIG_ENV]
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "solbound")


def cache_dir() -> str:
    """``$SOLBOUND_CACHE_DIR``, else ``$XDG_CACHE_HOME/solbound``, else
    ``~/.cache/solbound``."""
    if os.environ.get(CACHE_ENV):
        return os.environ[CACHE_ENV]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "solbound")


def host_spec_path() -> str:
    return os.path.join(config_dir(), "host.toml")
