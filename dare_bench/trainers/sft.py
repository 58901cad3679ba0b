"""Supervised fine-tuning of diffusion LMs: completion-only masked-diffusion SFT (LLaDA, Dream) and block-diffusion
SFT over the `[noisy; clean]` concatenation (SDAR, LLaDA2), optionally with LoRA adapters (peft).

    from dare_bench.trainers.sft import SFTConfig, SFTRunOptions, sft_batch_loss, train_sft
    result = train_sft(model, examples, SFTConfig(steps=300, lr=1e-3, batch_size=64), SFTRunOptions(sink=print))
    # paper-style: 3 epochs, cosine schedule, resumable checkpoints
    train_sft(model, examples, SFTConfig(steps=None, epochs=3, lr=1e-5, lr_schedule="cosine", order="epochs"),
              SFTRunOptions(checkpoint_dir="run/checkpoints", checkpoint_every=100, resume=True))
    loss = sft_batch_loss(model, examples[:16], SFTConfig(), torch.Generator().manual_seed(0))  # one step's loss

CPU: runs as is on the tiny presets. One GPU: move the model to `cuda` first. torchrun: `train_sft` joins the
process group itself (`trainers/distributed.py`): every rank draws the same global batch and its noise, computes the
loss on its contiguous share, gradients are averaged before clipping, rank 0 calls the sink and writes checkpoints.
    torchrun --nproc_per_node 8 -m dare_bench.cli reproduce sft-llada-sudoku --scale paper \
        --checkpoint /ckpt/LLaDA-8B-Instruct --device cuda
    CPU check of the two-rank path (gloo): pytest -m slow tests/trainers/test_supervised_parallel.py

Losses (algorithms.md §2.1 / §2.2):
- MDLM: t ~ U(0,1), p = (1-eps)t + eps; every answer token (EOS padding included, as LLaDA trains) is masked with
  probability p, the prompt never; loss = Σ_masked CE / p / answer_length per example, averaged over the batch
  (LLaDA GUIDELINES). Dream's shifted logits are aligned through the backbone's `logit_shift` trait.
- BDLM: one t per example (SDAR `forward_add_noise_packed`), at least one answer token forced masked; the model sees
  `[x_t; x_0]` with the BD3 mask and the loss is the same 1/p-weighted CE on the noisy copy, divided by the number of
  answer tokens (SDAR's objective).

Packing (`train.packing`, `SFTConfig.packing`): each example is trained at its own length (`collate_own_length`:
prompt + answer + its EOS, the padding after it hidden and unscored, as SDAR / LLaDA2's official SFT; not LLaDA's
EOS padding to the batch maximum, which is data and cannot be packed away) and the forward runs packed
(`diffusion/packing.py`), equal to the same objective computed padded (tests/diffusion/test_packing.py).

The run machinery (`SupervisedRun`: AdamW + the shared LR schedules of `loop.build_scheduler`, epochs → steps, data
order, data parallelism, checkpoints and `--resume`) is shared with the preference trainer (`preference.py`).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import torch
import torch.nn.functional as F

from dare_bench.errors import CheckpointError, ConfigError
from dare_bench.models.base import shift_logits
from dare_bench.trainers.checkpoint import (
    capture_rng,
    checkpoint_path,
    latest_checkpoint,
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
    gathered_training_state,
    init_distributed,
    shard_model,
    shard_rows,
)
from dare_bench.trainers.loop import PromptStream, build_scheduler
from dare_bench.trainers.precision import compute_precision, master_weights

DataOrder = Literal["with_replacement", "epochs"]


@dataclass
class LoraSettings:
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: Sequence[str] | None = None  # None: every nn.Linear except the LM head / embeddings


def run_length(steps: int | None, epochs: float | None, n_items: int, global_batch: int) -> int:
    """Optimizer steps of a run: `steps` when set, else ceil(epochs × ceil(items / global batch)) (the RL loop's
    rule for `train.epochs`)."""
    if steps is not None:
        return int(steps)
    if epochs is None:
        raise ConfigError("set steps or epochs (the run's length)")
    return math.ceil(float(epochs) * math.ceil(n_items / global_batch))


@dataclass
class SFTConfig:
    """The SFT recipe. `batch_size` is global (all ranks). `lr_schedule`: None = the tiny-base recipe (the lr ramps
    as (step+1)/warmup_steps, then stays: what the cached tiny bases were trained with), or a `train.lr_schedule`
    name for `loop.build_scheduler` (HF shapes, shared with the RL loop). `grad_clip`: max grad norm, None = no
    clipping. `order`: "with_replacement" draws each batch at random from the examples (the tiny bases),
    "epochs" walks seeded shuffled passes over them (the loop's `PromptStream`)."""

    steps: int | None = 300  # None: `epochs` passes over the examples (run_length)
    lr: float = 1e-3
    batch_size: int = 64
    warmup_steps: int = 50
    weight_decay: float = 0.01
    grad_clip: float | None = 1.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-3  # LLaDA's minimum mask rate
    seed: int = 0
    log_every: int = 10
    epochs: float | None = None
    lr_schedule: str | None = None
    order: DataOrder = "with_replacement"
    lm_head_chunk_tokens: int | None = None  # None: materialised logits; N: the chunked LM head (train.* field)
    # train.packing: each example at its own length (`collate_own_length`), the forward packed (diffusion/packing.py)
    packing: bool = False
    # CAP (the `cap` algorithm): lambda of L_SFT + lambda * L_conf (`confidence_loss`); 0 = plain SFT
    confidence_beta: float = 0.0

    def __post_init__(self):
        _check_recipe(self, self.batch_size, "SFT")
        if self.confidence_beta < 0:
            raise ConfigError(f"SFT confidence_beta must be >= 0, got {self.confidence_beta}")
        if self.confidence_beta > 0 and self.lm_head_chunk_tokens is not None:
            raise ConfigError("CAP's confidence loss needs each masked token's whole distribution (its argmax and "
                              "entropy); the chunked LM head (train.lm_head_chunk_tokens) scores the target only: "
                              "set train.lm_head_chunk_tokens=null")


def _check_recipe(cfg, batch: int, what: str) -> None:
    if (cfg.steps is not None and cfg.steps < 0) or batch < 1 or cfg.lr <= 0:
        raise ConfigError(f"invalid {what} settings: steps={cfg.steps}, batch={batch}, lr={cfg.lr}")
    if cfg.steps is None and (cfg.epochs is None or cfg.epochs <= 0):
        raise ConfigError(f"{what} needs steps or epochs > 0, got steps=None, epochs={cfg.epochs}")
    if cfg.grad_clip is not None and cfg.grad_clip <= 0:
        raise ConfigError(f"{what} grad_clip must be > 0 or None (no clipping), got {cfg.grad_clip}")
    if cfg.order not in ("with_replacement", "epochs"):
        raise ConfigError(f"{what} order must be 'with_replacement' or 'epochs', got {cfg.order!r}")


@dataclass
class SFTExample:
    prompt_ids: list[int]
    answer_ids: list[int]  # includes the final EOS


@dataclass
class SFTResult:
    """`losses`: every step's loss (mean over the global batch), a resumed run's earlier steps included;
    `logged`: the (step, metrics) handed to the sink, earlier ones included; `resumed_from`: the step of the
    checkpoint this call continued from (its earlier `logged` entries were sunk by the interrupted call)."""

    steps: int
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0
    logged: list[tuple[int, dict]] = field(default_factory=list)
    resumed_from: int | None = None
    checkpoint: Path | None = None


def collate(examples: Sequence[SFTExample], eos_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row is `prompt + answer`, padded on the right with EOS (LLaDA trains on EOS padding so
    the model learns to stop). Returns input_ids [B, L], prompt_lengths [B], answer_lengths [B] (EOS padding
    counted)."""
    length = max(len(e.prompt_ids) + len(e.answer_ids) for e in examples)
    rows, plen, alen = [], [], []
    for e in examples:
        ids = list(e.prompt_ids) + list(e.answer_ids)
        rows.append(ids + [eos_id] * (length - len(ids)))
        plen.append(len(e.prompt_ids))
        alen.append(length - len(e.prompt_ids))
    return torch.tensor(rows), torch.tensor(plen), torch.tensor(alen)


def collate_own_length(examples: Sequence[SFTExample], pad_id: int):
    """`train.packing`'s rows: each example is `prompt + answer` at its own length (no EOS padding to the batch
    maximum: SDAR / LLaDA2's official SFT, whose padding has attention mask 0), right-padded with `pad_id`, which
    no token sees and no loss scores. Returns input_ids [B, L], prompt_lengths [B], answer_lengths [B] (the
    example's own), lengths [B] (prompt + answer)."""
    length = max(len(e.prompt_ids) + len(e.answer_ids) for e in examples)
    rows = [list(e.prompt_ids) + list(e.answer_ids) for e in examples]
    lengths = [len(r) for r in rows]
    return (torch.tensor([r + [pad_id] * (length - len(r)) for r in rows]),
            torch.tensor([len(e.prompt_ids) for e in examples]), torch.tensor([len(e.answer_ids) for e in examples]),
            torch.tensor(lengths))


def _answer_positions(input_ids: torch.Tensor, prompt_lengths: torch.Tensor,
                      lengths: torch.Tensor | None = None) -> torch.Tensor:
    pos = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
    answer = pos >= prompt_lengths.to(input_ids.device)[:, None]
    return answer if lengths is None else answer & (pos < lengths.to(input_ids.device)[:, None])


def draw_sft_noise(input_ids: torch.Tensor, prompt_lengths: torch.Tensor, mask_id: int, generator: torch.Generator,
                   eps: float = 1e-3, force_one: bool = True, lengths: torch.Tensor | None = None,
                   mask_all: bool = False):
    """One t per example; answer tokens masked with p = (1-eps)t + eps; prompt never (nor, with `lengths`, the
    padding after each example). `mask_all`: every answer token masked, p = 1, nothing drawn (block size 1, where
    that is the next-token loss itself: `next_token_objective`). Returns (noisy, masked, p)."""
    b, l = input_ids.shape
    answer = _answer_positions(input_ids, prompt_lengths, lengths)
    if mask_all:
        return (torch.where(answer, torch.full_like(input_ids, mask_id), input_ids), answer,
                torch.ones(b, dtype=torch.float32))
    t = torch.rand(b, generator=generator)
    p = (1 - eps) * t + eps
    masked = (torch.rand(b, l, generator=generator) < p[:, None]) & answer
    if force_one:
        # Guarantee a finite, non-empty loss per example (SDAR forces one masked token the same way).
        none = ~masked.any(dim=1) & answer.any(dim=1)
        for row in none.nonzero().flatten().tolist():
            cand = answer[row].nonzero().flatten()
            pick = cand[torch.randint(len(cand), (1,), generator=generator)]
            masked[row, pick] = True
    noisy = torch.where(masked, torch.full_like(input_ids, mask_id), input_ids)
    return noisy, masked, p


def next_token_objective(traits) -> bool:
    """Block size 1: in the BD3 `[x_t ; x_0]` layout a masked token then sees itself (the mask) and the clean copy of
    the tokens before it, so its cross-entropy is the AR next-token loss, whatever else is masked; the 1/p-weighted
    random masking is an unbiased but noisy estimate of their sum. There every answer token is masked (p = 1): the
    next-token loss exactly (the AR replica `tiny-llada2-ar`, a WSD stage at block size 1)."""
    return bool(traits.is_block_diffusion and traits.block_size == 1)


def confidence_loss(logits: torch.Tensor, targets: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """CAP's L_conf (LLaDA2.0; dFactory `compute_confidence_loss`): the mean, over the scored positions whose argmax
    is the target, of the entropy -sum_v p_v log p_v of softmax(logits); 0 when no scored position is correct.
    logits `[..., V]`, targets and scored (bool) `[...]`."""
    correct = scored & (logits.argmax(dim=-1) == targets)
    if not bool(correct.any()):
        return logits.sum() * 0.0  # keeps the graph (every rank calls backward on the same structure)
    logp = F.log_softmax(logits[correct].float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1).mean()


def sft_loss(model, input_ids: torch.Tensor, prompt_lengths: torch.Tensor, answer_lengths: torch.Tensor,
             generator: torch.Generator, eps: float = 1e-3, *, rows: slice | None = None,
             head_chunk_tokens: int | None = None, lengths: torch.Tensor | None = None,
             packing: bool = False, confidence_beta: float = 0.0, capacity: int | None = None,
             single_copy: bool = False) -> torch.Tensor:
    """Completion-only diffusion SFT loss for any backbone (the pattern comes from the traits), averaged over `rows`
    of the batch (default all). The noise is drawn for every row first, so a row's masks do not depend on which
    rows this process computes (data parallelism: 1 process == N processes). `head_chunk_tokens`: only the masked
    tokens' hidden states go through the LM head, that many at a time (`models.lm_head`), no `[B, L, V]` logits.
    `lengths` (`collate_own_length`): each row is real up to its length; the padding after it is hidden from every
    token and never masked or scored. `packing`: the forward runs packed (`diffusion.packing`), same numbers;
    `capacity`: tokens per packed row (default the longest row; WSD: its `seq_len` rows).
    `confidence_beta` > 0: CAP, + beta x `confidence_loss` over the masked tokens of these rows.
    `single_copy` (block diffusion, WSD's full-sequence stage): the noisy copy alone under the model's own pattern
    instead of the BD3 layout; equal to it when the block covers every row (tests/trainers/test_wsd.py).
    At block size 1 every answer token is masked (`next_token_objective`)."""
    traits = model.traits if hasattr(model, "traits") else model.get_base_model().traits
    device = next(model.parameters()).device
    noisy, masked, p = draw_sft_noise(input_ids, prompt_lengths, traits.mask_token_id, generator, eps,
                                      lengths=lengths, mask_all=next_token_objective(traits))
    if rows is not None:
        noisy, masked, p, input_ids, answer_lengths = (x[rows] for x in (noisy, masked, p, input_ids, answer_lengths))
        lengths = None if lengths is None else lengths[rows]
    noisy, masked, p, clean = noisy.to(device), masked.to(device), p.to(device), input_ids.to(device)
    attn = None
    if lengths is not None:
        attn = (torch.arange(clean.shape[1], device=device)[None] < lengths.to(device)[:, None]).long()
    if packing:
        from dare_bench.diffusion.packing import PackedModel

        # the BD3 layout holds two copies of each row: a row of `capacity` tokens packs into 2 x capacity
        bd3 = traits.is_block_diffusion and not single_copy
        model = PackedModel(model, traits, capacity=None if capacity is None else capacity * (2 if bd3 else 1))
    if head_chunk_tokens is not None:
        if confidence_beta > 0:
            raise ConfigError("CAP's confidence loss needs the materialised logits (lm_head_chunk_tokens unset)")
        ce = -_masked_logprobs(model, traits, noisy, clean, masked, head_chunk_tokens, attn, single_copy)
        per_example = (ce / p[:, None]).sum(dim=1) / answer_lengths.to(device).clamp(min=1)
        return per_example.mean()
    if traits.is_block_diffusion and not single_copy:
        from dare_bench.models.block import training_forward

        logits = training_forward(model, noisy, clean, attention_mask=attn)
    else:
        logits = shift_logits(model(noisy, attention_mask=attn), traits.logit_shift)
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), clean.reshape(-1), reduction="none")
    ce = ce.view(clean.shape) * masked / p[:, None]
    per_example = ce.sum(dim=1) / answer_lengths.to(device).clamp(min=1)
    if confidence_beta > 0:
        return per_example.mean() + confidence_beta * confidence_loss(logits, clean, masked)
    return per_example.mean()


def sft_batch_loss(model, examples: Sequence[SFTExample], cfg: SFTConfig, generator: torch.Generator, *,
                   rows: slice | None = None) -> torch.Tensor:
    """The SFT trainer's loss on one batch of `examples` (in this order): collated as `cfg` says (EOS-padded to the
    longest, or each at its own length with `cfg.packing`), its noise drawn from `generator`, averaged over `rows`
    (default all). What every step of `train_sft` computes, and what the gradient snapshots (check/gradients.py)
    pin."""
    traits = model.traits if hasattr(model, "traits") else model.get_base_model().traits
    lengths = None
    if cfg.packing:  # each example at its own length, packed
        ids, plen, alen, lengths = collate_own_length(examples, traits.pad_token_id)
    else:
        ids, plen, alen = collate(examples, traits.eos_token_id)
    return sft_loss(model, ids, plen, alen, generator, cfg.eps, rows=rows, head_chunk_tokens=cfg.lm_head_chunk_tokens,
                    lengths=lengths, packing=cfg.packing, confidence_beta=cfg.confidence_beta)


def _masked_logprobs(model, traits, noisy, clean, masked, chunk: int, attn=None,
                     single_copy: bool = False) -> torch.Tensor:
    """log p(clean | noisy) `[B, L]` at the masked positions (0 elsewhere) through the chunked LM head: the same
    forward as the materialised path (BD3 layout for block diffusion unless `single_copy`, Dream's shift)."""
    from dare_bench.models.lm_head import chunked_token_logprobs

    if traits.is_block_diffusion and not single_copy:
        from dare_bench.models.block import training_forward

        out = training_forward(model, noisy, clean, attention_mask=attn, return_hidden=True)
        states = out.states
    else:
        out = model(noisy, attention_mask=attn, return_hidden=True)
        states = shift_logits(out.states, traits.logit_shift)
    rows, cols = masked.nonzero(as_tuple=True)
    lp = chunked_token_logprobs(states[rows, cols], out.head, clean[rows, cols], chunk_tokens=chunk)
    return torch.zeros(masked.shape, dtype=lp.dtype, device=lp.device).index_put((rows, cols), lp)


def warmup_constant_lambda(warmup_steps: int) -> Callable[[int], float]:
    """The tiny-base schedule (`SFTConfig.lr_schedule=None`): (step+1)/warmup, then 1. Kept apart from the HF
    shapes of `loop.build_scheduler` (which start at 0) so that the cached tiny bases keep their weights."""
    return lambda step: min(1.0, (step + 1) / max(1, warmup_steps))


# LR schedules whose rate at a step does not depend on the run's length (`warmup_constant_lambda` when None): a run
# that continues a shorter run's trajectory (`TrainRunOptions.continue_from`) follows the same rates.
LENGTH_FREE_SCHEDULES = (None, "constant", "constant_with_warmup")


@dataclass
class TrainRunOptions:
    """What is specific to one SFT / preference call (the recipe is the *Config): `sink(step, metrics)` every
    `cfg.log_every` steps and at the last (0-based steps; rank 0 only), a tqdm bar, `compute_dtype` (None /
    "float32": all fp32; "bfloat16": fp32 master weights, forwards under bf16 autocast), `dist` (default: joined from
    the torchrun environment). Checkpoints: every `checkpoint_every` steps and at the end into `checkpoint_dir`
    (rank 0 writes); with `resume`, continue from the latest complete checkpoint there if one exists; `stop_after`:
    stop (without a final checkpoint) after this many steps of this call, as an interruption would (tests).
    `after_step(step)`: called after each optimizer step with the number of steps done (the base calibration scan
    and the base's validation-target rule evaluate there; it must leave the model's weights and the run's random
    streams as it found them). A true return value stops the training there (the target rule's chosen step).
    `continue_from`: a checkpoint of an earlier stretch of this same trajectory, written by another run with this
    recipe, seed and start that stopped sooner (a smaller compute budget): this run continues from it as `resume`
    would, so it ends where training from step 0 would end, bit for bit. Only a length-free LR schedule allows it
    (`LENGTH_FREE_SCHEDULES`: the two runs' lengths differ); `resume` of the run's own checkpoint comes first."""

    sink: Callable[[int, dict], Any] | None = None
    progress: bool = False
    compute_dtype: str | None = None
    dist: DistInfo | None = None
    checkpoint_dir: str | Path | None = None
    checkpoint_every: int | None = None
    resume: bool = False
    stop_after: int | None = None
    after_step: Callable[[int], Any] | None = None
    continue_from: str | Path | None = None

    def __post_init__(self):
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            raise ConfigError(f"checkpoint_every must be >= 1, got {self.checkpoint_every}")
        if self.checkpoint_every is not None and self.checkpoint_dir is None:
            raise ConfigError("checkpoint_every needs a checkpoint_dir")


@dataclass
class SFTRunOptions(TrainRunOptions):
    """`TrainRunOptions` of `train_sft`."""


class SupervisedRun:
    """Setup and one optimizer step of an SFT / preference run, over shared state; `run_steps` drives it.

    setup: process group → run length (steps / epochs) → this rank's rows → AdamW (lr, betas, weight decay) and the
    LR schedule → the seeded generator (same seed on every rank: it draws the global batch, then its noise) and the
    data order. Per step: `draw` (global batch) → `loss` on this rank's share (subclass) → backward → gradient
    all-reduce → clip → step. Resume / checkpoints: weights, optimizer, scheduler, data position, RNG, losses."""

    kind = ""  # "sft" / "vrpo": names the run in checkpoints and the progress bar

    def __init__(self, model, cfg, opts: TrainRunOptions, n_items: int, global_batch: int):
        self.cfg, self.opts = cfg, opts
        self.dist = opts.dist or init_distributed()  # a no-op outside torchrun
        # under torchrun: FSDP2 shards, in place (the caller's model object is the sharded one); no-op in one process
        self.model = model = shard_model(model, self.dist, opts.compute_dtype)
        self.n_items, self.global_batch = n_items, global_batch
        self.total = run_length(cfg.steps, cfg.epochs, n_items, global_batch)
        self.local = shard_rows(global_batch, self.dist)
        self.traits = model.traits if hasattr(model, "traits") else model.get_base_model().traits
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ConfigError(f"{self.kind}: the model has no trainable parameters")
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, betas=tuple(cfg.betas),
                                           weight_decay=cfg.weight_decay)
        if cfg.lr_schedule is None:
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer,
                                                               warmup_constant_lambda(cfg.warmup_steps))
        else:
            self.scheduler = build_scheduler(self.optimizer, cfg.lr_schedule, cfg.warmup_steps, self.total)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.generators = {"data": self.gen}
        self.stream = PromptStream(n_items, cfg.seed) if cfg.order == "epochs" else None
        self.step = self.done_here = 0
        self.losses: list[float] = []
        self.logged: list[tuple[int, dict]] = []
        self.resumed_from: int | None = None
        self.ckpt_root = Path(opts.checkpoint_dir) if opts.checkpoint_dir is not None else None
        self.last_ckpt: Path | None = None

    # -- data ------------------------------------------------------------------------------------------------------
    def draw_indices(self) -> list[int]:
        """The next global batch's item indices, the same on every rank."""
        if self.stream is not None:
            return self.stream.take(self.global_batch)
        return torch.randint(self.n_items, (self.global_batch,), generator=self.gen).tolist()

    # -- one step --------------------------------------------------------------------------------------------------
    def loss(self, items) -> tuple[torch.Tensor, dict[str, float]]:
        """(loss on this rank's share of the global batch of `items`, metrics of that share); the subclass's."""
        raise NotImplementedError

    def optimizer_step(self, items) -> dict[str, float]:
        lr = self.optimizer.param_groups[0]["lr"]  # the rate this step uses
        with compute_precision(self.model, self.opts.compute_dtype):
            loss, metrics = self.loss(items)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        all_reduce_grads(self.params, self.dist)  # before clipping: every rank clips the same averaged gradient
        max_norm = float(self.cfg.grad_clip) if self.cfg.grad_clip is not None else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        self.done_here += 1
        metrics = dict(metrics, loss=float(loss.detach()), grad_norm=float(grad_norm), lr=float(lr))
        return all_reduce_metrics(metrics, self.dist)

    def record(self, metrics: dict[str, float]) -> None:
        """The step's loss; the sink (rank 0) every `log_every` steps and at the last (0-based step numbers)."""
        self.losses.append(metrics["loss"])
        step = self.step - 1
        if step % self.cfg.log_every == 0 or step == self.total - 1:
            self.logged.append((step, dict(metrics)))
            if self.opts.sink is not None and self.dist.is_main:
                self.opts.sink(step, dict(metrics))

    # -- checkpoints -----------------------------------------------------------------------------------------------
    def _identity(self) -> dict[str, Any]:
        return {"trainer": self.kind, "seed": self.cfg.seed, "total_steps": self.total,
                "global_batch": self.global_batch, "items": self.n_items}

    def resume(self) -> None:
        """With `resume`: weights, optimizer, scheduler, data position, RNG and losses of the latest checkpoint;
        else with `continue_from`: those of that earlier stretch of the same trajectory."""
        found = latest_checkpoint(self.ckpt_root) if self.opts.resume and self.ckpt_root is not None else None
        mine, length_free = self._identity(), False
        if found is None and self.opts.continue_from is not None:
            if self.cfg.lr_schedule not in LENGTH_FREE_SCHEDULES:
                raise ConfigError(f"continuing another run's trajectory needs an LR schedule that does not read the "
                                  f"run length ({', '.join(map(str, LENGTH_FREE_SCHEDULES))}); this run has "
                                  f"{self.cfg.lr_schedule!r}")
            found, length_free = Path(self.opts.continue_from), True
        if found is None:
            return
        try:
            state, rng = load_checkpoint(found, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler)
        except CheckpointError as exc:
            if not length_free:
                raise
            # a kept stretch is a cache of another run's end: say that deleting it is safe
            raise CheckpointError(f"{exc}; it is a kept stretch of this run's trajectory, a cache: delete {found} "
                                  "and rerun to train without it") from None
        if length_free:  # the earlier stretch stopped sooner; nothing it computed depended on its length
            mine.pop("total_steps")
        theirs = {k: state.get(k) for k in mine}
        if theirs != mine:
            raise ConfigError(f"{found} belongs to another run ({theirs}; this run: {mine})")
        if length_free and int(state["step"]) >= self.total:
            raise ConfigError(f"{found} is at step {state['step']}, not before this run's last ({self.total})")
        ranks = rng if isinstance(rng, list) else [rng]
        if len(ranks) != self.dist.world_size:
            raise ConfigError(f"{found} was written by {len(ranks)} rank(s); this run has {self.dist.world_size}")
        restore_rng(ranks[self.dist.rank], self.generators)
        if self.stream is not None:
            self.stream.load_state(state["data"])
        self.step = int(state["step"])
        self.losses = [float(x) for x in state["losses"]]
        self.logged = [(int(s), dict(m)) for s, m in state["logged"]]
        self.resumed_from, self.last_ckpt = self.step, found

    def checkpoint(self) -> None:
        """Every rank's RNG to rank 0, which writes weights, optimizer, scheduler, data position and losses."""
        rng_all = gather_objects(capture_rng(self.generators), self.dist)
        # a sharded model's full weights and optimizer state: gathered by every rank (collectives), kept by rank 0
        model_state, optimizer_state = gathered_training_state(self.model, self.optimizer)
        if self.dist.is_main:
            state = dict(self._identity(), losses=self.losses, logged=[[s, m] for s, m in self.logged],
                         data=self.stream.state() if self.stream is not None else None)
            save_checkpoint(self.ckpt_root, self.step, model=self.model, optimizer=self.optimizer,
                            scheduler=self.scheduler, trainer_state=state, rng=rng_all, model_state=model_state,
                            optimizer_state=optimizer_state)
        barrier(self.dist)
        self.last_ckpt = checkpoint_path(self.ckpt_root, self.step)

    def checkpoint_due(self) -> bool:
        """A checkpoint after this step besides the periodic ones (WSD: every stage boundary); none by default."""
        return False

    def run_steps(self, items) -> None:
        """resume → steps (each: optimizer step, record, periodic checkpoint) → final checkpoint; `stop_after`
        returns early without one, as an interruption would."""
        self.resume()
        every = self.opts.checkpoint_every
        with _progress(self, self.opts.progress) as bar:
            while self.step < self.total:
                if self.opts.stop_after is not None and self.done_here >= self.opts.stop_after:
                    return
                self.record(self.optimizer_step(items))
                if bar is not None:
                    bar.update(1)
                if self.opts.after_step is not None and self.opts.after_step(self.step):
                    break  # the caller's stopping rule (the tiny base's validation target) chose this step
                if self.step < self.total and (every is not None and self.step % every == 0
                                               or self.checkpoint_due()):
                    self.checkpoint()
        if self.ckpt_root is not None and self.done_here > 0:
            self.checkpoint()


