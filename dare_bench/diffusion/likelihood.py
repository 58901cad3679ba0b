"""Per-token log-prob and ELBO estimators of diffusion LMs, for any backbone, on masks from `masking.py`.

Everything goes through `aligned_logits(model, noisy_ids, ...)`, which calls
`model(input_ids, attention_mask=..., position_ids=..., attn_mask=...)` and reads `model.traits` only:
bidirectional backbones get the noisy ids directly; block-diffusion backbones (`traits.attention == "block_causal"`)
get the BD3 training layout `[noisy ; clean]` (`dare_bench.models.block.training_forward`, noisy-copy logits);
logits are then aligned with `shift_logits(logits, traits.logit_shift)` so that row i scores token i.
Rows with left padding are left-aligned before the forward (padding moved to the end, hidden by `attention_mask`)
and the logits moved back, as DARE's packed forward removes padding (positions restart at 0 for every sequence and
block boundaries are counted from the first real token).

Estimators (all return values on the full `[B, L]` grid, 0 outside the positions they score):

    d1_token_logprobs        one-step mean-field log p(x_i | prompt-noised, completion fully masked)   (d1)
    coupled_token_logprobs   (l_full + l_t / t + l_(1-t) / (1-t)) / 2 per completion token           (Coupled-GRPO)
    elbo_term                ONE Monte-Carlo copy: -CE / p on masked completion tokens; totals per row, per-block
                             sums (EBPO) when the draw has blocks; `reduce_var` adds ESPO's complement copy
    elbo                     all copies of a draw (loops `elbo_term`): per-copy totals `[B, n]` and their mean

Memory: with `head_chunk_tokens=N` (the run's `train.lm_head_chunk_tokens`) every estimator skips the `[B, L, V]`
logits: the forward returns final hidden states (`forward(..., return_hidden=True)`), only the positions it scores
(a copy's masked completion tokens) go through the LM head, N tokens of logits at a time in forward and backward
(`scored_token_logprobs` -> `models.lm_head.chunked_token_logprobs`); values and gradients equal the default path
within float32 rounding (tests/diffusion/test_lm_head.py). None (the default) keeps the materialised-logits path.

Packing (`train.packing`): pass the model as `diffusion.packing.PackedModel(model, traits)`; every forward here
(MDLM rows, the BD3 layout of `training_forward`) then runs packed with the same draws and numbers.

The `*_from_logits` variants take aligned logits (e.g. from a fixture). The same `MaskDraw` passed for the policy,
the old policy and the reference gives VRPO's antithetic estimates (same t and masks); BGPO / EBPO call `elbo_term`
once per copy and back-propagate each term before the next (memory O(1) in the number of copies).

Official reductions: BGPO / VRPO use e_k = total_k / R (R = padded response length) and B = mean_k e_k; LLaDA's
`get_log_likelihood` is `elbo(...).mean`; EBPO's composite ELBO is the mean over copies of the per-copy totals (the
sum over blocks); ESPO uses `reduce_var=True` totals divided by R.

Usage:

    draw = stratified_masks(attention_mask, prompt_len, n=16, generator=g)
    for k in range(draw.n):                                     # BGPO: one backward per MC copy
        term = elbo_term(model, input_ids, draw, k, attention_mask=attention_mask)
        loss_k = some_loss(term.total / R); (loss_k / draw.n).backward()
    with torch.no_grad():
        ref = elbo(ref_model, input_ids, draw, attention_mask=attention_mask).mean
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dare_bench.diffusion.masking import MaskDraw
from dare_bench.errors import ConfigError, DataError
from dare_bench.models.base import shift_logits
from dare_bench.models.lm_head import HiddenStates, chunked_token_logprobs

__all__ = [
    "aligned_logits",
    "scored_token_logprobs",
    "token_logprobs",
    "masked_token_terms",
    "d1_token_logprobs_from_logits",
    "d1_token_logprobs",
    "CoupledLogProbs",
    "coupled_token_logprobs_from_logits",
    "coupled_token_logprobs",
    "ElboTerm",
    "ElboEstimate",
    "elbo_term_from_logits",
    "elbo_term",
    "elbo",
    "block_sums",
]


# --- forward --------------------------------------------------------------------------------------------------------

def _left_align_order(attention_mask: torch.Tensor) -> torch.Tensor | None:
    """Per-row permutation putting real tokens first (stable), or None if no row has a pad before a real token."""
    valid = attention_mask.bool()
    # A pad followed later by a real token <=> the row is not of the form [1..1 0..0].
    later_real = torch.flip(torch.cummax(torch.flip(valid.int(), [1]), dim=1).values, [1]).bool()
    if not bool((~valid & later_real).any()):
        return None
    return torch.argsort((~valid).int(), dim=1, stable=True)


def _forward(model, noisy_ids, attention_mask, position_ids, clean_ids, left_align, hidden=False):
    """(logits `[N, L, V]` aligned, in left-aligned order; that order `[N, L]` or None if rows were unchanged).
    With `hidden`: `HiddenStates` (aligned final hidden states `[N, L, d]` + head) in place of the logits."""
    traits = model.traits
    if noisy_ids.dim() != 2:
        raise DataError(f"noisy_ids must be [N, L], got {tuple(noisy_ids.shape)}")
    if attention_mask is not None and attention_mask.shape != noisy_ids.shape:
        raise DataError(f"attention_mask {tuple(attention_mask.shape)} does not match ids {tuple(noisy_ids.shape)}")
    order = _left_align_order(attention_mask) if (left_align and attention_mask is not None) else None
    if order is not None:
        take = lambda x: None if x is None else x.gather(1, order)  # noqa: E731
        noisy_ids, clean_ids, position_ids = take(noisy_ids), take(clean_ids), take(position_ids)
        attention_mask = attention_mask.gather(1, order)
    if traits.is_block_diffusion:
        if clean_ids is None:
            raise ConfigError(f"{traits.family} is a block-diffusion backbone: pass clean_ids for the "
                              "[noisy; clean] training layout")
        from dare_bench.models.block import training_forward

        out = training_forward(model, noisy_ids, clean_ids, attention_mask=attention_mask, return_hidden=hidden)
    elif hidden:
        out = model(noisy_ids, attention_mask=attention_mask, position_ids=position_ids, return_hidden=True)
    else:
        out = model(noisy_ids, attention_mask=attention_mask, position_ids=position_ids)
    if hidden:
        return HiddenStates(shift_logits(out.states, traits.logit_shift), out.head), order
    return shift_logits(out, traits.logit_shift), order


def aligned_logits(model, noisy_ids: torch.Tensor, *, attention_mask: torch.Tensor | None = None,
                   position_ids: torch.Tensor | None = None, clean_ids: torch.Tensor | None = None,
                   left_align: bool = True) -> torch.Tensor:
    """Logits `[N, L, V]` where row i scores token i, for noisy inputs `[N, L]` (see module doc).

    clean_ids: the clean sequences `[N, L]`, needed by block-diffusion backbones (the `[x_t ; x_0]` layout; those
    build their own position ids, so `position_ids` only reaches bidirectional backbones).
    The estimators below avoid this function's extra `[N, L, V]` copy for left-padded rows (they score tokens in
    the left-aligned order and move only the `[N, L]` results back).
    """
    logits, order = _forward(model, noisy_ids, attention_mask, position_ids, clean_ids, left_align)
    if order is not None:
        logits = torch.empty_like(logits).scatter_(1, order[..., None].expand_as(logits), logits)
    return logits


def scored_token_logprobs(model, noisy_ids: torch.Tensor, targets: torch.Tensor, scored: torch.Tensor, *,
                          chunk_tokens: int, attention_mask: torch.Tensor | None = None,
                          position_ids: torch.Tensor | None = None, clean_ids: torch.Tensor | None = None,
                          left_align: bool = True, with_entropy: bool = False):
    """log p(targets_i | noisy input) `[N, L]` float32 at the `scored` positions (bool `[N, L]`), 0 elsewhere,
    without `[N, L, V]` logits: the forward returns final hidden states, only the scored rows go through the head,
    `chunk_tokens` rows of logits at a time (`models.lm_head.chunked_token_logprobs`, forward and backward).

    The same forward as `aligned_logits` (layout, alignment, `left_align`); with `with_entropy` also the entropy of
    each scored position's distribution (no gradient, 0 elsewhere).
    """
    if scored.shape != noisy_ids.shape or targets.shape != noisy_ids.shape:
        raise DataError(f"scored {tuple(scored.shape)} / targets {tuple(targets.shape)} do not match ids "
                        f"{tuple(noisy_ids.shape)}")
    out, order = _forward(model, noisy_ids, attention_mask, position_ids, clean_ids, left_align, hidden=True)
    scored = scored.to(out.states.device).bool()
    if order is not None:
        targets, scored = targets.gather(1, order), scored.gather(1, order)
    rows, cols = scored.nonzero(as_tuple=True)
    res = chunked_token_logprobs(out.states[rows, cols], out.head, targets[rows, cols], chunk_tokens=chunk_tokens,
                                 with_entropy=with_entropy)
    parts = res if with_entropy else (res,)
    grids = [torch.zeros(scored.shape, dtype=v.dtype, device=v.device).index_put((rows, cols), v) for v in parts]
    if order is not None:
        grids = [torch.empty_like(g).scatter_(1, order, g) for g in grids]
    return tuple(grids) if with_entropy else grids[0]


def _copy_logprobs(model, input_ids, draw: MaskDraw, copy: int, attention_mask, position_ids,
                   head_chunk_tokens: int | None = None) -> torch.Tensor:
    """log p(x_i | copy `copy` of the draw) `[B, L]` for every position (one forward); with `head_chunk_tokens`,
    for the copy's masked completion positions only (0 elsewhere), through the chunked head."""
    one = draw.select(copy)
    noisy = one.noisy_ids(input_ids, model.traits.mask_token_id)[:, 0]
    if head_chunk_tokens is not None:
        return scored_token_logprobs(model, noisy, input_ids, one.loss_mask[:, 0], chunk_tokens=head_chunk_tokens,
                                     attention_mask=attention_mask, position_ids=position_ids, clean_ids=input_ids)
    logits, order = _forward(model, noisy, attention_mask, position_ids, input_ids, True)
    if order is None:
        return token_logprobs(logits, input_ids)
    lp = token_logprobs(logits, input_ids.gather(1, order))
    return torch.empty_like(lp).scatter_(1, order, lp)


