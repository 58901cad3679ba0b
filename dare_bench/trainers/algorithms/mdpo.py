"""MDPO — Masked Diffusion Policy Optimisation (arXiv 2508.13148), with intermediate-step rewards.

Official code: `autonomousvision/mdpo` `src/open_r1/mdpo/mdpo_trainer.py` (`_generate_and_score_completions`,
`split_into_micro_batches`, `compute_loss`), rollouts `src/mdlm_generation_utils.py::diffusion_generate`. DARE:
`verl/trainer/ppo/mdpo_algos.py` (`compute_step_wise_advantage`, `select_top_k_steps`, `compute_mdpo_policy_loss`),
`dllm_ray_trainer.py` (the `mdpo` branch: per-step rewards and packing), `llada_/dream_dp_actor_mdpo.py`,
`mdpo_llada_/mdpo_dream_rollout.py`. Spec: shared/docs/algorithms.md §10.1.

Denoising is a multi-step MDP. The rollout records, per sampler step k = 0 … K−1, the canvas x^(k) before the step,
the step's proposal x̂^(k) (every masked position the step saw filled with the token drawn for it, committed or
not: DARE's `all_steps_completion_ids`) and the proposal's sampling probability c^(k) (`all_confidence`); see
`sampling.TrajectoryStep.proposal`. Then, per rollout batch:

1. step rewards r_k = the task's reward of x̂^(k)'s completion, graded by the loop (`RolloutBatch.grader`);
2. step scores s_k = (r_k − r_{k−1}) + 1 (r_{−1} = 0) + mean(r_{k+1}, …, r_{K−1}) (last step: + r_{K−1});
3. per prompt group and per step: A_k = (s_k − mean_G s_k) / (std_G s_k + 1e-6) (unbiased std; `std_normalise`
   off, or the shared `advantage: mean`: no division; a group of one: A_k = s_k), as DARE
   `compute_step_wise_advantage` (`norm_adv_by_std_in_grpo`);
4. the K' = `top_k_steps` steps with the largest Σ_rows |A_k| over the batch (DARE `select_top_k_steps`, sorted);
5. per selected step, on the completion positions masked in x^(k) (M_k): ℓ_i = log p_θ(x̂^(k)_i | x^(k)),
   λ_k = C / |M_k| (C = completion length, DARE's `max_completion_length = response_length`),
       L_i = max(−A_k ρ_i, −A_k clip(ρ_i, 1−ε, 1+ε_high)) · λ_k + β · ½ (ℓ_ref,i − ℓ_i)²,   ρ_i = exp(ℓ_i − ℓ_old,i)
   and the (row, step) loss Σ_{i∈M_k} c_i^(k) L_i / |M_k| (c = 1 without `confidence_weighting`);
6. the micro-batch loss: the mean of the (row, step) losses over its rows and the selected steps.

Aggregation: per (row, step), as DARE's actor with one row per micro-batch and the official trainer (one step's
batch per micro-batch); DARE's dynamic-batch packing pools rows of a micro-batch into one denominator, which
makes its numbers depend on the packing, so it is not followed. The step selection runs over a rollout unit (the
whole batch on one rank, as DARE's driver; with `unit_prompts` each unit selects its own steps).
The model is called as the sampler called it (the recorded padding mask / positions); logits are not divided by
the rollout temperature (DARE's actor; the official trainer divides). μ = 1 uses ℓ.detach() as ℓ_old.
Not implemented: the official RCR (running confidence remasking) rollouts and its `overtime_conf` confidences
(DARE's recipes run without them), classifier-free guidance rollouts (refused).
"""

from __future__ import annotations

from typing import Any

import torch

from dare_bench.catalogue.knobs.mdpo import MDPOConfig
from dare_bench.errors import ConfigError, DataError
from dare_bench.trainers.algorithms.base import (
    Algorithm,
    AlgorithmState,
    RolloutBatch,
    register_algorithm,
)
from dare_bench.trainers.algorithms.common import group_advantages, token_logprobs

STD_EPS = 1e-6  # DARE compute_step_wise_advantage epsilon


# --- the estimator pieces (pure functions, tested against a hand computation) ---------------------------------------

