"""The RL algorithm plug-in contract and registry.

An algorithm is one file under `trainers/algorithms/` with a subclass of `Algorithm` decorated with
`@register_algorithm`. The shared loop (`trainers/loop.py`) never names an algorithm; per rollout batch it calls:

    algo = get_algorithm("d1")(config_dict, model.traits)       # validates hyper-parameters (ConfigError)
    batch = RolloutBatch(...)                                    # G completions per prompt + rewards
    adv = algo.advantages(batch.rewards, batch.group_size)       # [N]
    state = algo.prepare(batch, policy, reference, generator=g, num_iterations=mu)   # no grad: noise, old/ref terms
    for it in range(mu):
        for rows in micro-batch index slices:
            metrics = algo.backward(policy, batch.select(rows), state.select(rows), adv[rows],
                                    loss_scale=1 / n_micro, iteration=it)            # calls .backward() itself
        optimizer step

`backward` runs the backward pass(es) itself so that an algorithm can do one backward per Monte-Carlo sample
(BGPO, EBPO: memory independent of the number of samples) or walk a recorded sampler trajectory (CJ-GRPO).

Refinements made with the shared loop (all backwards compatible):
- `AlgorithmConfig` also carries the GRPO settings every RL recipe has in `TrainSettings`: `advantage` (None = the
  algorithm's own default), `clip_ratio_c` (verl dual clip; None = off) and `kl_estimator`. The loop fills the
  config from `TrainSettings` (`trainers.loop.algorithm_settings`); a plug-in that cannot honour a value refuses it
  in `validate()`.
- `Algorithm.forward_batch_size`: rows per no-grad forward in `prepare` (None = all rows at once); set by the loop
  from its micro-batch size so that `prepare` never holds the logits of the whole rollout batch.
- `get_algorithm` accepts the reproduction spelling with hyphens (`coupled-grpo` -> `coupled_grpo`).
- Masks / noise drawn in `prepare` must be drawn for the whole batch there (not per micro-batch in `backward`), so a
  run's numbers do not depend on the micro-batch size.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from dare_bench.errors import ConfigError
from dare_bench.models.base import ModelTraits


@dataclass
class RolloutBatch:
    """G completions per prompt. Row r belongs to prompt r // group_size."""

    prompt_ids: torch.Tensor  # [N, P] left-padded with pad ids
    prompt_mask: torch.Tensor  # [N, P] 1 = real prompt token
    completion_ids: torch.Tensor  # [N, C] generated tokens (no mask ids left)
    completion_mask: torch.Tensor  # [N, C] 1 = scored token (up to and including the first EOS)
    rewards: torch.Tensor  # [N] float
    group_size: int
    trajectories: list[Any] | None = None  # per row, from the sampler when `Algorithm.needs_trajectory`

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, torch.ones_like(self.completion_ids)], dim=1)

    @property
    def num_rows(self) -> int:
        return int(self.prompt_ids.shape[0])

    def select(self, rows: slice | torch.Tensor) -> "RolloutBatch":
        idx = rows if isinstance(rows, slice) else rows.tolist()
        traj = None
        if self.trajectories is not None:
            traj = self.trajectories[rows] if isinstance(rows, slice) else [self.trajectories[i] for i in idx]
        return replace(
            self,
            prompt_ids=self.prompt_ids[rows], prompt_mask=self.prompt_mask[rows],
            completion_ids=self.completion_ids[rows], completion_mask=self.completion_mask[rows],
            rewards=self.rewards[rows], trajectories=traj,
        )


@dataclass
class AlgorithmState:
    """Tensors computed once per rollout batch (noise, old / reference log-probs ...), row-aligned with the batch.

    `rows` holds tensors whose first dim is the batch row (sliced per micro-batch); `shared` holds anything else
    (e.g. per-iteration seeds) and is passed through unchanged.
    """

    rows: dict[str, torch.Tensor] = field(default_factory=dict)
    shared: dict[str, Any] = field(default_factory=dict)

    def select(self, rows: slice | torch.Tensor) -> "AlgorithmState":
        return AlgorithmState({k: v[rows] for k, v in self.rows.items()}, dict(self.shared))


