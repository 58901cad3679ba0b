"""Typed schemas for reproductions and run configs, their content hash, and `key=value` overrides.

A reproduction (`dare_bench/reproductions/<algorithm>-<backbone>-<task>.yaml`, loaded by `dare_bench.registry`) is a
`ReproductionSpec`: identity (algorithm x backbone x task), one `ScaleProfile` per scale and the scores published
for it (`ReportedScore`). Resolving a spec at a scale, plus optional command-line overrides, gives a `RunConfig`,
whose `content_hash` keys runs in the store: identical semantic configs give identical hashes. Resolved
`with_data=True` (the pipeline, `dare-bench check`), the config also holds `train.data` resolved to sources and
fingerprints (`RunConfig.data`), so the hash says which data a run trains on.

    from dare_bench.registry import get
    cfg = get("bgpo-llada-sudoku").resolve("tiny", ["train.lr=1e-5", "eval.limit=64"])
    cfg.profile.train.lr, cfg.modified, cfg.content_hash

Every model forbids unknown keys (typos fail at load time). Algorithm-specific knobs live in `train.algorithm`,
validated here against the algorithm's knob schema in `dare_bench.catalogue`. For an RL plug-in that schema is the
plug-in's own `Config`, validated with the shared `train.*` fields it receives, so a config that loads is one the
plug-in accepts (the plug-in's cross-field checks, which need the backbone, still run when it is built).

Scales:
- `paper`: the recipe that produced the reported scores (real checkpoint + revision, published hyper-parameters).
- `official` (optional): the algorithm authors' own recipe where it differs from the one that produced the
  reported scores (for DARE-table rows, `paper` is DARE's recipe and `official` the original repository's).
- `tiny`: a tiny replica of the backbone (model preset) SFT-trained from scratch (`base`), then post-trained;
  minutes on 2 CPU cores.
- `micro`: the same pipeline in seconds, for CI.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import math
import re
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dare_bench import catalogue
from dare_bench.catalogue.settings import KlEstimator, LossAgg
from dare_bench.errors import ConfigError, DataError

# Every scale a reproduction must have, among those its task offers (`Task.scales`: a real benchmark offers paper
# only, a procedural CPU task tiny / micro only); `official` is optional.
REQUIRED_SCALES = ("paper", "tiny", "micro")
SCALES = ("paper", "official", "tiny", "micro")

# The names come from the catalogue (one declaration per algorithm, backbone, task); typed as literals so that a
# wrong name fails at load time with the list of valid ones.
Algorithm = Literal[catalogue.algorithm_names()]
Backbone = Literal[catalogue.backbone_names()]
Task = Literal[catalogue.task_names()]
ScaleName = Literal["paper", "official", "tiny", "micro"]

_SHA = re.compile(r"^[0-9a-f]{40}$")
# HF commit ids of the real checkpoints are not known to this project yet (no hub access when the registry was
# written); the literal below says so explicitly instead of pretending `main` is a pin.
UNPINNED = "unpinned"


class Strict(BaseModel):
    """Base of every schema: unknown keys are errors, assignments are validated. `removed` names fields that
    existed once and why they went, so an old YAML fails with the reason instead of a bare unknown-key error."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    removed: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _no_removed_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, why in cls.removed.items():
                if key in data:
                    raise ValueError(f"`{key}` was removed from the schema: {why}")
        return data


# --------------------------------------------------------------------------------------------------- pieces


