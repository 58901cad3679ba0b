"""DPO on the ELBO and VRPO (LLaDA 1.5, algorithms.md §7) for diffusion LMs.

    from dare_bench.trainers.preference import (PreferenceConfig, PreferenceRunOptions, preference_batch_loss,
                                                train_preference)
    train_preference(policy, pairs, PreferenceConfig(steps=50, lr=1e-5, mc_samples=4, beta=0.2),
                     PreferenceRunOptions(reference=reference, sink=print))
    loss, metrics = preference_batch_loss(policy, reference, pairs[:4], PreferenceConfig(), generator)  # one step

DPO replaces log π(y|x) with the ELBO B(y|x):  L = −log σ(β[(B_θ(y_w) − B_ref(y_w)) − (B_θ(y_l) − B_ref(y_l))]).
VRPO's three variance reductions are all here: the sampling budget (`mc_samples` = n), its allocation to timesteps
(LLaDA's stratified discrete estimator with one mask per timestep: n_t = n, n_{y_t} = 1) and antithetic sampling (the
policy and the reference ELBOs of a sequence share the same masks). As in DARE, the ELBO enters per token
(ELBO / R, R = padded response length) and chosen / rejected rows are interleaved, so a micro-batch must be even.

CPU: tiny presets as is. One GPU: move the policy to `cuda`. torchrun: `train_preference` joins the process group
itself: every rank draws the same global batch of pairs and its masks, computes the loss on its contiguous share of
pairs, gradients are averaged before clipping, rank 0 calls the sink and writes checkpoints (`sft.SupervisedRun`,
shared with SFT: AdamW, the LR schedules of `loop.build_scheduler`, epochs → steps, `--resume`).
    torchrun --nproc_per_node 8 -m dare_bench.cli reproduce vrpo-llada-sudoku --scale paper \
        --checkpoint /ckpt/LLaDA-8B-Instruct --device cuda
The reference is a frozen copy of the initial policy (or, with LoRA, the policy with adapters disabled: pass
`reference=None`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from dare_bench.diffusion.likelihood import elbo
from dare_bench.diffusion.masking import MaskDraw, stratified_masks
from dare_bench.diffusion.packing import maybe_packed
from dare_bench.errors import ConfigError
from dare_bench.trainers.checkpoint import is_peft
from dare_bench.trainers.distributed import init_distributed, shard_model
from dare_bench.trainers.precision import master_weights
from dare_bench.trainers.sft import DataOrder, SupervisedRun, TrainRunOptions, _check_recipe


def dpo_loss(chosen: torch.Tensor, rejected: torch.Tensor, chosen_ref: torch.Tensor, rejected_ref: torch.Tensor,
             beta: float) -> torch.Tensor:
    """DARE `compute_dpo_loss`: mean over all elements of −log σ(β((c − r) − (c_ref − r_ref)))."""
    logits = (chosen - rejected) - (chosen_ref - rejected_ref)
    return -F.logsigmoid(beta * logits).mean()


@dataclass
class PreferencePair:
    prompt_ids: list[int]
    chosen_ids: list[int]  # response tokens incl. EOS
    rejected_ids: list[int]


@dataclass
class PreferenceConfig:
    """The VRPO recipe. `batch_pairs` is global (all ranks). `steps` None: `epochs` passes over the pairs
    (`sft.run_length`). `lr_schedule` / `warmup_steps`: `loop.build_scheduler` (HF shapes, shared with the RL loop).
    `grad_clip`: max grad norm, None = no clipping. `order`: as `SFTConfig.order`."""

    steps: int | None = 50
    lr: float = 5e-7
    batch_pairs: int = 4
    beta: float = 0.2
    mc_samples: int = 4  # n = n_t: VRPO puts the whole budget on timesteps
    antithetic: bool = True  # share masks between policy and reference (VRPO)
    weight_decay: float = 0.0
    grad_clip: float | None = 1.0
    seed: int = 0
    log_every: int = 5
    betas: tuple[float, float] = (0.9, 0.999)
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    epochs: float | None = None
    order: DataOrder = "with_replacement"
    lm_head_chunk_tokens: int | None = None  # None: materialised logits; N: the chunked LM head (train.* field)
    packing: bool = False  # train.packing: the ELBO forwards run packed (diffusion/packing.py), same numbers

    def __post_init__(self):
        if self.mc_samples is None or self.mc_samples < 1 or self.beta <= 0:
            raise ConfigError(f"invalid preference settings (mc_samples >= 1 and beta > 0 needed): {self}")
        _check_recipe(self, self.batch_pairs, "preference")


@dataclass
class PreferenceResult:
    """As `sft.SFTResult`: every step's loss, the sunk (step, metrics), the resumed-from step, the last checkpoint."""

    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0
    steps: int = 0
    logged: list[tuple[int, dict]] = field(default_factory=list)
    resumed_from: int | None = None
    checkpoint: Path | None = None