def step_scores(step_rewards: torch.Tensor) -> torch.Tensor:
    """s `[N, K]` from step rewards r `[N, K]`: (r_k − r_{k−1}) + 1 with r_{−1} = 0, plus the mean of the later
    rewards r_{k+1..K−1} (the last step: plus r_{K−1}) — the official adv-v3 + adv-v4, DARE's same formula."""
    r = step_rewards.float()
    diffs = torch.cat([r[:, :1], r[:, 1:] - r[:, :-1]], dim=1) + 1.0
    k = r.shape[1]
    if k == 1:
        return diffs + r
    later = r[:, 1:].flip(-1).cumsum(-1) / torch.arange(1, k, device=r.device, dtype=r.dtype)
    future = torch.cat([later.flip(-1), r[:, -1:]], dim=1)
    return diffs + future


def step_advantages(step_rewards: torch.Tensor, group_size: int, *, std_normalise: bool = True,
                    epsilon: float = STD_EPS) -> torch.Tensor:
    """A `[N, K]`: step scores normalised per prompt group (G contiguous rows) and per step."""
    s = step_scores(step_rewards)
    n, k = s.shape
    if group_size < 1 or n % group_size:
        raise ValueError(f"{n} rows do not split into groups of {group_size}")
    if group_size == 1:  # DARE: a group of one has mean 0, std 1
        return s
    g = s.view(-1, group_size, k)
    centred = g - g.mean(dim=1, keepdim=True)
    if std_normalise:
        centred = centred / (g.std(dim=1, keepdim=True) + epsilon)
    return centred.reshape(n, k)


def select_steps(advantages: torch.Tensor, k: int | None) -> torch.Tensor:
    """Indices (ascending) of the k steps with the largest Σ_rows |A|; every step when k is None or ≥ K."""
    n_steps = advantages.shape[1]
    if k is None or k >= n_steps:
        return torch.arange(n_steps, device=advantages.device)
    return torch.topk(advantages.abs().sum(dim=0), k=k).indices.sort().values


