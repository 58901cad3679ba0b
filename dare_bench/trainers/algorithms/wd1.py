"""wd1 (Tang, Dolga, Yoon, Bogunovic, arXiv 2507.08838, ICLR 2026): ratio-free weighted policy optimisation.

Source read (the official code, github xiaohangt/wd1 at commit 0898985, the repository's HEAD when fetched):
- `wd1/trainers/rev_grpo_trainer.py` (class `RevDiffuGRPOTrainer`, trainer_type `wll_d1_neg`, the method of the
  `run/wll_NP_*.sh` / `run/wll_SFT_NP_*.sh` scripts): `compute_loss` (lines 117-160: the weights and the loss),
  `forward_process` (319-345: the mask), `_get_per_token_logps` (384-448: the estimator),
  `_generate_and_score_completions` (538-550 completion mask and mask seeds; 627-650 the advantages).
- `wd1/trainers/rev_grpo_trainer_psr.py` `compute_loss` (trainer_type `wll_d1_pos_only`, `run/wll_P_*.sh`): the
  same without the negative term. `wd1/trainers/rev_grpo_ref_pol_trainer.py` (`wll_d1_neg_ref`) has the same loss
  and mixes the reference logits into the ROLLOUT sampler (logits·(1−β) + ref_logits·β); not offered here.
- `wd1/run_train.py` (trainer types), `wd1/trainers/diffu_grpo_config.py` (knobs and defaults), `wd1/train.yaml`
  and `run/wll_NP_{gsm8k,math,countdown,sudoku}.sh` (the recipe; see _defaults/algorithms/wd1.yaml).
The paper's text was not read (only its abstract): the formula below is the code's.

Advantages (`_generate_and_score_completions`): A_i = r_i − mean_group(r) (no std division; `advantage: mean`).

Weights (`compute_loss`): `torch.softmax(advantages, dim=0)` over the per-device batch, which in the official setup
(per_device_train_batch_size = num_generations = 6; TRL's sampler gives each device one prompt's G completions) is
exactly one group. So, per group of G completions,
    w⁺_i = exp(A_i) / Σ_j exp(A_j),      w⁻_i = exp(−A_i) / Σ_j exp(−A_j)
with no temperature (the code has none), computed here per group whatever the micro-batch size.

Log-likelihood (`_get_per_token_logps` + `forward_process`): d1's one-step estimate, inherited from the d1 plug-in:
every completion position masked, each prompt token masked iid with p = `p_mask_prompt` (0.15 in train.yaml), one
forward, ℓ_it = log softmax(f(x̃))_t[o_it], no 1/p weight; L_i = Σ_t m_it ℓ_it summed over the scored completion
tokens (up to and including the first EOS). Inner iteration k of the μ (`num_iterations`) uses mask seed s_k ~
U{0..4095} drawn once per rollout batch (`random_masking`; else 42 for every k), as d1.

Loss (minimised), per group:
    wll_d1_neg (wd1):          ℒ = −Σ_i w⁺_i L_i + Σ_i w⁻_i L_i = −Σ_i (w⁺_i − w⁻_i) L_i
    wll_d1_pos_only (ablation): ℒ = −Σ_i w⁺_i L_i
No importance ratio, no old-policy or reference log-probs, no clipping, no KL term (the official `beta` is not read
by these losses; here kl_beta > 0 is refused). Equal rewards give w⁺ = w⁻ = 1/G, so wd1's loss and gradient vanish.
Aggregation: the official loss is that group sum (one group per device), averaged over devices and gradient-
accumulation steps. Here a micro-batch of rows R gives (G/|R|)·Σ_{i∈R} −c_i L_i (c = w⁺ − w⁻, or w⁺), i.e. exactly
ℒ of its group when R is one group, and the loop's 1/#micro-batches scale averages them: the mean of ℒ over groups.
`loss_agg` is therefore accepted from the shared recipes and unused.

One deliberate difference, as in the d1 plug-in: the model gets the batch's padding mask, and left padding is never
masked or attended to (upstream calls the model without one). wd1++ (the denoising-step-wise version in the paper's
v2) has no code in the official repository and is not implemented.

Knobs (`train.algorithm`, `dare_bench/catalogue/knobs/wd1.py`): trainer_type, p_mask_prompt, random_masking.
"""

