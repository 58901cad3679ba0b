"""wd1: the plug-in's settings (its knobs and its defaults of the shared ones), torch-free.

The catalogue reads `ALGORITHM` to validate reproductions at load time with this very class; the plug-in
(`dare_bench/trainers/algorithms/wd1.py`) is built from it at run time. See `dare_bench/catalogue/__init__.py`.
Knob names and defaults are those of the official code (xiaohangt/wd1 @ 0898985, `wd1/trainers/diffu_grpo_config.py`
and `wd1/train.yaml`); wd1++ (the denoising-step-wise version) is not in that repository and not offered here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dare_bench.catalogue import AlgorithmSpec
from dare_bench.catalogue.settings import AlgorithmConfig


class Wd1Config(AlgorithmConfig):
    # No likelihood ratio (nothing to clip), no KL term (kl_beta > 0 is refused), and the official aggregation
    # (each sequence's summed token log-likelihood, weighted and summed over its group) is the loss: loss_agg is
    # accepted from the shared recipes and not used.
    unused_shared_settings = frozenset({"clip_eps", "clip_eps_high", "clip_ratio_c", "kl_estimator", "loss_agg"})

    # official `trainer_type`: wll_d1_neg = wd1 (positive weights + negative-sample unlearning, run/wll_NP_*.sh);
    # wll_d1_pos_only = the positive-only ablation (rev_grpo_trainer_psr.py, run/wll_P_*.sh)
    trainer_type: Literal["wll_d1_neg", "wll_d1_pos_only"] = "wll_d1_neg"
    p_mask_prompt: float = Field(0.15, ge=0, lt=1)  # train.yaml (the config class default is 0.3; train.yaml wins)
    random_masking: bool = True


ALGORITHM = AlgorithmSpec(name="wd1", kind="rl", knobs=Wd1Config)
