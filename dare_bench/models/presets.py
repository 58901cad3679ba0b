"""Tiny replicas of every family for CPU runs (about 1-5 M parameters), registered by the family files.

A preset is a config.json dict in the official format of its family, with small sizes and a small vocabulary
whose special ids (mask, eos, pad, ...) are taken from the task tokenizer at run time when one is given. The
package `__init__` imports every family module, so the table is complete once `dare_bench.models` is imported.
"""

from __future__ import annotations

import copy
import difflib
from typing import Any

from dare_bench.errors import ConfigError
from dare_bench.models.families import detect_family

PRESETS: dict[str, dict[str, Any]] = {}


def register_preset(name: str, config: dict[str, Any]) -> None:
    PRESETS[name] = config


def preset_config(name: str, **overrides: Any) -> dict[str, Any]:
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
    return sorted(PRESETS)


def preset_for_tokenizer(name: str, tokenizer, **overrides: Any) -> dict[str, Any]:
    """A preset config whose vocabulary and special ids match `tokenizer` (mask, eos, pad, bos tokens)."""
    cfg = preset_config(name, **overrides)
    spec = detect_family(cfg, f"preset {name}")
    if spec.adapt_vocab is None:
        raise ConfigError(f"family {spec.name} cannot adapt its vocabulary to a tokenizer")
    ids = {
        "mask_token_id": tokenizer.mask_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
    }
    missing = [k for k, v in ids.items() if v is None and k != "bos_token_id"]
    if missing:
        raise ConfigError(f"tokenizer lacks special token(s) {missing}")
    return spec.adapt_vocab(cfg, vocab_size=len(tokenizer), **ids)
