"""CJ-GRPO — Consistency-Trajectory GRPO (Yang et al., arXiv 2509.23924), with EOSER / ASS decoding.

Official code: `yjyddq/EOSER-ASS-RL` `cj-grpo/cj_grpo_trainer_*.py` (`reversed_process`, `_get_per_token_logps`,
`compute_loss`); DARE: `llada_dp_actor_cj_grpo.py`, `sdar_/llada2_dp_actor_cj_grpo.py`,
`dllm_core_algos.py::collapse_cj_step_log_probs`. Spec: shared/docs/algorithms.md §9.

Estimator: the rollout records its denoising trajectory (`sampling.generate(..., return_trajectory=True)`): the
canvas x^(s) before every step s and the positions U_s unmasked by that step. Each completion token is scored at
the step that unmasked it, conditioned on the exact intermediate state:
    ℓ_i^(s) = log p_θ(x_i^final | x^(s)),  i ∈ U_s
The model is called exactly as the sampler called it (the recorded padding mask / positions for MDLM, the
block-causal prefix up to the step's block end for block diffusion, CFG when the rollout used it).

Loss (`loss_mode`):
- "per_step" (official EOSER-ASS-RL `compute_loss`): (1/S) Σ_s Σ_{b,i∈U_s} L_{b,i}^(s) / Σ_{b,i} 1[i∈U_s], with
  L = PPO clip of exp(ℓ − ℓ_old) (ε, optional dual clip) + β·k3 KL to the reference on the same step; S = the
  number of sampler steps, rows of a micro-batch pooled per step as the official batched loss does. Every unmasked
  completion position counts (the official loss does not use the completion mask: EOS padding is trained too).
- "collapsed" (DARE): per-token ℓ_i = ℓ_i^(step of i) via `collapse_step_logprobs` (each scored token assigned to
  exactly one step, padding to none — checked), then the token-mean PPO loss over the scored tokens: those of
  `completion_mask` that a step unmasked (a position the sampler never unmasked has no trajectory log-prob).
Both are linear in the steps, so `backward` back-propagates one step at a time (one forward of the micro-batch per
step, one graph alive). μ = 1 uses ℓ.detach() as ℓ^old; μ > 1 and β > 0 make `prepare` replay every step no-grad.

Trajectories: `RolloutBatch.trajectories[r]` is a `RowTrajectory` (see `split_trajectory`) or a batch-of-one
`sampling.Trajectory`. Steps are indexed by the sampler's step number; a step in which a row unmasked nothing
contributes nothing for that row, and rows may have different numbers of steps (the block sampler decodes a
left-padded batch row by row and records one trajectory per row: a row past its last step is not called). Canvas
column P + c is completion column c (P = prompt width of the batch); a block row's model call starts at its
`start` (its left pads, outside its block grid).

Decoding (`rollout_overrides`): `return_trajectory` always; `decoding: eoser` (EOS early rejection, γ from
eos_gamma_min to eos_gamma_max) or `eoser-ass` (plus ascending step sizes, `ass_blocks`) for the LLaDA sampler, as
the official `--decoding`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from dare_bench.catalogue.knobs.cj_grpo import CJGRPOConfig
from dare_bench.errors import ConfigError, DataError
from dare_bench.trainers.algorithms.base import (
    Algorithm,
    AlgorithmState,
    RolloutBatch,
    register_algorithm,
)
from dare_bench.trainers.algorithms.common import (
    group_advantages,
    kl_estimate,
    masked_mean,
    policy_loss,
    token_logprobs,
)

# --- trajectories -------------------------------------------------------------------------------------------------

@dataclass
class RowTrajectory:
    """One row of a sampler trajectory: states `[S, T]` (canvas before each step), unmasked bool `[S, T]`."""

    states: torch.Tensor
    unmasked: torch.Tensor
    region_end: list[int]
    kind: str  # "mdlm" | "block"
    logit_shift: int = 0
    block_size: int | None = None
    model_kwargs: dict[str, torch.Tensor] = field(default_factory=dict)  # this row's recorded kwargs, batch dim 1
    cfg_scale: float = 0.0
    prompt_index: torch.Tensor | None = None  # [1, T]
    start: int = 0  # block: the model saw columns start..region_end at positions 0.. (left pads before)

    @property
    def num_steps(self) -> int:
        return int(self.states.shape[0])


def split_trajectory(traj) -> list[RowTrajectory]:
    """Per-row views of a batched `sampling.Trajectory` (what `RolloutBatch.trajectories` holds for CJ-GRPO), or
    of a list of them (the block sampler's per-row trajectories of a left-padded batch), rows in order."""
    if isinstance(traj, list):
        return [row for t in traj for row in split_trajectory(t)]
    if not traj.steps:
        raise DataError("empty trajectory")
    states = torch.stack([s.state for s in traj.steps], dim=1)  # [B, S, T]
    unmasked = torch.stack([s.unmasked for s in traj.steps], dim=1)
    ends = [int(s.region_end) for s in traj.steps]
    out = []
    for r in range(states.shape[0]):
        kw = {k: v[r:r + 1] for k, v in (traj.model_kwargs or {}).items()}
        pidx = None if traj.prompt_index is None else traj.prompt_index[r:r + 1]
        out.append(RowTrajectory(states=states[r], unmasked=unmasked[r], region_end=list(ends), kind=traj.kind,
                                 logit_shift=traj.logit_shift, block_size=traj.block_size, model_kwargs=kw,
                                 cfg_scale=traj.cfg_scale, prompt_index=pidx, start=int(traj.start)))
    return out


def _as_row(entry) -> RowTrajectory:
    if isinstance(entry, RowTrajectory):
        return entry
    if hasattr(entry, "steps") and hasattr(entry, "kind"):
        rows = split_trajectory(entry)
        if len(rows) != 1:
            raise DataError(f"a per-row trajectory must hold one row, got {len(rows)} (use split_trajectory)")
        return rows[0]
    raise DataError(f"unsupported trajectory entry {type(entry).__name__}; expected RowTrajectory")


def collapse_step_logprobs(step_log_probs: torch.Tensor, trajectory: torch.Tensor,
                           response_mask: torch.Tensor) -> torch.Tensor:
    """DARE `collapse_cj_step_log_probs`: `[B, K, R]` step log-probs -> `[B, R]` via the step one-hot
    `trajectory` `[B, K, S']` (its last R columns are the response). Every valid token must be assigned to exactly
    one step and no padded token to any (ValueError otherwise, with DARE's messages)."""
    R = step_log_probs.shape[-1]
    assign = trajectory[..., -R:]
    counts = assign.long().sum(dim=1)
    valid = response_mask.bool()
    bad = int((valid & (counts != 1)).sum())
    if bad:
        raise ValueError("Each valid CJ response token must be assigned to exactly one trajectory step; "
                         f"found {bad} invalid token assignments")
    if bool((~valid & (counts > 0)).any()):
        raise ValueError("CJ trajectory assigns a padded response token")
    return (step_log_probs * assign.to(step_log_probs.dtype)).sum(dim=1)


# --- the plug-in --------------------------------------------------------------------------------------------------


@register_algorithm
class CJGRPO(Algorithm):
    name = "cj_grpo"
    Config = CJGRPOConfig
    attention_kinds = ("bidirectional", "block_causal")  # DARE has LLaDA, Dream, SDAR and LLaDA2 CJ actors
    needs_trajectory = True
    rollout_overrides = {"return_trajectory": True}

    def validate(self) -> None:
        c = self.config
        if c.mc_samples != 1:
            raise ConfigError(f"cj_grpo scores each token once, along the recorded trajectory (mc_samples=1); "
                              f"got {c.mc_samples}")
        if c.advantage not in (None, "mean", "mean_std", "leave_one_out"):
            raise ConfigError(f"cj_grpo: unknown advantage {c.advantage!r}")
        llada_sampler = self.traits.attention == "bidirectional" and self.traits.logit_shift == 0
        eoser, ass = c.decoding in ("eoser", "eoser-ass"), c.decoding == "eoser-ass"
        if eoser and not llada_sampler:
            raise ConfigError(f"EOSER / ASS decoding exists for the LLaDA sampler only, not {self.traits.family}")
        if not eoser and (c.eos_gamma_min is not None or c.eos_gamma_max != 1.0):
            raise ConfigError("eos_gamma_min / eos_gamma_max need decoding eoser or eoser-ass")
        if c.ass_blocks is not None and not ass:
            raise ConfigError("ass_blocks needs decoding: eoser-ass")
        overrides: dict[str, Any] = {"return_trajectory": True}
        if eoser:
            overrides["eoser"] = True
            overrides["eos_max_gamma"] = c.eos_gamma_max
            if c.eos_gamma_min is not None:
                overrides["eos_min_gamma"] = c.eos_gamma_min
        if ass:
            overrides["ass"] = True
            if c.ass_blocks is not None:
                overrides["ass_blocks"] = c.ass_blocks
        # an instance attribute: EOSER / ASS are knobs of this run, the class default only asks for trajectories
        self.rollout_overrides = overrides

    def advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        return group_advantages(rewards, group_size, self.config.advantage or "mean")

    # --- trajectory tensors ---------------------------------------------------------------------------------------
    def trajectory_rows(self, batch: RolloutBatch) -> tuple[list[RowTrajectory], torch.Tensor]:
        """(per-row trajectories, step assignment bool `[N, S_max, C]` of the completion columns)."""
        if batch.trajectories is None or len(batch.trajectories) != batch.num_rows:
            raise DataError("cj_grpo needs one recorded trajectory per row (generate(..., return_trajectory=True))")
        rows = [_as_row(t) for t in batch.trajectories]
        P, C = batch.prompt_ids.shape[1], batch.completion_ids.shape[1]
        s_max = max(r.num_steps for r in rows)
        assign = torch.zeros(batch.num_rows, s_max, C, dtype=torch.bool, device=batch.prompt_ids.device)
        for i, r in enumerate(rows):
            if r.states.shape[1] < P + C:
                raise DataError(f"row {i}: trajectory canvas {r.states.shape[1]} is shorter than prompt + "
                                f"completion {P + C}")
            if not torch.equal(r.states[0, :P].to(batch.prompt_ids.device), batch.prompt_ids[i]):
                raise DataError(f"row {i}: the trajectory's prompt is not the batch's prompt")
            assign[i, :r.num_steps] = r.unmasked[:, P:P + C].to(assign.device)
        if bool((assign.sum(dim=1) > 1).any()):
            raise DataError("a completion position is unmasked by two steps of its trajectory")
        return rows, assign

    def step_logprobs(self, model, batch: RolloutBatch, rows: list[RowTrajectory], step: int,
                      with_entropy: bool = False, reduce=None):
        """ℓ^(step) `[n, C]` of the completion tokens given each row's state before `step` (0 for rows whose
        trajectory is shorter), calling the model as the sampler did. `reduce(outputs [n, C, V])` -> `[n, C]`
        replaces the log-prob of the completion token (TraceRL's value head reads its scalar output there)."""
        from dare_bench.models.base import shift_logits
        from dare_bench.models.layers import block_causal_mask

        P, C = batch.prompt_ids.shape[1], batch.completion_ids.shape[1]
        n = batch.num_rows
        dev = batch.prompt_ids.device
        out = torch.zeros(n, C, device=dev)
        ent = torch.zeros(n, C, device=dev) if with_entropy else None
        live = [i for i, r in enumerate(rows) if step < r.num_steps]
        groups: dict[tuple, list[int]] = {}
        for i in live:
            r = rows[i]
            block = r.kind == "block"
            key = (r.kind, r.region_end[step] if block else None, r.start if block else 0,
                   tuple(sorted(r.model_kwargs)), r.cfg_scale, r.logit_shift, r.block_size)
            groups.setdefault(key, []).append(i)
        pieces = []
        for (kind, end, start, _, cfg, shift, bsize), idx in groups.items():
            states = torch.stack([rows[i].states[step] for i in idx]).to(dev)
            if kind == "block":
                # the sampler's call: columns start..end (a padded row's pads are outside its block grid)
                n_see = end - start
                pos = torch.arange(n_see, device=dev).expand(len(idx), n_see)
                logits = model(states[:, start:end], position_ids=pos,
                               attn_mask=block_causal_mask(n_see, n_see, bsize, device=dev))
                logits = logits.logits if hasattr(logits, "logits") else logits
                if start or end < P + C:  # back to canvas columns: zeros outside what the call saw
                    left = logits.new_zeros(len(idx), start, logits.shape[-1])
                    right = logits.new_zeros(len(idx), max(P + C - end, 0), logits.shape[-1])
                    logits = torch.cat([left, logits, right], dim=1)
            else:
                kw = {k: torch.cat([rows[i].model_kwargs[k] for i in idx]).to(dev) for k in rows[idx[0]].model_kwargs}
                if cfg > 0:
                    un = states.clone()
                    pidx = torch.cat([rows[i].prompt_index for i in idx]).to(dev)
                    un[pidx] = rows[idx[0]].states.new_tensor(self.traits.mask_token_id)
                    kw2 = {k: torch.cat([v, v]) for k, v in kw.items()}
                    both = model(torch.cat([states, un]), **kw2)
                    cond, unc = (both.logits if hasattr(both, "logits") else both).chunk(2)
                    logits = unc + (cfg + 1) * (cond - unc)
                else:
                    logits = model(states, **kw)
                    logits = logits.logits if hasattr(logits, "logits") else logits
                logits = shift_logits(logits, shift)
            res = (reduce(logits[:, P:P + C]) if reduce is not None else
                   token_logprobs(logits[:, P:P + C], batch.completion_ids[idx], with_entropy=with_entropy))
            pieces.append((idx, res))
        if not pieces:
            return (out, ent) if with_entropy else out
        dtype = (pieces[0][1][0] if with_entropy else pieces[0][1]).dtype
        out = out.to(dtype)
        # rows are written back by index so that the graph of every group reaches `out`
        for idx, res in pieces:
            lp = res[0] if with_entropy else res
            out = out.index_copy(0, torch.as_tensor(idx, device=dev), lp)
            if with_entropy:
                ent[idx] = res[1].to(ent.dtype)
        return (out, ent) if with_entropy else out

    @torch.no_grad()
    def prepare(self, batch: RolloutBatch, policy, reference, *, generator: torch.Generator,
                num_iterations: int) -> AlgorithmState:
        rows, assign = self.trajectory_rows(batch)
        state_rows: dict[str, torch.Tensor] = {"assign": assign}
        if self.config.loss_mode == "collapsed":
            # Scored: completion_mask tokens that some step unmasked. A token no step unmasked (a row that ran out
            # of steps, its leftover mask id turned into EOS by the loop) has no trajectory log-prob to score.
            scored = batch.completion_mask.bool() & assign.any(dim=1)
            # DARE's check on its one-hot of the scored tokens: each belongs to exactly one step
            collapse_step_logprobs(torch.zeros(assign.shape, dtype=torch.float32), assign & scored[:, None], scored)
            state_rows["scored"] = scored
        need_ref = self.config.kl_beta > 0
        if need_ref and reference is None:
            raise ConfigError("cj_grpo with kl_beta > 0 needs a reference model")
        chunk = self.forward_batch_size or batch.num_rows
        for key, model, needed in (("old_logp", policy, num_iterations > 1), ("ref_logp", reference, need_ref)):
            if not needed:
                continue
            per_chunk = []
            for a in range(0, batch.num_rows, chunk):
                sub = batch.select(slice(a, a + chunk))
                sub_rows = rows[a:a + chunk]
                per_chunk.append(torch.stack([self.step_logprobs(model, sub, sub_rows, s)
                                              for s in range(assign.shape[1])], dim=1))
            state_rows[key] = torch.cat(per_chunk, dim=0)  # [N, S, C]
        return AlgorithmState(rows=state_rows, shared={"num_steps": int(assign.shape[1])})

    # --- loss -----------------------------------------------------------------------------------------------------
    def token_terms(self, logp, old, ref, advantages, mask):
        """Per-token loss `[n, C]` (PPO clip + β·k3) and metric pieces, for the tokens of one step."""
        c = self.config
        out = policy_loss(old, logp, advantages, mask, clip_low=c.clip_eps, clip_high=c.clip_eps_high,
                          clip_ratio_c=c.clip_ratio_c, agg="token-mean")
        per_tok = out.per_token
        kl = None
        if c.kl_beta > 0:
            kl = kl_estimate(logp, ref, c.kl_estimator, clamp=None)  # the official trainer: unclamped k3
            per_tok = per_tok + c.kl_beta * kl
        return per_tok, out, kl

    def backward(self, policy, batch: RolloutBatch, state: AlgorithmState, advantages: torch.Tensor, *,
                 loss_scale: float, iteration: int) -> dict[str, float]:
        c = self.config
        rows = [_as_row(t) for t in batch.trajectories]
        assign = state.rows["assign"]
        S = assign.shape[1]
        collapsed = c.loss_mode == "collapsed"
        scored = state.rows["scored"] if collapsed else None
        denom_all = scored.sum() + 1e-8 if collapsed else None  # verl token-mean over the scored tokens
        total = 0.0
        sums = {"clip_frac": 0.0, "kl": 0.0, "entropy": 0.0}
        used = 0
        for s in range(S):
            step_mask = assign[:, s] & scored if collapsed else assign[:, s]
            if not bool(step_mask.any()):
                continue
            logp, entropy = self.step_logprobs(policy, batch, rows, s, with_entropy=True)
            old = state.rows["old_logp"][:, s] if "old_logp" in state.rows else logp.detach()
            ref = state.rows["ref_logp"][:, s] if "ref_logp" in state.rows else None
            per_tok, out, kl = self.token_terms(logp, old, ref, advantages.to(logp.dtype), step_mask)
            m = step_mask.to(per_tok.dtype)
            if collapsed:
                loss_s = (per_tok * m).sum() / denom_all
                weight = float(m.sum() / denom_all)
            else:
                loss_s = (per_tok * m).sum() / m.sum() / S
                weight = 1.0 / S
            (loss_s * loss_scale).backward()
            total += float(loss_s.detach())
            sums["clip_frac"] += weight * float(out.clip_frac)
            if kl is not None:
                sums["kl"] += weight * float(masked_mean(kl.detach(), m))
            sums["entropy"] += float(entropy[step_mask].sum())
            used += int(step_mask.sum())
        metrics = {"loss": total, "pg_loss": total, "clip_frac": sums["clip_frac"],
                   "entropy": sums["entropy"] / max(used, 1), "scored_tokens": float(used), "steps": float(S)}
        if c.kl_beta > 0:
            metrics["kl"] = sums["kl"]
        return metrics
