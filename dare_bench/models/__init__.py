"""Backbones: LLaDA, Dream (masked diffusion) and SDAR, LLaDA2 (block diffusion), loaded from official HF dirs.

    from dare_bench.models import load_pretrained, from_config
    model = load_pretrained("tiny-llada")                       # a preset, random init
    model = load_pretrained("/ckpt/LLaDA-8B-Instruct", dtype="bfloat16", device="cuda")
    meta = from_config("/ckpt/LLaDA-8B-Instruct")               # meta device: names, shapes, parameter count
"""

from __future__ import annotations

import importlib

from dare_bench import catalogue
from dare_bench.models.base import (  # noqa: F401
    FAMILIES,
    DiffusionLM,
    FamilySpec,
    KVCache,
    ModelTraits,
    detect_family,
    register_family,
    shift_logits,
)

# One module per backbone of the catalogue, named after it (dare_bench/models/<backbone>.py registers the family).
FAMILY_MODULES = catalogue.backbone_names()


def _import_families() -> None:
    for name in FAMILY_MODULES:
        try:
            importlib.import_module(f"dare_bench.models.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"dare_bench.models.{name}":
                raise


def load_pretrained(path_or_preset, *, dtype="float32", device="cpu", seed: int | None = 0):
    from dare_bench.models.io import load_pretrained as _load

    return _load(path_or_preset, dtype=dtype, device=device, seed=seed)


def from_config(path_or_dir, device="meta"):
    from dare_bench.models.io import from_config as _from_config

    return _from_config(path_or_dir, device=device)


def load_tokenizer(path_or_preset):
    from dare_bench.models.io import load_tokenizer as _load_tokenizer

    return _load_tokenizer(path_or_preset)
