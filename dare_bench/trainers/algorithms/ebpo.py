"""EBPO — ELBO-based Block-level Policy Optimisation (LLaDA2.1 report, arXiv 2602.08676) for block diffusion.

Official RL code is closed; this follows DARE's reading (`dllm_core_algos.py::_forward_process_ebpo`,
`compute_ebpo_composite_elbo`, `compute_policy_loss_ebpo`, `compute_ebpo_kl`; `verl/workers/actor/
ebpo_actor_mixin.py`, `sdar_dp_actor_ebpo.py`). Spec: shared/docs/algorithms.md §8.

Corruption (`masking.ebpo_block_masks`): one stratified noise level per (MC row, block); every MC row masks >= 1
token in EVERY completion block, so one block-causal forward (BD3 `[x_t ; x_0]` layout) scores all blocks. Drawn once
per rollout batch in `prepare`, shared by θ_old, θ and the reference.

Composite ELBO: B(θ) = Σ_n w_n Σ_b ELBO[n, b], ELBO[n, b] = Σ_{i ∈ b masked in row n} log p_θ(x_i | x̃_n) / p
(unnormalised: DARE's SDAR actor undoes SDAR's per-token normalisation), w_n = 1/N.

Loss: one PPO step on the sequence-level ratio, clipped in log space (exactly PPO's max(−Aρ, −A clip(ρ)) but never
exponentiating an unclipped large log-ratio on the clipped side):
    Δ = B_θ − B_old;  A ≥ 0: Δ' = min(Δ, log(1 + ε_high));  A < 0: Δ' = max(Δ, log(1 − ε_low))
    loss = mean over samples with a response of −A·exp(Δ')        (loss_agg is not used, as DARE)
DARE has no dual clip, so A < 0 with a large positive Δ overflows to +inf (fixture `loss_negative_adv_overflow`);
`clip_ratio_c` (off by default) adds verl's dual clip as Δ' ≤ log c for A < 0.

Backward (DARE's "composite proxy"): the composite objective is first evaluated without a graph, its gradient
g = ∂loss/∂B is taken w.r.t. a detached copy of B, then every MC row n is re-run with a graph and
(g · ELBO_n / N).sum() back-propagated on its own — memory O(1) in N at the price of 2N forwards.
μ = 1 takes B_old from that first (no-grad) pass, so `prepare` needs no forward then.
KL (off in recipes): DARE `compute_ebpo_kl` on B_θ − B_ref (k1 | abs | k2 | k3, no clamp), mean over samples.
"""

from __future__ import annotations

import math

import torch

from dare_bench.catalogue.knobs.ebpo import EBPOConfig
from dare_bench.errors import ConfigError
from dare_bench.trainers.algorithms.base import (
    Algorithm,
    AlgorithmState,
    RolloutBatch,
    register_algorithm,
)
from dare_bench.trainers.algorithms.bgpo import chunked_no_grad, draw_to_rows, elbo_layout, rows_to_draw, with_traits
from dare_bench.trainers.algorithms.common import group_advantages, proxy_gradient, with_kl_term

EBPO_KL = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")


def composite_elbo(contributions: torch.Tensor, contribution_mask: torch.Tensor | None = None,
                   timestep_weights: torch.Tensor | None = None) -> torch.Tensor:
    """DARE `compute_ebpo_composite_elbo`: `[B, N, ...]` contributions -> `[B]`.

    per_row[b, n] = Σ over the trailing dims of the (masked) contributions; composite = mean_n per_row, or
    Σ_n w[n] per_row (w `[N]` or `[B, N]`, not renormalised).
    """
    if contributions.dim() < 2:
        raise ValueError(f"contributions must be [B, N, ...], got {tuple(contributions.shape)}")
    vals = contributions
    if contribution_mask is not None:
        vals = vals * contribution_mask.to(vals.dtype)
    per_row = vals.reshape(vals.shape[0], vals.shape[1], -1).sum(dim=-1)
    if timestep_weights is None:
        return per_row.mean(dim=1)
    w = timestep_weights.to(per_row.dtype)
    if w.dim() == 1:
        w = w[None, :]
    return (per_row * w).sum(dim=1)


