"""SPG: the plug-in's settings (its knobs and its defaults of the shared ones), torch-free.

The catalogue reads `ALGORITHM` to validate reproductions at load time with this very class; the plug-in
(`spg.py`) is built from it at run time. See `dare_bench/catalogue/__init__.py`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field

from dare_bench.catalogue import AlgorithmSpec
from dare_bench.catalogue.settings import AlgorithmConfig


class SPGConfig(AlgorithmConfig):
    # no likelihood ratio (nothing to clip), no KL term, and the loss is a mean over sequences of the
    # per-sequence bound, not an aggregate of token losses
    unused_shared_settings = frozenset({"clip_eps", "clip_eps_high", "clip_ratio_c", "kl_estimator", "loss_agg"})

    mc_samples: int = Field(2, ge=1)  # draws per sequence per iteration when `num_t` is unset
    num_t: int | None = Field(None, ge=1)  # SPG's name for the draws per sequence per iteration (wins over mc_samples)
    # `block_length` is accepted too (the name of SPG's `forward_process` argument)
    mask_block_length: int = Field(32, ge=1, validation_alias=AliasChoices("mask_block_length", "block_length"))
    p_mask_prompt: float = Field(0.15, ge=0, lt=1)
    use_mask_prompt: bool = True
    min_t: float = Field(0.0, ge=0, le=1)
    max_t: float = Field(1.0, ge=0, le=1)
    variant: Literal["elbo", "eubo", "mixture", "zero"] = "mixture"  # A <= 0 estimator (official logp_estimation)
    eubo_beta: float = Field(1.5, gt=0)
    mix_weight: float = Field(0.5, ge=0, le=1)
    random_masking: bool = True


ALGORITHM = AlgorithmSpec(name="spg", kind="rl", knobs=SPGConfig)
