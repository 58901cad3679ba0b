"""TraceRL — trajectory-aware RL for block diffusion, with its diffusion value model (Wang et al., arXiv 2509.06949,
ICLR 2026; TraDo). Official code: Gen-Verse/dLLM-RL @ 10b4fd1 (`train/rl_sdar.py` without a value model;
`train/train_sdar_value.py` + `train/train_sdar_policy.py` with one; `train/init_sdar_value_model.py`;
`reward/rl_reward.py`; `sample/jetengine_ext/engine/scheduler.py`; recipe `configs/rl_sdar_with_value.yaml`).

Trajectory (scheduler.py:147-152): the rollout records, per response token, the global denoising step that first
unmasked it (`step_map`). Here that is the sampler's recorded trajectory (`sampling.generate(...,
return_trajectory=True)`, the same records CJ-GRPO walks: CJGRPO.trajectory_rows), steps grouped into blocks by the
block they decode (`region_end`).

Rounds (`one_round_vectorized`, train_sdar_value.py:411-482; `collect_training_data`, :485-568): per block the
distinct step ids, after the shrinkage `collapse_k_unique(·, shrink)` (:249-261: every `shrink` neighbouring steps
of a block become one, labelled by the last), are taken in order; round k of a sequence trains, in every block at
once, the tokens of that block's k-th (shrunk) step, each conditioned on the block's state with all tokens of that
step and later steps masked — i.e. the recorded state before the group's first step. A (sequence, round) is one
training row. The official trainer scores a round of all blocks in one BD3 forward ([x0; x_t], block attention);
here each step's tokens are scored by a forward of its recorded state, called as the sampler called the model
(`CJGRPO.step_logprobs`): the same conditioning, one forward per step.

Advantages. Without a value model (rl_sdar.py:713, rl_reward.py:74-79,105): every token of a sequence gets the
z-scored reward of its group, (r − mean) / std with the population std, 0 for a constant group. With it
(`compute_returns_and_advantages_from_fragments`, train_sdar_value.py:716-900): the z-scored reward is the
immediate reward of the tokens of the last trace step (the largest step id over the trainable tokens), the value of
a token V_j is the value head at its position in the state it is scored in; per step t (ordered over the whole
sequence) r*_t, V*_t are the means over its tokens; R*_t = r*_t + γ R*_{t+1}; A*_t = δ*_t + γλ A*_{t+1} with
δ*_t = r*_t − V*_t + γ V*_{t+1}; and per token R_j = r_j + γ R*_{t+1}, A_j = r_j − V_j + γ V*_{t+1} + γλ A*_{t+1}.
The values are the value model's before its update (the order of train_sdar_value.py: old values → advantages →
value training; then train_sdar_policy.py).

Value model (init_sdar_value_model.py:47-89): a separate network, the backbone with its LM head replaced by
`Linear(hidden, 1, bias=False)` initialised to zero, from the policy's starting weights (`value_base_model`, the
same checkpoint in the recipe). Its loss (train_sdar_value.py:983-1007): per row
0.5·Σ_j max((V_j − R_j)², (V_j^clip − R_j)²) / L1 with V^clip = V^old + clamp(V − V^old, ±ε), averaged over rows;
AdamW (value lr 5e-6, the policy's betas / eps / weight decay 0) with gradient accumulation over
`value_rows_per_step` rows (32) and clip `value_max_grad_norm`, trained every `value_train_every` rollout steps.

Policy loss (train_sdar_policy.py:475-520): per token ρ = exp(clamp(ℓ − ℓ_old, ±10)), −min(ρA, clip(ρ, 1±ε)A), plus
β·k3(ℓ_old, ℓ) with k3 = exp(clamp(ℓ_old − ℓ, ±10)) − 1 − (ℓ_old − ℓ): the KL is to the pre-update policy, no
reference model. Each row's token sum is divided by L1 (the completion width) and the micro-batch by its number of
rows (sequence × round); tokens: the scored ones (up to and including the first EOS, as the official
`post_num: 0` drops the padding).

Backbones: block diffusion only (`attention_kinds`): the rounds are per block and the official trainers are the
SDAR / TraDo ones; the full-attention variants (rl_llada.py / rl_dream.py with `shrink` over the whole sequence)
are not this plug-in.
"""

