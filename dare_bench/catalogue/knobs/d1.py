"""d1 / diffu-GRPO: the plug-in's settings (its knobs and its defaults of the shared ones), torch-free.

The catalogue reads `ALGORITHM` to validate reproductions at load time with this very class; the plug-in
(`d1.py`) is built from it at run time. See `dare_bench/catalogue/__init__.py`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dare_bench.catalogue import AlgorithmSpec
from dare_bench.catalogue.settings import AlgorithmConfig


class D1Config(AlgorithmConfig):
    clip_eps: float = Field(0.5, gt=0, lt=1)  # d1 train.yaml epsilon
    p_mask_prompt: float = Field(0.15, ge=0, lt=1)
    random_masking: bool = True
    kl_variant: Literal["standard", "dare"] = "standard"


ALGORITHM = AlgorithmSpec(name="d1", kind="rl", knobs=D1Config)
