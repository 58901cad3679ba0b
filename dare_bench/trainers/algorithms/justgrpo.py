"""JustGRPO ("The Flexibility Trap", arXiv 2601.15165): plain GRPO on exact left-to-right log-probs of a dLLM.

What. Rollouts decode strictly left to right (block length 1, one token per step: the plug-in requires
`train.rollout.block_length = 1`, see `rollout_requirements`), so a completion o has the exact likelihood of an
AR factorisation. For completion position t the query is the rollout's own decoding state

    x^(t) = [prompt, o_<t, [M], ..., [M]]          ([M] at every completion position >= t, the whole canvas)
    ℓ_t   = log softmax(f_θ(x^(t)))_{P+t}[o_t]       (Dream-style backbones: the logit shift is undone first)

which is log π_θ(o_t | prompt, o_<t) under the sampler at temperature 1. The loss is GRPO's token-level clipped
surrogate on these ℓ (common.policy_loss: ρ_t = exp(ℓ_t − ℓ_t^old), per token max(−Aρ, −A·clip(ρ, 1−ε, 1+ε)), the
verl dual clip when `clip_ratio_c` is set), aggregated with `loss_agg`, plus β·KL(π‖π_ref) per token when
`kl_beta` > 0. μ = 1 takes ℓ^old = ℓ.detach() (ratio ≡ 1, as upstream). Advantages, by default the official
`compute_group_advantages`: A = (r − mean_group) / (std_group + 1e-4) (unbiased std); `advantage: mean_std` gives
verl's ε = 1e-6, `advantage: mean` r − mean.

Position packing. The C queries of a row differ only in how much of the completion is masked, so they are stacked
as extra rows of one forward: positions are split into chunks of `position_chunk_size` (DARE
`justgrpo_position_chunk_size`); a chunk's queries are every (row, t) with t in the chunk that is scored, ordered by
position then row, each the row's full [prompt; completion] with its padding mask (padding-free varlen packing, as
DARE does with flash-attn, is the same computation with a different memory layout). `backward` runs one
forward + backward per chunk with the chunk's share of the aggregated loss (the shares sum to `agg_loss` of the
whole completion), so memory grows with the chunk size, never with C. Every micro-batch runs exactly ceil(C / k)
forwards (an empty chunk runs a zero-weighted dummy query), so ranks under FSDP stay in step.

Which positions are scored: up to and including the first EOS (the batch's `completion_mask`), or with
`score_padding` every completion position (official `logprob_loss` sums over all gen_length positions, EOS padding
included). `valid_sample_norm` drops rows with A = 0 from the loss mask (they carry no gradient), so token-mean
divides by the scored tokens of the rows with A ≠ 0; with `score_padding` that is C · #(A ≠ 0), the official
scale gain / gen_length / (valid_samples + 1e-5) without the 1e-5, per micro-batch (upstream: per prompt group
and accumulation step, the valid count averaged over ranks; the same when a micro-batch is one prompt group).

Contract: `rollout_requirements = {"block_length": 1}` (the general hook added to `base.Algorithm` with this
plug-in; the loop calls `check_rollout` once): an unset rollout block length becomes 1, any other is a ConfigError.

Sources read (LeapLabTHU/JustGRPO @ eebe50e; yjyddq/DARE @ 83ae8a3):
- JustGRPO `grpo.py`: `sample` (rollouts with `generate(..., block_length=1)`, temperature 1.0), `logprob_loss` (one
  forward per position t over the full canvas with the suffix masked, ratio of ℓ against ℓ.detach(), clip ε = 0.2,
  no KL, scale 1 / (gen_length · valid_samples), one backward per position), `compute_group_advantages` (std + 1e-4);
  `train.py` (recipe: lr 5e-6, AdamW (0.9, 0.999), wd 0, grad-norm 1.0, 125 steps, 64 prompts × 16 completions per
  step, gen 256 / 256 steps); `utils/generate.py` (LLaDA low-confidence semi-AR sampler); README (results, eval
  command `--gen_length 256 --steps 256 --block_length 32`).
- DARE `verl/workers/actor/llada_dp_actor_justgrpo.py` (`build_justgrpo_ar_position_pack`, chunked position
  ranges, `_aggregate_position_chunk`, one backward per chunk, dummy pack for empty chunks) and
  `recipe/llada/run_justgrpo_llada_8b_instruct.sh` (block_length 1, steps = response length, chunk 1).

Where the two differ. DARE packs only each row's valid tokens, so positions after the first EOS are dropped from
the canvas too (its ℓ_t then conditions on a shorter canvas than the rollout decoded with); here, as upstream,
the canvas is the rollout's (all C positions, suffix masked), and only the *scoring* stops at the first EOS unless
`score_padding`. DARE also divides the learner's logits by the rollout temperature (0.6 in its recipe); upstream and
this plug-in use temperature 1 (the paper recipe samples at 1.0). KL uses the standard verl estimators (DARE's
advantage-dependent variant is d1's `kl_variant: dare`; no JustGRPO recipe uses a KL term).

Backbones: MDLM (`bidirectional`: LLaDA as upstream and DARE; Dream through the logit shift). Block diffusion is
not enabled: the block samplers decode a block by confidence, not left to right, so ℓ would not be the rollout's
likelihood, and neither official code defines it.

Knobs (`train.algorithm`, `dare_bench/catalogue/knobs/justgrpo.py`): position_chunk_size, score_padding,
valid_sample_norm.
"""

