"""Seeded mask samplers of the masked-diffusion forward process, one per estimator family.

Every sampler takes the batch layout the RL trainers use (DARE's): `attention_mask` `[B, L]` (1 = real token) and
`prompt_len` (an int, or `[B]` per row): columns `< prompt_len` are the (left-padded) prompt, the real tokens at
columns `>= prompt_len` are the completion (right-padded). Each draws `n` noisy copies per sequence from an explicit
`torch.Generator` (never the global RNG) and returns a `MaskDraw`:

    mask       bool  [B, n, L]  True = replaced by the mask token in the model input
    p_mask     float [B, n, L]  mask probability per position exactly as the official code stores it; the
                                estimators divide a masked completion token's log-prob by it
    response_mask bool [B, L]   valid completion tokens; a term enters an estimator iff `mask & response_mask`

The same `MaskDraw` is passed to the policy, the old policy and the reference (d1 / BGPO / VRPO antithetic
sampling: same t, same masks). Samplers (official source in brackets):

    iid_masks          LLaDA forward process, p = (1-eps) t + eps, t ~ U(0,1) per copy   [LLaDA GUIDELINES.md]
    stratified_masks   LLaDA discrete stratified estimator, counts round(linspace(k, ...))  [LLaDA get_log_likelihood,
                       DARE _forward_process_bgpo / _forward_process_vrpo]
    coupled_masks      Coupled-GRPO: full / U<t / U>t copies, t ~ U(0.2, 0.8)   [_forward_process_coupled_grpo]
    d1_masks           d1: completion fully masked, prompt masked w.p. 0.15               [_forward_process_d1]
    spg_block_masks    SPG block-wise masks                                                [_forward_process_spg]
    ebpo_block_masks   EBPO: one stratified level per (copy, block), >= 1 mask per block  [_forward_process_ebpo]
    espo_masks         ESPO: L+1 stratified levels k/(L+1), complement weights            [_forward_process_espo]
    espo_batch_masks   ESPO over a batch as DARE's worker calls it: levels stratified across the rows when
                       their completion lengths are equal, else one independent level per row  [same]
    fixed_ratio_masks  GDPO's semi-deterministic MC: at each given ratio t (quadrature nodes), n copies masking
                       exactly int(t L) tokens, weight 1/t      [GDPO NumericalIntegrationEstimator.forward_process]

Usage:

    g = torch.Generator().manual_seed(0)
    draw = stratified_masks(attention_mask, prompt_len, n=16, generator=g)
    noisy = draw.noisy_ids(input_ids, model.traits.mask_token_id)      # [B, 16, L]
    one = draw.select(3)                                                # the 4th MC copy only (n = 1)

RNG faithfulness: each sampler consumes the generator in the same order, with the same shapes and dtypes, as the
official function called once per sequence (as DARE's worker does), so a generator seeded s reproduces the official
function run after `torch.manual_seed(s)` (CPU). Float draws use `dtype` (default: torch's default dtype, as the
official code does). Deliberate deviations are listed in each sampler's docstring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Sequence

import torch

from dare_bench.errors import ConfigError, DataError

__all__ = [
    "MaskDraw",
    "prompt_response_masks",
    "iid_masks",
    "stratified_mask_counts",
    "stratified_masks",
    "coupled_masks",
    "d1_masks",
    "spg_block_masks",
    "ebpo_mask_count",
    "ebpo_block_index",
    "ebpo_block_masks",
    "espo_mask_counts",
    "espo_masks",
    "espo_batch_masks",
    "fixed_ratio_masks",
]


@dataclass(frozen=True)
class MaskDraw:
    """`n` noisy copies of each of `B` sequences, and what an estimator needs to weight them (see module doc).

    t: per-copy noise level `[B, n]` (mask ratio) where the scheme has one; EBPO: `[B, n, num_blocks]` per block.
    block_index: `[B, L]` long, the block of each completion token (-1 elsewhere), for per-block ELBO terms.
    p_complement: `[B, n, L]` mask probability of the complementary copy (ESPO variance reduction), or None.
    """

    mask: torch.Tensor
    p_mask: torch.Tensor
    response_mask: torch.Tensor
    scheme: str
    t: torch.Tensor | None = None
    block_index: torch.Tensor | None = None
    p_complement: torch.Tensor | None = None

    @property
    def n(self) -> int:
        return int(self.mask.shape[1])

    @property
    def loss_mask(self) -> torch.Tensor:
        """bool `[B, n, L]`: masked completion tokens, the positions whose term enters an estimator."""
        return self.mask & self.response_mask[:, None, :]

    @property
    def num_blocks(self) -> int:
        if self.block_index is None:
            return 0
        return int(self.block_index.max().item()) + 1 if self.block_index.numel() else 0

    def noisy_ids(self, input_ids: torch.Tensor, mask_token_id: int) -> torch.Tensor:
        """Model inputs `[B, n, L]`: `input_ids` `[B, L]` with the mask token where `mask`."""
        if input_ids.shape != self.response_mask.shape:
            raise DataError(f"input_ids {tuple(input_ids.shape)} do not match the draw's "
                            f"{tuple(self.response_mask.shape)}")
        ids = input_ids[:, None, :].expand_as(self.mask)
        return torch.where(self.mask, torch.as_tensor(mask_token_id, dtype=ids.dtype, device=ids.device), ids)

    def select(self, index: int | Sequence[int]) -> "MaskDraw":
        """The copies `index` (an int keeps a copy axis of size 1), e.g. one MC sample for a per-sample backward."""
        idx = [index] if isinstance(index, int) else [int(i) for i in index]
        if not idx or min(idx) < -self.n or max(idx) >= self.n:
            raise ConfigError(f"copy index {index} out of range for a draw of {self.n} copies")
        sel = torch.as_tensor([i % self.n for i in idx], device=self.mask.device)
        t = None if self.t is None else self.t.index_select(1, sel.to(self.t.device))
        pc = None if self.p_complement is None else self.p_complement.index_select(1, sel)
        return replace(self, mask=self.mask.index_select(1, sel), p_mask=self.p_mask.index_select(1, sel), t=t,
                       p_complement=pc)

    def rows(self, index) -> "MaskDraw":
        """The sequences `index` (a slice, or indices / bool mask over the batch), e.g. one micro-batch."""
        take = lambda x: None if x is None else x[index]  # noqa: E731
        if isinstance(index, int):
            raise ConfigError("rows() keeps the batch axis: pass a slice or a list of indices")
        return replace(self, mask=self.mask[index], p_mask=self.p_mask[index], response_mask=self.response_mask[index],
                       t=take(self.t), block_index=take(self.block_index), p_complement=take(self.p_complement))

    @staticmethod
    def concat(draws: Sequence["MaskDraw"]) -> "MaskDraw":
        """Stack draws of the same scheme and copy count along the batch axis (their lengths must agree)."""
        if not draws:
            raise ConfigError("concat needs at least one draw")
        first = draws[0]
        if any(d.scheme != first.scheme or d.n != first.n for d in draws):
            raise ConfigError("concat needs draws of one scheme with the same number of copies")

        def cat(name):
            vals = [getattr(d, name) for d in draws]
            if all(v is None for v in vals):
                return None
            if any(v is None for v in vals):
                raise ConfigError(f"concat: field {name} is set in some draws only")
            return torch.cat(vals, dim=0)

        return MaskDraw(mask=cat("mask"), p_mask=cat("p_mask"), response_mask=cat("response_mask"),
                        scheme=first.scheme, t=cat("t"), block_index=cat("block_index"),
                        p_complement=cat("p_complement"))

    def to_dict(self) -> dict:
        """Plain dict (tensors + the scheme name), e.g. to keep with a rollout batch; inverse of `from_dict`."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict) -> "MaskDraw":
        return cls(**{f.name: data.get(f.name) for f in fields(cls)})

    def complement(self) -> "MaskDraw":
        """The antithetic draw: mask the valid completion tokens left clean, with probability `p_complement`."""
        if self.p_complement is None:
            raise ConfigError(f"the {self.scheme!r} draw has no complement weights (only espo draws do)")
        mask = self.response_mask[:, None, :] & ~self.mask
        return replace(self, mask=mask, p_mask=self.p_complement, p_complement=self.p_mask,
                       scheme=self.scheme + "-complement")

    def to(self, device) -> "MaskDraw":
        move = lambda x: None if x is None else x.to(device)  # noqa: E731
        return replace(self, mask=self.mask.to(device), p_mask=self.p_mask.to(device),
                       response_mask=self.response_mask.to(device), t=move(self.t),
                       block_index=move(self.block_index), p_complement=move(self.p_complement))


