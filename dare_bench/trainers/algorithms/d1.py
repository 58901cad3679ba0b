"""d1 / diffu-GRPO (Zhao et al., arXiv 2504.12216): GRPO with the one-step mean-field log-prob estimator.

Official code: `dllm-reasoning/d1` `diffu-grpo/diffu_grpo_trainer.py` (`forward_process`, `_get_per_token_logps`,
`compute_loss`); DARE: `dllm_core_algos.py::_forward_process_d1` + `compute_policy_loss`. Spec: shared/docs/
algorithms.md §3.

Estimator. For inner iteration k a mask is drawn from seed s_k: every completion position is masked (p = 1) and each
real prompt token is masked iid with p = `p_mask_prompt` (0.15); one forward gives ℓ_i = log softmax(f(x̃))_i[o_i]
for every completion token (no 1/p weight). The mask of iteration k is drawn ONCE per rollout batch in `prepare`
(for all rows, whatever the micro-batch size) and shared by ℓ^old, ℓ^ref and ℓ^θ; seeds s_k ~ U{0..4095} from the
loop's generator (`random_masking`), else 42 for every k, as upstream.

Loss (official `compute_loss`): token-level PPO clip with ε (`clip_eps`, `clip_eps_high`), plus β·KL_k3(π‖π_ref)
per token, aggregated token-mean over the micro-batch's scored completion tokens (up to and including the first
EOS). μ = 1 uses ℓ.detach() as ℓ^old (ratio ≡ 1), so `prepare` skips the old forward. Advantage: r − mean_group(r)
(`advantage: mean`, d1) or the verl/DARE (r − mean)/(std + 1e-6) (`advantage: mean_std`).

Iteration k of every micro-batch uses seed s_k. (Upstream TRL indexes the seed by a micro-batch counter modulo μ,
so which of the μ seeds a micro-batch meets at a given update differs; each update still pairs ℓ^θ with the ℓ^old of
the same mask, as here.)

Where this follows DARE instead of upstream d1, it is a setting: `clip_ratio_c` (verl dual clip; d1: None),
`kl_variant: dare` (DARE's advantage-dependent KL transform; d1: `standard`), `advantage: mean_std`.
One deliberate difference from both: the model gets the batch's padding mask (upstream d1 calls the model without
one; DARE packs sequences), so left-padded prompts do not attend to pad tokens.

Knobs (`train.algorithm` in a reproduction YAML, see `dare_bench/catalogue/knobs/d1.py`): p_mask_prompt, random_masking,
kl_variant.
"""

from __future__ import annotations

import torch

from dare_bench.catalogue.knobs.d1 import D1Config
from dare_bench.errors import ConfigError
from dare_bench.trainers.algorithms.base import (
    Algorithm,
    AlgorithmState,
    RolloutBatch,
    register_algorithm,
)
from dare_bench.trainers.algorithms.common import (
    agg_loss,
    dare_kl_penalty,
    group_advantages,
    iteration_mask_seeds,
    kl_estimate,
    model_logits,
    policy_loss,
    token_logprobs,
)


