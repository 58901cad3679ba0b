"""Coupled-GRPO (DiffuCoder, Gong et al., arXiv 2506.20639): GRPO with complementary-mask log-prob estimates.

Official code: `apple/ml-diffucoder` `src/open_r1/coupled_grpo.py` (`forward_process`, `_get_per_token_logps`,
`compute_loss`); DARE: `dllm_core_algos.py::_forward_process_coupled_grpo`, `llada_dp_actor_coupled_grpo.py`.
Spec: shared/docs/algorithms.md §4.

Estimator (`masking.coupled_masks` + `likelihood.coupled_token_logprobs`): per inner iteration one mask ratio
t ~ U(0.2, 0.8) shared by the batch (upstream: one `random.uniform` per call) and U_i ~ U(0,1) per position; three
copies — completion fully masked (p = 1), U < t masked (p = t), U > t masked (p = 1 − t); the prompt is never masked.
Each completion token is predicted in the full copy and in exactly ONE of the two coupled copies:
    ℓ_i = ½ [ log p(x_i | all masked) + log p(x_i | coupled copy) / p ]
(an importance-weighted score, not a normalised log-prob; ratios are exp of its differences). The masks of iteration
k are drawn once per rollout batch in `prepare` from seed s_k (d1-style `random_masking`; else 42 every iteration)
and shared by ℓ^old, ℓ^ref and ℓ^θ.

Loss: token-level PPO clip with asymmetric ε (`clip_eps`, `clip_eps_high`; DiffuCoder ε = 0.5, no dual clip; DARE's
dual clip via `clip_ratio_c`), plus β·k3 KL to the reference, token-mean over the scored completion tokens;
leave-one-out advantages without std scaling. μ = 1 uses ℓ.detach() as ℓ^old.

Layout as DARE (whose actor packs valid tokens): completion positions after the first EOS are padding — hidden,
never masked, never scored. One pair per sequence (the paper's λ = 1): `mc_samples` must be 1.
"""

from __future__ import annotations

import torch

from dare_bench.catalogue.knobs.coupled_grpo import CoupledGRPOConfig
from dare_bench.errors import ConfigError
from dare_bench.trainers.algorithms.base import (
    Algorithm,
    AlgorithmState,
    RolloutBatch,
    register_algorithm,
)
from dare_bench.trainers.algorithms.bgpo import elbo_layout, with_traits
from dare_bench.trainers.algorithms.common import (
    agg_loss,
    dare_kl_penalty,
    group_advantages,
    iteration_mask_seeds,
    kl_estimate,
    policy_loss,
)


