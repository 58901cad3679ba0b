"""Coupled-GRPO (DiffuCoder): the plug-in's settings (its knobs and its defaults of the shared ones), torch-free.

The catalogue reads `ALGORITHM` to validate reproductions at load time with this very class; the plug-in
(`coupled_grpo.py`) is built from it at run time. See `dare_bench/catalogue/__init__.py`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dare_bench.catalogue import AlgorithmSpec
from dare_bench.catalogue.settings import AlgorithmConfig


class CoupledGRPOConfig(AlgorithmConfig):
    clip_eps: float = Field(0.5, gt=0, lt=1)  # DiffuCoder recipe: ε_low = ε_high = 0.5
    t_min: float = Field(0.2, gt=0, lt=1)
    t_max: float = Field(0.8, gt=0, lt=1)
    pairs: int = Field(1, ge=1)  # λ complementary pairs per sample
    random_masking: bool = True
    kl_variant: Literal["standard", "dare"] = "standard"


ALGORITHM = AlgorithmSpec(name="coupled-grpo", kind="rl", knobs=CoupledGRPOConfig)
