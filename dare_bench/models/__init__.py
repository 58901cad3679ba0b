"""Backbones: LLaDA, Dream (masked diffusion) and SDAR, LLaDA2 (block diffusion), loaded from official HF dirs.

    from dare_bench.models import load_pretrained, from_config
    model = load_pretrained("tiny-llada")                       # a preset, random init
    model = load_pretrained("/ckpt/LLaDA-8B-Instruct", dtype="bfloat16", device="cuda")
    meta = from_config("/ckpt/LLaDA-8B-Instruct")               # meta device: names, shapes, parameter count
    set_attention(model, "flex")                        # sdpa | flash_attn | flex; or load_pretrained(attention=)
    set_moe(model, "grouped")                           # MoE experts: loop | grouped; or load_pretrained(moe=)
"""

from __future__ import annotations

# Importing the family modules registers their FamilySpec and presets; done here, at the top, so the registries are
# complete whenever anything in dare_bench.models has been imported (Python runs this file first).
from dare_bench.models import dream, llada, llada2, sdar  # noqa: F401
from dare_bench.models.base import (  # noqa: F401
    DiffusionLM,
    KVCache,
    ModelTraits,
    shift_logits,
)
from dare_bench.models.families import FAMILIES, FamilySpec, detect_family, register_family  # noqa: F401
from dare_bench.models.io import from_config, load_pretrained, load_tokenizer, set_attention  # noqa: F401
from dare_bench.models.moe import set_moe  # noqa: F401