# --- input checks -------------------------------------------------------------------------------------------------

def _check_generator(generator) -> torch.Generator:
    if not isinstance(generator, torch.Generator):
        raise ConfigError("mask samplers need an explicit torch.Generator (generator=torch.Generator().manual_seed(s))")
    return generator


def _prompt_lens(attention_mask: torch.Tensor, prompt_len) -> list[int]:
    if attention_mask.dim() != 2:
        raise DataError(f"attention_mask must be [B, L], got {tuple(attention_mask.shape)}")
    b, L = attention_mask.shape
    if isinstance(prompt_len, torch.Tensor):
        if prompt_len.dim() == 0:
            lens = [int(prompt_len)] * b
        elif prompt_len.shape == (b,):
            lens = [int(v) for v in prompt_len.tolist()]
        else:
            raise DataError(f"prompt_len must be an int or [B] = [{b}], got {tuple(prompt_len.shape)}")
    else:
        lens = [int(prompt_len)] * b
    for p in lens:
        if not 0 <= p <= L:
            raise DataError(f"prompt_len {p} outside [0, {L}]")
    return lens


def prompt_response_masks(attention_mask: torch.Tensor, prompt_len) -> tuple[torch.Tensor, torch.Tensor]:
    """(valid prompt tokens, valid completion tokens), both bool `[B, L]`, of the DARE layout."""
    lens = _prompt_lens(attention_mask, prompt_len)
    L = attention_mask.shape[1]
    col = torch.arange(L, device=attention_mask.device)[None, :]
    in_prompt = col < torch.as_tensor(lens, device=attention_mask.device)[:, None]
    valid = attention_mask.bool()
    return valid & in_prompt, valid & ~in_prompt


