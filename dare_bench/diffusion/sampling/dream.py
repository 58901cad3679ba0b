"""Dream sampler: Dream `diffusion_generate` (`_sample` with alg origin | maskgit_plus | topk_margin | entropy,
`alg_temp`, `eps`, and `sample_tokens`' temperature / top_p / top_k), and Fast-dLLM's Dream block decoding
(`block_length` / `threshold` / `use_cache`) through the semi-AR loop of llada.py with Dream's token proposal.

Deliberate deviations (shared/docs/models.md):
- Fast-dLLM threshold decoding uses the Fast-dLLM LLaDA rule (every masked position of the block with confidence
  >= threshold, always at least the top-1) for Dream too (upstream Dream defers below-threshold positions to later
  quotas); the cached Dream window starts one position before the block so that the shifted logits of the block's
  first position are fresh (upstream Dream commits that position from the refresh forward).
- `stop_at_eos` is refused (the official sampler always decodes the whole canvas).
Upstream quirks kept on purpose (comments at the code): the batch-mean mask count with int() truncation (so a row
that commits the mask token changes the other rows' quotas); `origin` draws torch.rand even at temperature 0.
Settings left out of the call take the official call's effective defaults (`DREAM_CALL_DEFAULTS`: temperature 1.0,
top_k 50, top_p 1.0, inherited by upstream from transformers' PretrainedConfig), not DreamGenerationConfig's nominal
ones (temperature 0.0, top_k / top_p None); pass them explicitly (None = no filter) to choose.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from dare_bench.diffusion.sampling.core import (
    CallSettings,
    Decoded,
    SamplerRun,
    SamplerSettings,
    Trajectory,
    register_sampler,
    uniform,
)
from dare_bench.diffusion.sampling.llada import MDLM_CACHES, WindowKwargs, semi_ar_decode, uniform_blocks
from dare_bench.errors import SamplerError
from dare_bench.models.base import shift_logits
from dare_bench.models.layers import query_key_padding_mask

DREAM_ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")
# what the official Dream call uses for settings it is not given (see DreamSettings.resolve)
DREAM_CALL_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0}


def dream_filter(logits, temperature, top_p, top_k):
    """Dream's sample_tokens filtering: temperature, then top_p, then top_k, masked with finfo.min."""
    if temperature > 0:
        logits = logits / temperature
    if top_p is not None and top_p < 1:
        sorted_logits, sorted_idx = torch.sort(logits, descending=True)
        cum = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
        remove = cum > top_p
        remove[..., 1:] = remove[..., :-1].clone()
        remove[..., 0] = False
        mask = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, sorted_idx, remove)
        logits = logits.masked_fill(mask, torch.finfo(logits.dtype).min)
    if top_k is not None:
        k = min(top_k, logits.size(-1))
        drop = logits < torch.topk(logits, k)[0][..., -1, None]
        logits = logits.masked_fill(drop, torch.finfo(logits.dtype).min)
    return logits


def dream_sample_tokens(logits, temperature, top_p, top_k, alg, generator):
    """(confidence, token) per row of `logits [N, V]`, as Dream's sample_tokens with the alg's confidence."""
    probs = torch.softmax(dream_filter(logits, temperature, top_p, top_k), dim=-1)
    if temperature > 0 and probs.shape[0] > 0:
        # Categorical(probs).sample(): renormalise, then one multinomial draw with replacement per row
        norm = probs / probs.sum(-1, keepdim=True)
        x0 = torch.multinomial(norm.reshape(-1, norm.shape[-1]), 1, True, generator=generator).view(norm.shape[:-1])
        conf = torch.gather(probs, -1, x0.unsqueeze(-1)).squeeze(-1)
    else:
        conf, x0 = probs.max(dim=-1)
    if alg == "topk_margin":
        top2 = torch.sort(probs, dim=-1, descending=True)[0]
        conf = top2[..., 0] - top2[..., 1]
    elif alg == "entropy":
        conf = torch.sum(probs * torch.log(probs + 1e-10), dim=-1)
    return conf, x0


def dream_window_kwargs(attention_mask: torch.Tensor | None, batch: int, prompt_length: int, gen_length: int,
                        device) -> WindowKwargs:
    """Positions (and, with padding, the 4-D padding mask) of canvas window [w0, w1) for Dream's Fast-dLLM path."""
    length = prompt_length + gen_length
    if attention_mask is not None and bool((attention_mask == 0).any()):
        full = torch.cat([attention_mask, torch.ones(batch, gen_length, dtype=attention_mask.dtype, device=device)], 1)
        pos = full.long().cumsum(-1) - 1
        pos.masked_fill_(full == 0, 1)
        mask4 = query_key_padding_mask(full)
    else:
        pos = torch.arange(length, device=device).expand(batch, length)
        mask4 = None

    def window_kwargs(w0, w1):
        kw = {"position_ids": pos[:, w0:w1]}
        if mask4 is not None:
            kw["attn_mask"] = mask4[:, :, w0:w1, :]
        return kw
    return window_kwargs


