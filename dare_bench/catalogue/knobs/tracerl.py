"""TraceRL: the plug-in's settings (its knobs and its defaults of the shared ones), torch-free.

Official values: Gen-Verse/dLLM-RL @ 10b4fd1, `configs/rl_sdar_with_value.yaml` (`training.*`, `optimizer.params.*`,
`experiment.train_value_every`); see `dare_bench/trainers/algorithms/tracerl.py` for the code they feed.
"""

from __future__ import annotations

from pydantic import Field

from dare_bench.catalogue import AlgorithmSpec
from dare_bench.catalogue.settings import AlgorithmConfig


class TraceRLConfig(AlgorithmConfig):
    # the loss is the official row normaliser (Σ tokens / L1 / rows), not a verl aggregation; the advantage is the
    # official z-score (population std, 0 for a constant group) or the value model's GAE; the policy term is the
    # official plain clip; the KL is k3 to the pre-update policy (`old_kl_beta`), never to a reference
    # lm_head_chunk_tokens: its forwards replay the sampler's own calls (CJ-GRPO's path) on materialised logits
    unused_shared_settings = frozenset({"loss_agg", "clip_ratio_c", "kl_estimator", "clip_eps_high", "advantage",
                                        "lm_head_chunk_tokens"})
    packing_refused = "tracerl replays the sampler's own calls (CJ-GRPO's path), not padded training forwards"

    clip_eps: float = Field(0.2, gt=0, lt=1)  # training.eps
    old_kl_beta: float = Field(0.01, ge=0)  # training.beta (with use_kl_estimator_k3: True), KL to π_old
    shrink: int = Field(1, ge=1)  # training.shrink: s neighbouring steps of a block aggregated into one
    value_model: bool = True  # rl_sdar_with_value.yaml (model.value_base_model set); false = rl_sdar.yaml
    gamma: float = Field(1.0, ge=0, le=1)  # training.gam
    lam: float = Field(1.0, ge=0, le=1)  # training.lam
    value_lr: float = Field(5e-6, gt=0)  # optimizer.params.value_learning_rate
    value_clip_eps: float = Field(0.2, gt=0)  # training.eps, reused by train_sdar_value.py's value clip
    value_max_grad_norm: float | None = Field(1.0, gt=0)  # training.max_grad_norm
    value_rows_per_step: int = Field(32, ge=1)  # training.gradient_accumulation_steps × batch_size_lm (1)
    value_train_every: int = Field(1, ge=1)  # experiment.train_value_every


ALGORITHM = AlgorithmSpec(name="tracerl", kind="rl", knobs=TraceRLConfig)
