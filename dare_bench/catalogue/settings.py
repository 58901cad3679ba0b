"""The hyper-parameters every RL plug-in shares, and how a reproduction's `train` section becomes a plug-in config.

Torch-free on purpose: the registry validates every reproduction against the plug-in's own `Config` at load time
(`dare_bench.catalogue`), and loading the registry must not import torch.

A plug-in's `Config` subclasses `AlgorithmConfig`; its own fields are the knobs a reproduction sets under
`train.algorithm`, the shared fields come from `train.*` (`SHARED_TRAIN_FIELDS` maps the names). A shared field the
YAML leaves unset (None) is not passed, so the plug-in's own default applies (BGPO's 16 MC samples, EBPO's k2 KL ...).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, model_validator

# `TrainSettings` field -> `AlgorithmConfig` field. The train names follow the published recipes (beta_kl);
# the plug-in names are older and kept so that checkpoints and tests stay readable.
SHARED_TRAIN_FIELDS = {
    "beta_kl": "kl_beta",
    "kl_estimator": "kl_estimator",
    "mc_samples": "mc_samples",
    "loss_agg": "loss_agg",
    "clip_eps": "clip_eps",
    "clip_eps_high": "clip_eps_high",
    "clip_ratio_c": "clip_ratio_c",
    "advantage": "advantage",
    "lm_head_chunk_tokens": "lm_head_chunk_tokens",
    "packing": "packing",
}
# verl's loss aggregation modes and KL estimators (`common.agg_loss`, `common.kl_estimate`), with their aliases; typed
# as literals so that the registry refuses at load time exactly what a plug-in refuses when it is built.
AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_KINDS = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")
LossAgg = Literal[AGG_MODES]
KlEstimator = Literal[KL_KINDS]
# `train.advantage: algorithm` says "the plug-in's own advantage", i.e. the same as leaving it unset.
PLUGIN_ADVANTAGE = "algorithm"


class AlgorithmConfig(BaseModel):
    """Hyper-parameters every algorithm shares; subclasses add their own. Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")
    # Shared fields this plug-in's objective has no use for (e.g. SPG has no ratio to clip). The shared recipes
    # set them for every algorithm, so they are accepted, and declared here so that ignoring them is a stated
    # choice: tests/trainers/test_knob_coverage.py checks a plug-in reads every other field and none of these.
    unused_shared_settings: ClassVar[frozenset[str]] = frozenset()
    # Why this plug-in's update cannot run packed (`train.packing`), or None: it can. A plug-in whose forwards are not
    # plain training forwards (replayed sampler calls with their caches, whole-distribution reads over a tree) says
    # why here, and the loader refuses `train.packing: true` for it with that reason.
    packing_refused: ClassVar[str | None] = None

    clip_eps: float = 0.2  # ε (lower clip); `clip_eps_high` defaults to ε
    clip_eps_high: float | None = None
    kl_beta: float = 0.0  # β of the KL-to-reference penalty; 0 disables the reference forward
    mc_samples: int = 1  # Monte-Carlo samples of the likelihood estimator
    loss_agg: LossAgg = "token-mean"
    advantage: str | None = None  # "mean" | "mean_std" | "leave_one_out"; None = the algorithm's default
    clip_ratio_c: float | None = None  # verl dual-clip cap of the ratio for A < 0; None = plain PPO clip
    kl_estimator: KlEstimator = "k3"
    # None: the estimators materialise [tokens, vocab] logits; N: scored tokens only, N at a time through the LM head
    # (models/lm_head.py). A plug-in that needs the whole predictive distribution declares it unused.
    lm_head_chunk_tokens: int | None = None
    # True: the update's forwards run packed (diffusion/packing.py: the loop wraps the policy and the reference)
    packing: bool = False

    @model_validator(mode="after")
    def _shared_ranges(self) -> "AlgorithmConfig":
        # Here, not in each plug-in: subclasses that redefine a field (e.g. BGPO's dual clip on by default) keep it.
        if self.clip_eps_high is not None and self.clip_eps_high <= 0:
            raise ValueError(f"clip_eps_high must be > 0, got {self.clip_eps_high}")
        if self.clip_ratio_c is not None and self.clip_ratio_c <= 1:
            raise ValueError(f"clip_ratio_c must be > 1, got {self.clip_ratio_c}")
        if self.kl_beta < 0:
            raise ValueError(f"kl_beta must be >= 0, got {self.kl_beta}")
        if self.lm_head_chunk_tokens is not None and self.lm_head_chunk_tokens < 1:
            raise ValueError(f"lm_head_chunk_tokens must be >= 1, got {self.lm_head_chunk_tokens}")
        if self.packing and self.packing_refused:
            raise ValueError(f"packing is not supported by this algorithm: {self.packing_refused}; set "
                             "train.packing: false")
        return self


def algorithm_settings(train: Any) -> dict[str, Any]:
    """The plug-in's config dict from `TrainSettings`: the shared fields that are set, plus `train.algorithm`.

    Unset fields (None) are left to the plug-in's defaults; `advantage: algorithm` means the plug-in's own.
    """
    out: dict[str, Any] = {}
    for train_name, plugin_name in SHARED_TRAIN_FIELDS.items():
        value = getattr(train, train_name)
        # packing defaults to False (not None) in `TrainSettings`; off is the plug-in's default too, so not passed
        if value is not None and not (train_name == "advantage" and value == PLUGIN_ADVANTAGE) \
                and not (train_name == "packing" and value is False):
            out[plugin_name] = value
    out.update(train.algorithm)
    return out


__all__ = ["AGG_MODES", "AlgorithmConfig", "KL_KINDS", "KlEstimator", "LossAgg", "PLUGIN_ADVANTAGE",
           "SHARED_TRAIN_FIELDS", "algorithm_settings"]