# --- token-level pieces -------------------------------------------------------------------------------------------

def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] `[..., L]` (= -cross_entropy), in float32 at least (as under autocast)."""
    if logits.shape[:-1] != targets.shape:
        raise DataError(f"logits {tuple(logits.shape)} do not match targets {tuple(targets.shape)}")
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    return -ce.view(targets.shape)


def masked_token_terms(logits: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor,
                       p_mask: torch.Tensor) -> torch.Tensor:
    """`-CE / p` on `loss_mask`, 0 elsewhere (`[..., L]`): the importance-weighted ELBO contribution of each token."""
    return _weighted(token_logprobs(logits, targets), loss_mask, p_mask)


def _weighted(lp: torch.Tensor, loss_mask: torch.Tensor, p_mask: torch.Tensor) -> torch.Tensor:
    p = torch.where(loss_mask, p_mask.to(lp.dtype), torch.ones((), dtype=lp.dtype, device=lp.device))
    if bool((p[loss_mask] <= 0).any()):
        raise DataError("a masked completion token has mask probability <= 0")
    return torch.where(loss_mask, -((-lp) / p), torch.zeros((), dtype=lp.dtype, device=lp.device))


# --- d1 -----------------------------------------------------------------------------------------------------------

def d1_token_logprobs_from_logits(logits: torch.Tensor, input_ids: torch.Tensor, draw: MaskDraw) -> torch.Tensor:
    """d1's per-token log-probs `[B, L]`: log p(x_i | noisy input) on valid completion tokens (no 1/p), 0 elsewhere.

    logits: aligned `[B, L, V]` of the draw's single copy.
    """
    return _d1_keep(token_logprobs(logits, input_ids), draw)


def _d1_keep(lp: torch.Tensor, draw: MaskDraw) -> torch.Tensor:
    if draw.n != 1:
        raise ConfigError(f"d1 uses one copy per sequence, the draw has {draw.n}")
    return torch.where(draw.loss_mask[:, 0], lp, torch.zeros((), dtype=lp.dtype, device=lp.device))


def d1_token_logprobs(model, input_ids: torch.Tensor, draw: MaskDraw, *, attention_mask: torch.Tensor,
                      position_ids: torch.Tensor | None = None, head_chunk_tokens: int | None = None) -> torch.Tensor:
    """d1 one-step mean-field per-token log-probs `[B, L]` (one forward), see `d1_token_logprobs_from_logits`.
    `head_chunk_tokens`: score the masked completion tokens only, through the chunked head (module doc)."""
    if draw.n != 1:
        raise ConfigError(f"d1 uses one copy per sequence, the draw has {draw.n}")
    return _d1_keep(_copy_logprobs(model, input_ids, draw, 0, attention_mask, position_ids, head_chunk_tokens), draw)


# --- Coupled-GRPO -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CoupledLogProbs:
    """token_logprobs `[B, L]`: (l_full + l_t / t + l_(1-t) / (1-t)) / 2 on valid completion tokens, 0 elsewhere
    (an importance-weighted score, not a normalised log-prob; ratios are exp of its differences).
    copy_elbo `[B, 3]`: per copy, sum of -CE/p over its masked completion tokens (DARE's loss_per_sample x R)."""

    token_logprobs: torch.Tensor
    copy_elbo: torch.Tensor


def coupled_token_logprobs_from_logits(logits: torch.Tensor, input_ids: torch.Tensor,
                                       draw: MaskDraw) -> CoupledLogProbs:
    """Coupled-GRPO per-token estimate from aligned logits `[B, 3, L, V]` of the three copies of `coupled_masks`."""
    if draw.n != 3 or logits.shape[:3] != draw.mask.shape:
        raise DataError(f"coupled estimate needs logits [B, 3, L, V] for a 3-copy draw; got {tuple(logits.shape)} "
                        f"and {draw.n} copies")
    ids = input_ids[:, None, :].expand_as(draw.mask)
    return _coupled(masked_token_terms(logits, ids, draw.loss_mask, draw.p_mask))


def _coupled(terms: torch.Tensor) -> CoupledLogProbs:  # terms [B, 3, L]
    token = (terms[:, 0] + (terms[:, 1] + terms[:, 2])) / 2
    return CoupledLogProbs(token_logprobs=token, copy_elbo=terms.sum(dim=-1))


def coupled_token_logprobs(model, input_ids: torch.Tensor, draw: MaskDraw, *, attention_mask: torch.Tensor,
                           position_ids: torch.Tensor | None = None,
                           head_chunk_tokens: int | None = None) -> CoupledLogProbs:
    """Coupled-GRPO per-token estimate (three forwards, one per copy; `head_chunk_tokens`: the chunked head)."""
    if draw.n != 3:
        raise ConfigError(f"coupled estimate needs the 3 copies of coupled_masks, the draw has {draw.n}")
    lp = torch.stack([_copy_logprobs(model, input_ids, draw, c, attention_mask, position_ids, head_chunk_tokens)
                      for c in range(3)], dim=1)
    return _coupled(_weighted(lp, draw.loss_mask, draw.p_mask))


# --- Monte-Carlo ELBO ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ElboTerm:
    """One MC copy: per_token `[B, L]` (-CE/p on masked completion tokens), total `[B]` (their sum),
    per_block `[B, num_blocks]` (sums per completion block) when the draw carries block ids, else None."""

    per_token: torch.Tensor
    total: torch.Tensor
    per_block: torch.Tensor | None = None

    def normalized(self, length) -> torch.Tensor:
        """total / length `[B]`: DARE's per-token ELBO (BGPO e_k, VRPO, ESPO use the padded response length R)."""
        return self.total / length


@dataclass(frozen=True)
class ElboEstimate:
    """All copies: terms `[B, n]` (per-copy totals), mean `[B]` (the MC ELBO), per_block `[B, n, blocks]` or None."""

    terms: torch.Tensor
    mean: torch.Tensor
    per_block: torch.Tensor | None = None

    def normalized(self, length) -> torch.Tensor:
        """mean / length `[B]` (see `ElboTerm.normalized`)."""
        return self.mean / length


def block_sums(per_token: torch.Tensor, block_index: torch.Tensor, num_blocks: int | None = None) -> torch.Tensor:
    """Sum `per_token` `[B, L]` within each block (`block_index` `[B, L]`, -1 = no block) -> `[B, num_blocks]`."""
    if num_blocks is None:
        num_blocks = int(block_index.max().item()) + 1 if block_index.numel() else 0
    idx = block_index.clamp_min(0).to(per_token.device)
    vals = torch.where(block_index.to(per_token.device) >= 0, per_token, torch.zeros_like(per_token))
    out = per_token.new_zeros(per_token.shape[0], max(num_blocks, 0))
    return out.scatter_add(1, idx, vals) if num_blocks > 0 else out


def _term(per_token: torch.Tensor, draw: MaskDraw) -> ElboTerm:
    per_block = None if draw.block_index is None else block_sums(per_token, draw.block_index, draw.num_blocks)
    return ElboTerm(per_token=per_token, total=per_token.sum(dim=-1), per_block=per_block)


def elbo_term_from_logits(logits: torch.Tensor, input_ids: torch.Tensor, draw: MaskDraw, copy: int = 0,
                          complement_logits: torch.Tensor | None = None) -> ElboTerm:
    """ELBO term of copy `copy` from its aligned logits `[B, L, V]`.

    With `complement_logits` (the logits of `draw.complement()`'s copy), the term is ESPO's variance-reduced
    estimate: (masked-copy term + complement term) / 2, the complement weighted by 1 / p_complement.
    """
    comp = None if complement_logits is None else token_logprobs(complement_logits, input_ids)
    return _elbo_from_logprobs(token_logprobs(logits, input_ids), draw, copy, comp)


def _elbo_from_logprobs(lp, draw: MaskDraw, copy: int, comp_lp=None) -> ElboTerm:
    one = draw.select(copy)
    per_token = _weighted(lp, one.loss_mask[:, 0], one.p_mask[:, 0])
    if comp_lp is not None:
        comp = one.complement()
        per_token = (per_token + _weighted(comp_lp, comp.loss_mask[:, 0], comp.p_mask[:, 0])) / 2
    return _term(per_token, draw)


def elbo_term(model, input_ids: torch.Tensor, draw: MaskDraw, copy: int = 0, *, attention_mask: torch.Tensor,
              position_ids: torch.Tensor | None = None, reduce_var: bool = False,
              head_chunk_tokens: int | None = None) -> ElboTerm:
    """ONE Monte-Carlo ELBO term for the batch: a forward on copy `copy` of the draw (plus, with `reduce_var`, a
    forward on its complement, ESPO). Call once per copy to back-propagate copy by copy (BGPO, EBPO).
    `head_chunk_tokens`: only the masked completion tokens go through the head, chunk by chunk (module doc)."""
    lp = _copy_logprobs(model, input_ids, draw, copy, attention_mask, position_ids, head_chunk_tokens)
    comp = None
    if reduce_var:
        comp_draw = draw.select(copy).complement()
        comp = _copy_logprobs(model, input_ids, comp_draw, 0, attention_mask, position_ids, head_chunk_tokens)
    return _elbo_from_logprobs(lp, draw, copy, comp)


def elbo(model, input_ids: torch.Tensor, draw: MaskDraw, *, attention_mask: torch.Tensor,
         position_ids: torch.Tensor | None = None, reduce_var: bool = False,
         head_chunk_tokens: int | None = None) -> ElboEstimate:
    """Monte-Carlo ELBO over all copies of the draw (a loop over `elbo_term`; wrap in no_grad for old / ref)."""
    terms = [elbo_term(model, input_ids, draw, c, attention_mask=attention_mask, position_ids=position_ids,
                       reduce_var=reduce_var, head_chunk_tokens=head_chunk_tokens) for c in range(draw.n)]
    totals = torch.stack([t.total for t in terms], dim=1)
    per_block = None if terms[0].per_block is None else torch.stack([t.per_block for t in terms], dim=1)
    return ElboEstimate(terms=totals, mean=totals.mean(dim=1), per_block=per_block)