@register_sampler("dream")
@dataclass(frozen=True)
class DreamSettings(SamplerSettings):
    """Settings of the Dream sampler: the official `diffusion_generate` (`official`), or Fast-dLLM block decoding
    when block_length / threshold / use_cache ask for it."""

    alg: str
    alg_temp: float | None
    eps: float
    temperature: float
    top_p: float | None
    top_k: int | None
    threshold: float | None
    use_cache: str  # none | prefix | dual
    steps: int
    official: bool  # no threshold, no cache, one block: the official diffusion_generate
    block_length: int | None  # Fast-dLLM only (None when official)

    # `remasking` is the reproduction configs' backbone-neutral name (SamplerSettings.remasking) for Dream's `alg`
    OPTIONS: ClassVar[frozenset[str]] = frozenset({"alg", "alg_temp", "eps", "remasking"})

    @classmethod
    def resolve(cls, call: CallSettings, options: dict[str, Any], traits, prompt_ids, attention_mask):
        gen, threshold, block_length = call.gen_length, call.threshold, call.block_length
        if "alg" in options and "remasking" in options and options["alg"] != options["remasking"]:
            raise SamplerError(f"alg {options['alg']!r} and remasking {options['remasking']!r} disagree; they name "
                               "the same Dream setting")
        alg = options.get("alg", options.get("remasking", "origin"))
        if alg not in DREAM_ALGS:
            raise SamplerError(f"unknown alg {alg!r}; use one of {DREAM_ALGS}")
        alg_temp = options.get("alg_temp")
        if alg_temp is not None and (not isinstance(alg_temp, (int, float)) or alg_temp < 0):
            raise SamplerError(f"alg_temp must be >= 0 or None, got {alg_temp!r}")
        eps = float(options.get("eps", 1e-3))
        if not 0 < eps < 1:
            raise SamplerError(f"eps must be in (0, 1), got {eps}")
        if call.stop_at_eos:
            raise SamplerError("stop_at_eos is not supported by the Dream sampler (it decodes the whole canvas)")
        use_cache = call.use_cache or "none"
        if use_cache not in MDLM_CACHES:
            raise SamplerError(f"use_cache {use_cache!r} is not one of {MDLM_CACHES} for MDLM")
        steps = call.steps if call.steps is not None else 512
        # Left-out settings take the values the official diffusion_generate ends up with (transformers 4.46):
        # DreamGenerationConfig.from_model_config(config) inherits PretrainedConfig's generation defaults, so a call
        # without them samples at temperature 1.0 with top_k 50 (the fixture gen_entropy_padded_b2 depends on it).
        # An explicit None means "no filter", as upstream.
        temperature = call.temperature if "temperature" in call.given else DREAM_CALL_DEFAULTS["temperature"]
        top_k = call.top_k if "top_k" in call.given else DREAM_CALL_DEFAULTS["top_k"]
        top_p = call.top_p if "top_p" in call.given else DREAM_CALL_DEFAULTS["top_p"]
        official = threshold is None and use_cache == "none" and block_length in (None, gen)
        if not official:
            if alg == "origin":
                raise SamplerError("alg='origin' has no confidence; use maskgit_plus / topk_margin / entropy with "
                                   "block_length / threshold / use_cache (Fast-dLLM)")
            if alg_temp:
                raise SamplerError("alg_temp sampling is not supported with Fast-dLLM block decoding")
            block_length = block_length or gen
            if gen % block_length:
                raise SamplerError(f"gen_length {gen} is not a multiple of block_length {block_length}")
            n_blocks = gen // block_length
            if threshold is None and steps % n_blocks:
                raise SamplerError(f"steps {steps} is not a multiple of the number of blocks {n_blocks}")
        return cls(**cls.common_fields(call), alg=alg, alg_temp=alg_temp, eps=eps,
                   temperature=float(temperature or 0.0), top_p=top_p, top_k=top_k, threshold=threshold,
                   use_cache=use_cache, steps=steps, official=official,
                   block_length=None if official else block_length)

    def record(self) -> dict[str, Any]:
        out = super().record()
        out.update(alg=self.alg, alg_temp=self.alg_temp, eps=self.eps, temperature=self.temperature,
                   top_p=self.top_p, top_k=self.top_k, threshold=self.threshold, use_cache=self.use_cache,
                   steps=self.steps, official=self.official, stop_at_eos=False)
        if not self.official:
            # what the shared semi-AR loop runs with (the LLaDA-only options off)
            out.update(block_length=self.block_length, remasking="low_confidence", cfg_scale=0.0, eoser=False,
                       ass=False, logits_eos_inf=False, confidence_eos_eot_inf=False, token_sampler="dream")
        return out

    def propose(self, logits: torch.Tensor, step_i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Dream's sample_tokens on a window's logits: (alg confidence, token)."""
        return dream_sample_tokens(logits, self.temperature, self.top_p, self.top_k, self.alg, self.generator)

    def proposal_prob(self, logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Probability of the drawn tokens under Dream's (temperature / top-p / top-k filtered) distribution."""
        probs = torch.softmax(dream_filter(logits.float(), self.temperature, self.top_p, self.top_k), dim=-1)
        return probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

    def decode(self, model, prompt_ids, attention_mask, run: SamplerRun) -> Decoded:
        if self.official:
            return self.diffusion_generate(prompt_ids, attention_mask, run)
        b_sz, p = prompt_ids.shape
        return semi_ar_decode(
            model, prompt_ids, run, mask_id=self.mask_id, gen_length=self.gen_length,
            blocks=uniform_blocks(p, self.gen_length, self.block_length, self.steps, self.threshold),
            threshold=self.threshold, use_cache=self.use_cache, cfg_scale=0.0,
            window_kwargs=dream_window_kwargs(attention_mask, b_sz, p, self.gen_length, prompt_ids.device),
            propose=self.propose, stop_at_eos=False, stop_ids=self.stop_ids, eos_id=self.eos_id,
            proposal_prob=self.proposal_prob)

    def diffusion_generate(self, prompt: torch.Tensor, am: torch.Tensor | None, run: SamplerRun) -> Decoded:
        """Dream `diffusion_generate` / `_sample`: every step runs the whole canvas and commits by `alg`."""
        mask_id, gen, steps = self.mask_id, self.gen_length, self.steps
        b_sz, p = prompt.shape
        length = p + gen
        device = prompt.device
        g = self.generator
        x = torch.full((b_sz, length), mask_id, dtype=torch.long, device=device)
        x[:, :p] = prompt
        kw: dict[str, Any] = {}
        if am is not None and bool((am == 0).any()):
            full = torch.cat([am, torch.ones(b_sz, gen, dtype=am.dtype, device=device)], 1)
            pos = full.long().cumsum(-1) - 1
            pos.masked_fill_(full == 0, 1)
            kw = {"attn_mask": query_key_padding_mask(full), "position_ids": pos}
        timesteps = torch.linspace(1, self.eps, steps + 1, device=device)
        alg, alg_temp = self.alg, self.alg_temp
        for i in range(steps):
            mask_index = x == mask_id
            logits = shift_logits(run.forward(x, **kw), 1)
            mask_logits = logits[mask_index]
            t, s = timesteps[i], timesteps[i + 1]
            before = x.clone() if run.recording else None
            proposal = prob = None
            if alg == "origin":
                p_transfer = 1 - s / t if i < steps - 1 else 1
                x0 = torch.full((mask_logits.shape[0],), mask_id, dtype=torch.long, device=device)
                # upstream draws torch.rand for every masked position even at temperature 0
                chosen = uniform(x0.shape, torch.float32, device, g) < p_transfer
                if bool(chosen.any()):
                    _, x0[chosen] = dream_sample_tokens(mask_logits[chosen], self.temperature, self.top_p,
                                                        self.top_k, "maskgit_plus", g)
                if before is not None:  # only the chosen positions drew a token
                    proposal = before.clone()
                    proposal[mask_index] = x0
                    prob = torch.zeros(before.shape, dtype=torch.float32, device=device)
                    if bool(chosen.any()):
                        drawn = torch.zeros(x0.shape, dtype=torch.float32, device=device)
                        drawn[chosen] = self.proposal_prob(mask_logits[chosen], x0[chosen])
                        prob[mask_index] = drawn
                x[mask_index] = x0
            else:
                conf, x0 = dream_sample_tokens(mask_logits, self.temperature, self.top_p, self.top_k, alg, g)
                if before is not None:
                    proposal = before.clone()
                    proposal[mask_index] = x0
                    prob = torch.zeros(before.shape, dtype=torch.float32, device=device)
                    prob[mask_index] = self.proposal_prob(mask_logits, x0)
                # batch-mean mask count (float32) and int() truncation, as upstream: a row that commits the mask
                # token changes the other rows' quotas
                n_mask = mask_index.sum() / mask_index.shape[0]
                n_transfer = int(n_mask * (1 - s / t)) if i < steps - 1 else int(n_mask)
                full_conf = torch.full_like(x, -torch.inf, dtype=logits.dtype)
                full_conf[mask_index] = conf
                if n_transfer > 0:
                    if alg_temp is None or alg_temp == 0:
                        _, idx = torch.topk(full_conf, n_transfer)
                    else:
                        weights = F.softmax(full_conf / alg_temp, dim=-1)
                        idx = torch.multinomial(weights, num_samples=n_transfer, generator=g)
                    x_ = torch.full_like(x, mask_id)
                    x_[mask_index] = x0
                    rows = torch.arange(b_sz, device=device).unsqueeze(1).expand_as(idx)
                    x[rows, idx] = x_[rows, idx]
            if before is not None:
                run.record(before, before, x, mask_id, length, proposal=proposal, proposal_prob=prob)
        traj = None
        if run.steps is not None:
            traj = Trajectory(steps=run.steps, prompt_length=p, kind="mdlm", mask_id=mask_id, logit_shift=1,
                              model_kwargs=kw)
        return Decoded(x, x, traj, p)