def _n(n: int, what: str = "n") -> int:
    if not isinstance(n, int) or n < 1:
        raise ConfigError(f"{what} must be a positive integer, got {n!r}")
    return n


def _dtype(dtype) -> torch.dtype:
    return torch.get_default_dtype() if dtype is None else dtype


def _finish(mask, p_mask, response_mask, device, scheme, **extra) -> MaskDraw:
    extra = {k: (None if v is None else v.to(device)) for k, v in extra.items()}
    return MaskDraw(mask=mask.to(device), p_mask=p_mask.to(device), response_mask=response_mask.to(device),
                    scheme=scheme, **extra)


# --- LLaDA i.i.d. forward process -----------------------------------------------------------------------------------

def iid_masks(attention_mask: torch.Tensor, prompt_len, *, generator: torch.Generator, n: int = 1,
              eps: float = 1e-3, t: torch.Tensor | None = None, dtype: torch.dtype | None = None) -> MaskDraw:
    """LLaDA's forward process on the completion: t ~ U(0,1) per copy, p = (1-eps) t + eps, each completion token
    masked independently with probability p; prompt and padding never masked. p_mask = p at every position.

    RNG order as LLaDA's SFT snippet: `rand(B, n)` for t (skipped when `t`, scalar or `[B, n]`, is given; e.g.
    d1 / SDAR evaluation use a fixed grid), then `rand(B, n, L)`.
    `t` is returned as the drawn t (before eps); the weight is 1/p.
    """
    _check_generator(generator)
    _n(n)
    dt = _dtype(dtype)
    gdev = generator.device
    _, response = prompt_response_masks(attention_mask, prompt_len)
    b, L = attention_mask.shape
    if t is None:
        t = torch.rand((b, n), generator=generator, device=gdev, dtype=dt)
    else:
        t = torch.as_tensor(t, dtype=dt, device=gdev)
        if t.dim() == 0:
            t = t.expand(b, n)
        if t.shape != (b, n):
            raise ConfigError(f"t must be a scalar or [B, n] = {(b, n)}, got {tuple(t.shape)}")
        if bool(((t < 0) | (t > 1)).any()):
            raise ConfigError("iid noise levels t must lie in [0, 1]")
    p = (1 - eps) * t + eps
    p_mask = p[:, :, None].expand(b, n, L).clone()
    u = torch.rand((b, n, L), generator=generator, device=gdev, dtype=dt)
    mask = (u < p_mask) & response.to(gdev)[:, None, :]
    return _finish(mask, p_mask, response, attention_mask.device, "iid", t=t)


# --- LLaDA discrete stratified estimator (BGPO, VRPO) ---------------------------------------------------------------