def step_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              confidence: torch.Tensor, *, completion_length: int, clip_low: float, clip_high: float,
              beta: float = 0.0, ref_logp: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Per-row MDPO loss `[n]` of one step (DARE `compute_mdpo_policy_loss` with one row per micro-batch):
    Σ_i m_i c_i (max(−Aρ, −A clip ρ) λ + β ½(ℓ_ref − ℓ)²) / Σ_i m_i, λ = completion_length / Σ_i m_i."""
    m = mask.to(logp.dtype)
    count = m.sum(dim=1, keepdim=True)
    lam = completion_length / count.clamp(min=1.0)
    adv = advantages.to(logp.dtype).unsqueeze(1)
    ratio = torch.exp(logp - old_logp)
    pg1 = -adv * ratio * lam
    pg2 = -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * lam
    per_tok = torch.maximum(pg1, pg2)
    out: dict[str, torch.Tensor] = {"clip_frac": ((pg2 > pg1).to(m.dtype) * m).sum() / m.sum().clamp(min=1.0)}
    if beta > 0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs reference log-probs")
        kl = (ref_logp - logp) ** 2 / 2
        per_tok = per_tok + beta * kl
        out["kl"] = (kl.detach() * m).sum() / m.sum().clamp(min=1.0)
    out["rows"] = (per_tok * m * confidence.to(logp.dtype)).sum(dim=1) / count.squeeze(1).clamp(min=1e-4)
    out["lambda"] = lam.squeeze(1)
    return out


# --- the plug-in --------------------------------------------------------------------------------------------------

@register_algorithm
class MDPO(Algorithm):
    name = "mdpo"
    Config = MDPOConfig
    # DARE has LLaDA and Dream MDPO rollouts / actors (mdpo_llada_rollout.py, mdpo_dream_rollout.py); the
    # proposals are recorded by the MDLM samplers only
    attention_kinds = ("bidirectional",)
    needs_trajectory = True
    rollout_overrides = {"return_trajectory": True}

    def validate(self) -> None:
        c = self.config
        if c.mc_samples != 1:
            raise ConfigError(f"mdpo scores each step once, on its recorded state (mc_samples=1); got {c.mc_samples}")
        # the shared `advantage` (when set) names the step-score normalisation; `std_normalise` when it is not
        by_advantage = {None: None, "mean_std": True, "std": True, "mean": False}
        if c.advantage not in by_advantage:
            raise ConfigError(f"mdpo normalises step scores per group (advantage mean / mean_std); got {c.advantage!r}")
        wanted, own = by_advantage[c.advantage], c.std_normalise
        explicit = "std_normalise" in c.model_fields_set
        if wanted is not None and explicit and wanted != own:
            raise ConfigError(f"mdpo: advantage {c.advantage!r} contradicts std_normalise={c.std_normalise} "
                              "(set advantage: algorithm, or make them agree)")
        self.std_normalise = own if wanted is None else wanted

    def advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        """The final-reward group advantages (metrics only: the update uses the per-step advantages of
        `prepare`)."""
        return group_advantages(rewards, group_size, "mean_std" if self.std_normalise else "mean",
                                epsilon=STD_EPS)

    # --- trajectories -----------------------------------------------------------------------------------------------
    @staticmethod
    def _rows(batch: RolloutBatch) -> list[Any]:
        if batch.trajectories is None or len(batch.trajectories) != batch.num_rows:
            raise DataError("mdpo needs one recorded trajectory per row (generate(..., return_trajectory=True))")
        rows = list(batch.trajectories)
        for i, t in enumerate(rows):
            if not getattr(t, "steps", None):
                raise DataError(f"row {i}: empty trajectory")
            if t.kind != "mdlm" or any(s.proposal is None or s.proposal_prob is None for s in t.steps):
                raise DataError("mdpo needs the step proposals of an MDLM sampler (TrajectoryStep.proposal); this "
                                f"trajectory ({t.kind}) has none")
            if t.cfg_scale > 0:
                raise ConfigError("mdpo: rollouts with classifier-free guidance are not supported")
        if len({len(t.steps) for t in rows}) != 1:
            raise DataError("mdpo: the rows of a rollout unit have trajectories of different lengths")
        return rows

    def _logprobs(self, model, rows: list[Any], states: torch.Tensor, targets: torch.Tensor, p: int,
                  with_entropy: bool = False):
        """ℓ `[n, C]` = log p(targets | states) on the completion columns, calling the model as the sampler did."""
        from dare_bench.models.base import shift_logits

        dev = states.device
        keys = sorted(rows[0].model_kwargs)
        kw = {k: torch.cat([r.model_kwargs[k] for r in rows]).to(dev) for k in keys}
        c = targets.shape[1]
        chunk = self.config.lm_head_chunk_tokens
        if chunk is not None:  # the completion columns' hidden states only, through the chunked LM head
            from dare_bench.models.lm_head import chunked_token_logprobs

            out = model(states, **kw, return_hidden=True)
            hidden = shift_logits(out.states, rows[0].logit_shift)[:, p:p + c]
            return chunked_token_logprobs(hidden, out.head, targets, chunk_tokens=chunk, with_entropy=with_entropy)
        out = model(states, **kw)
        logits = shift_logits(out.logits if hasattr(out, "logits") else out, rows[0].logit_shift)
        return token_logprobs(logits[:, p:p + c], targets, with_entropy=with_entropy)

    @torch.no_grad()
    def prepare(self, batch: RolloutBatch, policy, reference, *, generator: torch.Generator,
                num_iterations: int) -> AlgorithmState:
        c = self.config
        rows = self._rows(batch)
        if batch.grader is None:
            raise DataError("mdpo needs the loop's grader for intermediate states (RolloutBatch.grader)")
        p, n_comp = batch.prompt_ids.shape[1], batch.completion_ids.shape[1]
        dev = batch.prompt_ids.device
        n_steps = len(rows[0].steps)
        mask_id = int(self.traits.mask_token_id)
        for i, t in enumerate(rows):
            if t.steps[0].state.shape[-1] < p + n_comp:
                raise DataError(f"row {i}: trajectory canvas {t.steps[0].state.shape[-1]} is shorter than prompt + "
                                f"completion {p + n_comp}")
            if not torch.equal(t.steps[0].state[0, :p].to(dev), batch.prompt_ids[i]):
                raise DataError(f"row {i}: the trajectory's prompt is not the batch's prompt")
        # 1-4: step rewards, advantages, the selected steps
        proposals = torch.stack([torch.cat([t.steps[k].proposal for t in rows]) for k in range(n_steps)], dim=1)
        proposals = proposals[:, :, p:p + n_comp].to(dev)  # [N, K, C]
        rewards = batch.grader(proposals).to(dev)  # [N, K]: all steps in one call (a distinct program runs once)
        adv = step_advantages(rewards, batch.group_size, std_normalise=self.std_normalise)
        chosen = select_steps(adv, c.top_k_steps)
        sel = chosen.tolist()
        states = torch.stack([torch.cat([t.steps[k].state for t in rows]) for k in sel], dim=1).to(dev)  # [N, K', T]
        targets = proposals[:, chosen]  # [N, K', C]
        masked = (states[:, :, p:p + n_comp] == mask_id) & (targets != mask_id)
        conf = torch.stack([torch.cat([t.steps[k].proposal_prob for t in rows]) for k in sel], dim=1)
        conf = conf[:, :, p:p + n_comp].to(dev).float()
        if not c.confidence_weighting:
            conf = torch.ones_like(conf)
        # the canvas outside prompt + completion (none in practice) is kept for the model call
        state_rows: dict[str, torch.Tensor] = {"adv": adv[:, chosen], "states": states, "targets": targets,
                                               "mask": masked, "conf": conf, "step_rewards": rewards}
        need_ref = c.kl_beta > 0
        if need_ref and reference is None:
            raise ConfigError("mdpo with kl_beta > 0 needs a reference model")
        chunk = self.forward_batch_size or batch.num_rows
        for key, model, needed in (("old_logp", policy, num_iterations > 1), ("ref_logp", reference, need_ref)):
            if not needed:
                continue
            per_step = []
            for j in range(len(sel)):
                parts = [self._logprobs(model, rows[a:a + chunk], states[a:a + chunk, j], targets[a:a + chunk, j], p)
                         for a in range(0, batch.num_rows, chunk)]
                per_step.append(torch.cat(parts).float())
            state_rows[key] = torch.stack(per_step, dim=1)  # [N, K', C]
        return AlgorithmState(rows=state_rows, shared={"steps": sel, "num_steps": n_steps})

    # --- loss -----------------------------------------------------------------------------------------------------
    def backward(self, policy, batch: RolloutBatch, state: AlgorithmState, advantages: torch.Tensor, *,
                 loss_scale: float, iteration: int) -> dict[str, float]:
        """One forward + backward per selected step (one graph alive); `advantages` (final-reward) is unused."""
        c = self.config
        rows = self._rows(batch)
        p, n_comp = batch.prompt_ids.shape[1], batch.completion_ids.shape[1]
        st = state.rows
        n, k_sel = st["adv"].shape
        clip_high = c.clip_eps if c.clip_eps_high is None else c.clip_eps_high
        total, clip, kl, ent, used, lam = 0.0, 0.0, 0.0, 0.0, 0, 0.0
        for j in range(k_sel):
            logp, entropy = self._logprobs(policy, rows, st["states"][:, j], st["targets"][:, j], p,
                                           with_entropy=True)
            old = st["old_logp"][:, j] if "old_logp" in st else logp.detach()
            ref = st["ref_logp"][:, j] if "ref_logp" in st else None
            m = st["mask"][:, j]
            out = step_loss(logp, old.to(logp.dtype), st["adv"][:, j], m, st["conf"][:, j],
                            completion_length=n_comp, clip_low=c.clip_eps, clip_high=clip_high, beta=c.kl_beta,
                            ref_logp=None if ref is None else ref.to(logp.dtype))
            loss_j = out["rows"].sum() / (n * k_sel)
            (loss_j * loss_scale).backward()
            total += float(loss_j.detach())
            clip += float(out["clip_frac"]) / k_sel
            if "kl" in out:
                kl += float(out["kl"]) / k_sel
            ent += float(entropy[m].sum())
            used += int(m.sum())
            lam += float(out["lambda"].mean()) / k_sel
        r = st["step_rewards"]
        metrics = {"loss": total, "pg_loss": total, "clip_frac": clip, "entropy": ent / max(used, 1),
                   "scored_tokens": float(used), "steps_selected": float(k_sel),
                   "steps": float(state.shared["num_steps"]), "lambda_mean": lam,
                   "step_reward_mean": float(r.mean()), "final_step_reward": float(r[:, -1].mean()),
                   "step_advantage_abs_mean": float(st["adv"].abs().mean())}
        if c.kl_beta > 0:
            metrics["kl"] = kl
        return metrics
