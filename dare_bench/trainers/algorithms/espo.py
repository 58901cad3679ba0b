"""ESPO — ELBO-based Sequence-level Policy Optimisation (arXiv 2512.03759) for masked diffusion LMs.

Sources read: the authors' `ML-GSAI/ESPO` @ b5f2dac (`espo/espo_trainer.py`: `forward_process`, `_get_elbo`,
`_get_elbo_mc`, `compute_loss`, `compute_approx_kl`; `espo/configs.py`; `recipes/train.yaml`) and DARE's port
`yjyddq/DARE` @ 83ae8a3 (`verl/trainer/ppo/dllm_core_algos.py`: `_forward_process_espo`, `_masked_sequence_mean`,
`compute_policy_loss_espo`, `compute_espo_kl`, `compute_espo_sequence_elbo`; `verl/workers/actor/
llada_dp_actor_espo.py`; `verl/workers/dllm_fsdp_workers.py` (the per-iteration mask draws);
`recipe/llada/run_espo_llada_8b_instruct.sh`). Spec: shared/docs/algorithms.md §10.4. Fixture:
`tests/fixtures/losses/espo/` (DARE's functions run unmodified), reproduced by `tests/trainers/test_espo.py`.

The whole completion is ONE action; its log-likelihood is replaced by the sequence ELBO.

Corruption (`masking.espo_batch_masks`, DARE `_forward_process_espo`): a sequence with L valid completion tokens
gets k ∈ {0, …, L} masked tokens (L+1 levels, k = 0 allowed), chosen by a random permutation, weight p = k/(L+1).
When every row of the rollout batch has the same L, the levels are stratified over the rows (one k ~ U{0..L}, row j
gets round(k + j(L+1)/b) mod (L+1)); otherwise each row draws its own k (knob `stratify_rows=false`: always).
DARE draws a distinct set for every (update iteration, MC sample): `mc_samples` · μ copies, all drawn in `prepare`.

Sequence ELBO of one copy (DARE `compute_espo_sequence_elbo`, official `_get_elbo`), m = masked, m̄ = valid & ¬m:
    E = −Σ_{i∈m} CE_i / p                                                (reduce_var = false)
    E = ½ [ −Σ_{i∈m} CE_i(x̃) / p − Σ_{i∈m̄} CE_i(x̃ᶜ) / (L/(L+1) − p) ]  (reduce_var = true)
where x̃ᶜ is the complementary copy (m̄ masked, m clean) — both halves together use every valid token once
(`likelihood.elbo_term(..., reduce_var=True)`). Per-token normalisation: b = (1/M) Σ_m E_m / R with R the padded
completion length (DARE's `ELBO / response_length`, the official `/ logits_to_keep`); rows without a completion
token have b = 0 (DARE's masked row mean, clamp_min(1)).

Loss (DARE `compute_policy_loss_espo`): ρ = exp(b − b_old) per sequence, then PPO's clip on the sequence,
    loss = mean over ALL rows of max(−A ρ, −A clip(ρ, 1 − ε_low, 1 + ε_high))
(rows without a completion count with A = 0; no dual clip in DARE or the official code: `clip_ratio_c`, off by
default, adds verl's cap −A·c for A < 0). ε = 0 (DARE's countdown recipe) is allowed: gradient only where the
unclipped term is the larger one.
KL (DARE `compute_espo_kl`, official `compute_approx_kl` on the raw ELBO): on the RAW sequence ELBOs
E = b·R, E_ref = b_ref·R (same masks), D = E − E_ref,
    k2: ½ D² / R  (the recommended one)    k3: (e^{−D} + D − 1) / R    abs: |D| / R
    k1: (D + (E − sg E)(sg E − E_ref)) / R — value D / R, gradient (1 + D) / R (the official gradient correction)
mean over all rows, times β (`train.beta_kl`), added to the loss.

Backward (DARE's memory-bounded form): b is first evaluated without a graph, g = ∂(loss · scale)/∂b is taken on a
detached copy, then each MC copy's masked half and complement half are recomputed with a graph one at a time and
(g · half / (2 M R)).sum() back-propagated: the model gradient is exactly that of the loss, memory O(1) in M and
one forward's activations at a time (DARE keeps the two halves of a copy in one graph).
θ_old: DARE recomputes the old ELBO of every iteration's masks before the update; at iteration 0 the policy IS
θ_old, so b_old = b there (no forward in `prepare`), and `prepare` computes b_old for iterations 1..μ−1 only.

Backbones: `attention_kinds = ("bidirectional",)` — LLaDA (DARE's only ESPO actor) and Dream (the official repo's
`run_demo_dream.sh`; the logit shift is handled by `likelihood`). Block diffusion is not defined for ESPO: one mask
level over the whole completion is not a per-block ELBO of a block-causal model (EBPO is DARE's block-level
analogue).

Knobs (`train.algorithm`, `dare_bench/catalogue/knobs/espo.py`): reduce_var, stratify_rows; shared settings
(`train.*`): mc_samples (default 2), clip_eps, clip_eps_high, clip_ratio_c, beta_kl, kl_estimator (default k2),
advantage (default leave_one_out = DARE's rloo). `loss_agg` is not used (a mean over sequences, as DARE).
"""