def ebpo_policy_loss(old_l: torch.Tensor, l: torch.Tensor, advantages: torch.Tensor, sample_mask: torch.Tensor, *,
                     clip_low: float = 0.2, clip_high: float | None = None, clip_ratio_c: float | None = None):
    """Sequence-level log-space clipped loss on `[B]` composite ELBOs; returns (loss, clip_frac, ppo_kl,
    clip_frac_lower). Samples outside `sample_mask` are removed before anything is exponentiated."""
    if clip_high is None:
        clip_high = clip_low
    keep = sample_mask.bool()
    d = l[keep] - old_l[keep]
    a = advantages[keep].to(d.dtype)
    hi, lo = math.log1p(clip_high), math.log1p(-clip_low)
    pos = a >= 0
    eff = torch.where(pos, d.clamp(max=hi), d.clamp(min=lo))
    if clip_ratio_c is not None:
        eff = torch.where(pos, eff, eff.clamp(max=math.log(clip_ratio_c)))
    loss = (-a * torch.exp(eff)).mean()
    with torch.no_grad():
        upper = pos & (d > hi)
        lower = ~pos & (d < lo)
        clip_frac = (upper | lower).float().mean()
        clip_frac_lower = lower.float().mean()
        ppo_kl = (-d).mean()
    return loss, clip_frac, ppo_kl, clip_frac_lower


def ebpo_kl(sequence_elbo: torch.Tensor, ref_sequence_elbo: torch.Tensor, kind: str = "k2") -> torch.Tensor:
    """DARE `compute_ebpo_kl`: per-sample estimator of Δ = B − B_ref (k1 Δ, abs |Δ|, k2 ½Δ², k3 e^{−Δ} + Δ − 1)."""
    d = sequence_elbo - ref_sequence_elbo
    if kind in ("k1", "kl"):
        return d
    if kind == "abs":
        return d.abs()
    if kind in ("k2", "mse"):
        return 0.5 * d.square()
    if kind in ("k3", "low_var_kl"):
        return torch.exp(-d) + d - 1
    raise ConfigError(f"unknown EBPO KL estimator {kind!r}; expected one of {list(EBPO_KL)}")