class ModelRef(Strict):
    """Which weights a scale starts from: a real checkpoint (paper/official) or a tiny preset (tiny/micro)."""

    checkpoint: str | None = Field(None, description="Hugging Face repo id, e.g. GSAI-ML/LLaDA-8B-Instruct")
    revision: str | None = Field(None, description=f"40-hex commit of the checkpoint, or {UNPINNED!r}")
    preset: str | None = Field(None, description="tiny model preset (dare_bench.models.presets), e.g. tiny-llada")
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    # The names of dare_bench.models.layers.BACKENDS (a test keeps them equal). Left out of dumps when it is the
    # default, so adding the field kept every existing config hash (and the pinned baselines) unchanged.
    attention: Literal["sdpa", "flash_attn", "flex"] = Field(
        "sdpa", exclude_if=lambda v: v == "sdpa",
        description="attention backend the model is loaded with (flash_attn: the gpu extra)")
    # dare_bench.models.moe.MOE_MODES (a test keeps them equal); left out of dumps at the default, like `attention`,
    # so existing config hashes and pinned baselines do not move. Dense backbones ignore it.
    moe: Literal["loop", "grouped"] = Field(
        "loop", exclude_if=lambda v: v == "loop",
        description="how MoE blocks run their routed experts: loop (official, one expert at a time) or grouped "
                    "(grouped matmuls over expert-sorted tokens; equal within fp32 rounding)")

    # Left out of dumps when unset, like `attention`, so the config hashes of every other entry do not move.
    block_size: int | None = Field(
        None, gt=0, exclude_if=lambda v: v is None,
        description="block-diffusion replicas: the block size the preset model trains and attends at (default: "
                    "the preset's own, copied from the real config); a replica decodes short canvases, so it trains "
                    "at the block its samplers decode with (pipeline.plan checks they agree)")

    @model_validator(mode="after")
    def _one_source(self) -> "ModelRef":
        if (self.checkpoint is None) == (self.preset is None):
            raise ValueError("set exactly one of `checkpoint` (real weights) or `preset` (tiny replica)")
        if self.block_size is not None and self.preset is None:
            raise ValueError("`block_size` applies to a tiny `preset` (a real checkpoint's is in its config.json)")
        if self.checkpoint is not None:
            if self.revision is None:
                raise ValueError(f"`checkpoint` needs a `revision` (a 40-hex commit, or {UNPINNED!r})")
            if self.revision != UNPINNED and not _SHA.match(self.revision):
                raise ValueError(f"`revision` must be a 40-hex commit id or {UNPINNED!r}, got {self.revision!r}")
        elif self.revision is not None:
            raise ValueError("`revision` only applies to a `checkpoint`")
        return self

    @property
    def preset_overrides(self) -> dict[str, int]:
        """What the run changes in its preset's config: the keyword overrides of `models.presets.preset_config`."""
        return {} if self.block_size is None else {"block_size": self.block_size}