from __future__ import annotations

from typing import Iterator

import torch

from dare_bench.catalogue.knobs.justgrpo import JustGrpoConfig
from dare_bench.errors import ConfigError
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
    model_logits,
    policy_loss,
    token_logprobs,
)

# official compute_group_advantages: (r - mean) / (std + 1e-4)
OFFICIAL_ADV_EPS = 1e-4


def position_chunks(length: int, chunk_size: int | None) -> list[tuple[int, int]]:
    """Contiguous [start, end) ranges of response positions, `chunk_size` each (the last one shorter)."""
    k = int(chunk_size or length)
    return [(s, min(s + k, length)) for s in range(0, length, k)]


def ar_queries(batch: RolloutBatch, scored: torch.Tensor, start: int, end: int, mask_id: int):
    """The AR-order queries of positions [start, end): (input_ids [q, P+C], attention_mask, rows [q], positions [q]).

    Query (r, t) is row r's [prompt; completion] with every completion position >= t replaced by `mask_id`; one
    query per scored (r, t), ordered by position then row (DARE's packing order).
    """
    p = batch.prompt_ids.shape[1]
    c = batch.completion_ids.shape[1]
    pairs = scored[:, start:end].t().nonzero()  # [q, 2] = (t - start, r), position-major
    positions = pairs[:, 0] + start
    rows = pairs[:, 1]
    ids = batch.input_ids[rows].clone()
    future = torch.arange(c, device=ids.device).unsqueeze(0) >= positions.unsqueeze(1)  # [q, C]
    ids[:, p:] = torch.where(future, torch.as_tensor(mask_id, device=ids.device, dtype=ids.dtype), ids[:, p:])
    return ids, batch.attention_mask[rows], rows, positions


