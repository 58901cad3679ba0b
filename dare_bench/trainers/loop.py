"""The shared RL loop: rollout → reward → advantages → prepare (old / ref terms) → μ updates; checkpoints; metrics.

The loop never names an algorithm, a backbone or a task. The algorithm plug-in (`trainers/algorithms/`) supplies
advantages, `prepare` and `backward`; the backbone's `traits` give mask / eos / pad ids; the task gives prompts and
rewards. One loop step = one rollout batch (`batch_prompts` prompts × `group_size` completions) followed by up to μ
optimizer steps on it; `train.steps` counts optimizer steps, so a run has ceil(steps / μ) loop steps.

    from dare_bench.trainers.loop import RLRunOptions, train_rl
    result = train_rl(policy, tokenizer, task, "d1", run_config.profile.train,
                      RLRunOptions(sink=sink, checkpoint_dir=run_dir / "checkpoints", resume=True, seed=0))
    result.history[-1]["reward_mean"], result.checkpoint

Per step, in order: prompts (deterministic order from the seed; position saved in checkpoints) → rollouts with
`diffusion.sampling.generate` (train.rollout settings + `algo.rollout_overrides`, trajectories when the plug-in asks)
→ decode up to the first stop token and grade with the task's grader → completion mask (up to and including the
first EOS) → `algo.advantages` → `algo.prepare` → μ × micro-batches of `algo.backward` (gradient accumulation,
loss scale 1 / #micro-batches as the official trainers) → grad-norm clip → AdamW → LR scheduler. A plug-in with
`owns_rollout` decodes the prompts itself (`generate_rollouts`, e.g. a tree search); its rows (a tree's leaves) are
graded the same way, and its micro-batches keep `micro_batch_block` rows together. Metrics go to
`sink(step, dict)`: reward mean / std / accuracy, the plug-in's loss terms (loss, kl, clip_frac, entropy ...),
grad norm, lr, rollout tokens-per-forward, seconds per stage (rollout / reward / prepare / update), peak memory.

Packing (`train.packing`): `prepare` and `backward` get the policy and the reference as `diffusion.packing.PackedModel`
(the real tokens of a micro-batch in fewer rows, no attention across sequences; the same numbers as padded).

LoRA (`train.lora`): adapters via peft; the reference for a KL term is the same model with adapters disabled (d1's
`disable_adapter()`), so no second copy exists. Full fine-tuning with `beta_kl > 0`: a frozen copy of the starting
policy (or the `reference` argument).

Commands (the pipeline calls this function; these run one reproduction through it):
    CPU:       dare-bench reproduce d1-llada-sudoku --scale tiny            # add --resume after an interruption
    one GPU:   dare-bench reproduce d1-llada-sudoku --scale paper --checkpoint /ckpt/LLaDA-8B-Instruct --device cuda
    torchrun:  torchrun --nproc_per_node 8 -m dare_bench.cli reproduce d1-llada-sudoku --scale paper \
                   --checkpoint /ckpt/LLaDA-8B-Instruct --device cuda
    (under torchrun `train_rl` joins the process group itself: prompts are sharded, gradients averaged, rank 0
    writes checkpoints and calls the sink; see `trainers/distributed.py`.)
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import resource
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from dare_bench.catalogue.settings import algorithm_settings
from dare_bench.diffusion.packing import maybe_packed
from dare_bench.errors import ConfigError, DataError
from dare_bench.trainers.algorithms.base import CompletionGrader, RolloutBatch, get_algorithm
from dare_bench.trainers.checkpoint import (
    capture_rng,
    is_peft,
    latest_checkpoint,
    load_algorithm_state,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
)
from dare_bench.trainers.distributed import (
    DistInfo,
    all_reduce_grads,
    all_reduce_metrics,
    barrier,
    gather_objects,
    gathered_for_inference,
    gathered_training_state,
    init_distributed,
    is_sharded,
    shard_model,
    shard_rows,
)
from dare_bench.trainers.lora import apply_lora
from dare_bench.trainers.precision import compute_precision, master_weights

MetricsSink = Callable[[int, dict[str, float]], Any]
# Metrics that measure the machine, not the run: they differ between a resumed and an uninterrupted run.
TIMING_KEYS = ("time_rollout_s", "time_reward_s", "time_prepare_s", "time_update_s", "time_step_s",
               "peak_memory_mb")
COSINE_MIN_LR_RATE = 0.1  # cosine_with_min_lr: floor as a fraction of the peak lr


@dataclass
class TrainResult:
    """What `train_rl` hands back to the pipeline."""

    final_step: int  # loop steps (rollout batches) completed
    optimizer_steps: int
    history: list[dict[str, float]]  # one metrics dict per loop step, including the resumed-from part
    checkpoint: Path | None  # the last checkpoint written (or resumed from), None without checkpoint_dir
    policy: Any  # the trained model (a PEFT model for LoRA runs)
    resumed_from: int | None = None  # step of the checkpoint the run resumed from
    info: dict[str, Any] = field(default_factory=dict)  # algorithm config, resolved sampler settings, data size


# --- settings ---------------------------------------------------------------------------------------------------
def _train_settings(train_cfg):
    from dare_bench.config import TrainSettings

    if isinstance(train_cfg, TrainSettings):
        cfg = train_cfg
    else:
        try:
            cfg = TrainSettings(**dict(train_cfg))
        except Exception as exc:  # pydantic ValidationError: one line for the user
            raise ConfigError(f"invalid train settings: {exc}") from None
    if cfg.kind != "rl":
        raise ConfigError(f"train_rl runs train.kind=rl, got {cfg.kind!r}")
    return cfg


def rollout_settings(sampler) -> dict[str, Any]:
    """`generate()` keyword arguments from a `SamplerSettings`: every field that is set, plus `extra`.

    Fields at their schema default that only one sampler family knows (remasking, cfg_scale) are left out, so the
    same settings object drives every backbone's sampler.
    """
    d = sampler.model_dump() if hasattr(sampler, "model_dump") else dict(sampler)
    extra = dict(d.pop("extra", None) or {})
    d.pop("name", None)
    out = {k: v for k, v in d.items() if v is not None}
    if out.get("remasking") == "low_confidence":
        out.pop("remasking")
    if out.get("cfg_scale") == 0.0:
        out.pop("cfg_scale")
    out.update(extra)
    return out


def build_scheduler(optimizer, name: str, warmup_steps: int, total_steps: int):
    """LambdaLR with the Hugging Face schedule shapes (first step at warmup factor 0, as HF Trainer)."""
    w, total = int(warmup_steps), max(1, int(total_steps))

    def warm(s: int) -> float | None:
        return float(s) / float(max(1, w)) if s < w else None

    def progress(s: int) -> float:
        return float(s - w) / float(max(1, total - w))

    if name == "constant":
        fn = lambda s: 1.0  # noqa: E731
    elif name == "constant_with_warmup":
        fn = lambda s: warm(s) if s < w else 1.0  # noqa: E731
    elif name == "linear":
        fn = lambda s: warm(s) if s < w else max(0.0, float(total - s) / float(max(1, total - w)))  # noqa: E731
    elif name == "cosine":
        fn = lambda s: warm(s) if s < w else max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress(s))))  # noqa: E731
    elif name == "cosine_with_min_lr":
        def fn(s: int) -> float:
            if s < w:
                return warm(s)
            cos = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress(s))))
            return COSINE_MIN_LR_RATE + (1 - COSINE_MIN_LR_RATE) * cos
    else:
        raise ConfigError(f"unknown lr_schedule {name!r}")
    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)


# --- LoRA / reference -------------------------------------------------------------------------------------------
class AdapterDisabled:
    """The LoRA policy with its adapters switched off: the reference model without a second copy of the weights."""

    def __init__(self, peft_model):
        self.model = peft_model

    def __call__(self, *args, **kwargs):
        with self.model.disable_adapter():
            return self.model(*args, **kwargs)

    def parameters(self):
        return self.model.parameters()


def frozen_copy(model):
    ref = copy.deepcopy(model)
    ref.requires_grad_(False)
    return ref.eval()


# --- data order --------------------------------------------------------------------------------------------------
class PromptStream:
    """Items in a seeded random order, reshuffled every epoch; `state()` / `load_state()` give the data position."""

    def __init__(self, n: int, seed: int):
        if n < 1:
            raise ConfigError("the task has no training items")
        self.n, self.seed, self.epoch, self.pos = n, int(seed), 0, 0
        self._order = self._perm(0)

    def _perm(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def take(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.pos == self.n:
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._perm(self.epoch)
            out.append(self._order[self.pos])
            self.pos += 1
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.pos, "items": self.n}

    def load_state(self, st: dict[str, int]) -> None:
        if st["items"] != self.n:
            raise ConfigError(f"checkpoint was made with {st['items']} training items, this run has {self.n}")
        self.epoch, self.pos = int(st["epoch"]), int(st["position"])
        self._order = self._perm(self.epoch)


def load_train_items(task, data: Sequence[str]) -> list[Any]:
    """The training items named by `train.data`, concatenated in order (tasks.mixtures: the task's own name, a DARE
    data name, a file, `hf:<id>@<rev>`, `generator:<seed>`; nothing = the task's standard train split)."""
    from dare_bench.tasks.mixtures import load_mixture

    return list(load_mixture(task, data))


# --- rollout helpers ---------------------------------------------------------------------------------------------
def encode(tokenizer, text: str) -> list[int]:
    """Token ids of a prompt, without special tokens (templated prompts already carry them)."""
    from dare_bench.tasks.mixtures import prompt_token_ids

    ids = prompt_token_ids(tokenizer, text)
    if not ids:
        raise ConfigError(f"prompt tokenizes to nothing: {text[:60]!r}")
    return [int(i) for i in ids]


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = torch.tensor(list(s), dtype=torch.long)
        mask[i, width - len(s):] = 1
    return ids, mask


def completion_mask(completion: torch.Tensor, stop_ids: Sequence[int]) -> torch.Tensor:
    """1 for every token up to and including the first stop token (all tokens when there is none)."""
    is_stop = torch.zeros_like(completion, dtype=torch.bool)
    for t in stop_ids:
        is_stop |= completion == int(t)
    # positions strictly after the first stop have a stop token before them
    before = torch.cumsum(is_stop.long(), dim=1) - is_stop.long()
    return (before == 0).long()


def rollout_batch(policy, tokenizer, task, items: Sequence[Any], idx: Sequence[int], group: int,
                  sampler_settings: dict[str, Any], *, generator: torch.Generator | None, template: Any = "plain",
                  grader: str = "dare", prompt_cache: dict[int, list[int]] | None = None, algorithm=None):
    """`group` sampled completions for each of the prompts `items[i] for i in idx`, graded: (RolloutBatch, info).

    With an `algorithm` that `owns_rollout` (tree search), its `generate_rollouts` decodes instead of the sampler:
    each of the `group` copies of a prompt becomes `rows_per_prompt` rows, graded like sampled ones.
    info: `correct` (per row), `unfinished` (fraction of rows that ran out of steps), `output` (the sampler's
    GenerationOutput), `time_rollout_s`, `time_reward_s`. Shared by the RL loop and `dare-bench bench alignment`.
    """
    from dare_bench.diffusion.sampling import generate

    traits = policy.traits
    device = next(policy.parameters()).device
    stop_ids = tuple(dict.fromkeys((int(traits.eos_token_id), *map(int, traits.stop_token_ids))))
    cache = prompt_cache if prompt_cache is not None else {}
    for i in idx:
        if i not in cache:
            cache[i] = encode(tokenizer, task.format_prompt(items[i], template))
    prompt_ids, prompt_mask = left_pad([cache[i] for i in idx], traits.pad_token_id)
    prompt_ids = prompt_ids.repeat_interleave(group, dim=0).to(device)
    prompt_mask = prompt_mask.repeat_interleave(group, dim=0).to(device)
    padding = prompt_mask if bool((prompt_mask == 0).any()) else None
    t0 = time.perf_counter()
    if algorithm is not None and algorithm.owns_rollout:
        was_training = policy.training
        policy.eval()
        try:
            with torch.no_grad():
                own = algorithm.generate_rollouts(policy, prompt_ids, padding, settings=sampler_settings,
                                                  generator=generator)
        finally:
            policy.train(was_training)
        out, trajectories = own.output, own.trajectories
        prompt_ids = prompt_ids.repeat_interleave(own.rows_per_prompt, dim=0)
        prompt_mask = prompt_mask.repeat_interleave(own.rows_per_prompt, dim=0)
        group = group * own.rows_per_prompt
        if out.canvas.shape[0] != prompt_ids.shape[0] or (trajectories is not None
                                                          and len(trajectories) != prompt_ids.shape[0]):
            raise ConfigError(f"{algorithm.name}: generate_rollouts returned {out.canvas.shape[0]} rows, expected "
                              f"{prompt_ids.shape[0]} ({own.rows_per_prompt} per prompt row)")
    else:
        with torch.no_grad():
            out = generate(policy, prompt_ids, padding, generator=generator, **sampler_settings)
        trajectories = None
    p_len = prompt_ids.shape[1]
    comp = out.canvas[:, p_len:].clone()
    # a sampler that stops at EOS leaves mask ids behind it; one left before any stop token means the row ran out
    # of steps: it ends there (the mask id becomes EOS, the row is counted as unfinished)
    leftover = comp == int(traits.mask_token_id)
    unfinished = float((leftover & completion_mask(comp, stop_ids).bool()).any(dim=1).float().mean())
    comp[leftover] = int(traits.eos_token_id)
    cmask = completion_mask(comp, stop_ids)
    t_rollout = time.perf_counter() - t0
    t0 = time.perf_counter()
    mask_id, eos_id = int(traits.mask_token_id), int(traits.eos_token_id)

    def row_text(tokens: list[int]) -> str:
        """What is graded of a row's tokens: a mask id left counts as EOS (as for the rollouts), cut after the first
        stop token, stop tokens dropped, decoded. The rollouts and, through `RolloutBatch.grader`, any other
        completion a plug-in asks about (MDPO's intermediate states) are graded on the same text."""
        kept = []
        for t in tokens:
            t = eos_id if t == mask_id else t
            if t in stop_ids:
                break
            kept.append(t)
        return tokenizer.decode(kept, skip_special_tokens=True)

    def grade_row(r: int, tokens: list[int]):
        return task.grade(row_text(tokens), items[idx[r // group]], grader)

    grade_many = getattr(task, "grade_many", None)

    def grade_rows(rows: list[int], token_lists: list[list[int]]):
        """Many completions at once: code tasks grade concurrently, a program repeated (in a group, or across
        MDPO's intermediate states) reaches the sandbox once; equal to `grade_row` on each."""
        texts = [row_text(tokens) for tokens in token_lists]
        row_items = [items[idx[r // group]] for r in rows]
        return (grade_many(texts, row_items, grader) if grade_many is not None
                else [task.grade(t, it, grader) for t, it in zip(texts, row_items)])

    results = grade_rows(list(range(comp.shape[0])), comp.tolist())
    rewards = [float(res.reward) for res in results]
    correct = [float(bool(res.correct)) for res in results]
    rewards_t = torch.tensor(rewards, dtype=torch.float32, device=device)
    if trajectories is None:
        trajectories = _split_trajectory(out.trajectory, comp.shape[0])
    batch = RolloutBatch(prompt_ids, prompt_mask, comp, cmask, rewards_t, group, trajectories=trajectories,
                         grader=CompletionGrader(lambda r, toks: float(grade_row(r, toks).reward),
                                                 tuple(range(comp.shape[0])),
                                                 lambda rs, tls: [float(res.reward) for res in grade_rows(rs, tls)]))
    info = {"correct": correct, "unfinished": unfinished, "output": out, "time_rollout_s": t_rollout,
            "time_reward_s": time.perf_counter() - t0}
    return batch, info


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":  # reset at the start of every step: this step's peak
        return torch.cuda.max_memory_allocated(device) / 2**20
    # CPU: the process's peak resident set so far (no per-step reset exists); KiB on Linux, bytes on macOS
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 2**20 if sys.platform == "darwin" else kb / 2**10


def _micro_slices(n_rows: int, micro: int, block: int) -> list[slice]:
    """Micro-batches of `micro` rows (rounded down to whole `block`s of rows, at least one block), in order."""
    if block < 1 or n_rows % block:
        raise ConfigError(f"the plug-in keeps {block} rows together, but the rollout batch has {n_rows} rows")
    size = max(block, micro // block * block)
    return [slice(a, min(a + size, n_rows)) for a in range(0, n_rows, size)]


def _row_weighted(values: list[float], rows: list[int]) -> float:
    """Mean of per-unit values weighted by their rows (one unit: the value itself, bit for bit)."""
    if len(values) == 1:
        return float(values[0])
    return sum(v * n for v, n in zip(values, rows)) / sum(rows)


def _mean_metrics(records: list[dict[str, float]]) -> dict[str, float]:
    keys = sorted({k for r in records for k in r})
    return {k: sum(r[k] for r in records if k in r) / sum(1 for r in records if k in r) for k in keys}


# --- the loop ----------------------------------------------------------------------------------------------------
@dataclass
class RLRunOptions:
    """What is specific to one `train_rl` call (the recipe itself is `train.*`, a `TrainSettings`).

    Run: `seed` (data order, rollout noise, the plug-in's masks, LoRA init; also seeds the global torch RNG for
    dropout); `sink` is called as `sink(step, metrics)` after every loop step (rank 0 only; steps are 1-based);
    `progress` shows a tqdm bar; `dist` the process group (default: joined from the torchrun environment).
    Checkpoints: every `train.checkpoint_every` loop steps and at the end into `checkpoint_dir`, keeping the
    `keep_last` newest; with `resume`, continue from the latest complete checkpoint there (metrics history included)
    if one exists; `stop_after`: stop (without a final checkpoint) after this many loop steps of this call — for
    tests that simulate an interrupted run.
    Data: `items` (default: `train.data` through `load_train_items`); `prompt_template`: "plain" or a chat
    tokenizer (`task.format_prompt`); `grader`: the task grader that gives the reward.
    Model: `reference` for the KL term when fully fine-tuning (default: a frozen copy of the starting policy;
    ignored with LoRA, where the reference is the policy with adapters disabled); `micro_batch_size`: rows per
    forward / backward (default: the whole rollout batch of this rank); `gradient_checkpointing`: recompute
    activations in the backward (paper-scale memory; same numbers).
    `evaluate`: called as `evaluate(policy, step)` every `train.eval_every` loop steps before the last (on every
    rank, inside `gathered_for_inference`: the callback shards the items and lets rank 0 write; eval mode, no grad,
    global RNG restored afterwards); its metrics join the step's as `eval_<name>`.
    `unit_prompts`: prompts per rollout unit. Each unit is decoded, prepared and updated on its own, with its
    generators seeded from (seed, step, the unit's index in the whole batch), so the numbers do not depend on how
    many ranks share the batch (1 process == N processes, up to float reduction order). None: one unit per rank
    with per-rank generator streams (the fastest; numbers then depend on the rank count).
    Under torchrun (world size > 1) the policy and the reference are sharded with FSDP2 (`distributed.shard_model`).
    """

    seed: int = 0
    sink: MetricsSink | None = None
    progress: bool = True
    dist: DistInfo | None = None
    checkpoint_dir: str | Path | None = None
    resume: bool = False
    keep_last: int | None = None
    stop_after: int | None = None
    items: Sequence[Any] | None = None
    prompt_template: Any = "plain"
    grader: str = "dare"
    reference: Any = None
    micro_batch_size: int | None = None
    gradient_checkpointing: bool = False
    evaluate: Callable[[Any, int], Mapping[str, float]] | None = None
    # None / "float32": everything in fp32. "bfloat16": fp32 master weights and optimizer state, rollouts and
    # log-prob forwards under bf16 autocast (trainers/precision.py)
    compute_dtype: str | None = None
    unit_prompts: int | None = None


def train_rl(policy, tokenizer, task, algorithm_name: str, train_cfg,
             options: RLRunOptions | None = None) -> TrainResult:
    """Post-train `policy` with the RL algorithm `algorithm_name` on `task`; see the module docstring.

    train_cfg: a `dare_bench.config.TrainSettings` (kind "rl") or a dict of its fields; options: `RLRunOptions`.
    The stages are the methods of `RLRecipe`, called here in order.
    """
    run = RLRecipe(policy, tokenizer, task, algorithm_name, train_cfg, options or RLRunOptions())  # setup
    run.resume()
    with run.progress_bar():
        while not run.finished():
            if run.interrupted():
                return run.result()
            stats = run.start_step()
            units = run.rollout()
            run.update(stats, units)
            run.record(stats, units)  # metrics, mid-training evaluation, sink
            run.periodic_checkpoint()
        run.final_checkpoint()
    return run.result()


@dataclass
class _StepStats:
    """One loop step's numbers between the stages: timings, the update's records."""

    t_start: float
    advantages: torch.Tensor | None = None
    algo_records: list[dict[str, float]] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    lr: float = 0.0
    time_prepare_s: float = 0.0
    time_update_s: float = 0.0


class RLRecipe:
    """The stages of one RL run over shared state (torchtune-recipe style); `train_rl` calls them top to bottom.

    setup (`__init__`): settings → algorithm plug-in → data → model / reference / optimizer → RNG and data order;
    `resume`: the latest checkpoint, if asked; per loop step: `start_step` → `rollout` (prompts, sampling, grading)
    → `update` (advantages, `prepare`, μ optimizer steps) → `record` (metrics) → `periodic_checkpoint`; at the
    end `final_checkpoint` and `result`.
    """

    def __init__(self, policy, tokenizer, task, algorithm_name: str, train_cfg, opts: RLRunOptions):
        self.opts = opts
        self.tokenizer, self.task = tokenizer, task
        self._setup_settings(policy, algorithm_name, train_cfg)
        self._setup_data()
        self._setup_model(policy)
        self._setup_rng_and_order()
        self.history: list[dict[str, float]] = []
        self.step = self.opt_step = 0
        self.done_here = 0  # loop steps run by this call (a resumed run starts at 0 again)
        self.resumed_from: int | None = None
        self.last_ckpt: Path | None = None
        self.ckpt_root = Path(opts.checkpoint_dir) if opts.checkpoint_dir is not None else None
        self.info = {"algorithm": self.algo.name, "algorithm_config": self.algo.config.model_dump(),
                     "sampler": self.sampler_settings, "train_items": len(self.items),
                     "total_loop_steps": self.total_loop_steps, "total_optimizer_steps": self.total_opt_steps,
                     "micro_batch_size": self.micro, "world_size": self.dist.world_size,
                     "unit_prompts": self.opts.unit_prompts, "fsdp": is_sharded(self.policy)}
        self.bar = None

    # -- setup -----------------------------------------------------------------------------------------------------
    def _setup_settings(self, policy, algorithm_name: str, train_cfg) -> None:
        """Settings, process group and the algorithm plug-in; rows per rank and micro-batch."""
        self.cfg = cfg = _train_settings(train_cfg)
        self.dist = self.opts.dist or init_distributed()  # a no-op outside torchrun
        self.traits = policy.traits
        self.device = next(policy.parameters()).device
        algo_cls = get_algorithm(algorithm_name)
        self.algo = algo_cls(algorithm_settings(cfg), self.traits)
        self.n_prompts, self.group = int(cfg.batch_prompts), int(cfg.group_size)
        self.local_prompts = shard_rows(self.n_prompts, self.dist)
        local = self.local_prompts.stop - self.local_prompts.start
        self.unit_prompts = int(self.opts.unit_prompts or local)
        if self.unit_prompts < 1 or local % self.unit_prompts:
            raise ConfigError(f"unit_prompts {self.opts.unit_prompts} does not divide the {local} prompts per rank "
                              f"({self.n_prompts} prompts over {self.dist.world_size} rank(s))")
        self.micro = int(self.opts.micro_batch_size or self.unit_prompts * self.group)
        if self.micro < 1:
            raise ConfigError(f"micro_batch_size must be >= 1, got {self.micro}")
        self.algo.forward_batch_size = self.micro
        self.mu = int(cfg.mu)

    def _setup_data(self) -> None:
        """Training items and the run's length: `train.steps` optimizer steps, else `train.epochs` over the items."""
        cfg, items = self.cfg, self.opts.items
        total_opt_steps = int(cfg.steps) if cfg.steps is not None else None
        if items is None:
            items = load_train_items(self.task, cfg.data)
        self.items = list(items)
        if total_opt_steps is None:
            loop_steps_per_epoch = math.ceil(len(self.items) / self.n_prompts)
            total_opt_steps = math.ceil(float(cfg.epochs) * loop_steps_per_epoch) * self.mu
        self.total_opt_steps = total_opt_steps
        self.total_loop_steps = math.ceil(total_opt_steps / self.mu)

    def _setup_model(self, policy) -> None:
        """Seeded global RNG, gradient checkpointing, LoRA adapters, the KL reference, AdamW and the LR schedule."""
        cfg, opts, seed = self.cfg, self.opts, self.opts.seed
        # The global torch RNG drives LoRA's init and dropout: seed it so that a run depends on `seed` alone (a
        # resumed run then restores the exact state from its checkpoint).
        torch.manual_seed(seed * 7919 + 3 + self.dist.rank)
        if opts.compute_dtype:
            policy = master_weights(policy)  # before LoRA and the reference copy: both then start from fp32
        if opts.gradient_checkpointing:
            policy.gradient_checkpointing_enable()
        if cfg.lora is not None:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)  # identical adapters on every rank
                policy = apply_lora(policy, cfg.lora)
        policy.train()
        self.ref_model = None
        if self.algo.config.kl_beta > 0:
            if is_peft(policy):
                self.ref_model = AdapterDisabled(policy)
            else:
                self.ref_model = opts.reference if opts.reference is not None else frozen_copy(policy)
                self.ref_model = shard_model(self.ref_model, self.dist, opts.compute_dtype)
        # under torchrun: FSDP2 shards (a no-op in one process); LoRA's adapters are sharded with their layers
        policy = shard_model(policy, self.dist, opts.compute_dtype)
        if cfg.ref_sync_steps is not None:
            if is_peft(policy):
                warnings.warn("train.ref_sync_steps has no effect with LoRA: the reference is the base model with "
                              "adapters disabled", stacklevel=4)
            elif self.algo.config.kl_beta > 0:
                raise ConfigError("train.ref_sync_steps (periodic reference refresh) is not implemented for full "
                                  "fine-tuning; unset it or use LoRA")
        self.policy = policy
        self.params = [p for p in policy.parameters() if p.requires_grad]
        if not self.params:
            raise ConfigError("the policy has no trainable parameters")
        self.optimizer = torch.optim.AdamW(self.params, lr=float(cfg.lr), betas=tuple(cfg.adam_betas),
                                           weight_decay=float(cfg.weight_decay))
        self.scheduler = build_scheduler(self.optimizer, cfg.lr_schedule, cfg.warmup_steps, self.total_opt_steps)

    def _setup_rng_and_order(self) -> None:
        """Same prompt order on every rank; rollout noise and the plug-in's masks per rank; the sampler settings."""
        seed, rank = self.opts.seed, self.dist.rank
        self.stream = PromptStream(len(self.items), seed)
        self.rollout_gen = torch.Generator(device=self.device).manual_seed(seed * 7919 + 17 + rank)
        self.algo_gen = torch.Generator().manual_seed(seed * 7919 + 29 + rank)
        self.generators = {"rollout": self.rollout_gen, "algorithm": self.algo_gen}
        settings = rollout_settings(self.cfg.rollout)
        settings.update(self.algo.rollout_overrides)
        settings = self.algo.check_rollout(settings)
        settings["return_trajectory"] = bool(self.algo.needs_trajectory or settings.get("return_trajectory"))
        self.sampler_settings = settings
        self.prompt_cache: dict[int, list[int]] = {}

    # -- resume ----------------------------------------------------------------------------------------------------
    def resume(self) -> None:
        """With `resume`: weights, optimizer, scheduler, data position, history and RNG of the latest checkpoint."""
        if not (self.opts.resume and self.ckpt_root is not None):
            return
        found = latest_checkpoint(self.ckpt_root)
        if found is None:
            return
        seed, dist = self.opts.seed, self.dist
        state, rng = load_checkpoint(found, model=self.policy, optimizer=self.optimizer, scheduler=self.scheduler)
        if state.get("algorithm") != self.algo.name or state.get("seed") != seed:
            raise ConfigError(f"{found} belongs to another run (algorithm {state.get('algorithm')!r}, seed "
                              f"{state.get('seed')!r}; this run: {self.algo.name!r}, seed {seed})")
        self.step, self.opt_step = int(state["step"]), int(state["optimizer_steps"])
        self.history = list(state["history"])
        self.stream.load_state(state["data"])
        self.algo.load_state_dict(load_algorithm_state(found))
        ranks = rng if isinstance(rng, list) else [rng]
        if len(ranks) != dist.world_size:
            raise ConfigError(f"{found} was written by {len(ranks)} rank(s); this run has {dist.world_size}")
        restore_rng(ranks[dist.rank], self.generators)
        self.resumed_from, self.last_ckpt = self.step, found

    # -- the loop's control ------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def progress_bar(self):
        if self.opts.progress and self.dist.is_main:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total_loop_steps, initial=self.step, desc=f"rl {self.algo.name}", unit="step")
        try:
            yield self.bar
        finally:
            if self.bar is not None:
                self.bar.close()

    def finished(self) -> bool:
        return self.opt_step >= self.total_opt_steps

    def interrupted(self) -> bool:
        """`stop_after` loop steps of this call are done (a simulated interruption: no final checkpoint)."""
        return self.opts.stop_after is not None and self.done_here >= self.opts.stop_after

    def start_step(self) -> _StepStats:
        stats = _StepStats(t_start=time.perf_counter())
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        return stats

    # -- rollout -----------------------------------------------------------------------------------------------------
    def unit_generator(self, kind: str, unit: int) -> torch.Generator:
        """The generator of one rollout unit: with `unit_prompts`, seeded from (seed, step, kind, the unit's index
        in the whole batch), the same whichever rank holds the unit; else this rank's persistent stream."""
        if self.opts.unit_prompts is None:
            return self.generators[kind]
        first = self.local_prompts.start // self.unit_prompts
        salt = {"rollout": 17, "algorithm": 29}[kind]
        seed = ((self.opts.seed * 7919 + salt) * 1_000_003 + self.step) * 65_537 + first + unit
        device = self.device if kind == "rollout" else torch.device("cpu")
        return torch.Generator(device=device).manual_seed(seed % 2**63)

    def rollout(self) -> list[tuple[RolloutBatch, dict[str, Any]]]:
        """This rank's share of the next `batch_prompts` prompts, `group_size` completions each, graded: one
        (batch, info) per rollout unit."""
        idx = self.stream.take(self.n_prompts)[self.local_prompts]
        units = []
        with compute_precision(self.policy, self.opts.compute_dtype), gathered_for_inference(self.policy):
            for u, start in enumerate(range(0, len(idx), self.unit_prompts)):
                units.append(rollout_batch(self.policy, self.tokenizer, self.task, self.items,
                                           idx[start:start + self.unit_prompts], self.group, self.sampler_settings,
                                           generator=self.unit_generator("rollout", u),
                                           template=self.opts.prompt_template, grader=self.opts.grader,
                                           prompt_cache=self.prompt_cache, algorithm=self.algo))
        self.policy.train()
        return units

    # -- update ------------------------------------------------------------------------------------------------------
    def update(self, stats: _StepStats, units: list[tuple[RolloutBatch, dict[str, Any]]]) -> None:
        """Per unit: advantages and the plug-in's old / ref terms (`prepare`); then up to μ optimizer steps over
        all units' micro-batches."""
        algo, optimizer, cfg = self.algo, self.optimizer, self.cfg
        advs = [algo.advantages(batch.rewards, batch.group_size) for batch, _ in units]
        stats.advantages = torch.cat(advs)
        # -- old / ref terms
        t0 = time.perf_counter()
        n_updates = min(self.mu, self.total_opt_steps - self.opt_step)
        algo.optimizer_step, algo.total_optimizer_steps = self.opt_step, self.total_opt_steps
        states = []
        # train.packing: the plug-in's forwards run packed (same numbers; plug-ins that cannot are refused at load)
        policy, ref_model = (maybe_packed(m, self.traits, algo.config.packing) for m in (self.policy, self.ref_model))
        with compute_precision(self.policy, self.opts.compute_dtype):
            for u, (batch, _) in enumerate(units):
                states.append(algo.prepare(batch, policy, ref_model,
                                           generator=self.unit_generator("algorithm", u), num_iterations=n_updates))
        _sync(self.device)  # CUDA runs asynchronously: time the work, not its launch
        stats.time_prepare_s = time.perf_counter() - t0
        # -- μ updates: gradient accumulation over micro-batches (loss scale 1 / #micro-batches), clip, AdamW, LR
        t0 = time.perf_counter()
        # without a micro_batch_size option a unit is one micro-batch (a plug-in's own rollouts may give it more
        # rows than unit_prompts x group_size)
        work = [(batch, state, adv, rows) for (batch, _), state, adv in zip(units, states, advs)
                for rows in _micro_slices(batch.num_rows, self.micro if self.opts.micro_batch_size else batch.num_rows,
                                          algo.micro_batch_block(batch))]
        for it in range(n_updates):
            optimizer.zero_grad(set_to_none=True)
            for batch, state, adv, sl in work:
                with compute_precision(self.policy, self.opts.compute_dtype):
                    stats.algo_records.append(algo.backward(policy, batch.select(sl), state.select(sl),
                                                           adv[sl], loss_scale=1.0 / len(work), iteration=it))
            all_reduce_grads(self.params, self.dist)
            max_norm = float(cfg.max_grad_norm) if cfg.max_grad_norm is not None else float("inf")
            stats.grad_norms.append(float(torch.nn.utils.clip_grad_norm_(self.params, max_norm)))
            stats.lr = optimizer.param_groups[0]["lr"]
            optimizer.step()
            self.scheduler.step()
            self.opt_step += 1
        optimizer.zero_grad(set_to_none=True)
        _sync(self.device)
        stats.time_update_s = time.perf_counter() - t0
        self.step += 1
        self.done_here += 1

    # -- metrics -----------------------------------------------------------------------------------------------------
    def record(self, stats: _StepStats, units: list[tuple[RolloutBatch, dict[str, Any]]]) -> dict[str, float]:
        """The step's metrics (over all ranks), a mid-training evaluation when due, history, sink, bar."""
        metrics = self.step_metrics(stats, units)
        if (self.opts.evaluate is not None and self.cfg.eval_every is not None
                and self.step % self.cfg.eval_every == 0 and self.opt_step < self.total_opt_steps):
            with gathered_for_inference(self.policy):  # every rank evaluates its share of the items
                metrics.update(_evaluate_now(self.opts.evaluate, self.policy, self.step))
        self.history.append(metrics)
        if self.opts.sink is not None and self.dist.is_main:
            self.opts.sink(self.step, dict(metrics))
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}", loss=f"{metrics.get('loss', 0.0):.4f}")
        return metrics

    def step_metrics(self, stats: _StepStats, units: list[tuple[RolloutBatch, dict[str, Any]]]) -> dict[str, float]:
        # rows per prompt: train.group_size, times the rows a plug-in's own rollout makes of each (a tree's leaves)
        group, adv, grad_norms = units[0][0].group_size, stats.advantages, stats.grad_norms
        rolls = [roll for _, roll in units]
        n_rows = [batch.num_rows for batch, _ in units]
        # the reward statistics over the whole batch: every rank's rewards, in rank order (exact, not a mean of
        # per-rank statistics)
        local_rewards = torch.cat([batch.rewards for batch, _ in units]).cpu().tolist()
        rewards_t = torch.tensor([r for part in gather_objects(local_rewards, self.dist) for r in part])
        correct = [c for part in gather_objects([c for roll in rolls for c in roll["correct"]], self.dist)
                   for c in part]
        grouped = rewards_t.view(-1, group)
        metrics = {
            "optimizer_step": float(self.opt_step),
            "lr": float(stats.lr),
            "grad_norm": sum(grad_norms) / len(grad_norms),
        }
        local = {  # means over this rank's rows, then over ranks (every rank holds as many rows)
            "completion_tokens": float(torch.cat([b.completion_mask.sum(dim=1).float() for b, _ in units]).mean()),
            "unfinished": _row_weighted([roll["unfinished"] for roll in rolls], n_rows),
            "advantage_abs_mean": float(adv.abs().mean()),
            "tokens_per_forward": _row_weighted([roll["output"].stats.tokens_per_forward for roll in rolls], n_rows),
            "rollout_forwards": float(sum(roll["output"].stats.forwards for roll in rolls)),
            # rows the rollout forwards decoded, and how many of them an identical row's forward served
            # (diffusion/sampling/core.py)
            "rollout_row_forwards": float(sum(roll["output"].stats.row_forwards for roll in rolls)),
            "rollout_shared_rows": float(sum(roll["output"].stats.shared_rows for roll in rolls)),
            **_mean_metrics(stats.algo_records),
            "time_rollout_s": sum(roll["time_rollout_s"] for roll in rolls),
            "time_reward_s": sum(roll["time_reward_s"] for roll in rolls),
            "time_prepare_s": stats.time_prepare_s, "time_update_s": stats.time_update_s,
        }
        metrics.update(all_reduce_metrics(local, self.dist))
        metrics.update({
            "reward_mean": float(rewards_t.mean()),
            "reward_std": float(rewards_t.std()) if rewards_t.numel() > 1 else 0.0,
            "accuracy": sum(correct) / len(correct),
            "zero_std_groups": float((grouped.std(dim=1) == 0).float().mean()) if group > 1 else 1.0,
        })
        metrics["time_step_s"] = time.perf_counter() - stats.t_start
        metrics["peak_memory_mb"] = _peak_memory_mb(self.device)
        metrics["step"] = float(self.step)
        return metrics

    # -- checkpoints and result --------------------------------------------------------------------------------------
    def periodic_checkpoint(self) -> None:
        every = self.cfg.checkpoint_every
        if every is not None and self.step % every == 0 and self.opt_step < self.total_opt_steps:
            self.last_ckpt = self.checkpoint()

    def final_checkpoint(self) -> None:
        if self.ckpt_root is not None and self.done_here > 0:
            self.last_ckpt = self.checkpoint()

    def checkpoint(self) -> Path | None:
        """Every rank's RNG to rank 0, which writes weights, optimizer, scheduler, data position and history."""
        if self.ckpt_root is None:
            return None
        rng_all = gather_objects(capture_rng(self.generators), self.dist)
        # a sharded model's full weights and optimizer state: gathered by every rank (collectives), kept by rank 0
        model_state, optimizer_state = gathered_training_state(self.policy, self.optimizer)
        path = None
        if self.dist.is_main:
            trainer_state = {"algorithm": self.algo.name, "optimizer_steps": self.opt_step,
                             "data": self.stream.state(), "history": self.history, "seed": self.opts.seed,
                             "info": _jsonable(self.info)}
            path = save_checkpoint(self.ckpt_root, self.step, model=self.policy, optimizer=self.optimizer,
                                   scheduler=self.scheduler, trainer_state=trainer_state, rng=rng_all,
                                   keep_last=self.opts.keep_last, model_state=model_state,
                                   optimizer_state=optimizer_state, algorithm_state=self.algo.state_dict())
        barrier(self.dist)
        return path or checkpoint_path_for(self.ckpt_root, self.step)

    def result(self) -> TrainResult:
        return TrainResult(self.step, self.opt_step, self.history, self.last_ckpt, self.policy, self.resumed_from,
                           self.info)


def _evaluate_now(evaluate, policy, step: int) -> dict[str, float]:
    """Mid-training evaluation that leaves training exactly as it was (mode, global RNG, no autograd graph)."""
    was_training = policy.training
    policy.eval()
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            out = evaluate(policy, step)
    finally:
        policy.train(was_training)
    return {f"eval_{k}": float(v) for k, v in out.items()}


def checkpoint_path_for(root: Path, step: int) -> Path:
    from dare_bench.trainers.checkpoint import checkpoint_path

    return checkpoint_path(root, step)


def _split_trajectory(traj, n: int):
    """The sampler's batch `Trajectory` as one `Trajectory` per row (tensors with a batch axis sliced to [1, ...]),
    so that `RolloutBatch.select` keeps rows and trajectories aligned; None when none was recorded. A list (block
    diffusion of a left-padded batch: one per row already) is kept as it is."""
    if traj is None:
        return None
    if isinstance(traj, list):
        if len(traj) != n:
            raise DataError(f"the sampler recorded {len(traj)} row trajectories for {n} rows")
        return list(traj)

    def cut(v, r):
        if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == n:
            return v[r:r + 1]
        if isinstance(v, dict):
            return {k: cut(x, r) for k, x in v.items()}
        return v

    rows = []
    for r in range(n):
        steps = [dataclasses.replace(s, **{f.name: cut(getattr(s, f.name), r) for f in dataclasses.fields(s)})
                 for s in traj.steps]
        other = {f.name: cut(getattr(traj, f.name), r) for f in dataclasses.fields(traj) if f.name != "steps"}
        rows.append(dataclasses.replace(traj, steps=steps, **other))
    return rows


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return repr(obj)


__all__ = ["AdapterDisabled", "MetricsSink", "PromptStream", "RLRecipe", "RLRunOptions", "TIMING_KEYS", "TrainResult",
           "algorithm_settings", "build_scheduler", "completion_mask", "load_train_items", "rollout_batch",
           "rollout_settings", "train_rl"]