@register_algorithm
class EBPO(Algorithm):
    name = "ebpo"
    Config = EBPOConfig
    attention_kinds = ("block_causal",)  # a composite over blocks needs block-causal attention (SDAR, LLaDA2)

    def validate(self) -> None:
        c = self.config
        n_l = c.n_l or c.mc_samples
        if c.mc_samples % n_l:
            raise ConfigError(f"ebpo: mc_samples ({c.mc_samples}) must be a multiple of n_l ({n_l})")
        if c.block_length is not None and c.block_length != self.traits.block_size:
            raise ConfigError(f"ebpo: block_length {c.block_length} must match the backbone's block size "
                              f"{self.traits.block_size} (blocks of the composite are the attention blocks)")
        if not 0 < c.clip_eps < 1 or (c.clip_eps_high is not None and c.clip_eps_high <= 0):
            raise ConfigError(f"ebpo: need 0 < clip_eps < 1 and clip_eps_high > 0, got {c.clip_eps}, {c.clip_eps_high}")
        if c.advantage not in (None, "mean", "mean_std", "leave_one_out"):
            raise ConfigError(f"ebpo: unknown advantage {c.advantage!r}")

    def advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        return group_advantages(rewards, group_size, self.config.advantage or "mean_std")

    # --- estimator ------------------------------------------------------------------------------------------------
    def draw(self, batch: RolloutBatch, generator: torch.Generator):
        from dare_bench.diffusion.masking import ebpo_block_masks

        _, attn, p = elbo_layout(batch)
        c = self.config
        n_l = c.n_l or c.mc_samples
        return ebpo_block_masks(attn.cpu(), p, generator=generator, block_length=self.traits.block_size, n=n_l,
                                repeats=c.mc_samples // n_l, block_origin=c.block_origin,
                                dtype=torch.float32).to(batch.prompt_ids.device)

    def row_elbo(self, model, batch: RolloutBatch, rows: dict[str, torch.Tensor], copy: int) -> torch.Tensor:
        """Σ_b ELBO[n, b] `[n_rows]` of MC row `copy` (the sum over blocks is the sum over masked tokens)."""
        from dare_bench.diffusion.likelihood import elbo_term

        ids, attn, p = elbo_layout(batch)
        term = elbo_term(model, ids, rows_to_draw(rows, attn, p, "ebpo"), copy, attention_mask=attn,
                         head_chunk_tokens=self.config.lm_head_chunk_tokens)
        return term.total

    def composite(self, model, batch: RolloutBatch, rows: dict[str, torch.Tensor]) -> torch.Tensor:
        per_row = torch.stack([self.row_elbo(model, batch, rows, k) for k in range(rows["mask"].shape[1])], dim=1)
        return composite_elbo(per_row)

    @torch.no_grad()
    def prepare(self, batch: RolloutBatch, policy, reference, *, generator: torch.Generator,
                num_iterations: int) -> AlgorithmState:
        rows = draw_to_rows(self.draw(batch, generator))
        if num_iterations > 1:
            rows["old_composite"] = chunked_no_grad(lambda b, r: self.composite(policy, b, r), batch, dict(rows),
                                                    self.forward_batch_size)
        if self.config.kl_beta > 0:
            if reference is None:
                raise ConfigError("ebpo with kl_beta > 0 needs a reference model")
            ref = with_traits(reference, self.traits)
            rows["ref_composite"] = chunked_no_grad(lambda b, r: self.composite(ref, b, r), batch, dict(rows),
                                                    self.forward_batch_size)
        return AlgorithmState(rows=rows)

    # --- loss -----------------------------------------------------------------------------------------------------
    def objective(self, B: torch.Tensor, B_old: torch.Tensor, B_ref: torch.Tensor | None, advantages: torch.Tensor,
                  sample_mask: torch.Tensor):
        c = self.config
        terms = ebpo_policy_loss(B_old, B, advantages, sample_mask, clip_low=c.clip_eps, clip_high=c.clip_eps_high,
                                 clip_ratio_c=c.clip_ratio_c)
        kl = None if B_ref is None else ebpo_kl(B, B_ref.to(B.dtype), c.kl_estimator)[sample_mask].mean()
        return with_kl_term(terms, kl, c.kl_beta)

    def backward(self, policy, batch: RolloutBatch, state: AlgorithmState, advantages: torch.Tensor, *,
                 loss_scale: float, iteration: int) -> dict[str, float]:
        rows = state.rows
        N = rows["mask"].shape[1]
        sample_mask = batch.completion_mask.bool().any(dim=1)
        with torch.no_grad():
            B_now = self.composite(policy, batch, rows)
        B_old = rows["old_composite"] if "old_composite" in rows else B_now.clone()
        loss, metrics, kl, g = proxy_gradient(self.objective, B_now, B_old, rows.get("ref_composite"), advantages,
                                              sample_mask, loss_scale=loss_scale)
        # the chain rule split over MC rows: ∂loss/∂θ = Σ_n g · ∂B/∂ELBO_n · ∂ELBO_n/∂θ with ∂B/∂ELBO_n = 1/N
        for k in range(N):
            e = self.row_elbo(policy, batch, rows, k)
            ((e * g.to(e.dtype)).sum() / N).backward()
        metrics["loss"] = float(loss.detach())
        if kl is not None:
            metrics["kl"] = float(kl.detach())
        metrics["elbo"] = float(B_now[sample_mask].mean()) if bool(sample_mask.any()) else 0.0
        metrics["log_ratio"] = float((B_now - B_old)[sample_mask].mean()) if bool(sample_mask.any()) else 0.0
        metrics["mc_samples"] = float(N)
        metrics["scored_tokens"] = float(batch.completion_mask.sum())
        return metrics