def chunk_agg(loss_chunk: torch.Tensor, mask_chunk: torch.Tensor, full_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """One position chunk's share of `common.agg_loss(loss, full_mask, mode)`: the shares of all chunks sum to it."""
    m = mask_chunk.to(loss_chunk.dtype)
    if mode == "token-mean":
        return (loss_chunk * m).sum() / (full_mask.sum() + 1e-8)
    if mode == "seq-mean-token-sum":
        return (loss_chunk * m).sum(dim=-1).mean()
    if mode == "seq-mean-token-mean":
        return ((loss_chunk * m).sum(dim=-1) / full_mask.sum(dim=-1)).mean()
    if mode == "seq-mean-token-sum-norm":
        return (loss_chunk * m).sum() / full_mask.shape[-1]
    raise ConfigError(f"unknown loss_agg {mode!r}")


@register_algorithm
class JustGRPO(Algorithm):
    name = "justgrpo"
    Config = JustGrpoConfig
    attention_kinds = ("bidirectional",)  # MDLM, as upstream (LLaDA); see the module docstring for BDLM
    rollout_requirements = {"block_length": 1}  # left-to-right rollouts: ℓ is their exact likelihood

    def validate(self) -> None:
        c = self.config
        if c.mc_samples != 1:
            raise ConfigError(f"justgrpo computes exact log-probs (no Monte-Carlo estimate): mc_samples must be 1, "
                              f"got {c.mc_samples}")
        if c.advantage not in (None, "mean", "mean_std"):
            raise ConfigError(f"justgrpo advantage must be unset (official: std + 1e-4), 'mean' or 'mean_std', "
                              f"got {c.advantage!r}")
        if c.valid_sample_norm and c.loss_agg != "token-mean":
            raise ConfigError(f"justgrpo valid_sample_norm divides by the scored tokens of rows with A != 0: it needs "
                              f"loss_agg 'token-mean', got {c.loss_agg!r}")

    # --- advantages -----------------------------------------------------------------------------------------------
    def advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        if self.config.advantage is None:
            return group_advantages(rewards, group_size, "mean_std", epsilon=OFFICIAL_ADV_EPS)
        return group_advantages(rewards, group_size, self.config.advantage)

    # --- exact AR-order log-probs ---------------------------------------------------------------------------------
    def scored_positions(self, batch: RolloutBatch) -> torch.Tensor:
        """bool `[n, C]`: the completion positions whose log-prob enters the loss."""
        if self.config.score_padding:
            return torch.ones_like(batch.completion_mask, dtype=torch.bool)
        return batch.completion_mask.bool()

    def logprob_chunks(self, model, batch: RolloutBatch, scored: torch.Tensor, *, with_entropy: bool = False
                       ) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor | None]]:
        """Per position chunk [s, e): (s, e, ℓ `[n, e - s]`, entropy or None); 0 where not scored.

        One packed forward per chunk, always (a chunk without scored positions runs one zero-weighted query, so
        every micro-batch makes the same number of forwards).
        """
        n, c = batch.completion_ids.shape
        p = batch.prompt_ids.shape[1]
        mask_id = int(self.traits.mask_token_id)
        for s, e in position_chunks(c, self.config.position_chunk_size):
            chunk_scored = scored
            dummy = not bool(scored[:, s:e].any())
            if dummy:  # keep the forward (FSDP ranks must agree on the count); its output gets weight 0
                chunk_scored = torch.zeros_like(scored)
                chunk_scored[0, s] = True
            ids, attn, rows, positions = ar_queries(batch, chunk_scored, s, e, mask_id)
            q = torch.arange(ids.shape[0], device=ids.device)
            targets = batch.completion_ids[rows, positions]
            head_chunk = self.config.lm_head_chunk_tokens
            if head_chunk is not None:  # each query's one target position only, through the chunked LM head
                from dare_bench.diffusion.likelihood import scored_token_logprobs
                from dare_bench.trainers.algorithms.bgpo import with_traits

                at = torch.zeros_like(ids, dtype=torch.bool).index_put((q, p + positions), torch.tensor(True))
                grid = torch.zeros_like(ids).index_put((q, p + positions), targets)
                res = scored_token_logprobs(with_traits(model, self.traits), ids, grid, at, chunk_tokens=head_chunk,
                                            attention_mask=attn, left_align=False, with_entropy=with_entropy)
                out = tuple(x[q, p + positions] for x in res) if with_entropy else res[q, p + positions]
            else:
                logits = model_logits(model, ids, attn, logit_shift=self.traits.logit_shift)
                target_logits = logits[q, p + positions]  # [q, V]
                out = token_logprobs(target_logits, targets, with_entropy=with_entropy)
            lp, ent = out if with_entropy else (out, None)
            if dummy:
                logp = lp.new_zeros((n, e - s)) + 0.0 * lp.sum()
                entropy = None if ent is None else ent.new_zeros((n, e - s))
            else:
                logp = lp.new_zeros((n, e - s)).index_put((rows, positions - s), lp)
                entropy = None if ent is None else ent.new_zeros((n, e - s)).index_put((rows, positions - s), ent)
            yield s, e, logp, entropy

    def completion_logprobs(self, model, batch: RolloutBatch, scored: torch.Tensor | None = None) -> torch.Tensor:
        """ℓ `[n, C]` of every scored completion token (0 elsewhere), all chunks joined."""
        scored = self.scored_positions(batch) if scored is None else scored
        return torch.cat([lp for _, _, lp, _ in self.logprob_chunks(model, batch, scored)], dim=1)

    @torch.no_grad()
    def prepare(self, batch: RolloutBatch, policy, reference, *, generator: torch.Generator,
                num_iterations: int) -> AlgorithmState:
        rows: dict[str, torch.Tensor] = {}
        need_ref = self.config.kl_beta > 0
        if need_ref and reference is None:
            raise ConfigError("justgrpo with kl_beta > 0 needs a reference model")
        chunk = self.forward_batch_size or batch.num_rows
        # ℓ^old is the same for every inner iteration (no noise): one [N, C] tensor; μ = 1 uses ℓ.detach()
        for key, model, needed in (("old_logp", policy, num_iterations > 1), ("ref_logp", reference, need_ref)):
            if needed:
                rows[key] = torch.cat([self.completion_logprobs(model, batch.select(slice(a, a + chunk)))
                                       for a in range(0, batch.num_rows, chunk)], dim=0)
        return AlgorithmState(rows=rows)

    # --- loss -----------------------------------------------------------------------------------------------------
    def loss_mask(self, batch: RolloutBatch, advantages: torch.Tensor) -> torch.Tensor:
        """`[n, C]` float: the scored positions, without the rows of advantage 0 under `valid_sample_norm`."""
        mask = self.scored_positions(batch)
        if self.config.valid_sample_norm:
            mask = mask & (advantages != 0).unsqueeze(1)
        return mask.to(torch.float32)

    def backward(self, policy, batch: RolloutBatch, state: AlgorithmState, advantages: torch.Tensor, *,
                 loss_scale: float, iteration: int) -> dict[str, float]:
        c = self.config
        mask = self.loss_mask(batch, advantages)
        old_all = state.rows.get("old_logp")
        ref_all = state.rows.get("ref_logp")
        if c.kl_beta > 0 and ref_all is None:
            raise ConfigError("justgrpo with kl_beta > 0 needs reference log-probs")
        total = pg_total = kl_total = 0.0
        logps, entropies = [], []
        for s, e, logp, entropy in self.logprob_chunks(policy, batch, mask.bool(), with_entropy=True):
            m = mask[:, s:e]
            adv = advantages.to(logp.dtype)
            old = old_all[:, s:e] if old_all is not None else logp.detach()
            out = policy_loss(old, logp, adv, m, clip_low=c.clip_eps, clip_high=c.clip_eps_high,
                              clip_ratio_c=c.clip_ratio_c, agg=c.loss_agg)
            pg = chunk_agg(out.per_token, m, mask, c.loss_agg)
            loss = pg
            if c.kl_beta > 0:
                kl = chunk_agg(kl_estimate(logp, ref_all[:, s:e], c.kl_estimator), m, mask, c.loss_agg)
                loss = loss + c.kl_beta * kl
                kl_total += float(kl.detach())
            (loss * loss_scale).backward()
            total += float(loss.detach())
            pg_total += float(pg.detach())
            logps.append(logp.detach())
            entropies.append(entropy)
        # metrics over the whole completion (no gradient)
        logp = torch.cat(logps, dim=1)
        old = old_all if old_all is not None else logp
        full = policy_loss(old, logp, advantages.to(logp.dtype), mask, clip_low=c.clip_eps, clip_high=c.clip_eps_high,
                           clip_ratio_c=c.clip_ratio_c, agg=c.loss_agg)
        metrics = {"loss": total, "pg_loss": pg_total, "clip_frac": float(full.clip_frac),
                   "clip_frac_lower": float(full.clip_frac_lower), "ppo_kl": float(full.ppo_kl),
                   "entropy": float(masked_mean(torch.cat(entropies, dim=1), mask)),
                   "scored_tokens": float(mask.sum())}
        if c.kl_beta > 0:
            metrics["kl"] = kl_total
        return metrics