@register_algorithm
class CoupledGRPO(Algorithm):
    name = "coupled_grpo"
    Config = CoupledGRPOConfig
    attention_kinds = ("bidirectional",)  # DiffuCoder (Dream) and DARE's LLaDA / Dream actors

    def validate(self) -> None:
        c = self.config
        if c.mc_samples != 1:
            raise ConfigError(f"coupled_grpo evaluates one complementary pair per sequence (mc_samples=1); "
                              f"got mc_samples={c.mc_samples}")
        if not c.t_min <= c.t_max:
            raise ConfigError(f"coupled_grpo: need t_min <= t_max, got {c.t_min}, {c.t_max}")
        if c.pairs != 1:
            raise ConfigError(f"coupled_grpo: pairs={c.pairs} is not implemented; the official code and DARE use "
                              "one complementary pair per sample (λ = 1), which is what this plug-in computes")
        if c.advantage not in (None, "leave_one_out", "mean", "mean_std"):
            raise ConfigError(f"coupled_grpo: unknown advantage {c.advantage!r}")

    def advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        return group_advantages(rewards, group_size, self.config.advantage or "leave_one_out")

    # --- estimator ------------------------------------------------------------------------------------------------
    def mask_seeds(self, generator: torch.Generator, num_iterations: int) -> list[int]:
        return iteration_mask_seeds(generator, num_iterations, self.config.random_masking)

    def draw(self, batch: RolloutBatch, seed: int):
        """The three coupled copies of iteration seed `seed`; one t for the whole batch, as upstream."""
        from dare_bench.diffusion.masking import coupled_masks

        c = self.config
        _, attn, p = elbo_layout(batch)
        g = torch.Generator().manual_seed(int(seed))
        t = c.t_min + (c.t_max - c.t_min) * float(torch.rand((), generator=g, dtype=torch.float64))
        return coupled_masks(attn.cpu(), p, generator=g, t=t, dtype=torch.float32).to(batch.prompt_ids.device)

    def completion_logprobs(self, model, batch: RolloutBatch, mask: torch.Tensor, p_mask: torch.Tensor):
        """ℓ `[n, C]` of the completion tokens for the copies `mask` / `p_mask` `[n, 3, L]` (0 on padding)."""
        from dare_bench.diffusion.likelihood import coupled_token_logprobs
        from dare_bench.diffusion.masking import MaskDraw, prompt_response_masks

        ids, attn, p = elbo_layout(batch)
        _, response = prompt_response_masks(attn, p)
        draw = MaskDraw(mask=mask, p_mask=p_mask, response_mask=response, scheme="coupled")
        return coupled_token_logprobs(model, ids, draw, attention_mask=attn,
                                      head_chunk_tokens=self.config.lm_head_chunk_tokens).token_logprobs[:, p:]

    @torch.no_grad()
    def prepare(self, batch: RolloutBatch, policy, reference, *, generator: torch.Generator,
                num_iterations: int) -> AlgorithmState:
        seeds = self.mask_seeds(generator, num_iterations)
        draws = [self.draw(batch, s) for s in seeds]
        rows = {"mask": torch.stack([d.mask for d in draws], dim=1),  # [N, μ, 3, L]
                "p_mask": torch.stack([d.p_mask for d in draws], dim=1)}
        need_ref = self.config.kl_beta > 0
        if need_ref and reference is None:
            raise ConfigError("coupled_grpo with kl_beta > 0 needs a reference model")
        chunk = self.forward_batch_size or batch.num_rows
        for key, model, needed in (("old_logp", policy, num_iterations > 1), ("ref_logp", reference, need_ref)):
            if not needed:
                continue
            model = with_traits(model, self.traits)
            per_it = []
            for k in range(num_iterations):
                parts = [self.completion_logprobs(model, batch.select(slice(a, a + chunk)),
                                                  rows["mask"][a:a + chunk, k], rows["p_mask"][a:a + chunk, k])
                         for a in range(0, batch.num_rows, chunk)]
                per_it.append(torch.cat(parts, dim=0))
            rows[key] = torch.stack(per_it, dim=1)  # [N, μ, C]
        return AlgorithmState(rows=rows, shared={"mask_seeds": seeds})

    # --- loss -----------------------------------------------------------------------------------------------------
    def backward(self, policy, batch: RolloutBatch, state: AlgorithmState, advantages: torch.Tensor, *,
                 loss_scale: float, iteration: int) -> dict[str, float]:
        c = self.config
        rows = state.rows
        logp = self.completion_logprobs(policy, batch, rows["mask"][:, iteration], rows["p_mask"][:, iteration])
        old = rows["old_logp"][:, iteration] if "old_logp" in rows else logp.detach()
        ref = rows["ref_logp"][:, iteration] if "ref_logp" in rows else None
        cmask = batch.completion_mask
        adv = advantages.to(logp.dtype)
        out = policy_loss(old, logp, adv, cmask, clip_low=c.clip_eps, clip_high=c.clip_eps_high,
                          clip_ratio_c=c.clip_ratio_c, agg=c.loss_agg, ref_logp=ref)
        loss = out.loss
        metrics = {"pg_loss": float(out.loss.detach()), "clip_frac": float(out.clip_frac),
                   "clip_frac_lower": float(out.clip_frac_lower), "ppo_kl": float(out.ppo_kl.detach())}
        if c.kl_beta > 0:
            if c.kl_variant == "dare":
                kl = dare_kl_penalty(logp, ref, c.kl_estimator, adv)
            else:  # DiffuCoder: exp(ℓ_ref − ℓ) − (ℓ_ref − ℓ) − 1, unclamped
                kl = kl_estimate(logp, ref, c.kl_estimator, clamp=None)
            kl_loss = agg_loss(kl, cmask, c.loss_agg)
            loss = loss + c.kl_beta * kl_loss
            metrics["kl"] = float(kl_loss.detach())
        (loss * loss_scale).backward()
        metrics["loss"] = float(loss.detach())
        metrics["scored_tokens"] = float(cmask.sum())
        return metrics