def interleave_pairs(pairs: Sequence[PreferencePair], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows [chosen_0, rejected_0, chosen_1, ...]: left-padded prompt + response right-padded with `pad_id` (EOS).

    Returns input_ids [2P, L], attention_mask [2P, L] (0 on left padding only: the EOS padding of responses is
    scored, as LLaDA trains on it) and prompt_len (the common padded prompt length)."""
    if not pairs:
        raise ConfigError("preference training needs at least one pair")
    plen = max(len(p.prompt_ids) for p in pairs)
    rlen = max(max(len(p.chosen_ids), len(p.rejected_ids)) for p in pairs)
    rows, masks = [], []
    for p in pairs:
        left = plen - len(p.prompt_ids)
        for resp in (p.chosen_ids, p.rejected_ids):
            rows.append([pad_id] * left + list(p.prompt_ids) + list(resp) + [pad_id] * (rlen - len(resp)))
            masks.append([0] * left + [1] * (plen - left + rlen))
    return torch.tensor(rows), torch.tensor(masks), torch.tensor(plen)


def _draw_rows(draw: MaskDraw, rows: slice) -> MaskDraw:
    """The sequences `rows` of a mask draw (every per-sequence tensor sliced on its batch axis)."""
    b = draw.mask.shape[0]
    cut = {f.name: getattr(draw, f.name)[rows] for f in dataclasses.fields(draw)
           if isinstance(getattr(draw, f.name), torch.Tensor) and getattr(draw, f.name).dim() > 0
           and getattr(draw, f.name).shape[0] == b}
    return dataclasses.replace(draw, **cut)


def vrpo_loss(policy, reference, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len, *,
              beta: float, mc_samples: int, generator: torch.Generator,
              antithetic: bool = True, pairs: slice | None = None,
              head_chunk_tokens: int | None = None, packing: bool = False) -> tuple[torch.Tensor, dict]:
    """VRPO loss of interleaved chosen / rejected rows (see `interleave_pairs`), averaged over the pairs `pairs`
    (default all). The masks are drawn for every row first, so a row's masks do not depend on which pairs this
    process computes (data parallelism: 1 process == N processes). `head_chunk_tokens`: the ELBOs through the
    chunked LM head (`likelihood.elbo`), no `[tokens, vocab]` logits. `packing`: the policy's and the reference's
    forwards run packed (`diffusion.packing.PackedModel`: the prompts' left padding is not computed)."""
    if input_ids.shape[0] % 2:
        raise ConfigError(
            f"VRPO needs an even micro-batch (chosen/rejected interleaved), got {input_ids.shape[0]} rows"
        )
    draw = stratified_masks(attention_mask, prompt_len, n=mc_samples, generator=generator)
    ref_draw = draw if antithetic else stratified_masks(attention_mask, prompt_len, n=mc_samples, generator=generator)
    if pairs is not None:
        rows = slice(2 * pairs.start, 2 * pairs.stop)
        input_ids, attention_mask = input_ids[rows], attention_mask[rows]
        draw, ref_draw = _draw_rows(draw, rows), _draw_rows(ref_draw, rows)
    resp_len = input_ids.shape[1] - int(prompt_len)
    traits = policy.traits if hasattr(policy, "traits") else policy.get_base_model().traits
    policy_elbo = elbo(maybe_packed(policy, traits, packing), input_ids, draw, attention_mask=attention_mask,
                       head_chunk_tokens=head_chunk_tokens).mean / resp_len
    with torch.no_grad(), _reference_context(policy, reference) as ref_model:
        ref_elbo = elbo(maybe_packed(ref_model, traits, packing), input_ids, ref_draw, attention_mask=attention_mask,
                        head_chunk_tokens=head_chunk_tokens).mean / resp_len
    loss = dpo_loss(policy_elbo[0::2], policy_elbo[1::2], ref_elbo[0::2], ref_elbo[1::2], beta)
    margin = (policy_elbo[0::2] - ref_elbo[0::2]) - (policy_elbo[1::2] - ref_elbo[1::2])
    return loss, {"loss": float(loss.detach()), "reward_margin": float(beta * margin.detach().mean()),
                  "reward_accuracy": float((margin.detach() > 0).float().mean())}


def preference_batch_loss(policy, reference, batch: Sequence[PreferencePair], cfg: PreferenceConfig,
                          generator: torch.Generator, *, pairs: slice | None = None) -> tuple[torch.Tensor, dict]:
    """The preference trainer's (loss, metrics) on one batch of pairs (in this order): interleaved and EOS-padded
    (`interleave_pairs`), masks from `generator`, `cfg`'s beta / MC budget / antithetic sharing / loss head /
    packing, averaged over the pairs `pairs` (default all). What every step of `train_preference` computes, and
    what the gradient snapshots (check/gradients.py) pin."""
    traits = policy.traits if hasattr(policy, "traits") else policy.get_base_model().traits
    ids, am, plen = interleave_pairs(batch, traits.eos_token_id)
    return vrpo_loss(policy, reference, ids, am, plen, beta=cfg.beta, mc_samples=cfg.mc_samples, generator=generator,
                     antithetic=cfg.antithetic, pairs=pairs, head_chunk_tokens=cfg.lm_head_chunk_tokens,
                     packing=cfg.packing)


@contextlib.contextmanager
def _reference_context(policy, reference):
    """The reference model: the given one, or (LoRA) the policy with its adapters disabled."""
    if reference is not None:
        yield reference
    elif hasattr(policy, "disable_adapter"):
        with policy.disable_adapter():
            yield policy
    else:
        raise ConfigError("VRPO needs a reference model (or a LoRA policy whose adapters can be disabled)")


@dataclass
class PreferenceRunOptions(TrainRunOptions):
    """`sft.TrainRunOptions` of `train_preference`, plus the `reference` model (None: a frozen copy of the initial
    policy, or, for a LoRA policy, the policy with its adapters disabled)."""

    reference: Any = None


def train_preference(policy, pairs: Sequence[PreferencePair], cfg: PreferenceConfig,
                     options: PreferenceRunOptions | None = None) -> PreferenceResult:
    """VRPO training of `policy` in place; see `sft.SupervisedRun` for the stages (the reference is fixed before
    any checkpoint is loaded: the initial policy, never a resumed one)."""
    opts = options or PreferenceRunOptions()
    if not pairs:
        raise ConfigError("preference training needs at least one pair")
    start = time.perf_counter()
    if opts.compute_dtype:
        policy = master_weights(policy)
    run = _PreferenceRun(policy, cfg, opts, len(pairs))
    policy.train()
    run.run_steps(pairs)
    policy.eval()
    return PreferenceResult(losses=run.losses, seconds=time.perf_counter() - start, steps=run.step,
                            logged=run.logged, resumed_from=run.resumed_from, checkpoint=run.last_ckpt)


class _PreferenceRun(SupervisedRun):
    """VRPO's step: the global batch of pairs (indices, then its masks, from the shared generator), the loss on
    this rank's pairs of it."""

    kind = "vrpo"

    def __init__(self, policy, cfg: PreferenceConfig, opts: PreferenceRunOptions, n_pairs: int):
        reference = opts.reference
        if reference is None and not is_peft(policy):  # copied before FSDP2 shards the policy (in super())
            reference = copy.deepcopy(policy).eval().requires_grad_(False)
            reference = shard_model(reference, opts.dist or init_distributed(), opts.compute_dtype)
        self.reference = reference
        super().__init__(policy, cfg, opts, n_pairs, cfg.batch_pairs)

    def loss(self, pairs):
        picked = [pairs[i] for i in self.draw_indices()]
        return preference_batch_loss(self.model, self.reference, picked, self.cfg, self.gen, pairs=self.local)
