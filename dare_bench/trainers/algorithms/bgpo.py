"""BGPO — Boundary-Guided Policy Optimisation (arXiv 2510.11683), with memory constant in the number of MC samples.

Official code: `THU-KEG/BGPO` (no snapshot available); DARE: `dllm_core_algos.py::_forward_process_bgpo`,
`compute_policy_loss_bgpo`, `verl/workers/actor/llada_dp_actor_bgpo.py`. Spec: shared/docs/algorithms.md §6.

Estimator. LLaDA's discrete stratified ELBO (`masking.stratified_masks`: n_l copies stratified together, mc / n_l
independent strata), drawn ONCE per rollout batch in `prepare` and shared by θ_old, θ and the reference (DARE stores
the perturbed sequences). Per MC copy k: e_k(θ) = Σ_{i masked} log p_θ(x_i | x̃_k) / p_k / R, R = the padded
response length (DARE's `loss_per_sample / response_length`).

Loss. Per copy, DARE's sign-split "ratio" with Δ_k = e_k − e_k^old:
    A > 0 : ρ_k = 1 + Δ_k          (exp(x) ≥ 1 + x: a lower bound, linear in e_k)
    A ≤ 0 : ρ_k = exp(Δ_k)         (Jensen: mean_k exp(Δ_k) ≥ exp(mean_k Δ_k))
then the PPO clip with asymmetric ε and verl's dual clip c (A < 0), token-mean over the response; the total is
(1/K) Σ_k loss_k and each loss_k is back-propagated as soon as it is formed, so only one copy's graph is alive at a
time (memory O(1) in K; see `dare-bench bench memory`). At θ = θ_old both branches have value 1 and derivative 1,
so value and gradient equal those of the ELBO-ratio objective A·exp(B − B_old), B = mean_k e_k.

Deliberate difference from DARE: ρ = 1 + Δ is computed directly. DARE writes it as exp(log(1 + Δ)), which is NaN for
Δ < −1 (and breaks the whole micro-batch's loss and gradient). Where 1 + Δ > 0 the two agree to the last bit or
two (exp∘log rounding); the fixture test states the tolerance.

Normalisation (`elbo_norm`): DARE's actors differ per backbone — total / R (LLaDA, Dream), total / n_valid
(LLaDA2), total / (n_valid · R) (SDAR, whose model loss is already per answer token). The default is R; a
reproduction of a DARE block-diffusion run sets its actor's choice.

Layout: like DARE (which packs valid tokens), completion positions after the first EOS (`completion_mask == 0`) are
padding: never masked, never attended to, never scored. R stays the padded completion length.

KL (off in every DARE recipe): DARE applies its advantage-dependent `kl_penalty` to a one-sample ELBO against the
reference's MC mean; here it is applied per copy to e_k − e_k^ref on the SAME masks (antithetic, and still one
backward per copy). Knobs (`train.algorithm`, see `dare_bench/catalogue/knobs/bgpo.py`): n_l, elbo_norm; shared settings
(`train.*`):
mc_samples (default 16), clip_eps, clip_eps_high, clip_ratio_c (default 3.0), beta_kl.
"""

from __future__ import annotations

import torch

from dare_bench.catalogue.knobs.bgpo import BGPOConfig
from dare_bench.errors import ConfigError
from dare_bench.trainers.algorithms.base import (
    Algorithm,
    AlgorithmState,
    RolloutBatch,
    register_algorithm,
)
from dare_bench.trainers.algorithms.common import (
    PolicyLossOutput,
    agg_loss,
    dare_kl_penalty,
    group_advantages,
    masked_mean,
)

# --- batch layout shared by the ELBO-based plug-ins (bgpo, ebpo, spg, coupled_grpo) ------------------------------

