"""MDPO: the plug-in's settings (its knobs and its defaults of the shared ones), torch-free.

The catalogue reads `ALGORITHM` to validate reproductions at load time with this very class; the plug-in
(`trainers/algorithms/mdpo.py`) is built from it at run time. See `dare_bench/catalogue/__init__.py`.
"""

from __future__ import annotations

from pydantic import Field

from dare_bench.catalogue import AlgorithmSpec
from dare_bench.catalogue.settings import AlgorithmConfig


class MDPOConfig(AlgorithmConfig):
    # MDPO's own loss: the KL term is always ½(ℓ_ref − ℓ)² (DARE / official `per_token_kl = logr ** 2 / 2`), the
    # aggregation is per (row, step) over the step's masked tokens, and DARE's MDPO loss has no dual clip.
    unused_shared_settings = frozenset({"kl_estimator", "loss_agg", "clip_ratio_c"})
    packing_refused = ("mdpo replays the sampler's recorded calls (their model arguments), not padded "
                       "training forwards")

    # DARE `sample_train_steps` (recipe 16; official config_demo.yaml 16); None trains on every step
    top_k_steps: int | None = Field(16, gt=0, description="train only on the K steps with largest |advantage|")
    confidence_weighting: bool = True  # weight each token's loss by its rollout probability (DARE / official)
    std_normalise: bool = True  # divide step scores by the group std (DARE `norm_adv_by_std_in_grpo`, default on)


ALGORITHM = AlgorithmSpec(name="mdpo", kind="rl", knobs=MDPOConfig)
