"""Tiny replicas of every family for CPU runs (about 1-5 M parameters), registered by the family files.

A preset is a config.json dict in the official format of its family, with small sizes and a small vocabulary
whose special ids (mask, eos, pad, ...) are taken from the task tokenizer at run time when one is given.
"""

from __future__ import annotations

import copy
import difflib
from typing import Any

PRESETS: dict[str, dict[str, Any]] = {}


def register_preset(name: str, config: dict[str, Any]) -> None:
    PRESETS[name] = config


def preset_config(name: str, **overrides: Any) -> dict[str, Any]:
    from dare_bench.errors import ConfigError
    from dare_bench.models import _import_families

    _import_families()
    if name not in PRESETS:
        hint = difflib.get_close_matches(name, PRESETS, n=1)
        raise ConfigError(
            f"unknown model preset {name!r}" + (f"; did you mean {hint[0]!r}?" if hint else "")
            + f" (known: {sorted(PRESETS)})"
        )
    cfg = copy.deepcopy(PRESETS[name])
    cfg.update(overrides)
    return cfg


def list_presets() -> list[str]:
    from dare_bench.models import _import_families

    _import_families()
    return sorted(PRESETS)
