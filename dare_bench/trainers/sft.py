"""Supervised fine-tuning of diffusion LMs: completion-only masked-diffusion SFT (LLaDA, Dream) and block-diffusion
SFT over the `[noisy; clean]` concatenation (SDAR, LLaDA2), optionally with LoRA adapters (peft).

    from dare_bench.trainers.sft import SFTConfig, SFTRunOptions, train_sft
    result = train_sft(model, examples, SFTConfig(steps=300, lr=1e-3, batch_size=64), SFTRunOptions(sink=print))

CPU: runs as is on the tiny presets. One GPU: move the model to `cuda` first. torchrun: not wired here (the paper-scale
launcher in `trainers/distributed.py` wraps the same function).

Losses (algorithms.md §2.1 / §2.2):
- MDLM: t ~ U(0,1), p = (1-eps)t + eps; every answer token (EOS padding included, as LLaDA trains) is masked with
  probability p, the prompt never; loss = Σ_masked CE / p / answer_length per example, averaged over the batch
  (LLaDA GUIDELINES). Dream's shifted logits are aligned through the backbone's `logit_shift` trait.
- BDLM: one t per example (SDAR `forward_add_noise_packed`), at least one answer token forced masked; the model sees
  `[x_t; x_0]` with the BD3 mask and the loss is the same 1/p-weighted CE on the noisy copy, divided by the number of
  answer tokens (SDAR's objective).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from dare_bench.errors import ConfigError
from dare_bench.models.base import shift_logits
from dare_bench.trainers.precision import compute_precision, master_weights


@dataclass
class LoraSettings:
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: Sequence[str] | None = None  # None: every nn.Linear except the LM head / embeddings


@dataclass
class SFTConfig:
    steps: int = 300
    lr: float = 1e-3
    batch_size: int = 64
    warmup_steps: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-3  # LLaDA's minimum mask rate
    seed: int = 0
    log_every: int = 10

    def __post_init__(self):
        if self.steps < 0 or self.batch_size < 1 or self.lr <= 0:
            raise ConfigError(f"invalid SFT settings: steps={self.steps}, batch_size={self.batch_size}, lr={self.lr}")


@dataclass
class SFTExample:
    prompt_ids: list[int]
    answer_ids: list[int]  # includes the final EOS


@dataclass
class SFTResult:
    steps: int
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0


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


def _answer_positions(input_ids: torch.Tensor, prompt_lengths: torch.Tensor) -> torch.Tensor:
    pos = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
    return pos >= prompt_lengths.to(input_ids.device)[:, None]


def draw_sft_noise(input_ids: torch.Tensor, prompt_lengths: torch.Tensor, mask_id: int, generator: torch.Generator,
                   eps: float = 1e-3, force_one: bool = True):
    """One t per example; answer tokens masked with p = (1-eps)t + eps; prompt never. Returns (noisy, masked, p)."""
    b, l = input_ids.shape
    answer = _answer_positions(input_ids, prompt_lengths)
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


def sft_loss(model, input_ids: torch.Tensor, prompt_lengths: torch.Tensor, answer_lengths: torch.Tensor,
             generator: torch.Generator, eps: float = 1e-3) -> torch.Tensor:
    """Completion-only diffusion SFT loss for any backbone (the pattern comes from the traits)."""
    traits = model.traits if hasattr(model, "traits") else model.get_base_model().traits
    device = next(model.parameters()).device
    noisy, masked, p = draw_sft_noise(input_ids, prompt_lengths, traits.mask_token_id, generator, eps)
    noisy, masked, p, clean = noisy.to(device), masked.to(device), p.to(device), input_ids.to(device)
    if traits.is_block_diffusion:
        from dare_bench.models.block import training_forward

        logits = training_forward(model, noisy, clean)
    else:
        logits = shift_logits(model(noisy), traits.logit_shift)
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), clean.reshape(-1), reduction="none")
    ce = ce.view(clean.shape) * masked / p[:, None]
    per_example = ce.sum(dim=1) / answer_lengths.to(device).clamp(min=1)
    return per_example.mean()


def warmup_constant_lambda(warmup_steps: int) -> Callable[[int], float]:
    return lambda step: min(1.0, (step + 1) / max(1, warmup_steps))


def cosine_lambda(warmup_steps: int, total: int) -> Callable[[int], float]:
    def f(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / max(1, warmup_steps)
        progress = (step - warmup_steps) / max(1, total - warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return f


@dataclass
class SFTRunOptions:
    """What is specific to one `train_sft` call (the recipe is `SFTConfig`): `sink(step, metrics)` every
    `cfg.log_every` steps and at the last (0-based steps), `checkpoint_cb(steps_done)` after every step, a tqdm bar."""

    sink: Callable[[int, dict], Any] | None = None
    checkpoint_cb: Callable[[int], Any] | None = None
    progress: bool = False
    # None / "float32": everything in fp32. "bfloat16": fp32 master weights, forwards under bf16 autocast.
    compute_dtype: str | None = None


def train_sft(model, examples: Sequence[SFTExample], cfg: SFTConfig,
              options: SFTRunOptions | None = None) -> SFTResult:
    """Train `model` in place for `cfg.steps` steps on batches drawn (seeded) from `examples`.

    Stages: setup (seeded generator, AdamW, warmup LR) → per step: draw a batch → loss / backward / clip / step →
    log (sink, checkpoint callback) → eval mode and the result."""
    opts = options or SFTRunOptions()
    if not examples:
        raise ConfigError("SFT needs at least one example")
    run = _SFTRun(master_weights(model) if opts.compute_dtype else model, cfg, opts.compute_dtype)
    result = SFTResult(steps=cfg.steps)
    start = time.perf_counter()
    for step in _steps(cfg.steps, "sft", opts.progress):
        ids, plen, alen = run.draw_batch(examples)
        loss, grad_norm = run.optimizer_step(ids, plen, alen)
        result.losses.append(float(loss.detach()))
        _log(opts, cfg, step, {"loss": float(loss.detach()), "grad_norm": float(grad_norm),
                               "lr": run.scheduler.get_last_lr()[0]})
        if opts.checkpoint_cb is not None:
            opts.checkpoint_cb(step + 1)
    model.eval()
    result.seconds = time.perf_counter() - start
    return result


class _SFTRun:
    """Setup and one optimizer step of `train_sft` (the generator draws the batch, then the noise)."""

    def __init__(self, model, cfg: SFTConfig, compute_dtype: str | None = None):
        self.model, self.cfg, self.compute_dtype = model, cfg, compute_dtype
        self.traits = model.traits if hasattr(model, "traits") else model.get_base_model().traits
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, warmup_constant_lambda(cfg.warmup_steps))
        model.train()

    def draw_batch(self, examples: Sequence[SFTExample]):
        idx = torch.randint(len(examples), (self.cfg.batch_size,), generator=self.gen).tolist()
        return collate([examples[i] for i in idx], self.traits.eos_token_id)

    def optimizer_step(self, ids, plen, alen):
        with compute_precision(self.model, self.compute_dtype):
            loss = sft_loss(self.model, ids, plen, alen, self.gen, self.cfg.eps)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        return loss, grad_norm


def _steps(n: int, desc: str, progress: bool):
    """range(n), with a tqdm bar when asked (shared by the SFT and preference trainers)."""
    if not progress:
        return range(n)
    from tqdm.auto import tqdm

    return tqdm(range(n), desc=desc, unit="step")


def _log(opts, cfg, step: int, metrics: dict[str, float]) -> None:
    """`opts.sink(step, metrics)` every `cfg.log_every` steps and at the last step."""
    if opts.sink is not None and (step % cfg.log_every == 0 or step == cfg.steps - 1):
        opts.sink(step, metrics)
