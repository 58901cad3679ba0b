"""BGPO: the plug-in's settings (its knobs and its defaults of the shared ones), torch-free.

The catalogue reads `ALGORITHM` to validate reproductions at load time with this very class; the plug-in
(`bgpo.py`) is built from it at run time. See `dare_bench/catalogue/__init__.py`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dare_bench.catalogue import AlgorithmSpec
from dare_bench.catalogue.settings import AlgorithmConfig


class BGPOConfig(AlgorithmConfig):
    mc_samples: int = Field(16, ge=1)  # DARE recipes: mc_num = n_l = 16
    n_l: int | None = Field(None, ge=1)  # copies stratified together; None = mc_samples
    clip_ratio_c: float | None = 3.0  # verl dual clip, on in DARE
    # e_k = ELBO total / this: R (DARE LLaDA / Dream actors), the valid count n (DARE LLaDA2 actor), n·R (DARE
    # SDAR actor, whose model loss is already divided by the answer length)
    elbo_norm: Literal["padded", "valid", "valid_x_padded"] = "padded"


ALGORITHM = AlgorithmSpec(name="bgpo", kind="rl", knobs=BGPOConfig)
