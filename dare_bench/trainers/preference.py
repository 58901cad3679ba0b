"""DPO on the ELBO and VRPO (LLaDA 1.5, algorithms.md §7) for diffusion LMs.

    from dare_bench.trainers.preference import PreferenceConfig, PreferenceRunOptions, train_preference
    train_preference(policy, pairs, PreferenceConfig(steps=50, lr=1e-5, mc_samples=4, beta=0.2),
                     PreferenceRunOptions(reference=reference, sink=print))

DPO replaces log π(y|x) with the ELBO B(y|x):  L = −log σ(β[(B_θ(y_w) − B_ref(y_w)) − (B_θ(y_l) − B_ref(y_l))]).
VRPO's three variance reductions are all here: the sampling budget (`mc_samples` = n), its allocation to timesteps
(LLaDA's stratified discrete estimator with one mask per timestep: n_t = n, n_{y_t} = 1) and antithetic sampling (the
policy and the reference ELBOs of a sequence share the same masks). As in DARE, the ELBO enters per token
(ELBO / R, R = padded response length) and chosen / rejected rows are interleaved, so a micro-batch must be even.

CPU: tiny presets as is. One GPU: move both models to `cuda`. The reference is a frozen copy (or, with LoRA, the
policy with adapters disabled: pass `reference=None`).
"""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from dare_bench.diffusion.likelihood import elbo
from dare_bench.diffusion.masking import stratified_masks
from dare_bench.errors import ConfigError
from dare_bench.trainers.precision import compute_precision, master_weights
from dare_bench.trainers.sft import _log, _steps


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
    steps: int = 50
    lr: float = 5e-7
    batch_pairs: int = 4
    beta: float = 0.2
    mc_samples: int = 4  # n = n_t: VRPO puts the whole budget on timesteps
    antithetic: bool = True  # share masks between policy and reference (VRPO)
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    log_every: int = 5

    def __post_init__(self):
        if self.mc_samples < 1 or self.batch_pairs < 1 or self.beta <= 0 or self.lr <= 0:
            raise ConfigError(f"invalid preference settings: {self}")


@dataclass
class PreferenceResult:
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0


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


def vrpo_loss(policy, reference, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len, *,
              beta: float, mc_samples: int, generator: torch.Generator,
              antithetic: bool = True) -> tuple[torch.Tensor, dict]:
    """VRPO loss of interleaved chosen / rejected rows (see `interleave_pairs`)."""
    if input_ids.shape[0] % 2:
        raise ConfigError(
            f"VRPO needs an even micro-batch (chosen/rejected interleaved), got {input_ids.shape[0]} rows"
        )
    draw = stratified_masks(attention_mask, prompt_len, n=mc_samples, generator=generator)
    resp_len = input_ids.shape[1] - int(prompt_len)
    policy_elbo = elbo(policy, input_ids, draw, attention_mask=attention_mask).mean / resp_len
    ref_draw = draw if antithetic else stratified_masks(attention_mask, prompt_len, n=mc_samples, generator=generator)
    with torch.no_grad(), _reference_context(policy, reference) as ref_model:
        ref_elbo = elbo(ref_model, input_ids, ref_draw, attention_mask=attention_mask).mean / resp_len
    loss = dpo_loss(policy_elbo[0::2], policy_elbo[1::2], ref_elbo[0::2], ref_elbo[1::2], beta)
    margin = (policy_elbo[0::2] - ref_elbo[0::2]) - (policy_elbo[1::2] - ref_elbo[1::2])
    return loss, {"loss": float(loss.detach()), "reward_margin": float(beta * margin.detach().mean()),
                  "reward_accuracy": float((margin.detach() > 0).float().mean())}


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
class PreferenceRunOptions:
    """What is specific to one `train_preference` call (the recipe is `PreferenceConfig`): the `reference` model
    (None: a frozen copy of the initial policy, or disabled adapters for LoRA), `sink(step, metrics)` every
    `cfg.log_every` steps and at the last (0-based steps), a tqdm bar."""

    reference: Any = None
    sink: Callable[[int, dict], Any] | None = None
    progress: bool = False
    # None / "float32": everything in fp32. "bfloat16": fp32 master weights, forwards under bf16 autocast.
    compute_dtype: str | None = None


def train_preference(policy, pairs: Sequence[PreferencePair], cfg: PreferenceConfig,
                     options: PreferenceRunOptions | None = None) -> PreferenceResult:
    """VRPO training. Stages: setup (reference, seeded generator, AdamW) → per step: draw pairs → VRPO loss /
    backward / clip / step → log → eval mode and the result."""
    opts = options or PreferenceRunOptions()
    if cfg.batch_pairs < 1:
        raise ConfigError("batch_pairs must be >= 1")
    if opts.compute_dtype:
        policy = master_weights(policy)
    run = _PreferenceRun(policy, cfg, opts.reference, opts.compute_dtype)
    result = PreferenceResult()
    start = time.perf_counter()
    policy.train()
    for step in _steps(cfg.steps, "vrpo", opts.progress):
        ids, am, plen = run.draw_pairs(pairs)
        metrics = run.optimizer_step(ids, am, plen)
        result.losses.append(metrics["loss"])
        _log(opts, cfg, step, metrics)
    policy.eval()
    result.seconds = time.perf_counter() - start
    return result


class _PreferenceRun:
    """Setup and one optimizer step of `train_preference` (one generator draws the pairs, then the masks)."""

    def __init__(self, policy, cfg: PreferenceConfig, reference, compute_dtype: str | None = None):
        self.policy, self.cfg, self.compute_dtype = policy, cfg, compute_dtype
        self.traits = policy.traits if hasattr(policy, "traits") else policy.get_base_model().traits
        if reference is None and not hasattr(policy, "disable_adapter"):
            reference = copy.deepcopy(policy).eval().requires_grad_(False)
        self.reference = reference
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.params = [p for p in policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)

    def draw_pairs(self, pairs: Sequence[PreferencePair]):
        idx = torch.randint(len(pairs), (self.cfg.batch_pairs,), generator=self.gen).tolist()
        return interleave_pairs([pairs[i] for i in idx], self.traits.eos_token_id)

    def optimizer_step(self, ids, am, plen) -> dict[str, float]:
        cfg = self.cfg
        with compute_precision(self.policy, self.compute_dtype):
            loss, metrics = vrpo_loss(self.policy, self.reference, ids, am, plen, beta=cfg.beta,
                                      mc_samples=cfg.mc_samples, generator=self.gen, antithetic=cfg.antithetic)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip)
        self.optimizer.step()
        return metrics
