"""SPG — Sandwiched Policy Gradient (Wang et al., arXiv 2510.09541).

Official code: `facebookresearch/SPG` `spg/spg_trainer.py`; DARE: `dllm_core_algos.py::_forward_process_spg`,
`compute_policy_loss_spg`, `verl/workers/actor/llada_dp_actor_spg.py::_forward_micro_batch`. Spec:
shared/docs/algorithms.md §5.

Masks (`masking.spg_block_masks`): per sequence and draw, a random block k among those holding completion tokens;
earlier positions (prompt and earlier blocks) masked w.p. p_mask_prompt, block k gets m ~ U{..} masks, later blocks
and post-completion padding fully masked. `num_t` (else `mc_samples`; 2 upstream) draws per sequence per inner
iteration, drawn in `prepare` from one seed per iteration (d1-style `random_masking`, else seed 42 every iteration).

Sequence surrogates (per draw j, M_j = masked valid completion tokens, over the C completion columns):
    ELBO-type  L_lo = mean_j [ Σ_{i∈M_j} log p_θ(x_i | x̃_j) / |M_j| ]                (no 1/t weight, as official)
    EUBO-type  q_i = mean_j [ p_θ(x_i | x̃_j)^β · 1[i∈M_j] / t_j ],  t_j = |M_j| / #valid
               L_up = (1/β) · mean_{i: q_i > 0} log q_i
    mixture    ω·L_up + (1 − ω)·L_lo                                                     (`variant: mixture`)
    L = L_lo where A > 0, else the chosen negative surrogate (`variant`: elbo | eubo | mixture | zero).
Loss (REINFORCE; no ratio, no clip, no KL): −Σ_b A_b · L_b · |o_b| / Σ_b |o_b| over the micro-batch.
The shared clip settings (clip_eps, clip_eps_high, clip_ratio_c, loss_agg) are accepted and unused, as in DARE,
whose SPG recipes inherit them from the common MDLM settings; a KL coefficient is refused (upstream raises).

About the sandwich: the ELBO side is a true bound — with one block and m ~ U{1..len}, E[L_lo] = ELBO/len ≤
log p(x)/len for the any-order likelihood p(x) = E_σ Π_k p(x_σk | x_σ<k). The exact upper side is the Rényi bound
(1/β) log E_σ[(Π_k p(x_σk | x_σ<k))^β] ≥ log p(x) (β ≥ 1). The official per-token EUBO surrogate above is a
tractable stand-in for it and is NOT itself an upper bound (tests/trainers/test_spg.py shows a brute-forced toy
where it lies below log p at β = 1); it is implemented as the official code computes it.

Layout: completion positions after the first EOS are padding (DARE packs valid tokens): never attended to, never
scored (SPG masks them as "after the completion" but they are hidden and excluded from every sum).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dare_bench.catalogue.knobs.spg import SPGConfig
from dare_bench.errors import ConfigError
from dare_bench.trainers.algorithms.base import (
    Algorithm,
    AlgorithmState,
    RolloutBatch,
    register_algorithm,
)
from dare_bench.trainers.algorithms.bgpo import elbo_layout
from dare_bench.trainers.algorithms.common import group_advantages, iteration_mask_seeds


def spg_sequence_logps(per_token_logps: torch.Tensor, per_token_probs: torch.Tensor, perturb: torch.Tensor,
                       completion_mask: torch.Tensor, reward_mask: torch.Tensor, *, mode: str = "mix",
                       beta: float = 1.5, mix_weight: float = 0.5) -> dict[str, torch.Tensor]:
    """The official SPG surrogates from per-draw token terms `[B, n, R]` (log p, p, masked-or-not), the valid
    completion mask `[B, R]` and `reward_mask` `[B]` (A > 0). Returns `elbo`, `eubo` (None unless eubo/mix),
    `negative` and `seq` (the selected per-sequence value), each `[B]`. Operation order as the official actor."""
    cm = completion_mask[:, None, :].expand_as(perturb)
    both = cm * perturb
    denominator = both.sum(dim=2)
    if bool((denominator == 0).any()):
        denominator = torch.clamp(denominator, min=1e-8)
    per_draw = (per_token_logps * cm * perturb).sum(dim=2) / denominator
    elbo = per_draw.mean(dim=1)
    eubo = None
    if mode in ("eubo", "mix"):
        # int / int divides in torch's default dtype upstream (float32 in production); the token terms' dtype here
        dt = per_token_probs.dtype
        t_emp = both.sum(dim=2).to(dt) / cm.sum(dim=2).to(dt)
        avg = per_token_probs.pow(beta) * perturb * cm / t_emp[:, :, None].expand_as(perturb).clamp(min=1e-8)
        avg = avg.mean(dim=1)
        dezero = avg.clone()
        dezero[dezero == 0] = 1
        keep = (avg > 0).bool()
        eubo = (dezero.log() * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1e-8) / beta
    if mode == "elbo":
        negative = elbo
    elif mode == "eubo":
        negative = eubo
    elif mode == "mix":
        negative = mix_weight * eubo + (1 - mix_weight) * elbo
    elif mode == "zero":
        negative = torch.zeros_like(elbo)
    else:
        raise ConfigError(f"unknown SPG logp_estimation {mode!r}")
    seq = reward_mask.float() * elbo + (~reward_mask).float() * negative
    return {"elbo": elbo, "eubo": eubo, "negative": negative, "seq": seq}


def spg_policy_loss(log_prob: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """DARE `compute_policy_loss_spg`: −Σ_b Ā_b L_b |o_b| / max(Σ_b |o_b|, 1), Ā_b = Σ_t A·m / max(|o_b|, 1).

    log_prob: `[1, B]` or `[B]`; advantages `[B, R]` (token-broadcast) or `[B]`."""
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand(-1, response_mask.shape[1])
    completion_length = response_mask.sum(dim=1)
    sequence_advantages = (advantages * response_mask).sum(dim=1) / completion_length.clamp_min(1)
    per_seq_loss = -sequence_advantages.unsqueeze(0) * log_prob.reshape(1, -1)
    return (per_seq_loss * completion_length.unsqueeze(0)).sum() / completion_length.sum().clamp_min(1)


@register_algorithm
class SPG(Algorithm):
    name = "spg"
    Config = SPGConfig
    attention_kinds = ("bidirectional",)  # official and DARE: LLaDA / Dream actors

    def validate(self) -> None:
        c = self.config
        if c.kl_beta != 0:
            raise ConfigError("spg has no KL term (the official code raises for a KL coefficient); set kl_beta: 0")
        if c.min_t > c.max_t:
            raise ConfigError(f"spg: min_t ({c.min_t}) > max_t ({c.max_t})")
        if c.advantage not in (None, "mean", "mean_std", "leave_one_out"):
            raise ConfigError(f"spg: unknown advantage {c.advantage!r}")
        if c.num_t is not None and "mc_samples" in c.model_fields_set and c.mc_samples not in (1, c.num_t):
            raise ConfigError(f"spg: num_t ({c.num_t}) and mc_samples ({c.mc_samples}) disagree; set one")
        if c.variant in ("eubo", "mixture") and c.eubo_beta < 1:
            raise ConfigError(f"spg: the EUBO needs eubo_beta >= 1, got {c.eubo_beta}")

    def unread_settings(self) -> dict[str, str]:
        if self.config.num_t in (None, self.config.mc_samples):  # equal: the override agrees with what is drawn
            return {}
        return {"mc_samples": f"spg draws num_t = {self.config.num_t} mask sets when num_t is set; "
                              "set train.algorithm.num_t (with train.mc_samples equal to it)"}

    def advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        return group_advantages(rewards, group_size, self.config.advantage or "mean")

    @property
    def num_draws(self) -> int:
        return self.config.num_t or self.config.mc_samples

    def mask_seeds(self, generator: torch.Generator, num_iterations: int) -> list[int]:
        return iteration_mask_seeds(generator, num_iterations, self.config.random_masking)

    def draw(self, batch: RolloutBatch, seed: int):
        from dare_bench.diffusion.masking import spg_block_masks

        c = self.config
        _, attn, p = elbo_layout(batch)
        g = torch.Generator().manual_seed(int(seed))
        return spg_block_masks(attn.cpu(), p, generator=g, block_length=c.mask_block_length, n=self.num_draws,
                               min_t=c.min_t, max_t=c.max_t, mask_prompt=c.use_mask_prompt,
                               p_prompt=c.p_mask_prompt, dtype=torch.float32).to(batch.prompt_ids.device)

    @torch.no_grad()
    def prepare(self, batch: RolloutBatch, policy, reference, *, generator: torch.Generator,
                num_iterations: int) -> AlgorithmState:
        seeds = self.mask_seeds(generator, num_iterations)
        masks = torch.stack([self.draw(batch, s).mask for s in seeds], dim=1)  # [N, μ, n, L]
        return AlgorithmState(rows={"masks": masks}, shared={"mask_seeds": seeds})

    def token_terms(self, model, batch: RolloutBatch, masks: torch.Tensor):
        """(log p, p) `[n_rows, n, C]` of the completion tokens under each draw `masks` `[n_rows, n, L]`."""
        from dare_bench.diffusion.likelihood import aligned_logits

        ids, attn, p = elbo_layout(batch)
        logps, probs = [], []
        chunk = self.config.lm_head_chunk_tokens
        for j in range(masks.shape[1]):
            noisy = torch.where(masks[:, j], torch.as_tensor(self.traits.mask_token_id, device=ids.device), ids)
            if chunk is not None:  # the completion tokens only, through the chunked LM head; p = exp(log p)
                from dare_bench.diffusion.likelihood import scored_token_logprobs

                scored = torch.zeros_like(ids, dtype=torch.bool)
                scored[:, p:] = True
                lp = scored_token_logprobs(model, noisy, ids, scored, chunk_tokens=chunk, attention_mask=attn,
                                           clean_ids=ids)[:, p:]
                logps.append(lp)
                probs.append(lp.exp())
                continue
            logits = aligned_logits(model, noisy, attention_mask=attn, clean_ids=ids)[:, p:]
            if logits.dtype in (torch.float16, torch.bfloat16):
                logits = logits.float()
            tgt = ids[:, p:]
            logps.append(-F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                                          reduction="none").view(tgt.shape))
            probs.append(F.softmax(logits, dim=-1).gather(-1, tgt.unsqueeze(-1)).squeeze(-1))
        return torch.stack(logps, dim=1), torch.stack(probs, dim=1)

    def sequence_logps(self, model, batch: RolloutBatch, masks: torch.Tensor, advantages: torch.Tensor):
        c = self.config
        _, attn, p = elbo_layout(batch)
        logp, prob = self.token_terms(model, batch, masks)
        cm = attn[:, p:]
        reward_mask = (advantages[:, None] * cm).sum(dim=-1) > 0
        mode = "mix" if c.variant == "mixture" else c.variant
        return spg_sequence_logps(logp, prob, masks[:, :, p:], cm, reward_mask, mode=mode, beta=c.eubo_beta,
                                  mix_weight=c.mix_weight)

    def backward(self, policy, batch: RolloutBatch, state: AlgorithmState, advantages: torch.Tensor, *,
                 loss_scale: float, iteration: int) -> dict[str, float]:
        masks = state.rows["masks"][:, iteration]
        est = self.sequence_logps(policy, batch, masks, advantages)
        cm = batch.completion_mask
        loss = spg_policy_loss(est["seq"], advantages.to(est["seq"].dtype), cm)
        (loss * loss_scale).backward()
        metrics = {"loss": float(loss.detach()), "pg_loss": float(loss.detach()),
                   "elbo": float(est["elbo"].detach().mean()), "scored_tokens": float(cm.sum())}
        if est["eubo"] is not None:
            metrics["eubo"] = float(est["eubo"].detach().mean())
        return metrics