@contextlib.contextmanager
def _progress(run: SupervisedRun, progress: bool):
    """A tqdm bar on rank 0 when asked (shared by the SFT and preference trainers)."""
    if not (progress and run.dist.is_main):
        yield None
        return
    from tqdm.auto import tqdm

    bar = tqdm(total=run.total, initial=run.step, desc=run.kind, unit="step")
    try:
        yield bar
    finally:
        bar.close()


class _SFTRun(SupervisedRun):
    """SFT's step: the global batch (indices, then its noise, from the shared generator), the loss on this rank's
    rows of it."""

    kind = "sft"

    def loss(self, examples):
        picked = [examples[i] for i in self.draw_indices()]
        return sft_batch_loss(self.model, picked, self.cfg, self.gen, rows=self.local), {}


def train_sft(model, examples: Sequence[SFTExample], cfg: SFTConfig,
              options: SFTRunOptions | None = None) -> SFTResult:
    """Train `model` in place for `run_length(cfg.steps, cfg.epochs, ...)` steps on batches drawn (seeded) from
    `examples`; see `SupervisedRun` for the stages."""
    opts = options or SFTRunOptions()
    if not examples:
        raise ConfigError("SFT needs at least one example")
    start = time.perf_counter()
    model = master_weights(model) if opts.compute_dtype else model
    run = _SFTRun(model, cfg, opts, len(examples), cfg.batch_size)
    model.train()
    run.run_steps(examples)
    model.eval()
    return SFTResult(steps=run.step, losses=run.losses, seconds=time.perf_counter() - start, logged=run.logged,
                     resumed_from=run.resumed_from, checkpoint=run.last_ckpt)