class SamplerSettings(Strict):
    """Decoding settings, used both for RL rollouts and for evaluation.

    `name` identifies the pinned preset these settings come from (recorded with every evaluation). The numbers
    are always explicit so a run record never depends on a preset table that may change later.
    """

    name: str | None = Field(None, description="preset id, e.g. dare-llada-math (recorded with evaluations)")
    gen_length: int = Field(..., gt=0, description="completion tokens generated (max_new_tokens)")
    steps: int = Field(..., gt=0, description="denoising steps (BDLM: per block)")
    block_length: int | None = Field(None, gt=0, description="semi-AR block size; None = whole completion")
    temperature: float = Field(0.0, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    remasking: str = Field("low_confidence", description="low_confidence | random | entropy | maskgit_plus | ...")
    threshold: float | None = Field(None, gt=0, le=1, description="confidence threshold for parallel decoding")
    cfg_scale: float = Field(0.0, ge=0)
    extra: dict[str, Any] = Field(default_factory=dict, description="family-specific knobs, read by the sampler")

    @model_validator(mode="after")
    def _blocks_divide(self) -> "SamplerSettings":
        if self.block_length is not None and self.gen_length % self.block_length:
            raise ValueError(f"gen_length {self.gen_length} is not a multiple of block_length {self.block_length}")
        return self


class LoraSettings(Strict):
    r: int = Field(..., gt=0)
    alpha: float = Field(..., gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    quant_4bit: bool = False
    target_modules: list[str] | None = None


class BaseTarget(Strict):
    """The validation-target rule that picks a tiny base (issue #16: machine-stable bases). The base SFT holds out
    the last `validation_items` training items (it never trains on them), evaluates them with the run's pinned
    evaluation every `every` steps from `from_step`, and stops at the first checkpoint whose primary metric reaches
    `value`. A fixed step is not machine-stable: on the steep part of the SFT curve the reduction order of a matmul
    (1 vs 2 threads) moved LLaDA-sudoku's step-275 base from 20.6 % to 8.2 %; a target on held-out items moves only
    the step it is reached at."""

    value: float = Field(..., gt=0, le=1, description="the validation metric the base must reach")
    every: int = Field(..., gt=0, description="SFT steps between validation checks")
    from_step: int = Field(0, ge=0, description="first check (steps before it are never the base)")
    max_steps: int = Field(..., gt=0, description="give up (an error) when the target is not reached by then")
    validation_items: int = Field(256, gt=0, description="held out from the end of the training items")

    @model_validator(mode="after")
    def _reachable(self) -> "BaseTarget":
        if self.from_step > self.max_steps:
            raise ValueError(f"target.from_step {self.from_step} is past target.max_steps {self.max_steps}")
        return self

    def checks(self, step: int) -> bool:
        """Whether the validation runs after SFT step `step`."""
        return step >= self.from_step and (step - self.from_step) % self.every == 0


class BaseRecipe(Strict):
    """SFT recipe of the shared tiny base model (tiny/micro scales): trained from scratch on the task once,
    cached by its own hash, and reused by every algorithm of that backbone x task. The post-training start is an
    under-trained checkpoint, chosen either at a fixed SFT step (`start_step`) or by the validation-target rule
    (`target`, machine-stable: `BaseTarget`). Exactly one of them is set (a layer that switches rule sets the other
    to null)."""

    removed: ClassVar[dict[str, str]] = {
        "steps": "the base SFT trains exactly `start_step` steps (or up to `target.max_steps`); set one of them",
        "checkpoint_every": "the base keeps only its chosen checkpoint (`start_step`, or `target.every` checks)",
    }

    lr: float = Field(..., gt=0)
    warmup_steps: int = Field(0, ge=0)
    batch_size: int = Field(..., gt=0)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float | None = Field(1.0, gt=0)
    start_step: int | None = Field(None, gt=0, description="fixed rule: the SFT step the post-training starts from")
    target: BaseTarget | None = Field(None, description="validation-target rule (BaseTarget)")
    seed: int = 0

    @model_validator(mode="after")
    def _one_rule(self) -> "BaseRecipe":
        if (self.start_step is None) == (self.target is None):
            raise ValueError("set exactly one of `start_step` (a fixed SFT step) or `target` (the validation-target "
                             "rule); to switch rule in a layer or override, set the other to null "
                             "(e.g. base.target=null base.start_step=300)")
        return self

    @property
    def max_steps(self) -> int:
        """The most SFT steps the base can take."""
        return self.start_step if self.target is None else self.target.max_steps

    @property
    def held_out(self) -> int:
        """Training items the base never trains on (the target rule's validation items)."""
        return 0 if self.target is None else self.target.validation_items


# ------------------------------------------------------------------------------------------ train / eval


class TrainSettings(Strict):
    """Post-training settings common to every algorithm; knobs of one algorithm go in `algorithm`.

    `kind` says which trainer runs: none (baseline: evaluate the start model), sft, rl, preference, wsd (LLaDA2.0's
    block-level Warmup-Stable-Decay conversion; its schedule is `train.algorithm`, catalogue/wsd.py).
    Batch sizes are global (all ranks): `batch_prompts` prompts x `group_size` completions per step.
    """

    kind: Literal["none", "sft", "rl", "preference", "wsd"]
    lr: float | None = Field(None, gt=0)
    lr_schedule: Literal["constant", "constant_with_warmup", "cosine", "cosine_with_min_lr", "linear"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    adam_betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float | None = Field(1.0, gt=0)
    steps: int | None = Field(None, gt=0, description="optimizer steps; None = run `epochs` over the data")
    compute_budget_flops: float | None = Field(
        None, gt=0, description="sft only: stop once the counted training FLOPs reach this (trainers/compute.py); the "
        "compute-matched control of an RL run (`reproduce --control`) sets it to the RL run's count")
    epochs: float | None = Field(None, gt=0)
    batch_prompts: int | None = Field(None, gt=0)
    group_size: int | None = Field(None, gt=0, description="G completions per prompt")
    mu: int = Field(1, gt=0, description="gradient steps per rollout batch (num_iterations / ppo epochs)")
    # The fields an RL plug-in receives (catalogue.settings.SHARED_TRAIN_FIELDS) default to None: unset,
    # the plug-in's own default applies (BGPO's 16 MC samples, EBPO's k2 KL ...).
    beta_kl: float | None = Field(None, ge=0)
    kl_estimator: KlEstimator | None = None
    clip_eps: float | None = Field(None, ge=0, description="PPO clip (epsilon_low); 0 clips the ratio to 1 "
                                   "(DARE's ESPO countdown recipe)")
    clip_eps_high: float | None = Field(None, gt=0, description="None = clip_eps")
    clip_ratio_c: float | None = Field(None, gt=1, description="dual-clip cap for A<0 (verl)")
    advantage: Literal["mean", "mean_std", "leave_one_out", "algorithm"] | None = Field(
        None, description="algorithm (or unset): the plug-in's own advantage")
    loss_agg: LossAgg | None = None
    mc_samples: int | None = Field(None, gt=0, description="Monte-Carlo masks per sequence for the likelihood (mc_num)")
    ref_sync_steps: int | None = Field(None, gt=0)
    # Left out of dumps at its default (None), so adding it kept every existing config hash and pinned baseline.
    lm_head_chunk_tokens: int | None = Field(
        None, gt=0, exclude_if=lambda v: v is None,
        description="loss head: None = materialised [tokens, vocab] logits; N = only the scored tokens' hidden "
                    "states go through the LM head, N tokens of logits at a time, forward and backward "
                    "(models/lm_head.py); read by SFT, VRPO and the RL plug-ins that score target tokens")
    # Left out of dumps at its default (False): existing config hashes and pinned baselines stay as they were.
    packing: bool = Field(
        False, exclude_if=lambda v: v is False,
        description="packed (varlen) training forwards: the real tokens of a padded batch laid into fewer rows, "
                    "positions kept, no attention across sequences (diffusion/packing.py); same numbers as padded. "
                    "Read by the RL update (plug-ins whose Config sets packing_refused are refused), VRPO and SFT "
                    "(where it also trains each example at its own length: no EOS padding to the batch maximum)")
    max_prompt_length: int | None = Field(None, gt=0)
    lora: LoraSettings | None = None
    rollout: SamplerSettings | None = None
    data: list[str] = Field(default_factory=list, description="training sets (task-relative ids or files)")
    gpus: int | None = Field(None, gt=0, description="GPUs of the published run (informational at tiny scale)")
    checkpoint_every: int | None = Field(None, gt=0)
    eval_every: int | None = Field(None, gt=0)
    algorithm: dict[str, Any] = Field(default_factory=dict, description="algorithm knobs (catalogue: knob_names)")

    @model_validator(mode="after")
    def _needed_for_kind(self) -> "TrainSettings":
        if self.kind == "none":
            return self
        if self.lr is None:
            raise ValueError(f"train.kind={self.kind} needs `lr`")
        if self.steps is None and self.epochs is None:
            raise ValueError(f"train.kind={self.kind} needs `steps` or `epochs`")
        if self.kind == "rl":
            missing = [k for k in ("batch_prompts", "group_size", "rollout") if getattr(self, k) is None]
            if missing:
                raise ValueError(f"train.kind=rl needs {', '.join(missing)}")
        if self.compute_budget_flops is not None and self.kind != "sft":
            raise ValueError(f"train.compute_budget_flops applies to train.kind=sft (a compute-matched control), "
                             f"not {self.kind}")
        return self


class EvalSettings(Strict):
    """The evaluation of the final (last) model: one decoded sample per item, or the mean over `repeats` samples."""

    removed: ClassVar[dict[str, str]] = {
        "checkpoint": "the final evaluation is of the last model; picking the best on the test set is selection "
                      "on the test set",
    }

    split: str = "test"
    limit: int | None = Field(None, gt=0, description="first N items of the split; None = all")
    batch_size: int = Field(16, gt=0)
    metric: str = Field("accuracy", description="primary metric written to the store")
    # Left out of dumps at 1, so adding the field kept every existing config hash unchanged.
    repeats: int = Field(1, ge=1, exclude_if=lambda v: v == 1,
                         description="independent samples per item, the metric averaged over all of them "
                                     "(OpenCompass' repeatN datasets: DARE scores AIME as the mean of 8)")
    # Left out of dumps at "native" (existing hashes unchanged); a run through OpenCompass is another config.
    engine: Literal["native", "opencompass"] = Field(
        "native", exclude_if=lambda v: v == "native",
        description="native: dare-bench's evaluator; opencompass: the same checkpoint, sampler settings, task "
                    "protocol and grader through OpenCompass' infer and eval tasks (the opencompass extra)")
    sampler: SamplerSettings
    # Left out of dumps when empty (existing config hashes unchanged).
    thresholds: list[float] = Field(
        default_factory=list, exclude_if=lambda v: not v,
        description="also evaluate the final model with confidence-threshold decoding at each of these thresholds "
                    "(evaluations `final-thr<t>`: accuracy and tokens per forward, the trade CAP claims to move)")

    @field_validator("thresholds")
    @classmethod
    def _thresholds_in_range(cls, v: list[float]) -> list[float]:
        for t in v:
            if not 0 < t <= 1:
                raise ValueError(f"a confidence threshold is in (0, 1], got {t}")
        if len(set(v)) != len(v):
            raise ValueError(f"thresholds must be distinct, got {v}")
        return v


class ScaleProfile(Strict):
    """Everything a run at one scale needs: start model, (tiny) SFT base, post-training, evaluation, seeds."""

    description: str | None = None
    hardware: str | None = Field(None, description="what the published run used, e.g. 8xA100-80GB")
    model: ModelRef
    base: BaseRecipe | None = None
    train: TrainSettings
    eval: EvalSettings
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    task_options: dict[str, Any] = Field(
        default_factory=dict, description="the task's options: the generator's difficulty knobs (arith: steps, "
        "max_operand, ops; pyfunc: difficulty, unseen_functions), for training and evaluation alike, or an "
        "evaluation protocol (protocol: an OpenCompass dataset config); validated by the task (Task.with_options)")

    @model_validator(mode="after")
    def _engine_needs_a_checkpoint(self) -> "ScaleProfile":
        # OpenCompass loads the weights itself from a directory: the released checkpoint, never a trained model
        # still in memory nor a tiny replica's SFT base
        if self.eval.engine == "opencompass" and (self.train.kind != "none" or self.model.checkpoint is None):
            raise ValueError("eval.engine opencompass evaluates a released checkpoint directory: only evaluation-only "
                             "reproductions (train.kind none) at paper scale")
        return self


def scale_refusal(task, scale: str, algorithm: str, backbone: str) -> str:
    """Why `algorithm-backbone-task` has no `scale`, naming what to run instead (the task's own reason, except for
    an evaluation of a released checkpoint, whose CPU path is the same evaluation of a shrunk checkpoint)."""
    if algorithm == "released":
        return (f"released-{backbone}-{task.name} evaluates the released checkpoint (paper scale only); the same "
                f"path on CPU, with shrunk random weights: dare-bench eval-suite {backbone} --shrunk --benchmarks "
                f"{task.name}")
    return task.scale_refusal(scale, algorithm, backbone)


# ---------------------------------------------------------------------------------------- reported scores

# Our metrics that are fractions of 1, where papers report percentages (the leaderboard, `check` and the
# evaluation suite compare in percent).
FRACTION_METRICS = ("accuracy", "pass@1", "pass@k", "score", "exact_match")


def to_percent(value: float | None, metric: str) -> float | None:
    """Our fraction-of-1 metrics as percentages (the unit papers report); other metrics unchanged."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return 100.0 * value if metric in FRACTION_METRICS else value


class Source(Strict):
    kind: Literal["paper", "repo"]
    ref: str = Field(..., description="arXiv id / paper title, or owner/repo")
    table: str | None = Field(None, description="table or section as the source names it")
    file: str | None = Field(None, description="file in the repo (kind=repo)")
    commit: str | None = Field(None, description="repo snapshot the number was read from")

    @model_validator(mode="after")
    def _located(self) -> "Source":
        if self.kind == "paper" and not self.table:
            raise ValueError("a paper source needs `table`")
        if self.kind == "repo" and not self.file:
            raise ValueError("a repo source needs `file`")
        return self

    def cite(self) -> str:
        where = self.file if self.kind == "repo" else None
        parts = [self.ref + (f"@{self.commit}" if self.commit else "")]
        parts += [p for p in (where, self.table) if p]
        return ", ".join(parts)


class ReportedScore(Strict):
    value: float
    metric: str
    source: Source
    table: str = Field(..., description="which comparison the number belongs to; rows of different tables never mix")
    settings: dict[str, Any] = Field(default_factory=dict, description="evaluation settings stated by the source")
    note: str | None = None


# --------------------------------------------------------------------------------------------- the spec


class ReproductionSpec(Strict):
    name: str
    algorithm: Algorithm
    backbone: Backbone
    task: Task
    paper_ref: str
    grader: str = "dare"
    description: str | None = None
    scales: dict[ScaleName, ScaleProfile]
    reported: list[ReportedScore] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> "ReproductionSpec":
        # Messages start with the dotted path they concern, so the registry can point at the YAML line.
        expected = f"{self.algorithm}-{self.backbone}-{self.task}"
        if self.name != expected:
            raise ValueError(f"name: {self.name!r} must be <algorithm>-<backbone>-<task> = {expected!r}")
        from dare_bench.tasks import get_task

        task = get_task(self.task)
        missing = [s for s in REQUIRED_SCALES if task.offers_scale(s) and s not in self.scales]
        extra = [s for s in self.scales if not task.offers_scale(s)]
        if extra:
            raise ValueError(f"scales.{extra[0]}: {scale_refusal(task, extra[0], self.algorithm, self.backbone)}")
        if missing:
            raise ValueError(f"scales: missing scale(s) {', '.join(missing)}")
        spec = catalogue.algorithm(self.algorithm)
        for scale, prof in self.scales.items():
            if prof.train.kind != spec.kind:
                raise ValueError(
                    f"scales.{scale}.train.kind: {self.algorithm} trains with kind {spec.kind!r}, "
                    f"not {prof.train.kind!r}"
                )
            if scale in ("paper", "official") and prof.model.checkpoint is None:
                raise ValueError(f"scales.{scale}.model: this scale must start from a real `checkpoint`")
            if scale in ("tiny", "micro"):
                if prof.model.preset is None:
                    raise ValueError(f"scales.{scale}.model: this scale must use a tiny `preset`")
                if prof.base is None:
                    raise ValueError(f"scales.{scale}: needs `base` (the tiny SFT recipe)")
            problem = knob_problem(self.algorithm, prof.train) or profile_problem(self.algorithm, self.backbone, prof)
            if problem:
                raise ValueError(f"scales.{scale}.{problem}")
            try:
                task.with_options(prof.task_options)
            except ConfigError as exc:
                raise ValueError(f"scales.{scale}.task_options: {exc}") from None
        seen: set[tuple] = set()
        for i, r in enumerate(self.reported):
            key = (r.table, r.metric, json.dumps(r.settings, sort_keys=True))
            if key in seen:
                raise ValueError(
                    f"reported.{i}: a second score for table {r.table!r}, metric {r.metric!r}, same settings"
                )
            seen.add(key)
        return self

    def resolve(self, scale: str, overrides: list[str] | tuple[str, ...] = (), *,
                with_data: bool = False) -> "RunConfig":
        """The run config of `scale` (+ overrides). `with_data`: also resolve `train.data` to its sources and
        fingerprints (`RunConfig.data`, part of the hash; a missing file is a DataError). The pipeline and
        `dare-bench check` resolve with data, so a run's hash says which data it trained on; the registry alone
        (listing, showing, validating) needs no data on disk."""
        from dare_bench.tasks import get_task

        task = get_task(self.task)
        if scale in SCALES and not task.offers_scale(scale):
            raise ConfigError(scale_refusal(task, scale, self.algorithm, self.backbone))
        if scale not in self.scales:
            hint = _suggest(scale, self.scales)
            raise ConfigError(f"{self.name} has no scale {scale!r}{hint} (scales: {', '.join(self.scales)})")
        pinned = RunConfig(
            reproduction=self.name, algorithm=self.algorithm, backbone=self.backbone, task=self.task,
            grader=self.grader, scale=scale, profile=self.scales[scale].model_copy(deep=True),
        )
        if with_data:
            try:
                pinned = pinned.model_copy(update={"data": pinned.resolve_data()})
            except DataError:
                # the overrides may name the data that is missing; without them, the error stands
                if not overrides:
                    raise
        if not overrides:
            return pinned
        cfg = pinned.apply_overrides(overrides)
        return cfg.model_copy(update={"data": cfg.resolve_data()}) if with_data else cfg

    def knobs(self, scale: str) -> BaseModel:
        """The typed algorithm settings of a scale (defaults filled in): for an RL plug-in, its `Config`."""
        return catalogue.algorithm(self.algorithm).settings(self.scales[scale].train)


def knob_problem(algorithm: str, train: TrainSettings) -> str | None:
    """What is wrong with the algorithm settings of `train` (a path relative to the scale, then why), or None.

    The algorithm's catalogue schema decides; an RL plug-in's schema also checks the shared `train.*` fields it
    receives, so e.g. CJ-GRPO's `eos_gamma_min` is refused here with the same bound the plug-in applies.
    """
    spec = catalogue.algorithm(algorithm)
    knobs = spec.knob_names
    listed = f"({algorithm} knobs: {', '.join(knobs) or 'none'})"
    for key in train.algorithm:
        if key not in knobs and spec.takes_shared_settings and key in spec.knobs.model_fields:
            return f"{spec.setting_path(key)}: a shared setting, set it there, not under train.algorithm {listed}"
    try:
        spec.settings(train)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err["loc"]]
        where = spec.setting_path(loc[0]) + "".join(f".{p}" for p in loc[1:]) if loc else "train.algorithm"
        hint = _suggest(err["loc"][-1], knobs) if err["type"] == "extra_forbidden" else ""
        msg = err["msg"].removeprefix("Value error, ")
        return f"{where}: {msg} {listed}{hint}"
    return None


def profile_problem(algorithm: str, backbone: str, profile: ScaleProfile) -> str | None:
    """What is wrong with a scale profile of `algorithm` on `backbone` beyond its knobs (a path relative to the
    scale, then why), or None: an algorithm on a diffusion kind it is not defined for (`AlgorithmSpec.diffusion`:
    CAP or WSD on an MDLM); a WSD schedule whose steps are not `train.steps` or whose final block is not the one the
    evaluation decodes with; an SFT at a pinned block size (ar: 1) evaluated at another. Checked at load time and
    after overrides (the knobs themselves by `knob_problem`, first)."""
    spec = catalogue.algorithm(algorithm)
    kind = catalogue.backbone(backbone).diffusion
    if kind not in spec.diffusion:
        return (f"algorithm: {algorithm} applies to {' / '.join(spec.diffusion)} diffusion backbones only; "
                f"{backbone} is {kind} diffusion")
    train, sampler = profile.train, profile.eval.sampler
    knobs = spec.settings(train)
    if train.kind == "wsd":
        if train.steps != knobs.total_steps:
            return (f"train.steps: {train.steps} is not the schedule's {knobs.total_steps} "
                    f"(the sum of train.algorithm.stages[*].steps)")
        if sampler.block_length != knobs.final_block_size:
            return (f"eval.sampler.block_length: {sampler.block_length} is not the block size the schedule ends at "
                    f"({knobs.final_block_size}): the final model is evaluated at the block it was trained for")
    trained_at = getattr(knobs, "block_size", None)  # an SFT at a pinned block size (ar: 1, the AR decoder)
    if trained_at is not None and sampler.block_length != trained_at:
        return (f"eval.sampler.block_length: {sampler.block_length} is not the block size {spec.name} trains at "
                f"({trained_at})")
    return None


# --------------------------------------------------------------------------------------------- run config

# Fields that document a config without changing what runs; left out of the content hash.
NON_SEMANTIC = {"description", "hardware", "overrides", "modified", "pinned_hash"}


class DataRecord(Strict):
    """One resolved `train.data` entry (dare_bench.tasks.mixtures): the entry, what it resolved to, the sha256 that
    pins its content (file hash; for hf: / generators the pinned id or the generator call)."""

    entry: str
    source: str
    fingerprint: str


def train_items_needed(profile: ScaleProfile, scale: str) -> int | None:
    """How many training items a run draws: None (the whole training split) except at micro scale, where a smoke
    run reads what its base and its few steps use (40 x 32, not a 20k-item set). Tiny runs read everything, so a
    base's items (and its SFT batches) do not depend on how long it trains: a calibration scan's step-k model is
    the base that `start_step: k` builds (pipeline/calibrate.py; at micro only the scan's last step is)."""
    if scale != "micro":
        return None
    train = profile.train
    needed = max(profile.base.max_steps * profile.base.batch_size + profile.base.held_out if profile.base else 0,
                 (train.steps or 1) * (train.batch_prompts or 1), 256)
    return needed if needed < 20000 else None


class RunConfig(Strict):
    """A reproduction resolved at one scale (+ overrides): what the pipeline runs and the store records.

    `data` is `train.data` resolved to sources and fingerprints (empty until resolved, `resolve(with_data=True)`);
    it is semantic, so a run on generated data and one on DARE's files hash differently."""

    reproduction: str
    algorithm: Algorithm
    backbone: Backbone
    task: Task
    grader: str
    scale: ScaleName
    profile: ScaleProfile
    overrides: list[str] = Field(default_factory=list)
    pinned_hash: str | None = Field(None, description="hash before overrides; set when overrides were applied")
    data: list[DataRecord] = Field(default_factory=list, description="train.data resolved (tasks.mixtures)")

    def resolve_data(self) -> list[DataRecord]:
        """`train.data` of this config resolved to sources and fingerprints; DataError when a source is missing."""
        from dare_bench.tasks.mixtures import resolve_sources

        if self.profile.train.kind == "none" and self.profile.base is None:
            return []  # a paper-scale baseline evaluates the checkpoint: no training data at all
        sources = resolve_sources(self.run_task(), self.profile.train.data,
                                  train_items_needed(self.profile, self.scale))
        return [DataRecord(**s.record()) for s in sources]

    @property
    def modified(self) -> bool:
        """True when overrides changed the pinned config: such runs never count as faithful reproductions."""
        return self.pinned_hash is not None and self.pinned_hash != self.content_hash

    @property
    def content_hash(self) -> str:
        return hashlib.sha256(canonical_json(self.semantic_dict()).encode()).hexdigest()

    @property
    def recipe_hash(self) -> str:
        """The content hash without the training data's fingerprints: the recipe alone, which the registry can
        resolve on any machine (whether DARE's parquet files or the task's generator feed it). Two runs of one
        entry with different recipe hashes ran different versions of its pinned config."""
        semantic = {k: v for k, v in self.semantic_dict().items() if k != "data"}
        return hashlib.sha256(canonical_json(semantic).encode()).hexdigest()

    def semantic_dict(self) -> dict[str, Any]:
        d = _strip(self.model_dump(mode="json"), NON_SEMANTIC)
        # where a data file lies is not what it holds: the same files under another directory hash the same
        d["data"] = [{k: v for k, v in rec.items() if k != "source"} for rec in d["data"]]
        if not d["profile"].get("task_options"):  # the default (none set) hashes as before the field existed
            d["profile"].pop("task_options", None)
        base = d["profile"].get("base")
        if base and base.get("target") is None:  # the fixed-step rule hashes as before `target` existed
            base.pop("target", None)
        if d["profile"]["train"].get("compute_budget_flops") is None:  # likewise a run without a compute budget
            d["profile"]["train"].pop("compute_budget_flops", None)
        return d

    def run_task(self):
        """The task this run trains and evaluates on, with the scale's `task_options` applied."""
        from dare_bench.tasks import get_task

        return get_task(self.task).with_options(self.profile.task_options)

    def check_evaluation_items(self) -> None:
        """The evaluation split loads here and its first item's prompt builds: a missing benchmark file is one
        DataError naming `dare-bench data get`, a protocol dare-bench cannot run one NotBuiltError. The plan calls
        it before anything is written; `dare-bench list --runnable` reports it."""
        from dare_bench.errors import DataError

        ev = self.profile.eval
        task = self.run_task()
        items = list(task.load(split=ev.split, limit=1))
        if not items:
            raise DataError(f"{self.reproduction}: the {task.name} {ev.split} split has no items")
        task.messages(items[0])

    def to_dict(self) -> dict[str, Any]:
        d = self.model_dump(mode="json")
        d["content_hash"] = self.content_hash
        d["modified"] = self.modified
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunConfig":
        d = {k: v for k, v in d.items() if k not in ("content_hash", "modified")}
        try:
            return cls.model_validate(d)
        except ValidationError as exc:
            raise ConfigError(f"invalid run config: {_first_error(exc)}") from None

    def apply_overrides(self, overrides: list[str] | tuple[str, ...]) -> "RunConfig":
        """Return a copy with `dotted.key=value` overrides applied to the profile, type-checked.

        Keys are relative to the scale profile (`train.lr=1e-5`, `eval.limit=32`, `seeds=[0,1]`,
        `train.algorithm.p_mask_prompt=0.1`). Values are parsed as YAML (`null`, lists, numbers).
        """
        data = self.profile.model_dump(mode="python")
        for item in overrides:
            key, sep, raw = item.partition("=")
            key = key.strip()
            if not sep or not key:
                raise ConfigError(f"override {item!r} is not key=value")
            _set_path(self.profile, data, key.split("."), raw, item, self.algorithm)
        try:
            profile = ScaleProfile.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(f"overrides {list(overrides)} give an invalid config: {_first_error(exc)}") from None
        problem = knob_problem(self.algorithm, profile.train) or profile_problem(self.algorithm, self.backbone, profile)
        if problem:
            raise ConfigError(f"overrides {list(overrides)} give an invalid config: {problem}")
        from dare_bench.tasks import get_task

        get_task(self.task).with_options(profile.task_options)  # a knob out of range: one ConfigError
        return self.model_copy(update={
            "profile": profile,
            "overrides": [*self.overrides, *overrides],
            "pinned_hash": self.pinned_hash or self.content_hash,
        })


def _set_path(model: Any, data: dict, parts: list[str], raw: str, item: str, algorithm: str) -> None:
    node_model: Any = model
    node = data
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        where = ".".join(parts[: i + 1])
        if isinstance(node_model, BaseModel):
            fields = type(node_model).model_fields
            if part not in fields:
                raise ConfigError(f"override {item!r}: unknown key {where!r}{_suggest(part, fields)}")
            child_model = getattr(node_model, part)
        elif isinstance(node, dict):
            if where.startswith("train.algorithm.") and i == 2:
                knob_fields = catalogue.algorithm(algorithm).knob_names
                if part not in knob_fields:
                    known = ", ".join(knob_fields) or "none"
                    raise ConfigError(
                        f"override {item!r}: {algorithm} has no knob {part!r}{_suggest(part, knob_fields)} "
                        f"(knobs: {known})"
                    )
            child_model = node.get(part) if isinstance(node, dict) else None
        else:
            raise ConfigError(f"override {item!r}: {'.'.join(parts[:i])!r} is a value, not a section")
        if last:
            node[part] = _parse_value(raw)
            return
        if node.get(part) is None:
            raise ConfigError(f"override {item!r}: section {where!r} is not set at this scale")
        node_model, node = child_model, node[part]


def _parse_value(raw: str) -> Any:
    raw = raw.strip()
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        return raw
    # YAML 1.1 reads "1e-5" as a string; numbers in scientific notation are common in overrides.
    if isinstance(value, str):
        try:
            return float(value) if re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", value) else value
        except ValueError:
            return value
    return value


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _strip(obj: Any, keys: set[str]) -> Any:
    if isinstance(obj, dict):
        return {k: _strip(v, keys) for k, v in obj.items() if k not in keys}
    if isinstance(obj, list):
        return [_strip(v, keys) for v in obj]
    return obj


def _suggest(word: str, options: Any) -> str:
    hits = difflib.get_close_matches(str(word), [str(o) for o in options], n=1, cutoff=0.6)
    return f" (did you mean {hits[0]!r}?)" if hits else ""


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    return f"{loc}: {err['msg']}" if loc else err["msg"]


def deep_merge(base: Any, over: Any) -> Any:
    """Mappings merge key by key; anything else in `over` replaces `base` (lists are not concatenated)."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = deep_merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    return copy.deepcopy(over)
