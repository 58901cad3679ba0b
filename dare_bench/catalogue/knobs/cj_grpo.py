"""CJ-GRPO: the plug-in's settings (its knobs and its defaults of the shared ones), torch-free.

The catalogue reads `ALGORITHM` to validate reproductions at load time with this very class; the plug-in
(`cj_grpo.py`) is built from it at run time. See `dare_bench/catalogue/__init__.py`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dare_bench.catalogue import AlgorithmSpec
from dare_bench.catalogue.settings import AlgorithmConfig


class CJGRPOConfig(AlgorithmConfig):
    # the aggregation is `loss_mode`'s (per-step means, or DARE's token-mean over the collapsed tokens)
    # lm_head_chunk_tokens: its forwards replay the sampler's own calls (block windows, CFG logit mixing) on
    # materialised logits
    unused_shared_settings = frozenset({"loss_agg", "lm_head_chunk_tokens"})
    packing_refused = ("cj_grpo replays the sampler's own calls (block windows, KV-cache positions, CFG), "
                       "not padded training forwards")

    clip_eps: float = Field(0.5, gt=0, lt=1)  # official train.yaml epsilon
    # per_step: the official EOSER-ASS-RL loss; collapsed: DARE's collapse_cj_step_log_probs
    loss_mode: Literal["per_step", "collapsed"] = "per_step"
    decoding: Literal["standard", "eoser", "eoser-ass"] = "standard"  # the official `--decoding`
    eos_gamma_min: float | None = Field(None, gt=0, le=1)  # None: the sampler's (0.4 EOSER, 0.01 with ASS)
    eos_gamma_max: float = Field(1.0, gt=0, le=1)
    ass_blocks: int | None = Field(None, ge=1)


ALGORITHM = AlgorithmSpec(name="cj-grpo", kind="rl", knobs=CJGRPOConfig)
