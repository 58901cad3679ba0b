"""Pieces shared by the GRPO-family plug-ins: group advantages, the PPO-clip token loss, loss aggregation, KL terms.

Each function follows one official definition (see `../shared/docs/algorithms.md` §1.4 and the fixtures in
`../shared/fixtures/losses/{grpo_advantage,grpo_policy_loss,kl_penalty}`), down to the order of floating-point
operations, so that `tests/trainers/test_common_losses.py` can compare values and gradients bit for bit:

- `grpo_outcome_advantage` — verl `core_algos.compute_grpo_outcome_advantage` (unbiased std, eps on the std,
  a singleton group gets mean 0 / std 1).
- `group_advantages` — the same on contiguous groups of G rows, plus d1's mean-only baseline and Coupled-GRPO's
  leave-one-out baseline.
- `policy_loss` — DARE's `dllm_core_algos.compute_policy_loss` (asymmetric clip, verl dual-clip c for A < 0,
  k3 `ppo_kl` metric); `clip_ratio_c=None` gives the plain PPO-clip of the d1 / DiffuCoder trainers.
- `agg_loss`, `masked_mean` — verl's aggregation modes (note the +1e-8 of token-mean).
- `kl_estimate` — verl core k1 / abs / k2 / k3 (`low_var_kl`); `dare_kl_penalty` — DARE's advantage-dependent variant
  (log(1 + diff) where A > 0 before the estimator).
- `with_kl_term`, `proxy_gradient` — the loss + metrics and the memory-bounded backward of the sequence-level
  plug-ins (ESPO, EBPO, GDPO).

Conventions: every loss is the quantity MINIMISED (= −objective); log-prob tensors are `[B, R]` over the response.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

import torch

from dare_bench.catalogue.settings import AGG_MODES, KL_KINDS
from dare_bench.errors import ConfigError

ADVANTAGE_MODES = ("mean", "mean_std", "leave_one_out")
# short aliases accepted by `group_advantages`
_ADV_ALIASES = {"std": "mean_std", "loo": "leave_one_out"}


# --- aggregation --------------------------------------------------------------------------------------------------
def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """verl `masked_mean`: sum(values * mask) / (sum(mask) + 1e-8).

    The +1e-8 is added to the integer/bool count as verl does (it is lost in float32 for counts > ~1, kept for
    bit-exactness, and makes an all-padding micro-batch give 0 instead of NaN).
    """
    if dim is None:
        return (values * mask).sum() / (mask.sum() + 1e-8)
    return (values * mask).sum(dim=dim) / (mask.sum(dim=dim) + 1e-8)


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, mode: str = "token-mean") -> torch.Tensor:
    """verl `agg_loss` over a `[B, R]` per-token loss.

    token-mean: Σ(l·m) / (Σm + 1e-8) over the whole micro-batch; seq-mean-token-sum: mean_b Σ_t l·m;
    seq-mean-token-mean: mean_b [Σ_t l·m / Σ_t m] (an all-padding row gives NaN, as in verl);
    seq-mean-token-sum-norm: Σ(l·m) / R.
    """
    if mode == "token-mean":
        return masked_mean(loss_mat, loss_mask)
    if mode == "seq-mean-token-sum":
        return torch.mean(torch.sum(loss_mat * loss_mask, dim=-1))
    if mode == "seq-mean-token-mean":
        return torch.mean(torch.sum(loss_mat * loss_mask, dim=-1) / torch.sum(loss_mask, dim=-1))
    if mode == "seq-mean-token-sum-norm":
        return torch.sum(loss_mat * loss_mask) / loss_mask.shape[-1]
    raise ConfigError(f"unknown loss_agg {mode!r}; expected one of {list(AGG_MODES)}")



# --- advantages ---------------------------------------------------------------------------------------------------
@torch.no_grad()
def grpo_outcome_advantage(scores: torch.Tensor, index: Sequence[Hashable], *, norm_by_std: bool = True,
                           epsilon: float = 1e-6) -> torch.Tensor:
    """verl GRPO outcome advantage of sequence scores `[N]` grouped by `index` (any hashable per row).

    A_i = (s_i − mean_g) / (std_g + ε) with the unbiased std, or s_i − mean_g without std normalisation.
    A singleton group uses mean 0 and std 1 (so A = s / (1 + ε), not 0) exactly as verl; its 0-d constants are
    default-dtype tensors, which keeps verl's rounding of 1 + ε in float32.
    """
    if scores.dim() != 1 or scores.shape[0] != len(index):
        raise ValueError(f"scores must be [N] with one index entry per row, got {tuple(scores.shape)}, {len(index)}")
    groups: dict[Hashable, list[int]] = {}
    for i, key in enumerate(index):
        groups.setdefault(key, []).append(i)
    stats = {}
    for key, rows in groups.items():
        if len(rows) == 1:
            stats[key] = (torch.tensor(0.0), torch.tensor(1.0))
        else:
            vals = scores[rows]
            stats[key] = (torch.mean(vals), torch.std(vals))
    out = scores.clone()
    for i, key in enumerate(index):
        mean, std = stats[key]
        out[i] = (scores[i] - mean) / (std + epsilon) if norm_by_std else scores[i] - mean
    return out


@torch.no_grad()
def group_advantages(rewards: torch.Tensor, group_size: int, mode: str = "std", *,
                     epsilon: float = 1e-6) -> torch.Tensor:
    """Advantages `[N]` for rows grouped contiguously G at a time (row r belongs to prompt r // G).

    mode "mean": A = r − mean_group(r) (d1, `diffu_grpo_trainer.py`); "mean_std" (alias "std"): verl/DARE default
    (r − mean) / (std_unbiased + ε); "leave_one_out" (alias "loo"): A = r − (Σ_k r_k − r) / (G − 1) (Coupled-GRPO).
    The mode names are those of `TrainSettings.advantage`.
    """
    mode = _ADV_ALIASES.get(mode, mode)
    n = rewards.shape[0]
    if group_size < 1 or n % group_size:
        raise ValueError(f"{n} rewards do not split into groups of {group_size}")
    if mode == "mean_std":
        return grpo_outcome_advantage(rewards, [i // group_size for i in range(n)], norm_by_std=True,
                                      epsilon=epsilon)
    grouped = rewards.view(-1, group_size)
    if mode == "mean":
        return (grouped - grouped.mean(dim=1, keepdim=True)).reshape(n)
    if mode == "leave_one_out":
        if group_size < 2:
            raise ConfigError("leave-one-out advantages need group_size >= 2")
        baseline = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)
        return (grouped - baseline).reshape(n)
    raise ConfigError(f"unknown advantage mode {mode!r}; expected one of {list(ADVANTAGE_MODES)}")


# --- per-token log-probs from a model -------------------------------------------------------------------------------
def model_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                 logit_shift: int = 0) -> torch.Tensor:
    """Logits `[B, L, V]` where row i predicts token i (Dream's shift undone via `models.base.shift_logits`).

    `model` is a `DiffusionLM`, a PEFT wrapper of one, or any callable with the same signature (e.g. the LoRA
    reference `trainers.loop.AdapterDisabled`); an output object with `.logits` is accepted too.
    """
    from dare_bench.models.base import shift_logits

    out = model(input_ids, attention_mask=attention_mask)
    logits = out if isinstance(out, torch.Tensor) else out.logits
    return shift_logits(logits, logit_shift)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, *, with_entropy: bool = False):
    """log softmax(logits)[target] per position (= −cross_entropy), computed in at least float32.

    With `with_entropy`, also returns the per-position entropy of the predictive distribution (no gradient).
    """
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return logp
    with torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


# --- policy loss --------------------------------------------------------------------------------------------------
@dataclass
class PolicyLossOutput:
    loss: torch.Tensor  # scalar, aggregated
    clip_frac: torch.Tensor  # fraction of tokens whose clipped term is the active one (float32, as verl)
    ppo_kl: torch.Tensor  # k3 of (ref or old) against the current log-probs, token-mean (a metric)
    clip_frac_lower: torch.Tensor  # fraction of A < 0 tokens capped by the dual clip
    per_token: torch.Tensor  # [B, R] per-token loss before aggregation


def policy_loss(old_logp: torch.Tensor, logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                clip_low: float = 0.2, clip_high: float | None = None, clip_ratio_c: float | None = 3.0,
                agg: str = "token-mean", ref_logp: torch.Tensor | None = None) -> PolicyLossOutput:
    """DARE `compute_policy_loss`: token-level PPO-clip with asymmetric clip and verl's dual clip.

    ratio ρ = exp(ℓ − ℓ_old); per token max(−Aρ, −A·clip(ρ, 1−ε_low, 1+ε_high)), and for A < 0 additionally
    capped at −A·c (`clip_ratio_c`; None disables the dual clip, as in the d1 / DiffuCoder trainers).
    `advantages` is `[B, R]` (a sequence advantage broadcast over tokens) or `[B]`.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(logp)
    if not (old_logp.shape == logp.shape == advantages.shape):
        raise ValueError(f"shape mismatch: old {tuple(old_logp.shape)}, new {tuple(logp.shape)}, "
                         f"advantages {tuple(advantages.shape)}")
    if clip_high is None:
        clip_high = clip_low
    ratio = torch.exp(logp - old_logp)
    base = old_logp if ref_logp is None else ref_logp
    ppo_kl = masked_mean(torch.exp(base - logp) - (base - logp) - 1, mask)
    pg1 = -advantages * ratio
    pg2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clipped = torch.maximum(pg1, pg2)
    clip_frac = masked_mean(torch.gt(pg2, pg1).float(), mask)
    if clip_ratio_c is None:
        per_token = clipped
        clip_frac_lower = torch.zeros((), dtype=torch.float32, device=logp.device)
    else:
        if clip_ratio_c <= 1.0:
            raise ConfigError(f"clip_ratio_c (dual-clip bound) must be > 1, got {clip_ratio_c}")
        pg3 = -advantages * clip_ratio_c
        dual = torch.min(pg3, clipped)
        clip_frac_lower = masked_mean(torch.gt(clipped, pg3) * (advantages < 0).float(), mask)
        per_token = torch.where(advantages < 0, dual, clipped)
    loss = agg_loss(per_token, mask, agg)
    return PolicyLossOutput(loss, clip_frac, ppo_kl, clip_frac_lower, per_token)


# --- KL -----------------------------------------------------------------------------------------------------------
def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3", *,
                clamp: float | None = 10.0) -> torch.Tensor:
    """Per-token KL(π‖π_ref) estimators of verl `core_algos.kl_penalty` (Schulman, "Approximating KL").

    k1 = ℓ − ℓ_ref; abs = |k1|; k2 = ½(ℓ − ℓ_ref)²; k3 (low_var_kl) = exp(ℓ_ref − ℓ) − (ℓ_ref − ℓ) − 1 (≥ 0),
    clamped to [−clamp, clamp] as verl does; the d1 trainer applies no clamp (`clamp=None`).
    """
    if kind in ("k1", "kl"):
        return logp - ref_logp
    if kind == "abs":
        return (logp - ref_logp).abs()
    if kind in ("k2", "mse"):
        return 0.5 * (logp - ref_logp).square()
    if kind in ("k3", "low_var_kl"):
        d = ref_logp - logp
        kld = torch.exp(d) - d - 1
        return kld if clamp is None else torch.clamp(kld, min=-clamp, max=clamp)
    raise ConfigError(f"unknown KL estimator {kind!r}; expected one of {list(KL_KINDS)}")


def dare_kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str, advantages: torch.Tensor) -> torch.Tensor:
    """DARE `dllm_core_algos.kl_penalty`: the estimator applied to kl = log(1 + ℓ − ℓ_ref) where A > 0, else ℓ − ℓ_ref.

    This is DARE's own (BGPO-style) transform, not a standard KL estimator: it is NaN where A > 0 and
    ℓ − ℓ_ref < −1. Kept for DARE-protocol parity; k3 is clamped to [−10, 10].
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(logp)
    diff = logp - ref_logp
    kl = torch.where(advantages > 0, torch.log(1 + diff), diff)
    if kind in ("k1", "kl"):
        return kl
    if kind == "abs":
        return kl.abs()
    if kind in ("k2", "mse"):
        return 0.5 * kl.square()
    if kind in ("k3", "low_var_kl"):
        neg = -kl
        return torch.clamp(torch.exp(neg) - neg - 1, min=-10, max=10)
    raise ConfigError(f"unknown KL estimator {kind!r}; expected one of {list(KL_KINDS)}")


# --- sequence-level objectives (ESPO, EBPO, GDPO: one likelihood value per completion) -----------------------------
def with_kl_term(policy_terms, kl: torch.Tensor | None, beta: float):
    """(loss, metrics, kl) of a sequence-level clipped loss: `policy_terms` = (pg, clip_frac, ppo_kl,
    clip_frac_lower) as `espo_policy_loss` / `ebpo_policy_loss` return them, plus β·kl when `kl` (a scalar) is
    given."""
    pg, clip_frac, ppo_kl, clip_lower = policy_terms
    loss = pg if kl is None else pg + beta * kl
    return loss, {"pg_loss": float(pg.detach()), "clip_frac": float(clip_frac),
                  "clip_frac_lower": float(clip_lower), "ppo_kl": float(ppo_kl)}, kl


def proxy_gradient(objective, value: torch.Tensor, *args, loss_scale: float):
    """First half of the memory-bounded backward of a sequence-level loss: `objective(proxy, *args)` -> (loss,
    metrics, kl) on a detached copy of `value` `[n]`, and g = ∂(loss · loss_scale)/∂value. The caller then
    back-propagates Σ_n g_n ∂value_n/∂θ one forward's graph at a time: the gradient of the loss, memory O(1) in the
    number of MC copies. Returns (loss, metrics, kl, g)."""
    proxy = value.detach().requires_grad_(True)
    loss, metrics, kl = objective(proxy, *args)
    (g,) = torch.autograd.grad(loss * loss_scale, proxy)
    return loss, metrics, kl, g


__all__ = [
    "AGG_MODES", "ADVANTAGE_MODES", "KL_KINDS", "PolicyLossOutput", "agg_loss",
    "dare_kl_penalty", "group_advantages", "grpo_outcome_advantage", "kl_estimate", "masked_mean", "model_logits",
    "policy_loss", "proxy_gradient", "token_logprobs", "with_kl_term",
]


# Upstream (d1, DiffuCoder, SPG): one mask seed per inner iteration from torch.randint(0, 2**12, ...), or seed 42 for
# every iteration when `random_masking` is off.
MASK_SEED_RANGE = 2**12
FIXED_MASK_SEED = 42


def iteration_mask_seeds(generator: torch.Generator, num_iterations: int, random_masking: bool) -> list[int]:
    """The mask seed of each of the μ inner iterations, shared by the old, reference and new log-probs."""
    if not random_masking:
        return [FIXED_MASK_SEED] * num_iterations
    return torch.randint(0, MASK_SEED_RANGE, (num_iterations,), generator=generator).tolist()