from __future__ import annotations

import torch

from dare_bench.catalogue.knobs.wd1 import Wd1Config
from dare_bench.errors import ConfigError
from dare_bench.trainers.algorithms.base import AlgorithmState, RolloutBatch, register_algorithm
from dare_bench.trainers.algorithms.common import agg_loss, group_advantages
from dare_bench.trainers.algorithms.d1 import D1


@torch.no_grad()
def wd1_weights(advantages: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(w⁺, w⁻), each `[N]`: softmax of A and of −A within each contiguous group of `group_size` rows."""
    n = advantages.shape[0]
    if group_size < 1 or n % group_size:
        raise ValueError(f"{n} advantages do not split into groups of {group_size}")
    grouped = advantages.view(-1, group_size)
    return torch.softmax(grouped, dim=1).reshape(n), torch.softmax(-grouped, dim=1).reshape(n)


@register_algorithm
class Wd1(D1):
    """The d1 estimator (masks, seeds, completion log-probs) with wd1's weighted log-likelihood loss."""

    name = "wd1"
    Config = Wd1Config
    attention_kinds = ("bidirectional",)  # one-step estimate over a fully masked completion: MDLM (LLaDA, Dream)

    def validate(self) -> None:
        c = self.config
        if c.mc_samples != 1:
            raise ConfigError(f"wd1 uses exactly one mask per sequence per iteration (mc_samples=1); got "
                              f"mc_samples={c.mc_samples}")
        if c.kl_beta != 0:
            raise ConfigError("wd1 has no KL term (the official loss never reads beta); set beta_kl: 0")
        if c.advantage not in (None, "mean", "mean_std"):
            raise ConfigError(f"wd1 advantage must be 'mean' (official) or 'mean_std', got {c.advantage!r}")

    def advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        return group_advantages(rewards, group_size, self.config.advantage or "mean")

    def coefficients(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        """c_i `[N]`, the weight of L_i in the objective: w⁺ − w⁻ (wll_d1_neg) or w⁺ (wll_d1_pos_only)."""
        w_pos, w_neg = wd1_weights(self.advantages(rewards, group_size), group_size)
        return w_pos - w_neg if self.config.trainer_type == "wll_d1_neg" else w_pos

    @torch.no_grad()
    def prepare(self, batch: RolloutBatch, policy, reference, *, generator: torch.Generator,
                num_iterations: int) -> AlgorithmState:
        """The masks of the μ iterations and the per-row weights; no forward (nothing of the old policy is used)."""
        seeds = self.mask_seeds(generator, num_iterations)
        masks = torch.stack([self.draw_masks(batch, s) for s in seeds], dim=1)  # [N, μ, L]
        coef = self.coefficients(batch.rewards.float(), batch.group_size)
        return AlgorithmState(rows={"masks": masks, "coef": coef},
                              shared={"mask_seeds": seeds, "group_size": batch.group_size})

    def loss(self, logp: torch.Tensor, coef: torch.Tensor, completion_mask: torch.Tensor,
             group_size: int) -> torch.Tensor:
        """(G/|R|)·Σ_i −c_i Σ_t m_it ℓ_it over the micro-batch's rows R (= the official group loss for one group)."""
        seq_logp = (logp * completion_mask).sum(-1)
        return -(seq_logp * coef.to(seq_logp.dtype)).sum() * (group_size / logp.shape[0])

    def backward(self, policy, batch: RolloutBatch, state: AlgorithmState, advantages: torch.Tensor, *,
                 loss_scale: float, iteration: int) -> dict[str, float]:
        mask = state.rows["masks"][:, iteration]
        logp, entropy = self.completion_logprobs(policy, batch, mask, with_entropy=True)
        cmask = batch.completion_mask
        loss = self.loss(logp, state.rows["coef"], cmask, int(state.shared["group_size"]))
        (loss * loss_scale).backward()
        return {
            "loss": float(loss.detach()),
            "seq_logp": float((logp.detach() * cmask).sum(-1).mean()),
            "entropy": float(agg_loss(entropy, cmask, "token-mean")),  # entropy carries no gradient
            "scored_tokens": float(cmask.sum()),
        }