def elbo_layout(batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(input_ids `[N, P+C]`, attention mask `[N, P+C]` with post-EOS completion positions as padding, P)."""
    ids = batch.input_ids
    attn = torch.cat([batch.prompt_mask, batch.completion_mask.to(batch.prompt_mask.dtype)], dim=1)
    return ids, attn, int(batch.prompt_ids.shape[1])


class _WithTraits:
    """A callable model that lacks `traits` (the loop's LoRA reference, `AdapterDisabled`) seen with the policy's
    traits, which the likelihood estimators read."""

    def __init__(self, model, traits):
        self.model, self.traits = model, traits

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)


def with_traits(model, traits):
    return model if hasattr(model, "traits") else _WithTraits(model, traits)


def draw_to_rows(draw, prefix: str = "") -> dict[str, torch.Tensor]:
    """The row-aligned tensors of a `MaskDraw` (so `AlgorithmState.select` slices them per micro-batch)."""
    rows = {f"{prefix}mask": draw.mask, f"{prefix}p_mask": draw.p_mask}
    if draw.block_index is not None:
        rows[f"{prefix}block_index"] = draw.block_index
    return rows


def rows_to_draw(rows: dict[str, torch.Tensor], attn: torch.Tensor, prompt_len: int, scheme: str, prefix: str = ""):
    from dare_bench.diffusion.masking import MaskDraw, prompt_response_masks

    _, response = prompt_response_masks(attn, prompt_len)
    return MaskDraw(mask=rows[f"{prefix}mask"], p_mask=rows[f"{prefix}p_mask"], response_mask=response,
                    scheme=scheme, block_index=rows.get(f"{prefix}block_index"))


def chunked_no_grad(fn, batch: RolloutBatch, state_rows: dict[str, torch.Tensor], chunk: int | None) -> torch.Tensor:
    """Concatenate `fn(batch_slice, rows_slice)` over row chunks (no-grad forwards of `prepare`)."""
    n = batch.num_rows
    step = chunk or n
    parts = []
    with torch.no_grad():
        for a in range(0, n, step):
            sl = slice(a, a + step)
            parts.append(fn(batch.select(sl), {k: v[sl] for k, v in state_rows.items()}))
    return torch.cat(parts, dim=0)


def per_iteration_no_grad(fn, batch: RolloutBatch, state_rows: dict[str, torch.Tensor], iterations: int, first: int,
                          chunk: int | None) -> torch.Tensor:
    """`[N, iterations]` float32: column it = `fn(batch_slice, rows_slice, it)` for it >= `first`, 0 before (no-grad
    forwards of `prepare`, chunked over rows): ESPO / GDPO's θ_old values of iterations 1.. and reference values."""
    def one(b, r):
        vals = [torch.zeros(b.num_rows, device=b.prompt_ids.device) if it < first else fn(b, r, it).float()
                for it in range(iterations)]
        return torch.stack(vals, dim=1)
    return chunked_no_grad(one, batch, dict(state_rows), chunk)


# --- the loss ----------------------------------------------------------------------------------------------------

def bgpo_policy_loss(old_l: torch.Tensor, l: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor, *,
                     clip_low: float = 0.2, clip_high: float | None = None, clip_ratio_c: float | None = 3.0,
                     agg: str = "token-mean") -> PolicyLossOutput:
    """DARE `compute_policy_loss_bgpo` on `[B, R]` tensors, with the linear branch computed as 1 + Δ (see module doc).

    ratio = 1 + Δ where A > 0, exp(Δ) elsewhere (A = 0 and padding included, as DARE); then max(−Aρ, −A clip(ρ)),
    capped at −A·c for A < 0 (`clip_ratio_c=None`: no dual clip). ppo_kl metric = masked mean of −log ρ.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(l)
    if not (old_l.shape == l.shape == advantages.shape):
        raise ValueError(f"shape mismatch: old {tuple(old_l.shape)}, new {tuple(l.shape)}, "
                         f"advantages {tuple(advantages.shape)}")
    if clip_high is None:
        clip_high = clip_low
    delta = l - old_l
    pos = advantages > 0
    # exp only sees Δ where it is used: a huge Δ on the linear side would give inf there and a 0·inf = NaN gradient.
    ratio = torch.where(pos, 1 + delta, torch.exp(torch.where(pos, torch.zeros_like(delta), delta)))
    with torch.no_grad():
        lin = 1 + delta
        log_lin = torch.log(torch.where(lin > 0, lin, torch.ones_like(lin)))
        neg_kl = torch.where(pos, torch.where(lin > 0, log_lin, torch.full_like(lin, float("-inf"))), delta)
        ppo_kl = masked_mean(-neg_kl, response_mask)
    pg1 = -advantages * ratio
    pg2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clipped = torch.maximum(pg1, pg2)
    clip_frac = masked_mean(torch.gt(pg2, pg1).float(), response_mask)
    if clip_ratio_c is None:
        per_token = clipped
        clip_frac_lower = torch.zeros((), dtype=torch.float32, device=l.device)
    else:
        pg3 = -advantages * clip_ratio_c
        dual = torch.min(pg3, clipped)
        clip_frac_lower = masked_mean(torch.gt(clipped, pg3) * (advantages < 0).float(), response_mask)
        per_token = torch.where(advantages < 0, dual, clipped)
    return PolicyLossOutput(agg_loss(per_token, response_mask, agg), clip_frac, ppo_kl, clip_frac_lower, per_token)


# --- the plug-in -------------------------------------------------------------------------------------------------


@register_algorithm
class BGPO(Algorithm):
    name = "bgpo"
    Config = BGPOConfig
    attention_kinds = ("bidirectional", "block_causal")  # DARE ships LLaDA, SDAR and LLaDA2 BGPO actors

    def validate(self) -> None:
        c = self.config
        n_l = c.n_l or c.mc_samples
        if c.mc_samples % n_l:
            raise ConfigError(f"bgpo: mc_samples ({c.mc_samples}) must be a multiple of n_l ({n_l})")
        if c.advantage not in (None, "mean", "mean_std", "leave_one_out"):
            raise ConfigError(f"bgpo: unknown advantage {c.advantage!r}")
        if not 0 < c.clip_eps < 1 or (c.clip_eps_high is not None and c.clip_eps_high <= 0):
            raise ConfigError(f"bgpo: need 0 < clip_eps < 1 and clip_eps_high > 0, got {c.clip_eps}, {c.clip_eps_high}")

    def advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        return group_advantages(rewards, group_size, self.config.advantage or "mean_std")

    # --- estimator ------------------------------------------------------------------------------------------------
    def draw(self, batch: RolloutBatch, generator: torch.Generator):
        from dare_bench.diffusion.masking import stratified_masks

        _, attn, p = elbo_layout(batch)
        n_l = self.config.n_l or self.config.mc_samples
        return stratified_masks(attn.cpu(), p, generator=generator, n=n_l, repeats=self.config.mc_samples // n_l,
                                dtype=torch.float32).to(batch.prompt_ids.device)

    def copy_elbo(self, model, batch: RolloutBatch, rows: dict[str, torch.Tensor], copy: int) -> torch.Tensor:
        """e_k `[n]`: copy k's ELBO total over the padded response length R."""
        from dare_bench.diffusion.likelihood import elbo_term

        ids, attn, p = elbo_layout(batch)
        draw = rows_to_draw(rows, attn, p, "stratified")
        term = elbo_term(model, ids, draw, copy, attention_mask=attn,
                         head_chunk_tokens=self.config.lm_head_chunk_tokens)
        R = batch.completion_ids.shape[1]
        norm = self.config.elbo_norm
        if norm == "padded":
            return term.total / R
        n_valid = batch.completion_mask.sum(dim=1).clamp_min(1).to(term.total.dtype)
        return term.total / n_valid if norm == "valid" else term.total / (n_valid * R)

    def all_copies(self, model, batch: RolloutBatch, rows: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.stack([self.copy_elbo(model, batch, rows, k) for k in range(rows["mask"].shape[1])], dim=1)

    @torch.no_grad()
    def prepare(self, batch: RolloutBatch, policy, reference, *, generator: torch.Generator,
                num_iterations: int) -> AlgorithmState:
        draw = self.draw(batch, generator)
        rows = draw_to_rows(draw)
        if num_iterations > 1:  # μ = 1: θ = θ_old at the update, e_k.detach() is e_k^old (as d1 does)
            rows["old_elbo"] = chunked_no_grad(lambda b, r: self.all_copies(policy, b, r), batch, dict(rows),
                                               self.forward_batch_size)
        if self.config.kl_beta > 0:
            if reference is None:
                raise ConfigError("bgpo with kl_beta > 0 needs a reference model")
            ref = with_traits(reference, self.traits)
            rows["ref_elbo"] = chunked_no_grad(lambda b, r: self.all_copies(ref, b, r), batch, dict(rows),
                                               self.forward_batch_size)
        return AlgorithmState(rows=rows)

    # --- loss -----------------------------------------------------------------------------------------------------
    def copy_loss(self, e: torch.Tensor, e_old: torch.Tensor, e_ref: torch.Tensor | None, advantages: torch.Tensor,
                  response_mask: torch.Tensor):
        """Copy k's loss from e_k `[n]` (DARE broadcasts the per-sequence values over the response)."""
        c = self.config
        R = response_mask.shape[1]
        lb = e[:, None].expand(-1, R)
        ob = e_old[:, None].expand(-1, R).to(lb.dtype)
        adv = advantages[:, None].to(lb.dtype) * response_mask
        out = bgpo_policy_loss(ob, lb, adv, response_mask, clip_low=c.clip_eps, clip_high=c.clip_eps_high,
                               clip_ratio_c=c.clip_ratio_c, agg=c.loss_agg)
        loss = out.loss
        kl = None
        if e_ref is not None:
            kld = dare_kl_penalty(lb, e_ref[:, None].expand(-1, R).to(lb.dtype), c.kl_estimator, adv)
            kl = agg_loss(kld, response_mask, c.loss_agg)
            loss = loss + c.kl_beta * kl
        return loss, out, kl

    def backward(self, policy, batch: RolloutBatch, state: AlgorithmState, advantages: torch.Tensor, *,
                 loss_scale: float, iteration: int) -> dict[str, float]:
        rows = state.rows
        K = rows["mask"].shape[1]
        cmask = batch.completion_mask
        sums = {"loss": 0.0, "pg_loss": 0.0, "clip_frac": 0.0, "clip_frac_lower": 0.0, "ppo_kl": 0.0}
        kl_sum = 0.0
        elbo_sum = 0.0
        for k in range(K):
            e = self.copy_elbo(policy, batch, rows, k)
            e_old = rows["old_elbo"][:, k] if "old_elbo" in rows else e.detach()
            e_ref = rows["ref_elbo"][:, k] if "ref_elbo" in rows else None
            loss, out, kl = self.copy_loss(e, e_old, e_ref, advantages, cmask)
            # one backward per copy: the copy's graph is freed before the next forward
            (loss * (loss_scale / K)).backward()
            sums["loss"] += float(loss.detach())
            sums["pg_loss"] += float(out.loss.detach())
            sums["clip_frac"] += float(out.clip_frac)
            sums["clip_frac_lower"] += float(out.clip_frac_lower)
            sums["ppo_kl"] += float(out.ppo_kl)
            elbo_sum += float(e.detach().mean())
            if kl is not None:
                kl_sum += float(kl.detach())
        metrics = {k: v / K for k, v in sums.items()}
        metrics["elbo"] = elbo_sum / K
        if self.config.kl_beta > 0:
            metrics["kl"] = kl_sum / K
        metrics["scored_tokens"] = float(cmask.sum())
        metrics["mc_samples"] = float(K)
        return metrics