class AlgorithmConfig(BaseModel):
    """Hyper-parameters every algorithm shares; subclasses add their own. Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")

    clip_eps: float = 0.2  # ε (lower clip); `clip_eps_high` defaults to ε
    clip_eps_high: float | None = None
    kl_beta: float = 0.0  # β of the KL-to-reference penalty; 0 disables the reference forward
    mc_samples: int = 1  # Monte-Carlo samples of the likelihood estimator
    loss_agg: str = "token-mean"
    advantage: str | None = None  # "mean" | "mean_std" | "leave_one_out"; None = the algorithm's default
    clip_ratio_c: float | None = None  # verl dual-clip cap of the ratio for A < 0; None = plain PPO clip
    kl_estimator: str = "k3"  # k1 | k2 | k3 (low_var_kl) | abs

    @model_validator(mode="after")
    def _shared_ranges(self) -> "AlgorithmConfig":
        # Here, not in each plug-in: subclasses that redefine a field (e.g. BGPO's dual clip on by default) keep it.
        if self.clip_eps_high is not None and self.clip_eps_high <= 0:
            raise ValueError(f"clip_eps_high must be > 0, got {self.clip_eps_high}")
        if self.clip_ratio_c is not None and self.clip_ratio_c <= 1:
            raise ValueError(f"clip_ratio_c must be > 1, got {self.clip_ratio_c}")
        if self.kl_beta < 0:
            raise ValueError(f"kl_beta must be >= 0, got {self.kl_beta}")
        return self


class Algorithm:
    """Base class of every RL algorithm plug-in."""

    name: ClassVar[str] = ""
    Config: ClassVar[type[AlgorithmConfig]] = AlgorithmConfig
    # Attention kinds (ModelTraits.attention) of the backbones this algorithm is defined for.
    attention_kinds: ClassVar[tuple[str, ...]] = ("bidirectional", "block_causal")
    # Whether rollouts must record the sampler trajectory (CJ-GRPO, MDPO, TraceRL).
    needs_trajectory: ClassVar[bool] = False
    # Extra sampler settings the algorithm imposes on rollouts (e.g. CJ-GRPO's EOSER / ASS).
    rollout_overrides: ClassVar[dict[str, Any]] = {}
    # Rows per no-grad forward in `prepare` (None = the whole batch); the loop sets it from its micro-batch size.
    forward_batch_size: int | None = None

    def __init__(self, config: dict[str, Any] | None, traits: ModelTraits):
        if traits.attention not in self.attention_kinds:
            raise ConfigError(
                f"algorithm {self.name!r} is not defined for {traits.family} ({traits.attention} attention); "
                f"it supports {list(self.attention_kinds)} backbones"
            )
        try:
            self.config = self.Config(**(config or {}))
        except ValidationError as exc:
            raise ConfigError(f"invalid {self.name} settings: {_pydantic_message(exc, self.Config)}") from None
        self.traits = traits
        self.validate()

    def validate(self) -> None:
        """Cross-field checks; raise ConfigError (e.g. d1 with mc_samples != 1)."""

    # --- the three things a plug-in supplies ------------------------------------------------------------------
    def advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def prepare(self, batch: RolloutBatch, policy, reference, *, generator: torch.Generator,
                num_iterations: int) -> AlgorithmState:
        """Draw the noise and compute the old-policy (and reference) terms with gradients off.

        `reference` is a callable model (for LoRA: the policy with adapters disabled, see `trainers.loop`) or None
        when `kl_beta == 0`.
        """
        raise NotImplementedError

    def backward(self, policy, batch: RolloutBatch, state: AlgorithmState, advantages: torch.Tensor, *,
                 loss_scale: float, iteration: int) -> dict[str, float]:
        """Compute this micro-batch's loss, call `.backward()` on `loss * loss_scale` (once or once per MC sample)
        and return metrics (at least `loss`; `kl`, `clip_frac`, `entropy` when defined)."""
        raise NotImplementedError


ALGORITHMS: dict[str, type[Algorithm]] = {}

ALGORITHM_MODULES = ("d1", "coupled_grpo", "cj_grpo", "spg", "bgpo", "ebpo")


def register_algorithm(cls: type[Algorithm]) -> type[Algorithm]:
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    ALGORITHMS[cls.name] = cls
    return cls


def _import_all() -> None:
    import importlib

    for mod in ALGORITHM_MODULES:
        try:
            importlib.import_module(f"dare_bench.trainers.algorithms.{mod}")
        except ModuleNotFoundError as exc:
            if exc.name != f"dare_bench.trainers.algorithms.{mod}":
                raise


def get_algorithm(name: str) -> type[Algorithm]:
    """The plug-in class registered as `name`; reproduction names with hyphens (`coupled-grpo`) find the module-style
    registration (`coupled_grpo`)."""
    _import_all()
    if name not in ALGORITHMS and name.replace("-", "_") in ALGORITHMS:
        name = name.replace("-", "_")
    if name not in ALGORITHMS:
        hint = difflib.get_close_matches(name, ALGORITHMS, n=1)
        raise ConfigError(f"unknown algorithm {name!r}" + (f"; did you mean {hint[0]!r}?" if hint else "")
                          + f" (known: {sorted(ALGORITHMS)})")
    return ALGORITHMS[name]


def list_algorithms() -> list[str]:
    _import_all()
    return sorted(ALGORITHMS)


def _pydantic_message(exc: ValidationError, model: type[BaseModel]) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"])
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            hint = difflib.get_close_matches(str(err["loc"][-1]), list(model.model_fields), n=1)
            msg = "unknown setting" + (f" (did you mean {hint[0]!r}?)" if hint else "")
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


__all__ = [
    "Algorithm", "AlgorithmConfig", "AlgorithmState", "RolloutBatch", "register_algorithm", "get_algorithm",
    "list_algorithms", "ALGORITHMS",
]
