"""ESPO: the plug-in's settings (its knobs and its defaults of the shared ones), torch-free.

The catalogue reads `ALGORITHM` to validate reproductions at load time with this very class; the plug-in
(`dare_bench/trainers/algorithms/espo.py`) is built from it at run time. See `dare_bench/catalogue/__init__.py`.
"""

from __future__ import annotations

from pydantic import Field

from dare_bench.catalogue import AlgorithmSpec
from dare_bench.catalogue.settings import AlgorithmConfig, KlEstimator


class ESPOConfig(AlgorithmConfig):
    # one sequence-level ratio per completion: the loss is a mean over sequences, not an aggregate of token losses
    unused_shared_settings = frozenset({"loss_agg"})

    mc_samples: int = Field(2, ge=1)  # M MC ELBO samples per update (DARE mc_num 2; official ESPO num_mc 1)
    kl_estimator: KlEstimator = "k2"  # on the RAW sequence ELBO, then / R (official: k2, its recommendation)
    # ESPO's variance reduction: each masked copy paired with its complement (official `reduce_var`, DARE
    # `espo_reduce_var`; both default true); false = the masked copy alone
    reduce_var: bool = True
    # spread the L+1 mask levels over the rows of the rollout batch when their completion lengths are equal
    # (DARE's `_forward_process_espo` on the whole batch; official ESPO always does, over its micro-batch);
    # false = one independent level per row
    stratify_rows: bool = True


ALGORITHM = AlgorithmSpec(name="espo", kind="rl", knobs=ESPOConfig)