@register_algorithm
class D1(Algorithm):
    name = "d1"
    Config = D1Config
    attention_kinds = ("bidirectional",)  # one-step mean-field over a fully masked completion: MDLM backbones

    def validate(self) -> None:
        c = self.config
        if c.mc_samples != 1:
            raise ConfigError(f"d1 uses exactly one mask per sequence per iteration (mc_samples=1); got "
                              f"mc_samples={c.mc_samples}. Use an ELBO-based algorithm (bgpo, spg, ...) for more.")
        if c.advantage not in (None, "mean", "mean_std"):
            raise ConfigError(f"d1 advantage must be 'mean' (d1) or 'mean_std' (DARE), got {c.advantage!r}")

    # --- advantages -----------------------------------------------------------------------------------------------
    def advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        return group_advantages(rewards, group_size, self.config.advantage or "mean")

    # --- estimator ------------------------------------------------------------------------------------------------
    def mask_seeds(self, generator: torch.Generator, num_iterations: int) -> list[int]:
        return iteration_mask_seeds(generator, num_iterations, self.config.random_masking)

    def draw_masks(self, batch: RolloutBatch, seed: int) -> torch.Tensor:
        """bool `[N, P + C]`: prompt tokens masked w.p. p_mask_prompt, every completion position masked."""
        from dare_bench.diffusion.masking import d1_masks

        g = torch.Generator().manual_seed(int(seed))
        draw = d1_masks(batch.attention_mask.cpu(), batch.prompt_ids.shape[1], generator=g,
                        p_prompt=self.config.p_mask_prompt)
        return draw.mask[:, 0].to(batch.prompt_ids.device)

    def completion_logprobs(self, model, batch: RolloutBatch, mask: torch.Tensor, *, with_entropy: bool = False):
        """ℓ `[n, C]` of the completion tokens under `model` with the positions in `mask` replaced by [MASK]."""
        ids = batch.input_ids
        noisy = torch.where(mask, torch.as_tensor(self.traits.mask_token_id, device=ids.device), ids)
        p = batch.prompt_ids.shape[1]
        chunk = self.config.lm_head_chunk_tokens
        if chunk is not None:  # the completion positions only, through the chunked LM head
            from dare_bench.diffusion.likelihood import scored_token_logprobs
            from dare_bench.trainers.algorithms.bgpo import with_traits

            scored = torch.zeros_like(ids, dtype=torch.bool)
            scored[:, p:] = True
            out = scored_token_logprobs(with_traits(model, self.traits), noisy, ids, scored, chunk_tokens=chunk,
                                        attention_mask=batch.attention_mask, left_align=False,
                                        with_entropy=with_entropy)
            return tuple(x[:, p:] for x in out) if with_entropy else out[:, p:]
        logits = model_logits(model, noisy, batch.attention_mask, logit_shift=self.traits.logit_shift)
        return token_logprobs(logits[:, p:], batch.completion_ids, with_entropy=with_entropy)

    @torch.no_grad()
    def prepare(self, batch: RolloutBatch, policy, reference, *, generator: torch.Generator,
                num_iterations: int) -> AlgorithmState:
        seeds = self.mask_seeds(generator, num_iterations)
        masks = torch.stack([self.draw_masks(batch, s) for s in seeds], dim=1)  # [N, μ, L]
        rows: dict[str, torch.Tensor] = {"masks": masks}
        need_old = num_iterations > 1
        need_ref = self.config.kl_beta > 0
        if need_ref and reference is None:
            raise ConfigError("d1 with kl_beta > 0 needs a reference model")
        chunk = self.forward_batch_size or batch.num_rows
        for key, model, needed in (("old_logp", policy, need_old), ("ref_logp", reference, need_ref)):
            if not needed:
                continue
            per_it = []
            for k in range(num_iterations):
                parts = [self.completion_logprobs(model, batch.select(slice(a, a + chunk)), masks[a:a + chunk, k])
                         for a in range(0, batch.num_rows, chunk)]
                per_it.append(torch.cat(parts, dim=0))
            rows[key] = torch.stack(per_it, dim=1)  # [N, μ, C]
        return AlgorithmState(rows=rows, shared={"mask_seeds": seeds})

    # --- loss -----------------------------------------------------------------------------------------------------
    def loss_terms(self, logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
                   advantages: torch.Tensor, completion_mask: torch.Tensor):
        """The official d1 objective on per-token log-probs `[n, C]`; returns (loss, metrics)."""
        c = self.config
        out = policy_loss(old_logp, logp, advantages, completion_mask, clip_low=c.clip_eps,
                          clip_high=c.clip_eps_high, clip_ratio_c=c.clip_ratio_c, agg=c.loss_agg, ref_logp=ref_logp)
        loss = out.loss
        metrics = {"pg_loss": float(out.loss.detach()), "clip_frac": float(out.clip_frac),
                   "clip_frac_lower": float(out.clip_frac_lower), "ppo_kl": float(out.ppo_kl.detach())}
        if c.kl_beta > 0:
            if ref_logp is None:
                raise ConfigError("d1 with kl_beta > 0 needs reference log-probs")
            if c.kl_variant == "dare":
                kl = dare_kl_penalty(logp, ref_logp, c.kl_estimator, advantages)
            else:  # the d1 trainer: exp(ℓ_ref − ℓ) − (ℓ_ref − ℓ) − 1, unclamped
                kl = kl_estimate(logp, ref_logp, c.kl_estimator, clamp=None)
            kl_loss = agg_loss(kl, completion_mask, c.loss_agg)
            loss = loss + c.kl_beta * kl_loss
            metrics["kl"] = float(kl_loss.detach())
        metrics["loss"] = float(loss.detach())
        return loss, metrics

    def backward(self, policy, batch: RolloutBatch, state: AlgorithmState, advantages: torch.Tensor, *,
                 loss_scale: float, iteration: int) -> dict[str, float]:
        mask = state.rows["masks"][:, iteration]
        logp, entropy = self.completion_logprobs(policy, batch, mask, with_entropy=True)
        old = state.rows["old_logp"][:, iteration] if "old_logp" in state.rows else logp.detach()
        ref = state.rows["ref_logp"][:, iteration] if "ref_logp" in state.rows else None
        cmask = batch.completion_mask
        loss, metrics = self.loss_terms(logp, old, ref, advantages.to(logp.dtype), cmask)
        (loss * loss_scale).backward()
        metrics["entropy"] = float(agg_loss(entropy, cmask, "token-mean"))  # entropy carries no gradient
        metrics["scored_tokens"] = float(cmask.sum())
        return metrics
