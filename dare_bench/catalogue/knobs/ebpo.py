"""EBPO: the plug-in's settings (its knobs and its defaults of the shared ones), torch-free.

The catalogue reads `ALGORITHM` to validate reproductions at load time with this very class; the plug-in
(`ebpo.py`) is built from it at run time. See `dare_bench/catalogue/__init__.py`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dare_bench.catalogue import AlgorithmSpec
from dare_bench.catalogue.settings import AlgorithmConfig, KlEstimator


class EBPOConfig(AlgorithmConfig):
    # one composite ELBO ratio per sequence: the loss is a mean over sequences, not an aggregate of token losses
    unused_shared_settings = frozenset({"loss_agg"})

    mc_samples: int = Field(16, ge=1)  # N MC rows (DARE: mc_num = n_l = 16)
    n_l: int | None = Field(None, ge=1)  # rows stratified together; None = mc_samples
    block_length: int | None = Field(None, ge=1)  # None = the backbone's block size
    block_origin: Literal["global", "response"] = "global"  # where block 0 starts: the sequence or the response
    kl_estimator: KlEstimator = "k2"


ALGORITHM = AlgorithmSpec(name="ebpo", kind="rl", knobs=EBPOConfig)
