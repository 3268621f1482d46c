"""The models ``solbound step`` and ``solbound serve`` take: a transformers config (a
directory holding ``config.json``, a ``.json`` file, or a bundled name such as
``llama-3-8b``), built on the meta device with no weights, or ``pkg.module:factory``
returning a causal LM."""

from __future__ import annotations

import json
import os

from .step import StepError

CONFIGS = os.path.join(os.path.dirname(__file__), "configs")


def bundled() -> list[str]:
    """The names of the bundled configs (``configs/NAME.json``)."""
    return sorted(f[:-5] for f in os.listdir(CONFIGS) if f.endswith(".json"))


def _config_path(spec: str) -> str | None:
    if os.path.isdir(spec):
        path = os.path.join(spec, "config.json")
        if not os.path.exists(path):
            raise StepError(f"{spec}: a model directory needs a config.json")
        return path
    if spec.endswith(".json"):
        if not os.path.exists(spec):
            raise StepError(f"{spec}: no such file")
        return spec
    if spec in bundled():
        return os.path.join(CONFIGS, spec + ".json")
    return None


def load_config(spec: str):
    """The transformers config ``spec`` names (a directory, a ``.json`` file or a bundled
    name) and its JSON; every failure is one :class:`StepError` line."""
    path = _config_path(spec)
    if path is None:
        raise StepError(f"{spec}: not a model directory, a config .json or a bundled config "
                        f"({', '.join(bundled())})")
    try:
        data = json.load(open(path, encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise StepError(f"{path}: not a readable JSON config ({e})") from None
    data = {k: v for k, v in data.items() if not k.startswith("_")}
    from transformers import AutoConfig
    kind = data.pop("model_type", None)
    if not kind:
        raise StepError(f"{path}: no model_type")
    try:
        cls = type(AutoConfig.for_model(kind))
    except ValueError as e:
        raise StepError(f"{path}: {e}") from None
    try:
        # the config class's own reader: it decodes what its writer encodes (a tuple, an
        # infinite float as {"__float__": "Infinity"}: Mamba 2's time_step_limit)
        cfg = cls.from_json_file(path)
    except Exception as e:  # noqa: BLE001 - one line for the user
        from ..frontends.loading import oneline
        raise StepError(f"{path}: {cls.__name__} does not read it: {oneline(e)}") from None
    return cfg, data


def load_model(spec: str, dtype: str | None = None):
    """The causal LM ``spec`` names (see the module's docstring), eval mode; a config is
    built on the meta device in its ``torch_dtype`` (``dtype`` overrides; bfloat16 when the
    config names none). Every failure is one :class:`StepError` line."""
    import torch
    path = _config_path(spec)
    if path is None and ":" in spec:
        from ..frontends.contract import FrontendError
        from ..frontends.loading import factory_of
        try:
            model = factory_of(spec)()
        except FrontendError as e:
            raise StepError(str(e)) from None
        except Exception as e:  # noqa: BLE001 - one line for the user
            raise StepError(f"{spec}: factory failed: {type(e).__name__}: {e}") from None
        return model.eval() if hasattr(model, "eval") else model
    if path is None:
        raise StepError(f"{spec}: not a model directory, a config .json, a bundled config "
                        f"({', '.join(bundled())}) or pkg.module:factory")
    cfg, data = load_config(path)
    from transformers import AutoModelForCausalLM
    name = dtype or data.get("torch_dtype") or data.get("dtype") or "bfloat16"
    if not isinstance(getattr(torch, str(name), None), torch.dtype):
        raise StepError(f"{path}: unknown dtype {name!r}")
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, name))
    except ValueError as e:
        raise StepError(f"{path}: transformers builds no causal LM from it ({e})") from None
    return model.eval()
