"""The family registry: which backbone class a config.json belongs to (`detect_family`) and how it is built.

The bottom of `dare_bench.models`: it imports nothing else from the package. Each family module (llada.py,
dream.py, sdar.py, llada2.py) calls `register_family` at import, and the package `__init__` imports every family
module, so the registry is complete whenever any part of `dare_bench.models` has been imported.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from dare_bench.errors import CheckpointError

if TYPE_CHECKING:  # for annotations only: base.py sits above this module
    from dare_bench.models.base import DiffusionLM


@dataclass(frozen=True)
class FamilySpec:
    name: str
    model_cls: type[DiffusionLM]
    model_types: tuple[str, ...]
    architectures: tuple[str, ...]
    # Fields that must be present in config.json for this family (clear error instead of a KeyError deep inside).
    required_fields: tuple[str, ...] = ()
    # Extra files the official loader needs beside config.json, written by save_pretrained: name -> builder(config).
    companion_files: dict[str, Callable[[dict], dict]] = field(default_factory=dict)
    # adapt_vocab(config, vocab_size=, mask_token_id=, eos_token_id=, pad_token_id=, bos_token_id=) -> new config
    # dict with the family's own field names set; used to fit a tiny preset to a task tokenizer.
    adapt_vocab: Callable[..., dict] | None = None


FAMILIES: dict[str, FamilySpec] = {}


def register_family(spec: FamilySpec) -> FamilySpec:
    if spec.name in FAMILIES and FAMILIES[spec.name].model_cls is not spec.model_cls:
        raise ValueError(f"family {spec.name!r} registered twice")
    FAMILIES[spec.name] = spec
    return spec


def detect_family(config: dict[str, Any], source: str = "config.json") -> FamilySpec:
    """The family of a config.json dict, by `model_type` or `architectures`; a clear error when none matches."""
    model_type = str(config.get("model_type", ""))
    archs = tuple(config.get("architectures") or ())
    for spec in FAMILIES.values():
        if model_type.lower() in {t.lower() for t in spec.model_types} or set(archs) & set(spec.architectures):
            missing = [f for f in spec.required_fields if f not in config]
            if missing:
                raise CheckpointError(f"{source}: {spec.name} config lacks required field(s) {missing}")
            return spec
    known = sorted(t for s in FAMILIES.values() for t in s.model_types)
    hint = difflib.get_close_matches(model_type, known, n=1)
    raise CheckpointError(
        f"{source}: unknown model family (model_type={model_type!r}, architectures={list(archs)}); "
        f"known model_types: {known}" + (f"; did you mean {hint[0]!r}?" if hint else "")
    )