def stratified_mask_counts(k: int, target_len: int, n: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Mask counts `[n]` of the n stratified copies for offset k in 1..L (LLaDA `get_log_likelihood`):
    x_j = round(linspace(k, k + (n-1) L/n, n)), wrapped into [1, L].

    `torch.round` rounds halves to even, so when j L/n has a fractional part of exactly 1/2 the map k -> x_j is not a
    bijection and x_j is not uniform on 1..L (the official estimator is then slightly biased; see the tests).
    """
    dt = _dtype(dtype)
    kt = torch.tensor(k)
    # `k + (n-1) * (L/n)` is a 0-dim long tensor plus a float: evaluated in the default dtype, as upstream.
    end = (kt + (n - 1) * (target_len / n)).to(dt)
    x = torch.round(torch.linspace(float(k), end.item(), steps=n, dtype=dt)).long()
    return ((x - 1) % target_len) + 1


def stratified_masks(attention_mask: torch.Tensor, prompt_len, *, generator: torch.Generator, n: int,
                     repeats: int = 1, dtype: torch.dtype | None = None) -> MaskDraw:
    """LLaDA's discrete stratified ELBO masks (DARE `_forward_process_bgpo` / `_forward_process_vrpo`).

    Per sequence (completion of L valid tokens) and per repeat: k ~ U{1..L}; copy j masks exactly x_j
    (`stratified_mask_counts`) completion tokens chosen by `randperm(L)`; p_mask = x_j / L at every position.
    `n` = DARE's n_l (copies stratified together), `repeats` = mc_num // n_l (independent strata); the draw has
    n * repeats copies. A sequence with an empty completion raises DataError (upstream: randint(1, 1) fails).
    """
    _check_generator(generator)
    _n(n)
    _n(repeats, "repeats")
    dt = _dtype(dtype)
    gdev = generator.device
    _, response = prompt_response_masks(attention_mask, prompt_len)
    b, L = attention_mask.shape
    total = n * repeats
    mask = torch.zeros((b, total, L), dtype=torch.bool)
    p_mask = torch.zeros((b, total, L), dtype=dt)
    for i in range(b):
        idx = torch.nonzero(response[i].cpu()).flatten()
        target_len = idx.numel()
        if target_len == 0:
            raise DataError(f"row {i} has no completion token to mask")
        for r in range(repeats):
            k = int(torch.randint(1, target_len + 1, (), generator=generator, device=gdev))
            x = stratified_mask_counts(k, target_len, n, dt)
            for j in range(n):
                perm = torch.randperm(target_len, generator=generator, device=gdev).cpu()
                mask[i, r * n + j, idx[perm[: int(x[j])]]] = True
            p_mask[i, r * n:(r + 1) * n, :] = (x / target_len).to(dt)[:, None]
    t = p_mask[:, :, 0].clone()
    return _finish(mask, p_mask, response, attention_mask.device, "stratified", t=t)


# --- Coupled-GRPO ---------------------------------------------------------------------------------------------------

def coupled_masks(attention_mask: torch.Tensor, prompt_len, *, generator: torch.Generator,
                  t: float | torch.Tensor | None = None, t_range: tuple[float, float] = (0.2, 0.8),
                  dtype: torch.dtype | None = None) -> MaskDraw:
    """Coupled-GRPO's three copies per sequence (DARE `_forward_process_coupled_grpo`, DiffuCoder `forward_process`).

    copy 0: every non-prompt position masked, p = 1; copy 1: non-prompt positions with U < t masked, p = t;
    copy 2: non-prompt positions with U > t masked, p = 1 - t (U ~ U(0,1) per position, shared by copies 1-2).
    "Non-prompt" is upstream's `~prompt_index`, i.e. it includes padding (left prompt pads and completion pads), as
    upstream; those positions are hidden by the attention mask and excluded from every estimator by response_mask.

    Deviation: upstream draws t with Python's `random.uniform(0.2, 0.8)` after `set_seed(42)` (the same t and U for
    every sequence of every step in DARE). Here t = lo + (hi - lo) * rand() from `generator`, one per sequence, drawn
    before that sequence's U; pass `t` (float or `[B]`) to reproduce upstream, e.g. `random.Random(s).uniform(.2, .8)`.
    """
    _check_generator(generator)
    dt = _dtype(dtype)
    gdev = generator.device
    prompt, response = prompt_response_masks(attention_mask, prompt_len)
    b, L = attention_mask.shape
    if t is not None:
        t_all = torch.as_tensor(t, dtype=torch.float64).flatten()
        if t_all.numel() == 1:
            t_all = t_all.expand(b)
        if t_all.numel() != b:
            raise ConfigError(f"t must be a float or [B] = [{b}], got {t_all.numel()} values")
        if ((t_all <= 0) | (t_all >= 1)).any():
            raise ConfigError("coupled mask ratio t must lie in (0, 1)")
    lo, hi = t_range
    if not 0 < lo <= hi < 1:
        raise ConfigError(f"t_range must satisfy 0 < lo <= hi < 1, got {t_range}")
    mask = torch.zeros((b, 3, L), dtype=torch.bool)
    p_mask = torch.zeros((b, 3, L), dtype=dt)
    ts = torch.zeros((b, 3), dtype=dt)
    for i in range(b):
        if t is None:
            ti = lo + (hi - lo) * float(torch.rand((), generator=generator, device=gdev, dtype=torch.float64))
        else:
            ti = float(t_all[i])
        t_p = torch.ones(L, dtype=dt) * ti
        u = torch.rand((1, L), generator=generator, device=gdev, dtype=dt).cpu()[0]
        non_prompt = ~prompt[i].cpu()
        m1 = non_prompt & (u < t_p)
        m2 = non_prompt & (u > t_p)
        mask[i, 0], mask[i, 1], mask[i, 2] = non_prompt, m1, m2
        # Upstream: copy 0 `.float()` (float32), copies 1-2 `.float() * t_p`; concatenation promotes to t_p's dtype.
        p_mask[i, 0] = non_prompt.float().to(dt)
        p_mask[i, 1] = m1.float() * t_p
        p_mask[i, 2] = m2.float() * (1.0 - t_p)
        ts[i] = torch.tensor([1.0, ti, 1.0 - ti], dtype=dt)
    return _finish(mask, p_mask, response, attention_mask.device, "coupled", t=ts)


# --- d1 -----------------------------------------------------------------------------------------------------------

def d1_masks(attention_mask: torch.Tensor, prompt_len, *, generator: torch.Generator, p_prompt: float = 0.15,
             dtype: torch.dtype | None = None) -> MaskDraw:
    """d1 / diffu-GRPO one-step masks (DARE `_forward_process_d1`, d1 `forward_process`): one copy per sequence with
    every valid completion token masked (p = 1) and each valid prompt token masked with probability `p_prompt`.

    p_mask as upstream: p_prompt on valid prompt positions, 1 on valid completion positions, 0 on padding.
    RNG: `rand(1, prompt_len)` per sequence.
    """
    _check_generator(generator)
    if not 0.0 <= p_prompt < 1.0:
        raise ConfigError(f"p_prompt must lie in [0, 1), got {p_prompt}")
    dt = _dtype(dtype)
    gdev = generator.device
    lens = _prompt_lens(attention_mask, prompt_len)
    prompt, response = prompt_response_masks(attention_mask, prompt_len)
    b, L = attention_mask.shape
    mask = torch.zeros((b, 1, L), dtype=torch.bool)
    p_mask = torch.zeros((b, 1, L), dtype=dt)
    for i in range(b):
        P = lens[i]
        valid_prompt = prompt[i, :P].cpu()
        u = torch.rand((1, P), generator=generator, device=gdev, dtype=dt).cpu()[0]
        mask[i, 0, :P] = valid_prompt & (u < p_prompt)
        mask[i, 0, P:] = response[i, P:].cpu()
        p_mask[i, 0, :P] = p_prompt * valid_prompt.to(dt)
        p_mask[i, 0, P:] = response[i, P:].cpu().to(dt)
    t = torch.ones((b, 1), dtype=dt)
    return _finish(mask, p_mask, response, attention_mask.device, "d1", t=t)


# --- SPG ----------------------------------------------------------------------------------------------------------

def spg_block_masks(attention_mask: torch.Tensor, prompt_len, *, generator: torch.Generator, block_length: int = 32,
                    n: int = 1, min_t: float = 0.0, max_t: float = 1.0, mask_prompt: bool = True,
                    p_prompt: float = 0.15, dtype: torch.dtype | None = None) -> MaskDraw:
    """SPG block-wise masks (`facebookresearch/SPG` `forward_process(block_random)`, DARE `_forward_process_spg`).

    The completion region (columns prompt_len.., length a multiple of `block_length`) is split into blocks; copy j
    picks a block k among those holding valid completion tokens (`randperm(num_blocks) % completion_blocks`, the
    first n entries, so n <= num_blocks); blocks after k and padding after the completion are fully masked; in block k
    m ~ U{max(1, floor(len_k min_t)) .. min(floor(len_k max_t), len_k)} random tokens are masked (p = m / len_k).
    With `mask_prompt` (SPG's use_mask_prompt) every position before block k (prompt AND earlier completion blocks,
    as upstream) is masked with probability `p_prompt` and gets p_mask = p_prompt.
    p_mask as upstream: m/len_k in block k, 1 on completion positions after it, p_prompt (or 0) before it.
    """
    _check_generator(generator)
    _n(n)
    if not isinstance(block_length, int) or block_length < 1:
        raise ConfigError(f"block_length must be a positive integer, got {block_length!r}")
    if not 0.0 <= min_t <= max_t <= 1.0:
        raise ConfigError(f"need 0 <= min_t <= max_t <= 1, got {min_t}, {max_t}")
    dt = _dtype(dtype)
    gdev = generator.device
    lens = _prompt_lens(attention_mask, prompt_len)
    _, response = prompt_response_masks(attention_mask, prompt_len)
    b, L = attention_mask.shape
    att = attention_mask.bool().cpu()
    mask = torch.zeros((b, n, L), dtype=torch.bool)
    p_mask = torch.zeros((b, n, L), dtype=dt)
    ts = torch.zeros((b, n), dtype=dt)
    for i in range(b):
        P = lens[i]
        gen_length = L - P
        if gen_length % block_length:
            raise ConfigError(f"completion region {gen_length} is not a multiple of block_length {block_length}")
        num_blocks = gen_length // block_length
        if n > num_blocks:
            raise ConfigError(f"SPG needs n <= number of blocks ({num_blocks}), got n = {n}")
        completion = att[i, P:]
        clen = int(completion.sum())
        if clen == 0:
            raise DataError(f"row {i} has no completion token to mask")
        if not bool(completion[:clen].all()):
            raise DataError(f"row {i}: SPG needs a right-padded completion (valid tokens first)")
        completion_blocks = (clen - 1) // block_length + 1
        order = torch.randperm(num_blocks, generator=generator, device=gdev).cpu() % completion_blocks
        chosen = order[:n]
        for j in range(n):
            k = int(chosen[j])
            start = P + k * block_length
            future = torch.zeros(L, dtype=torch.bool)
            future[start:] = True
            following = torch.ones(L, dtype=torch.bool)
            row_p = torch.zeros(L, dtype=dt)
            mask_length = min(block_length, clen - block_length * k)
            lo = max(int(mask_length * min_t), 1)
            hi = min(int(mask_length * max_t), mask_length)
            if lo > hi:
                raise ConfigError(f"min_t/max_t leave no valid mask count for a block of {mask_length} tokens")
            m = int(torch.randint(lo, hi + 1, (1, 1), generator=generator, device=gdev))
            prob = m / mask_length
            perm = torch.randperm(mask_length, generator=generator, device=gdev).cpu()
            following[start:start + mask_length] = (torch.arange(mask_length) < m)[perm]
            row_p[start:start + mask_length] = prob
            row_p[start + mask_length:] = 1
            mask[i, j] = future & following
            p_mask[i, j] = row_p
            ts[i, j] = prob
        completion_append = torch.cat([torch.ones(P, dtype=torch.bool), completion])
        if mask_prompt:
            before = torch.zeros((n, L), dtype=torch.bool)
            for j in range(n):
                before[j] = torch.arange(L) < P + int(chosen[j]) * block_length
            p_mask[i] = torch.where(before, torch.as_tensor(p_prompt, dtype=dt), p_mask[i])
            u = torch.rand((1, n, L), generator=generator, device=gdev, dtype=dt).cpu()[0]
            mask[i] = (before & (u < p_prompt)) | mask[i] | ~completion_append
        else:
            mask[i] = mask[i] | ~completion_append
    return _finish(mask, p_mask, response, attention_mask.device, "spg", t=ts)


# --- EBPO (block diffusion) -----------------------------------------------------------------------------------------

def ebpo_mask_count(level: float, block_len: int) -> int:
    """Tokens masked in a block of `block_len` at noise level `level` in [0, 1]: min(floor(level n) + 1, n) >= 1."""
    return min(int(math.floor(level * block_len)) + 1, block_len)


def ebpo_block_index(attention_mask: torch.Tensor, prompt_len, block_length: int,
                     block_origin: str = "global") -> torch.Tensor:
    """Block id `[B, L]` of every valid completion token (-1 elsewhere), in compact (padding-free) coordinates.

    "global": blocks counted from the first real prompt token (compact position = valid prompt tokens + offset in
    the completion), matching the block-causal attention of the packed sequence (DARE's EBPO); "response": blocks
    counted from the first completion token. Ids are renumbered from 0 per row.
    """
    if block_origin not in ("global", "response"):
        raise ConfigError(f"block_origin must be 'global' or 'response', got {block_origin!r}")
    if not isinstance(block_length, int) or block_length < 1:
        raise ConfigError(f"block_length must be a positive integer, got {block_length!r}")
    prompt, response = prompt_response_masks(attention_mask, prompt_len)
    if block_origin == "global":
        offset = prompt.sum(dim=1, keepdim=True)
    else:
        offset = torch.zeros_like(prompt[:, :1], dtype=torch.long)
    compact = offset + torch.cumsum(response.long(), dim=1) - 1
    raw = torch.div(compact, block_length, rounding_mode="floor")
    big = torch.full_like(raw, torch.iinfo(torch.long).max)
    first = torch.where(response, raw, big).min(dim=1, keepdim=True).values
    return torch.where(response, raw - first, torch.full_like(raw, -1))


def ebpo_block_masks(attention_mask: torch.Tensor, prompt_len, *, generator: torch.Generator, block_length: int,
                     n: int, repeats: int = 1, t: torch.Tensor | None = None, block_origin: str = "global",
                     dtype: torch.dtype | None = None) -> MaskDraw:
    """EBPO all-block corruption (DARE `_forward_process_ebpo`): every copy masks >= 1 token in every completion block.

    Per sequence and repeat: N = n * (number of blocks) cells (copy-major), offset u ~ U(0,1) (`rand(())`), levels
    (u + c/N) mod 1 (or the given `t`: one value, or `[B, repeats, N]`); a block of length m_b at level tau masks
    `ebpo_mask_count(tau, m_b)` tokens chosen by `randperm(m_b)`; p_mask = count / m_b on those tokens (0 elsewhere,
    float32 as upstream). `t` of the draw is `[B, n * repeats, num_blocks]` (the levels).
    """
    _check_generator(generator)
    _n(n)
    _n(repeats, "repeats")
    dt = _dtype(dtype)
    gdev = generator.device
    _, response = prompt_response_masks(attention_mask, prompt_len)
    block_index = ebpo_block_index(attention_mask, prompt_len, block_length, block_origin).cpu()
    b, L = attention_mask.shape
    total = n * repeats
    nb_max = int(block_index.max().item()) + 1 if block_index.numel() else 0
    mask = torch.zeros((b, total, L), dtype=torch.bool)
    p_mask = torch.zeros((b, total, L), dtype=torch.float32)
    levels_out = torch.zeros((b, total, max(nb_max, 0)), dtype=dt)
    given = None if t is None else torch.as_tensor(t, dtype=torch.float32)
    for i in range(b):
        nb = int(block_index[i].max().item()) + 1
        blocks = [torch.nonzero(block_index[i] == c).flatten() for c in range(nb)]
        if nb <= 0:
            raise DataError(f"row {i} has no completion token to mask")
        num_cells = n * nb
        for r in range(repeats):
            if given is None:
                offset = torch.rand((), generator=generator, device=gdev, dtype=dt).cpu()
                levels = (offset + torch.arange(num_cells, dtype=torch.float32) / num_cells) % 1.0
            else:
                levels = given.flatten() if given.numel() == 1 else given[i, r].flatten()
                if levels.numel() == 1:
                    levels = levels.expand(num_cells)
                if levels.numel() != num_cells:
                    raise ConfigError(f"t must be a scalar or [B, repeats, n * blocks]; row {i} needs {num_cells}")
                if ((levels < 0) | (levels > 1)).any():
                    raise ConfigError("EBPO noise levels must lie in [0, 1]")
            c = 0
            for j in range(n):
                for blk_id, blk in enumerate(blocks):
                    level = levels[c]
                    c += 1
                    m_b = blk.numel()
                    cnt = min(int(torch.floor(level * m_b).item()) + 1, m_b)
                    perm = torch.randperm(m_b, generator=generator, device=gdev).cpu()
                    sel = blk[perm[:cnt]]
                    mask[i, r * n + j, sel] = True
                    p_mask[i, r * n + j, sel] = float(cnt) / float(m_b)
                    levels_out[i, r * n + j, blk_id] = level
    return _finish(mask, p_mask, response, attention_mask.device, "ebpo", t=levels_out, block_index=block_index)


# --- ESPO -----------------------------------------------------------------------------------------------------------

def espo_mask_counts(k: int, target_len: int, n: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Mask counts `[n]` for offset k in 0..L with L+1 levels: round(linspace(k, k + (n-1)(L+1)/n, n)) mod (L+1)."""
    dt = _dtype(dtype)
    x = torch.round(torch.linspace(float(k), float(k) + (n - 1) * ((target_len + 1) / n), steps=n, dtype=dt)).long()
    return x % (target_len + 1)


def espo_masks(attention_mask: torch.Tensor, prompt_len, *, generator: torch.Generator, n: int, repeats: int = 1,
               dtype: torch.dtype | None = None) -> MaskDraw:
    """ESPO's L+1-level stratified masks (DARE `_forward_process_espo`, `ML-GSAI/ESPO`).

    Per sequence and repeat: k ~ U{0..L}; copy j masks x_j = `espo_mask_counts` completion tokens (possibly 0) via
    `randperm(L)` (drawn for every copy, as upstream); p_mask = x_j / (L+1) (float32) at every position. The draw
    carries `p_complement` = L/(L+1) - p (float32, as upstream's denominator) for the antithetic complement copy.
    A sequence with no completion token gets no mask and p = 0 (and consumes no randomness).
    """
    _check_generator(generator)
    _n(n)
    _n(repeats, "repeats")
    gdev = generator.device
    dt = _dtype(dtype)
    _, response = prompt_response_masks(attention_mask, prompt_len)
    b, L = attention_mask.shape
    total = n * repeats
    mask = torch.zeros((b, total, L), dtype=torch.bool)
    p_mask = torch.zeros((b, total, L), dtype=torch.float32)
    p_comp = torch.zeros((b, total, L), dtype=torch.float32)
    for i in range(b):
        idx = torch.nonzero(response[i].cpu()).flatten()
        target_len = idx.numel()
        if target_len == 0:
            continue
        for r in range(repeats):
            k = int(torch.randint(0, target_len + 1, (), generator=generator, device=gdev))
            x = espo_mask_counts(k, target_len, n, dt)
            for j in range(n):
                perm = torch.randperm(target_len, generator=generator, device=gdev).cpu()
                local = torch.arange(target_len) < int(x[j])
                mask[i, r * n + j, idx] = local[perm]
                p = x[j].float() / float(target_len + 1)
                p_mask[i, r * n + j] = p
                tl = torch.tensor(float(target_len), dtype=torch.float32)
                p_comp[i, r * n + j] = tl / (tl + 1.0) - p
    t = p_mask[:, :, 0].to(dt)
    return _finish(mask, p_mask, response, attention_mask.device, "espo", t=t, p_complement=p_comp)


def espo_batch_masks(attention_mask: torch.Tensor, prompt_len, *, generator: torch.Generator, n: int = 1,
                     stratify_rows: bool = True, dtype: torch.dtype | None = None) -> MaskDraw:
    """`n` ESPO draws over a whole batch, each one call of DARE's `_forward_process_espo` on the batch.

    DARE's worker calls the forward process once per (iteration, MC sample) on all rows together, so its L+1
    levels are spread over the ROWS: when every row has the same number L of completion tokens, one k ~ U{0..L}
    gives row j the count round(linspace(k, k + (b-1)(L+1)/b, b))_j mod (L+1) and every row draws a `randperm(L)`;
    otherwise each row with a completion draws its own k_i ~ U{0..L_i} (all k first, then a `randperm(L_i)` for the
    rows with k_i > 0, whose first k_i entries are the masked positions; the stratified branch masks position j iff
    perm[j] < k, as DARE does in each branch). `stratify_rows=False` always takes the independent branch.
    p_mask = k / (L_i+1) (float32) at every position of the row; `p_complement` = L_i/(L_i+1) - p (float32) as in
    `espo_masks`. Copy c of the result is the c-th call, drawn in order from `generator`; the generator is consumed
    exactly as the official function consumes the global RNG (CPU), so a batch of b identical rows gives
    `espo_masks(one row, n=b)`.
    """
    _check_generator(generator)
    _n(n)
    gdev = generator.device
    dt = _dtype(dtype)
    _, response = prompt_response_masks(attention_mask, prompt_len)
    b, L = attention_mask.shape
    mask = torch.zeros((b, n, L), dtype=torch.bool)
    p_mask = torch.zeros((b, n, L), dtype=torch.float32)
    p_comp = torch.zeros((b, n, L), dtype=torch.float32)
    resp = response.cpu()
    lens = [int(v) for v in resp.sum(dim=1).tolist()]
    idxs = [torch.nonzero(resp[i]).flatten() for i in range(b)]
    equal = stratify_rows and all(v == lens[0] for v in lens)
    if max(lens, default=0) == 0:
        return _finish(mask, p_mask, response, attention_mask.device, "espo", t=p_mask[:, :, 0].to(dt),
                       p_complement=p_comp)
    for c in range(n):
        if equal:
            k = int(torch.randint(0, lens[0] + 1, (), generator=generator, device=gdev))
            counts = espo_mask_counts(k, lens[0], b, dt).tolist()
        else:
            counts = [int(torch.randint(0, t + 1, (), generator=generator, device=gdev)) if t > 0 else 0
                      for t in lens]
        for i in range(b):
            t = lens[i]
            if t == 0:
                continue
            if equal:  # DARE: position j of the completion is masked iff perm[j] < k
                perm = torch.randperm(t, generator=generator, device=gdev).cpu()
                mask[i, c, idxs[i]] = (torch.arange(t) < counts[i])[perm]
            elif counts[i] > 0:  # DARE: the positions perm[:k] are masked
                perm = torch.randperm(t, generator=generator, device=gdev).cpu()
                mask[i, c, idxs[i][perm[:counts[i]]]] = True
            tl = torch.tensor(float(t), dtype=torch.float32)
            p = torch.tensor(float(counts[i]), dtype=torch.float32) / float(t + 1)
            p_mask[i, c] = p
            p_comp[i, c] = tl / (tl + 1.0) - p
    return _finish(mask, p_mask, response, attention_mask.device, "espo", t=p_mask[:, :, 0].to(dt),
                   p_complement=p_comp)


# --- GDPO -----------------------------------------------------------------------------------------------------------

def fixed_ratio_masks(attention_mask: torch.Tensor, prompt_len, *, generator: torch.Generator,
                      ratios: Sequence[float], n: int = 1, dtype: torch.dtype | None = None) -> MaskDraw:
    """GDPO's semi-deterministic masks (`KevinRojas1499/GDPO` @ 1918683 `gdpo/likelihood_estimators.py`,
    `NumericalIntegrationEstimator.forward_process` as `get_log_likelihood` calls it): the mask ratios are given
    (the quadrature nodes t_q of the time integral), only the positions are random.

    For each ratio t (in the given order), each sequence (in batch order) and each of its n copies: exactly
    int(t * L) of its L valid completion tokens are masked (Python float product, truncated, as upstream: a ratio
    with t L < 1 masks nothing), the first int(t L) entries of `randperm(L)`. p_mask = t at every position (the
    ELBO weight is 1/t, not 1 / (count / L)); `t` of the draw is `[B, len(ratios) * n]`. Copy q * n + k is copy k
    at ratio q. RNG as upstream after `torch.manual_seed(s)` (CPU): one `randperm(L)` per (ratio, sequence, copy),
    in that nesting, so a generator seeded s reproduces the official masks of the same batch. Rows without a
    completion token get no mask and consume no randomness.
    """
    _check_generator(generator)
    _n(n)
    ratios = [float(t) for t in ratios]
    if not ratios or any(not 0.0 < t <= 1.0 for t in ratios):
        raise ConfigError(f"mask ratios must lie in (0, 1], got {ratios}")
    dt = _dtype(dtype)
    gdev = generator.device
    _, response = prompt_response_masks(attention_mask, prompt_len)
    b, L = attention_mask.shape
    total = len(ratios) * n
    resp = response.cpu()
    idxs = [torch.nonzero(resp[i]).flatten() for i in range(b)]
    mask = torch.zeros((b, total, L), dtype=torch.bool)
    for q, t in enumerate(ratios):
        for i in range(b):
            target_len = idxs[i].numel()
            if target_len == 0:
                continue
            count = int(t * target_len)
            for k in range(n):
                perm = torch.randperm(target_len, generator=generator, device=gdev).cpu()
                mask[i, q * n + k, idxs[i][perm[:count]]] = True
    t_copy = torch.tensor([t for t in ratios for _ in range(n)], dtype=dt)
    p_mask = t_copy[None, :, None].expand(b, total, L).clone()
    return _finish(mask, p_mask, response, attention_mask.device, "fixed_ratio", t=t_copy[None, :].expand(b, total))