from __future__ import annotations

import torch

from dare_bench.catalogue.knobs.espo import ESPOConfig
from dare_bench.errors import ConfigError
from dare_bench.trainers.algorithms.base import (
    Algorithm,
    AlgorithmState,
    RolloutBatch,
    register_algorithm,
)
from dare_bench.trainers.algorithms.bgpo import elbo_layout, per_iteration_no_grad, with_traits
from dare_bench.trainers.algorithms.common import group_advantages, proxy_gradient, with_kl_term

ESPO_KL = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")


# --- the official pieces, on tensors ----------------------------------------------------------------------------

def masked_sequence_mean(values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """DARE `_masked_sequence_mean`: Σ(values · mask) / max(Σ mask, 1) over the last dim (`[B, R]` -> `[B]`)."""
    m = response_mask.to(dtype=values.dtype)
    return (values * m).sum(dim=-1) / m.sum(dim=-1).clamp_min(1.0)


def espo_policy_loss(old_l: torch.Tensor, l: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor, *,
                     clip_low: float = 0.2, clip_high: float | None = None, clip_ratio_c: float | None = None):
    """DARE `compute_policy_loss_espo` on `[B, R]` tensors (per-token normalised ELBOs and advantages broadcast over
    the response); returns (loss, clip_frac, ppo_kl, clip_frac_lower).

    Sequence values are masked row means; ρ = exp(b − b_old); loss = mean over every row of max(−Aρ, −A clip(ρ)).
    `clip_ratio_c` (not in DARE): for A < 0 the row loss is capped at −A·c.
    """
    if not (old_l.shape == l.shape == advantages.shape):
        raise ValueError(f"shape mismatch: old {tuple(old_l.shape)}, new {tuple(l.shape)}, "
                         f"advantages {tuple(advantages.shape)}")
    if clip_high is None:
        clip_high = clip_low
    old_seq = masked_sequence_mean(old_l, response_mask)
    seq = masked_sequence_mean(l, response_mask)
    adv = masked_sequence_mean(advantages, response_mask)
    log_ratio = seq - old_seq
    ratio = torch.exp(log_ratio)
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    pg = torch.maximum(pg1, pg2)
    if clip_ratio_c is not None:
        pg = torch.where(adv < 0, torch.minimum(pg, -adv * clip_ratio_c), pg)
    loss = pg.mean()
    with torch.no_grad():
        low = (ratio < 1 - clip_low) & (adv < 0)
        high = (ratio > 1 + clip_high) & (adv > 0)
        clip_frac = (low | high).float().mean()
        ppo_kl = (-log_ratio).mean()
        clip_frac_lower = low.float().mean()
    return loss, clip_frac, ppo_kl, clip_frac_lower


def espo_kl(sequence_elbo: torch.Tensor, ref_sequence_elbo: torch.Tensor, normalization_length,
            kind: str = "k2") -> torch.Tensor:
    """DARE `compute_espo_kl`: the estimator on the RAW sequence ELBO difference D = E − E_ref, divided by the
    normalisation length R (k1 value D with gradient 1 + D, abs |D|, k2 ½D², k3 e^{−D} + D − 1), per sample."""
    if sequence_elbo.shape != ref_sequence_elbo.shape:
        raise ValueError(f"sequence_elbo {tuple(sequence_elbo.shape)} and ref_sequence_elbo "
                         f"{tuple(ref_sequence_elbo.shape)} differ")
    if normalization_length <= 0:
        raise ValueError(f"normalization_length must be positive, got {normalization_length}")
    d = sequence_elbo - ref_sequence_elbo
    if kind in ("k1", "kl"):
        kl = d + (sequence_elbo - sequence_elbo.detach()) * (sequence_elbo.detach() - ref_sequence_elbo)
    elif kind == "abs":
        kl = d.abs()
    elif kind in ("k2", "mse"):
        kl = 0.5 * d.square()
    elif kind in ("k3", "low_var_kl"):
        kl = torch.exp(-d) + d - 1
    else:
        raise ConfigError(f"unknown ESPO KL estimator {kind!r}; expected one of {list(ESPO_KL)}")
    return kl / normalization_length


# --- the plug-in -------------------------------------------------------------------------------------------------

@register_algorithm
class ESPO(Algorithm):
    name = "espo"
    Config = ESPOConfig
    attention_kinds = ("bidirectional",)  # LLaDA (DARE), Dream (official demo); see the module doc for BDLM

    def validate(self) -> None:
        c = self.config
        if c.advantage not in (None, "mean", "mean_std", "leave_one_out"):
            raise ConfigError(f"espo: unknown advantage {c.advantage!r}")
        if not 0 <= c.clip_eps < 1:
            raise ConfigError(f"espo: need 0 <= clip_eps < 1, got {c.clip_eps}")

    def advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        return group_advantages(rewards, group_size, self.config.advantage or "leave_one_out")

    # --- estimator ------------------------------------------------------------------------------------------------
    def draw(self, batch: RolloutBatch, generator: torch.Generator, num_iterations: int):
        """mc_samples · num_iterations copies: copy it·M + m is MC sample m of update iteration it."""
        from dare_bench.diffusion.masking import espo_batch_masks

        _, attn, p = elbo_layout(batch)
        return espo_batch_masks(attn.cpu(), p, generator=generator, n=self.config.mc_samples * num_iterations,
                                stratify_rows=self.config.stratify_rows,
                                dtype=torch.float32).to(batch.prompt_ids.device)

    @staticmethod
    def _draw(batch: RolloutBatch, rows: dict[str, torch.Tensor]):
        from dare_bench.diffusion.masking import MaskDraw, prompt_response_masks

        _, attn, p = elbo_layout(batch)
        _, response = prompt_response_masks(attn, p)
        return MaskDraw(mask=rows["mask"], p_mask=rows["p_mask"], response_mask=response, scheme="espo",
                        p_complement=rows["p_complement"])

    def copies(self, iteration: int, available: int) -> range:
        M = self.config.mc_samples
        if (iteration + 1) * M > available:
            raise ConfigError(f"espo: update iteration {iteration} has no masks (prepare drew {available // M} "
                              "iterations; num_iterations must cover every update)")
        return range(iteration * M, (iteration + 1) * M)

    def sequence_elbo(self, model, batch: RolloutBatch, rows: dict[str, torch.Tensor], copy: int) -> torch.Tensor:
        """E `[n]`: copy `copy`'s raw sequence ELBO (with its complement when `reduce_var`)."""
        from dare_bench.diffusion.likelihood import elbo_term

        ids, attn, _ = elbo_layout(batch)
        return elbo_term(model, ids, self._draw(batch, rows), copy, attention_mask=attn,
                         reduce_var=self.config.reduce_var, head_chunk_tokens=self.config.lm_head_chunk_tokens).total

    def normalized(self, model, batch: RolloutBatch, rows: dict[str, torch.Tensor], iteration: int) -> torch.Tensor:
        """b `[n]` of one update iteration: mean over its MC copies of E / R (0 for rows without a completion)."""
        R = batch.completion_ids.shape[1]
        per = [self.sequence_elbo(model, batch, rows, k) / R for k in self.copies(iteration, rows["mask"].shape[1])]
        b = torch.stack(per, dim=1).mean(dim=1)
        return torch.where(batch.completion_mask.bool().any(dim=1), b, torch.zeros_like(b))

    @torch.no_grad()
    def prepare(self, batch: RolloutBatch, policy, reference, *, generator: torch.Generator,
                num_iterations: int) -> AlgorithmState:
        I = max(int(num_iterations), 1)
        draw = self.draw(batch, generator, I)
        rows = {"mask": draw.mask, "p_mask": draw.p_mask, "p_complement": draw.p_complement}

        def per_iteration(model, first: int):
            return per_iteration_no_grad(lambda b, r, it: self.normalized(model, b, r, it), batch, rows, I, first,
                                         self.forward_batch_size)

        if I > 1:  # iteration 0 runs at θ = θ_old: its b_old is the b of the update's own no-grad pass
            rows["old"] = per_iteration(policy, 1)
        if self.config.kl_beta > 0:
            if reference is None:
                raise ConfigError("espo with kl_beta > 0 needs a reference model")
            rows["ref"] = per_iteration(with_traits(reference, self.traits), 0)
        return AlgorithmState(rows=rows)

    # --- loss -----------------------------------------------------------------------------------------------------
    def objective(self, b: torch.Tensor, b_old: torch.Tensor, b_ref: torch.Tensor | None, advantages: torch.Tensor,
                  completion_mask: torch.Tensor, R: int):
        """(loss, metrics, kl) of per-token normalised ELBOs `[n]`, broadcast over the response as DARE does."""
        c = self.config
        shape = completion_mask.shape
        expand = lambda v: v.to(b.dtype)[:, None].expand(shape)  # noqa: E731
        mask = completion_mask.to(b.dtype)
        terms = espo_policy_loss(expand(b_old), expand(b), expand(advantages) * mask, completion_mask,
                                 clip_low=c.clip_eps, clip_high=c.clip_eps_high, clip_ratio_c=c.clip_ratio_c)
        kl = None if b_ref is None else espo_kl(b * R, b_ref.to(b.dtype) * R, R, c.kl_estimator).mean()
        return with_kl_term(terms, kl, c.kl_beta)

    def backward(self, policy, batch: RolloutBatch, state: AlgorithmState, advantages: torch.Tensor, *,
                 loss_scale: float, iteration: int) -> dict[str, float]:
        from dare_bench.diffusion.likelihood import elbo_term

        rows = state.rows
        c = self.config
        M = c.mc_samples
        R = batch.completion_ids.shape[1]
        copies = self.copies(iteration, rows["mask"].shape[1])
        with torch.no_grad():
            b_now = self.normalized(policy, batch, rows, iteration)
        b_old = rows["old"][:, iteration] if ("old" in rows and iteration > 0) else b_now.clone()
        b_ref = rows["ref"][:, iteration] if "ref" in rows else None
        loss, metrics, kl, g = proxy_gradient(self.objective, b_now, b_old, b_ref, advantages, batch.completion_mask,
                                              R, loss_scale=loss_scale)
        # ∂loss/∂θ = Σ_n g_n ∂b_n/∂θ, b_n = (1/M) Σ_m E_nm / R, E = ½ (masked half + complement half) with reduce_var
        ids, attn, _ = elbo_layout(batch)
        draw = self._draw(batch, rows)
        valid = batch.completion_mask.bool().any(dim=1)
        g = torch.where(valid, g, torch.zeros_like(g))
        half_weight = 0.5 if c.reduce_var else 1.0
        for k in copies:
            one = draw.select(k)
            halves = [one, one.complement()] if c.reduce_var else [one]
            for half in halves:
                if not bool(half.loss_mask.any()):  # nothing scored in this micro-batch: no gradient
                    continue
                e = elbo_term(policy, ids, half, 0, attention_mask=attn,
                              head_chunk_tokens=self.config.lm_head_chunk_tokens).total
                ((e * g.to(e.dtype)).sum() * (half_weight / (M * R))).backward()
        metrics["loss"] = float(loss.detach())
        if kl is not None:
            metrics["kl"] = float(kl.detach())
        if bool(valid.any()):
            metrics["elbo"] = float(b_now[valid].mean())
            metrics["ratio"] = float(torch.exp(b_now - b_old.to(b_now.dtype))[valid].mean())
        metrics["mc_samples"] = float(M)
        metrics["scored_tokens"] = float(batch.completion_mask.sum())
        return metrics
