"""The RL algorithm plug-in contract and registry.

An algorithm is two files: `dare_bench/catalogue/knobs/<name>.py` (torch-free: its `Config`, a subclass of
`AlgorithmConfig`, and the `ALGORITHM` entry the catalogue discovers, see `dare_bench/catalogue/__init__.py`) and
`dare_bench/trainers/algorithms/<name>.py` (a subclass of `Algorithm` decorated with `@register_algorithm`, `name =
"<name>"`, `Config` = that class). The shared loop (`trainers/loop.py`) never names an algorithm; per rollout batch it
calls:

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
- `Algorithm.rollout_requirements` + `check_rollout(settings)`: sampler settings a plug-in's estimator needs (JustGRPO:
  `block_length: 1`). The loop passes its rollout settings through `check_rollout` once; unset values are filled
  in, conflicting ones refused (ConfigError), so a run record never says one thing while the rollouts do another.
- `AlgorithmConfig` also carries the GRPO settings every RL recipe has in `TrainSettings`: `advantage` (None = the
  algorithm's own default), `clip_ratio_c` (verl dual clip; None = off) and `kl_estimator`. The loop fills the
  config from `TrainSettings` (`catalogue.settings.algorithm_settings`, only the fields that are set); a
  plug-in that cannot honour a value refuses it in `validate()`.
- `Algorithm.forward_batch_size`: rows per no-grad forward in `prepare` (None = all rows at once); set by the loop
  from its micro-batch size so that `prepare` never holds the logits of the whole rollout batch.
- `get_algorithm` accepts the reproduction spelling with hyphens (`coupled-grpo` -> `coupled_grpo`): names come
  from the catalogue.
- Masks / noise drawn in `prepare` must be drawn for the whole batch there (not per micro-batch in `backward`), so a
  run's numbers do not depend on the micro-batch size.
- `RolloutBatch.grader` (a `CompletionGrader`): the reward of any completion token sequence of a row, graded exactly
  as the loop graded the rollouts (cut at the first stop token, decoded, the task's grader on that row's item).
  The loop attaches it to every batch; a plug-in that rewards intermediate states (MDPO: the proposal of every
  denoising step) calls `batch.grader(completions [n, K, C])` in `prepare`, all K steps in one call. `select`
  keeps it row-aligned.
- Plug-in rollouts, for algorithms whose rollouts are not `group_size` independent samples per prompt (tree
  search: d-TreeRPO; any next tree / trajectory-search algorithm): `owns_rollout = True` and
  `generate_rollouts(policy, prompt_ids, prompt_mask, settings=..., generator=...)` returns a `PluginRollout`:
  the canvases of its rows (`rows_per_prompt` contiguous rows per prompt row it was given, e.g. a tree's leaves),
  their per-row `trajectories` (any objects; a tree's leaf carries its root-to-leaf path) and the sampler stats.
  The loop then grades every row as its own rollouts (same cut, same grader), so the `RolloutBatch` the plug-in
  gets has `group_size = train.group_size * rows_per_prompt`, the rewards of its rows and its trajectories; the
  loop's advantages and reward metrics use `batch.group_size`. The loop's sampler settings (`train.rollout` after
  `check_rollout`) are handed over as they are: the plug-in interprets and checks them (`check_rollout`).
- `Algorithm.micro_batch_block(batch)`: rows that must share a micro-batch (a tree's leaves, whose segments and
  sibling groups span rows); the loop's micro-batches are whole multiples of it. Default 1.
- Training progress: before each rollout batch's update the loop sets `optimizer_step` (optimizer steps done so far;
  `backward`'s `iteration` counts on from it) and `total_optimizer_steps` (the run's length), for losses with a
  time schedule (d-TreeRPO's self-distillation weight).
- Plug-in state in checkpoints: `state_dict()` -> dict of anything `torch.save` writes (default `{}`: nothing) and
  `load_state_dict(state)`. The loop writes a non-empty one as `algorithm.pt` beside the policy's optimizer in every
  checkpoint and hands it back on `--resume` before the first update. A plug-in that trains a module of its own
  (TraceRL's value model: a second network with its own AdamW, trained inside `prepare` before the policy update)
  keeps that module and its optimizer here; the loop never sees them (its optimizer, LR schedule, gradient
  clipping and FSDP sharding are the policy's only).
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass, field, replace
from typing import Any, Callable, ClassVar

import torch
from pydantic import BaseModel, ValidationError

from dare_bench.catalogue.settings import AlgorithmConfig
from dare_bench.errors import ConfigError
from dare_bench.models.base import ModelTraits


@dataclass
class CompletionGrader:
    """Rewards of arbitrary completions of a batch's rows: `grader(completions [n, C])` -> float32 `[n]`, row i of
    `completions` graded against the item of this view's row i; `grader(completions [n, K, C])` -> `[n, K]` grades K
    completions of each row in one call. `grade_row(row, token_ids)` is the loop's grading of one row of the original
    batch; `rows` maps this view's rows to the original batch's. `grade_rows(rows, token_id_lists)`, where given, grades
    many at once and must equal `grade_row` on each: the loop's sends a code task's programs to the sandbox
    concurrently and each distinct one once, which is what makes MDPO's graded intermediate states affordable on
    pyfunc (K proposals per row, one sandbox process each when graded one by one)."""

    grade_row: Callable[[int, list[int]], float]
    rows: tuple[int, ...]
    grade_rows: Callable[[list[int], list[list[int]]], list[float]] | None = None

    def __call__(self, completions: torch.Tensor) -> torch.Tensor:
        if completions.dim() not in (2, 3) or completions.shape[0] != len(self.rows):
            raise ValueError(f"grader: expected [{len(self.rows)}, C] or [{len(self.rows)}, K, C] completions, got "
                             f"{tuple(completions.shape)}")
        per_row = 1 if completions.dim() == 2 else completions.shape[1]
        ids = completions.reshape(len(self.rows) * per_row, completions.shape[-1]).tolist()
        rows = [r for r in self.rows for _ in range(per_row)]  # row-major, as the reshape lays out `ids`
        rewards = (self.grade_rows(rows, ids) if self.grade_rows is not None
                   else [self.grade_row(r, toks) for r, toks in zip(rows, ids)])
        out = torch.tensor([float(x) for x in rewards], dtype=torch.float32, device=completions.device)
        return out if completions.dim() == 2 else out.view(len(self.rows), per_row)

    def select(self, rows: slice | list[int]) -> "CompletionGrader":
        picked = self.rows[rows] if isinstance(rows, slice) else tuple(self.rows[i] for i in rows)
        return CompletionGrader(self.grade_row, tuple(picked), self.grade_rows)


@dataclass
class RolloutBatch:
    """G completions per prompt. Row r belongs to prompt r // group_size (with plug-in rollouts G is
    `train.group_size * PluginRollout.rows_per_prompt`)."""

    prompt_ids: torch.Tensor  # [N, P] left-padded with pad ids
    prompt_mask: torch.Tensor  # [N, P] 1 = real prompt token
    completion_ids: torch.Tensor  # [N, C] generated tokens (no mask ids left)
    completion_mask: torch.Tensor  # [N, C] 1 = scored token (up to and including the first EOS)
    rewards: torch.Tensor  # [N] float
    group_size: int
    trajectories: list[Any] | None = None  # per row, from the sampler when `Algorithm.needs_trajectory`
    grader: CompletionGrader | None = None  # rewards of other completions of these rows (the loop's grading)

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
        grader = None if self.grader is None else self.grader.select(rows if isinstance(rows, slice) else idx)
        return replace(
            self,
            prompt_ids=self.prompt_ids[rows], prompt_mask=self.prompt_mask[rows],
            completion_ids=self.completion_ids[rows], completion_mask=self.completion_mask[rows],
            rewards=self.rewards[rows], trajectories=traj, grader=grader,
        )


@dataclass
class PluginRollout:
    """What `Algorithm.generate_rollouts` hands the loop: rows the loop grades as its own rollouts.

    `output.canvas` is `[prompt rows * rows_per_prompt, P + C]` (prompt as given, then the completion; mask ids left
    in a row's completion are treated as the loop treats them: EOS, the row counted as unfinished); row r belongs to
    prompt row r // rows_per_prompt. `trajectories`: one object per row, or None; `output.stats` feeds the loop's
    rollout metrics (forwards, tokens per forward)."""

    output: Any  # diffusion.sampling.GenerationOutput
    rows_per_prompt: int
    trajectories: list[Any] | None = None


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
    # Sampler settings the algorithm's estimator is only defined for (e.g. JustGRPO: block_length 1, left to right).
    # Unlike `rollout_overrides` they never replace a value the recipe sets: `check_rollout` fills them in where
    # `train.rollout` leaves them unset and refuses a recipe that sets them otherwise.
    rollout_requirements: ClassVar[dict[str, Any]] = {}
    # Rows per no-grad forward in `prepare` (None = the whole batch); the loop sets it from its micro-batch size.
    forward_batch_size: int | None = None
    # Whether the plug-in generates its rollouts itself (`generate_rollouts`: tree search ...) instead of the loop's
    # `group_size` independent samples per prompt.
    owns_rollout: ClassVar[bool] = False
    # Training progress, set by the loop before each rollout batch's update (see the module docstring).
    optimizer_step: int = 0
    total_optimizer_steps: int | None = None

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

    def unread_settings(self) -> dict[str, str]:
        """Shared settings (`AlgorithmConfig` field -> why) that these settings make the plug-in ignore, e.g. SPG's
        `mc_samples` once `num_t` is set. A command-line override of one is refused at plan time
        (`pipeline.plan`), since it would change the run's config hash and nothing else."""
        return {}

    def check_rollout(self, settings: dict[str, Any]) -> dict[str, Any]:
        """The rollout sampler settings (`generate()` keywords) with `rollout_requirements` applied: an unset one
        is filled in, a conflicting one is a ConfigError. The loop calls it once, before the first rollout."""
        out = dict(settings)
        for key, required in self.rollout_requirements.items():
            value = out.get(key)
            if value is None:
                out[key] = required
            elif value != required:
                raise ConfigError(f"algorithm {self.name!r} needs train.rollout.{key} = {required!r}, got {value!r}")
        return out

    def generate_rollouts(self, policy, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor | None, *,
                          settings: dict[str, Any], generator: torch.Generator | None) -> PluginRollout:
        """With `owns_rollout`: the rollouts of these prompt rows (`[n, P]`, left-padded; `prompt_mask` None when no
        row is padded), under no grad, the policy in eval mode. `settings` are the loop's sampler settings (after
        `check_rollout`), `generator` the rollout noise."""
        raise NotImplementedError(f"{self.name} does not generate its own rollouts")

    def state_dict(self) -> dict[str, Any]:
        """Plug-in state to checkpoint (modules of its own, their optimizers, counters); `{}` = nothing."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`'s output on resume (called before the first `prepare`)."""

    def micro_batch_block(self, batch: RolloutBatch) -> int:
        """Rows of `batch` that must stay in one micro-batch (its micro-batches are multiples of this)."""
        return 1

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


def register_algorithm(cls: type[Algorithm]) -> type[Algorithm]:
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    ALGORITHMS[cls.name] = cls
    return cls


def get_algorithm(name: str) -> type[Algorithm]:
    """The plug-in class of the catalogue's algorithm `name` (reproduction spelling `coupled-grpo`, or the plug-in's
    own `coupled_grpo`); an algorithm without a plug-in, or an unknown name, is a ConfigError."""
    from dare_bench import catalogue

    spec = catalogue.find_algorithm(name)
    if spec is None or spec.plugin is None:
        known = catalogue.plugin_names()
        hint = difflib.get_close_matches(name, known, n=1)
        raise ConfigError(f"unknown algorithm {name!r}" + (f"; did you mean {hint[0]!r}?" if hint else "")
                          + f" (known: {known})")
    importlib.import_module(f"dare_bench.trainers.algorithms.{spec.plugin}")
    return ALGORITHMS[spec.plugin]


def list_algorithms() -> list[str]:
    """Names of every RL plug-in (the plug-in spelling, e.g. coupled_grpo)."""
    from dare_bench import catalogue

    return catalogue.plugin_names()


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
    "Algorithm", "AlgorithmConfig", "AlgorithmState", "CompletionGrader", "PluginRollout", "RolloutBatch",
    "register_algorithm",
    "get_algorithm", "list_algorithms", "ALGORITHMS",
]