from __future__ import annotations

import copy
import math

import torch

from dare_bench.catalogue.knobs.tracerl import TraceRLConfig
from dare_bench.errors import ConfigError
from dare_bench.trainers.algorithms.base import AlgorithmState, RolloutBatch, register_algorithm
from dare_bench.trainers.algorithms.cj_grpo import CJGRPO, RowTrajectory, _as_row


def zscore_rewards(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """rl_reward.py `z_score_normalize` per group: (r − mean) / std (population), all 0 for a constant group."""
    g = rewards.float().view(-1, group_size)
    mean = g.mean(dim=1, keepdim=True)
    std = ((g - mean) ** 2).mean(dim=1, keepdim=True).sqrt()
    return torch.where(std > 0, (g - mean) / torch.where(std > 0, std, torch.ones_like(std)),
                       torch.zeros_like(g)).reshape(-1)


def collapse_k_unique(values: list[int], k: int) -> list[int]:
    """Official `collapse_k_unique`: the sorted distinct values in groups of k, each mapped to its group's last."""
    uniq = sorted(set(values))
    rep = {v: uniq[min((i // k + 1) * k - 1, len(uniq) - 1)] for i, v in enumerate(uniq)}
    return [rep[v] for v in values]


def trace_plan(row: RowTrajectory, assign: torch.Tensor, scored: torch.Tensor, shrink: int):
    """One row's rounds. `assign` `[S, C]` bool (completion columns unmasked by each step), `scored` `[C]`.

    Returns (`score_at` `[S, C]` bool: the tokens scored in the state before step s; `step_id` `[C]` long: each
    scored token's (shrunk) trace step, −1 elsewhere; number of rounds)."""
    S, C = assign.shape
    score_at = torch.zeros(S, C, dtype=torch.bool)
    step_id = torch.full((C,), -1, dtype=torch.long)
    blocks: dict[int, list[int]] = {}
    for s in range(S):
        if bool((assign[s] & scored).any()):
            blocks.setdefault(int(row.region_end[s]), []).append(s)
    rounds = 0
    for steps in blocks.values():
        reps = collapse_k_unique(steps, shrink)
        groups: dict[int, list[int]] = {}
        for s, rep in zip(steps, reps):
            groups.setdefault(rep, []).append(s)
        rounds = max(rounds, len(groups))
        for rep, members in groups.items():
            toks = assign[members].any(dim=0) & scored
            score_at[min(members)] = toks  # masked from the group's first step on: its recorded state
            step_id[toks] = rep
    return score_at, step_id, rounds


def trace_returns(reward: float, values: torch.Tensor, step_id: torch.Tensor, gamma: float, lam: float):
    """Official step-level returns and GAE of one sequence: (R `[C]`, A `[C]`) at its scored tokens (step_id ≥ 0),
    from its (z-scored) reward and per-token old values `values` `[C]`."""
    C = step_id.shape[0]
    R = torch.zeros(C)
    A = torch.zeros(C)
    trainable = step_id >= 0
    if not bool(trainable.any()):
        return R, A
    values = values.float().cpu()
    steps = torch.unique(step_id[trainable], sorted=True).tolist()
    S = len(steps)
    r_tok = torch.zeros(C)
    r_tok[step_id == steps[-1]] = float(reward)  # the outcome reward on the last trace step's tokens
    r_star = torch.tensor([float(r_tok[step_id == s].mean()) for s in steps])
    v_star = torch.tensor([float(values[step_id == s].mean()) for s in steps])
    R_star = torch.zeros(S + 1)
    A_star = torch.zeros(S + 1)
    v_next = torch.cat([v_star[1:], torch.zeros(1)])
    for i in range(S - 1, -1, -1):
        R_star[i] = r_star[i] + gamma * R_star[i + 1]
        A_star[i] = (r_star[i] - v_star[i] + gamma * v_next[i]) + gamma * lam * A_star[i + 1]
    for i, s in enumerate(steps):
        m = step_id == s
        R[m] = r_tok[m] + gamma * R_star[i + 1]
        A[m] = (r_tok[m] - values[m]) + gamma * v_next[i] + gamma * lam * A_star[i + 1]
    return R, A


def build_value_model(policy) -> torch.nn.Module:
    """init_sdar_value_model.py: a copy of the policy backbone whose head is `Linear(hidden, 1, bias=False)` = 0."""
    if not hasattr(policy, "lm_head") or "hidden_size" not in getattr(policy, "config", {}):
        raise ConfigError(f"tracerl's value model needs a backbone with an `lm_head` and `hidden_size` "
                          f"({type(policy).__name__} has not)")
    value = copy.deepcopy(policy)
    ref = next(policy.parameters())
    value.lm_head = torch.nn.Linear(int(policy.config["hidden_size"]), 1, bias=False).to(ref.device, ref.dtype)
    torch.nn.init.zeros_(value.lm_head.weight)
    value.train()
    return value


def _value_of(outputs: torch.Tensor) -> torch.Tensor:
    return outputs[..., 0].float()


@register_algorithm
class TraceRL(CJGRPO):
    name = "tracerl"
    Config = TraceRLConfig
    attention_kinds = ("block_causal",)  # per-block rounds; the official SDAR / TraDo trainers
    needs_trajectory = True
    rollout_overrides = {"return_trajectory": True}

    def __init__(self, config, traits):
        super().__init__(config, traits)
        self.value_net: torch.nn.Module | None = None
        self.value_optimizer: torch.optim.Optimizer | None = None
        self._pending_value_state: dict | None = None
        self.value_updates = 0  # rollout batches seen (experiment.current_epoch − 1)

    def validate(self) -> None:
        c = self.config
        if c.mc_samples != 1:
            raise ConfigError(f"tracerl scores each token once, along the recorded trajectory (mc_samples=1); "
                              f"got {c.mc_samples}")
        if c.kl_beta:
            raise ConfigError("tracerl has no reference model: its KL is to the old policy (old_kl_beta)")
        self.rollout_overrides = {"return_trajectory": True}

    def advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        return zscore_rewards(rewards, group_size)

    # --- plug-in state in checkpoints (the value model and its optimizer) ----------------------------------------
    def state_dict(self) -> dict:
        if not self.config.value_model:
            return {}
        if self.value_net is None:
            return dict(self._pending_value_state or {})
        return {"value_model": self.value_net.state_dict(), "value_optimizer": self.value_optimizer.state_dict(),
                "value_updates": self.value_updates}

    def load_state_dict(self, state: dict) -> None:
        if not state:
            return
        self._pending_value_state = dict(state)
        self.value_updates = int(state.get("value_updates", 0))
        if self.value_net is not None:
            self._apply_pending()

    def _apply_pending(self) -> None:
        st, self._pending_value_state = self._pending_value_state, None
        if st:
            self.value_net.load_state_dict(st["value_model"])
            self.value_optimizer.load_state_dict(st["value_optimizer"])

    def _ensure_value_model(self, policy) -> None:
        if self.value_net is not None:
            return
        if torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            raise ConfigError("tracerl's value model is trained in one process; run it without --nproc "
                              "(or set train.algorithm.value_model: false)")
        self.value_net = build_value_model(policy)
        # train_sdar_value.py: AdamW(value_learning_rate, beta1/beta2/epsilon of the recipe, weight decay 0);
        # the scheduler is cosine with min_lr_scale 1.0, i.e. constant
        self.value_optimizer = torch.optim.AdamW(self.value_net.parameters(), lr=self.config.value_lr,
                                                 betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
        self._apply_pending()

    # --- the trace -------------------------------------------------------------------------------------------------
    def plan(self, batch: RolloutBatch):
        """(rows, score_at `[N, S, C]`, step_id `[N, C]`, rounds `[N]`)."""
        rows, assign = self.trajectory_rows(batch)
        scored = batch.completion_mask.bool() & assign.any(dim=1)
        plans = [trace_plan(r, assign[i].cpu(), scored[i].cpu(), self.config.shrink) for i, r in enumerate(rows)]
        dev = batch.prompt_ids.device
        score_at = torch.stack([p[0] for p in plans]).to(dev)
        step_id = torch.stack([p[1] for p in plans]).to(dev)
        rounds = torch.tensor([p[2] for p in plans], dtype=torch.float32, device=dev)
        return rows, score_at, step_id, rounds

    def trace_outputs(self, model, batch: RolloutBatch, rows, score_at: torch.Tensor, reduce=None) -> torch.Tensor:
        """`[n, C]`: each scored token's log-prob (or `reduce` output) in the state it is scored in."""
        out = torch.zeros(score_at.shape[0], score_at.shape[2], device=batch.prompt_ids.device)
        for s in range(score_at.shape[1]):
            m = score_at[:, s]
            if bool(m.any()):
                out = torch.where(m, self.step_logprobs(model, batch, rows, s, reduce=reduce).to(out.dtype), out)
        return out

    def _chunks(self, n: int):
        chunk = self.forward_batch_size or n
        return [slice(a, min(a + chunk, n)) for a in range(0, n, chunk)]

    @torch.no_grad()
    def prepare(self, batch: RolloutBatch, policy, reference, *, generator: torch.Generator,
                num_iterations: int) -> AlgorithmState:
        c = self.config
        rows, score_at, step_id, rounds = self.plan(batch)
        st = {"score_at": score_at, "rounds": rounds}
        if num_iterations > 1:
            st["old_logp"] = torch.cat([self.trace_outputs(policy, batch.select(sl), rows[sl], score_at[sl])
                                        for sl in self._chunks(batch.num_rows)])
        if c.value_model:
            self._ensure_value_model(policy)
            adv = zscore_rewards(batch.rewards, batch.group_size)
            old_v = torch.cat([self.trace_outputs(self.value_net, batch.select(sl), rows[sl], score_at[sl], _value_of)
                               for sl in self._chunks(batch.num_rows)])
            ret, tok_adv = zip(*[trace_returns(float(adv[i]), old_v[i], step_id[i].cpu(), c.gamma, c.lam)
                                 for i in range(batch.num_rows)])
            dev = batch.prompt_ids.device
            st["returns"], st["token_adv"] = torch.stack(ret).to(dev), torch.stack(tok_adv).to(dev)
            st["old_values"] = old_v
            metrics = {}
            if self.value_updates % c.value_train_every == 0:
                metrics = self.train_value(batch, rows, score_at, st["returns"], old_v, rounds)
            self.value_updates += 1
            return AlgorithmState(rows=st, shared={"value_metrics": metrics})
        return AlgorithmState(rows=st, shared={})

    def value_loss(self, values, old_values, returns, mask, completion_width: int) -> torch.Tensor:
        """Σ over rows of the official clipped value loss of a row (its token sum / L1): sum, not yet averaged."""
        eps = self.config.value_clip_eps
        clipped = old_values + (values - old_values).clamp(-eps, eps)
        per_tok = 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2) * mask
        return per_tok.sum() / completion_width

    def train_value(self, batch, rows, score_at, returns, old_values, rounds) -> dict[str, float]:
        """One epoch over the (sequence, round) rows: optimizer steps every `value_rows_per_step` rows (whole
        sequences kept together), loss = Σ row losses / rows of the step."""
        c, net, opt = self.config, self.value_net, self.value_optimizer
        C = batch.completion_ids.shape[1]
        steps, losses, start = [], [], 0
        acc = 0.0
        for i in range(batch.num_rows):  # close a step once it holds value_rows_per_step rows
            acc += float(rounds[i])
            if acc >= c.value_rows_per_step or i == batch.num_rows - 1:
                steps.append(slice(start, i + 1))
                start, acc = i + 1, 0.0
        with torch.enable_grad():
            for sl in steps:
                n_rows = max(float(rounds[sl].sum()), 1.0)
                opt.zero_grad(set_to_none=True)
                sub, sub_rows, sa = batch.select(sl), rows[sl], score_at[sl]
                total = 0.0
                for s in range(sa.shape[1]):  # one graph per step
                    m = sa[:, s]
                    if not bool(m.any()):
                        continue
                    v = self.step_logprobs(net, sub, sub_rows, s, reduce=_value_of)
                    loss = self.value_loss(v, old_values[sl], returns[sl], m.to(v.dtype), C) / n_rows
                    loss.backward()
                    total += float(loss.detach())
                if c.value_max_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(net.parameters(), c.value_max_grad_norm)
                opt.step()
                losses.append(total)
        opt.zero_grad(set_to_none=True)
        return {"value_loss": sum(losses) / max(len(losses), 1), "value_steps": float(len(losses))}

    # --- policy loss ------------------------------------------------------------------------------------------------
    def token_loss(self, logp, old, adv):
        """Official per-token policy loss: −min(ρA, clip(ρ)A) + β·k3(old‖new), log-ratios clamped to ±10."""
        c = self.config
        log_ratio = (logp - old).clamp(-10.0, 10.0)
        ratio = torch.exp(log_ratio)
        clipped = ratio.clamp(1 - c.clip_eps, 1 + c.clip_eps)
        surr = torch.min(ratio * adv, clipped * adv)
        d = logp - old
        kl = torch.exp((-d).clamp(-10.0, 10.0)) - 1.0 + d
        clip_hit = ((ratio - clipped).abs() > 0).to(logp.dtype)
        return -surr + c.old_kl_beta * kl, kl, clip_hit

    def backward(self, policy, batch: RolloutBatch, state: AlgorithmState, advantages: torch.Tensor, *,
                 loss_scale: float, iteration: int) -> dict[str, float]:
        rows = [_as_row(t) for t in batch.trajectories]
        score_at = state.rows["score_at"]
        C = batch.completion_ids.shape[1]
        n_rows = max(float(state.rows["rounds"].sum()), 1.0)  # the official B: (sequence, round) rows
        token_adv = state.rows.get("token_adv")
        total, kl_sum, clip_sum, ent_sum, used = 0.0, 0.0, 0.0, 0.0, 0
        for s in range(score_at.shape[1]):
            m = score_at[:, s]
            if not bool(m.any()):
                continue
            logp, entropy = self.step_logprobs(policy, batch, rows, s, with_entropy=True)
            old = state.rows["old_logp"] if "old_logp" in state.rows else logp.detach()
            adv = token_adv if token_adv is not None else advantages[:, None].expand_as(logp)
            per_tok, kl, clip_hit = self.token_loss(logp, old.to(logp.dtype), adv.to(logp.dtype))
            mf = m.to(per_tok.dtype)
            loss_s = (per_tok * mf).sum() / C / n_rows
            (loss_s * loss_scale).backward()
            total += float(loss_s.detach())
            kl_sum += float((kl.detach() * mf).sum())
            clip_sum += float((clip_hit * mf).sum())
            ent_sum += float(entropy[m].sum())
            used += int(m.sum())
        metrics = {"loss": total, "pg_loss": total, "kl": kl_sum / max(used, 1), "clip_frac": clip_sum / max(used, 1),
                   "entropy": ent_sum / max(used, 1), "scored_tokens": float(used),
                   "rounds": float(state.rows["rounds"].mean())}
        metrics.update(state.shared.get("value_metrics", {}))
        if token_adv is not None:
            metrics["value_mean"] = float((state.rows["old_values"] * score_at.any(dim=1)).sum()
                                          / max(float(score_at.any(dim=1).sum()), 1.0))
        return {k: v for k, v in metrics.items() if math.isfinite(v)}


__all__ = ["TraceRL", "build_value_model", "collapse_k_unique", "trace_plan", "trace_returns", "zscore_rewards"]

