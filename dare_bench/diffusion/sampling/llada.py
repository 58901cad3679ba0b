"""LLaDA semi-autoregressive sampler: ML-GSAI/LLaDA `generate` (low-confidence / random remasking, classifier-free
guidance), Fast-dLLM `generate_with_prefix_cache` / `generate_with_dual_cache` (`use_cache`) and threshold decoding
(`threshold`), and CJ-GRPO eval/generate.py's EOSER (`eoser`) and ascending step-size plan (`ass`).

`semi_ar_decode` is the block loop shared with Dream's Fast-dLLM decoding (dream.py); the family only hands in its
token proposal (`propose`) and model-call arguments.

Deliberate deviations (shared/docs/models.md):
- `cfg_scale > 0` without an attention_mask works (upstream raises NameError).
- `logits_eos_inf` / `confidence_eos_eot_inf` use the model's eos / stop ids instead of the hard-coded real ids;
  `confidence_eos_eot_inf` keeps upstream's effect (only the EoT confidence is zeroed, eos is untouched).
- Fast-dLLM threshold decoding commits every masked position of the block with confidence >= threshold, always at
  least the top-1 (the Fast-dLLM LLaDA rule, used for Dream too).
- `stop_at_eos` (not in the official sampler; off by default): after a block, if every row has an eos / stop id in
  its generated part, the remaining masks become eos and decoding stops.
Upstream quirks kept on purpose (comments at the code): the confidence softmax runs in the logits' dtype (current
generate.py) but in float64 under `threshold` (Fast-dLLM); earlier-block leftovers stay eligible; the mask token is
never suppressed; EOSER's factor uses the step index inside the block over the total step count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch
import torch.nn.functional as F

from dare_bench.diffusion.cache import FastDLLMCache
from dare_bench.diffusion.sampling.core import (
    CallSettings,
    Decoded,
    SamplerRun,
    SamplerSettings,
    Trajectory,
    check_int,
    register_sampler,
    sampling_prob,
    uniform,
)
from dare_bench.errors import SamplerError
from dare_bench.models.base import shift_logits

REMASKING = ("low_confidence", "random")
MDLM_CACHES = ("none", "prefix", "dual")

# (confidence [B, W], proposed token [B, W]) for logits [B, W, V] of a canvas window, at step index `step_i`
Propose = Callable[[torch.Tensor, int], "tuple[torch.Tensor, torch.Tensor]"]
# probability [B, W] of the proposed tokens [B, W] under the sampling distribution of logits [B, W, V]
ProposalProb = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# model-call keyword arguments (padding mask / positions) for canvas window [w0, w1)
WindowKwargs = Callable[[int, int], dict]


@dataclass(frozen=True)
class SemiARBlock:
    """One block [start, end) of the canvas and its steps. `step_ids` None: threshold decoding (until no mask is
    left). `counts` None: each step commits get_num_transfer_tokens of the block's masks; else the ASS per-step
    token counts, indexed by step id, the same for every row."""

    start: int
    end: int
    step_ids: tuple[int, ...] | None
    counts: tuple[int, ...] | None = None


def uniform_blocks(prompt_length: int, gen_length: int, block_length: int, steps: int,
                   threshold: float | None) -> list[SemiARBlock]:
    """LLaDA's semi-AR grid: gen_length // block_length blocks of steps // n_blocks steps each."""
    n_blocks = gen_length // block_length
    step_ids = tuple(range(steps // n_blocks)) if threshold is None else None
    p = prompt_length
    return [SemiARBlock(p + k * block_length, p + (k + 1) * block_length, step_ids) for k in range(n_blocks)]


def get_num_transfer_tokens(n_masks: torch.Tensor, steps: int) -> torch.Tensor:
    """`[B, steps]`: n // steps each, the first n % steps steps one more (LLaDA get_num_transfer_tokens)."""
    base = n_masks // steps
    rem = n_masks % steps
    q = base[:, None].expand(-1, steps).clone()
    q += (torch.arange(steps, device=n_masks.device)[None, :] < rem[:, None]).long()
    return q


def ass_plan(gen: int, steps: int, n_blocks: int) -> tuple[list[tuple[int, list[int]]], list[int]]:
    """CJ-GRPO ascending step-size plan: blocks [(size, step ids)] and the per-step token counts (2^i)."""
    s_pow = steps
    rem = gen - 2 ** s_pow
    sizes: list[tuple[int, list[int]]] = []
    if n_blocks == 1:
        sizes = [(gen, list(range(s_pow)))]
    else:
        left, power = gen, s_pow - 1
        for idx in range(n_blocks - 1, -1, -1):
            if idx == n_blocks - 1:
                size, st = 2 ** power + 1 + rem, [power]
                power -= 1
            elif idx == 0:
                size, st = left, list(range(power + 1))
            else:
                size, st = 2 ** power, [power]
                power -= 1
            left -= size
            sizes.insert(0, (size, st))
    counts = []
    last = sizes[-1][0]
    for i in range(steps):
        if i == steps - 1:
            if len(sizes) == 1:
                counts.append(last - (2 ** i - 1))
            else:
                counts.append(last if last > 2 ** i else 0)
        else:
            counts.append(2 ** i)
    return sizes, counts


def eoser_gamma(step_i: int, *, min_gamma: float, max_gamma: float, steps: int, ass: bool) -> float:
    """EOS confidence factor at step `step_i` (CJ-GRPO eval/generate.py `sampling` / `ass_sampling`)."""
    if steps <= 1:
        return max_gamma
    if ass:
        t = (2 ** (step_i + 1) - 1) / 2 ** steps
    else:
        # upstream passes the step index inside the block with the TOTAL step count, so with several blocks the
        # factor never reaches eos_max_gamma; kept as is
        t = min(max(step_i, 0), steps - 1) / (steps - 1)
    return min_gamma + (max_gamma - min_gamma) * t


def gumbel_argmax(logits: torch.Tensor, temperature: float, generator) -> torch.Tensor:
    """LLaDA's add_gumbel_noise + argmax: float64 `exp(l) / (-log u)^T`; plain argmax at T = 0."""
    if temperature == 0:
        return logits.argmax(-1)
    l64 = logits.to(torch.float64)
    u = uniform(l64.shape, torch.float64, l64.device, generator)
    return (l64.exp() / (-torch.log(u)) ** temperature).argmax(-1)


def semi_ar_decode(model, prompt: torch.Tensor, run: SamplerRun, *, mask_id: int, gen_length: int,
                   blocks: list[SemiARBlock], threshold: float | None, use_cache: str, cfg_scale: float,
                   window_kwargs: WindowKwargs, propose: Propose, stop_at_eos: bool, stop_ids: tuple[int, ...],
                   eos_id: int, proposal_prob: ProposalProb | None = None,
                   deterministic_propose: bool = False) -> Decoded:
    """The semi-AR block loop of LLaDA `generate` / Fast-dLLM: per block, each step commits the top-confidence
    masked positions of the block (a fixed quota, or every one above `threshold`), with optional prefix / dual
    cache and classifier-free guidance. With `proposal_prob` a recorded trajectory also keeps each step's proposal
    (the drawn token of every mask position of the step's window) and its sampling probability.

    `deterministic_propose` (the family's promise that `propose` draws no random numbers and scores each position
    on its own: greedy, low_confidence) lets a step compute the LM head and the confidence softmax only at the
    positions it may commit (masked, before the block end) instead of over its whole window, as upstream does:
    the same tokens, without the `[window, vocab]` logits (issue #15 item 6). Not while recording a trajectory,
    whose proposals cover every masked position of the window, nor with CFG or a shifted model."""
    b_sz, p = prompt.shape
    length = p + gen_length
    device = prompt.device
    x = torch.full((b_sz, length), mask_id, dtype=torch.long, device=device)
    x[:, :p] = prompt
    prompt_index = x != mask_id
    shift = model.traits.logit_shift
    trajectory_kwargs = window_kwargs(0, length)

    def full_logits():
        if cfg_scale > 0:
            un = x.clone()
            un[prompt_index] = mask_id
            kw = {k: torch.cat([v, v]) for k, v in window_kwargs(0, length).items()}
            cond, unc = run.forward(torch.cat([x, un]), **kw).chunk(2)
            logits = unc + (cfg_scale + 1) * (cond - unc)
        else:
            logits = run.forward(x, **window_kwargs(0, length))
        return shift_logits(logits, shift)

    cache = FastDLLMCache(model, use_cache, run.forward) if use_cache != "none" else None
    # a narrowed step asks the model for its final hidden states (return_hidden) and applies the head itself
    narrow = (deterministic_propose and cfg_scale == 0 and shift == 0 and not run.recording
              and _has_plain_head(model))

    def narrow_select(hidden, w0, end, quota, step_i):
        """`step_select` from hidden states of canvas window [w0, ...): the head and `propose` run only at the
        positions the step may commit; every other position gets what step_select gives it (confidence -inf,
        the canvas token), so the same tokens are committed."""
        states = hidden.states
        window = x[:, w0:w0 + states.shape[1]]
        eligible = window == mask_id
        eligible[:, max(end - w0, 0):] = False
        # float64 holds any propose dtype exactly, so ranks and threshold tests are those of step_select
        conf = torch.full(window.shape, -torch.inf, dtype=torch.float64, device=window.device)
        x0 = window.clone()
        if bool(eligible.any()):
            c, t = propose(hidden.head.logits(states[eligible]).unsqueeze(0), step_i)
            conf[eligible], x0[eligible] = c[0].to(torch.float64), t[0]
        commit(window, conf, x0, eligible, quota)

    def step_select(logits, w0, end, quota, step_i):
        """Commit tokens for one step from logits of canvas window [w0, w0 + logits.shape[1])."""
        w1 = w0 + logits.shape[1]
        conf, x0 = propose(logits, step_i)
        conf = conf.clone()
        conf[:, max(end - w0, 0):] = -torch.inf
        window = x[:, w0:w1]
        # positions of earlier blocks still masked (their quota was spent on a committed mask token) stay eligible,
        # as upstream: only positions from the block end on are excluded
        mask_index = window == mask_id
        x0 = torch.where(mask_index, x0, window)
        conf = torch.where(mask_index, conf, torch.full_like(conf, -torch.inf))
        eligible = mask_index.clone()
        eligible[:, max(end - w0, 0):] = False
        before = x.clone() if run.recording else None
        proposal = prob = None
        if before is not None and proposal_prob is not None:
            proposal = before.clone()
            proposal[:, w0:w1] = x0
            prob = torch.zeros(before.shape, dtype=torch.float32, device=before.device)
            prob[:, w0:w1] = torch.where(mask_index, proposal_prob(logits, x0), 0.0)
        commit(window, conf, x0, eligible, quota)
        if before is not None:
            run.record(before, before, x, mask_id, length, proposal=proposal, proposal_prob=prob)

    def commit(window, conf, x0, eligible, quota):
        """Write the step's committed tokens into `window` (a view of x): every eligible position with confidence
        >= threshold and at least the top-1 (threshold), or the `quota` top-confidence positions."""
        transfer = torch.zeros_like(eligible)
        if threshold is not None:
            for j in range(b_sz):
                if not bool(eligible[j].any()):
                    continue
                top = torch.topk(conf[j], 1).indices
                transfer[j] = eligible[j] & (conf[j] >= threshold)
                transfer[j, top] = True
        else:
            for j in range(b_sz):
                k = int(quota[j])
                if k > 0:
                    transfer[j, torch.topk(conf[j], k=k).indices] = True
        window[transfer] = x0[transfer]

    for block in blocks:
        start, end = block.start, block.end
        if block.step_ids is None:
            quota_of = lambda i: None  # noqa: E731
        elif block.counts is not None:
            quota_of = lambda i: torch.full((b_sz,), block.counts[i], dtype=torch.long, device=device)  # noqa: E731
        else:
            q = get_num_transfer_tokens((x[:, start:end] == mask_id).sum(1), len(block.step_ids))
            quota_of = lambda i, q=q: q[:, i]  # noqa: E731

        def one_step(i, first):
            if narrow:  # shift == 0 here: every window starts at the block (or the canvas) start
                if cache is None:
                    hidden = run.forward(x, return_hidden=True, **window_kwargs(0, length))
                    narrow_select(hidden, 0, end, quota_of(i), i)
                elif first:
                    narrow_select(cache.refresh(x, start, return_hidden=True, **window_kwargs(0, length)), 0, end,
                                  quota_of(i), i)
                else:
                    w1 = length if cache.mode == "prefix" else end
                    hidden = cache.window_logits(x, start, w1, return_hidden=True, **window_kwargs(start, w1))
                    narrow_select(hidden, start, end, quota_of(i), i)
            elif cache is None:
                step_select(full_logits(), 0, end, quota_of(i), i)
            elif first:
                lead = start - shift
                logits = cache.refresh(x, lead, **window_kwargs(0, length))
                step_select(shift_logits(logits, shift), 0, end, quota_of(i), i)
            else:
                # a shifted model's window starts one position before the block, so that the shifted logits of
                # the block's first position are fresh
                lead = start - shift
                w1 = length if cache.mode == "prefix" else end
                logits = cache.window_logits(x, lead, w1, **window_kwargs(lead, w1))
                logits = shift_logits(logits, shift)[:, shift:]
                step_select(logits, start, end, quota_of(i), i)

        if block.step_ids is not None:
            for n, i in enumerate(block.step_ids):
                one_step(i, n == 0)
        else:
            n = 0
            limit = 4 * (end - start) + 8
            while bool((x[:, start:end] == mask_id).any()):
                if n >= limit:
                    raise SamplerError("threshold decoding made no progress (the model keeps committing the mask "
                                       "token)")
                one_step(n, n == 0)
                n += 1
        if stop_at_eos and end < length:
            gen_part = x[:, p:end]
            hit = torch.zeros(b_sz, dtype=torch.bool, device=device)
            for t in stop_ids:
                hit |= (gen_part == t).any(1)
            if bool(hit.all()):
                rest = x[:, end:]
                rest[rest == mask_id] = eos_id
                break

    traj = None
    if run.steps is not None:
        traj = Trajectory(steps=run.steps, prompt_length=p, kind="mdlm", mask_id=mask_id, logit_shift=shift,
                          model_kwargs=trajectory_kwargs, cfg_scale=cfg_scale, prompt_index=prompt_index)
    return Decoded(x, x, traj, p)


def _has_plain_head(model) -> bool:
    """Whether the model's LM head can be applied to chosen rows (`output_head()`): a LoRA-wrapped head cannot."""
    from dare_bench.errors import ConfigError

    try:
        model.output_head()
    except (ConfigError, AttributeError, NotImplementedError):
        return False
    return True


def llada_window_kwargs(attention_mask: torch.Tensor | None, gen_length: int) -> WindowKwargs:
    """LLaDA takes the 2-D padding mask of the whole canvas on every call (None without padding)."""
    if attention_mask is None:
        return lambda w0, w1: {}
    b_sz = attention_mask.shape[0]
    full = torch.cat([attention_mask, torch.ones(b_sz, gen_length, dtype=attention_mask.dtype,
                                                 device=attention_mask.device)], 1)
    return lambda w0, w1: {"attention_mask": full}


@register_sampler("llada")
@dataclass(frozen=True)
class LladaSettings(SamplerSettings):
    """Settings of the LLaDA semi-AR sampler (also Fast-dLLM caches / threshold, EOSER and ASS)."""

    remasking: str
    cfg_scale: float
    temperature: float
    threshold: float | None
    use_cache: str  # none | prefix | dual
    eoser: bool
    ass: bool
    eos_min_gamma: float
    eos_max_gamma: float
    logits_eos_inf: bool
    confidence_eos_eot_inf: bool
    stop_at_eos: bool
    steps: int
    ass_blocks: int | None  # only with ass
    block_length: int | None  # None with ass (the plan fixes the blocks)

    OPTIONS: ClassVar[frozenset[str]] = frozenset({
        "cfg_scale", "remasking", "eoser", "ass", "ass_blocks", "eos_min_gamma", "eos_max_gamma", "logits_eos_inf",
        "confidence_eos_eot_inf"})

    @classmethod
    def resolve(cls, call: CallSettings, options: dict[str, Any], traits, prompt_ids, attention_mask):
        gen, threshold = call.gen_length, call.threshold
        remasking = options.get("remasking", "low_confidence")
        if remasking not in REMASKING:
            raise SamplerError(f"unknown remasking {remasking!r}; use one of {REMASKING}")
        cfg_scale = float(options.get("cfg_scale", 0.0))
        if cfg_scale < 0:
            raise SamplerError(f"cfg_scale must be >= 0, got {cfg_scale}")
        ass = bool(options.get("ass", False))
        eoser = bool(options.get("eoser", False))
        use_cache = call.use_cache or "none"
        if use_cache not in MDLM_CACHES:
            raise SamplerError(f"use_cache {use_cache!r} is not one of {MDLM_CACHES} for MDLM")
        if use_cache != "none" and cfg_scale > 0:
            raise SamplerError("cfg_scale > 0 is not supported with a Fast-dLLM cache (use_cache='none')")
        if (eoser or ass) and remasking != "low_confidence":
            raise SamplerError("eoser / ass need remasking='low_confidence' (as in the official CJ-GRPO code)")
        eos_max_gamma = float(options.get("eos_max_gamma", 1.0))
        if call.top_p is not None or call.top_k is not None:
            raise SamplerError("top_p / top_k do not apply to the LLaDA sampler (Gumbel-max over full logits)")
        eos_min_gamma = options.get("eos_min_gamma")
        if eos_min_gamma is None:
            eos_min_gamma = 0.01 if ass else 0.4
        steps, ass_blocks, block_length = call.steps, None, call.block_length
        if ass:
            if threshold is not None:
                raise SamplerError("ass fixes its own per-step quotas; it cannot be combined with threshold")
            s_pow = int(math.floor(math.log2(gen)))
            if steps is not None and steps != s_pow:
                raise SamplerError(f"ass decodes gen_length {gen} in floor(log2(gen_length)) = {s_pow} steps; "
                                   f"got steps={steps}")
            ass_blocks = check_int("ass_blocks", options.get("ass_blocks", min(4, s_pow)))
            if ass_blocks > s_pow:
                raise SamplerError(f"ass_blocks {ass_blocks} exceeds the {s_pow} ASS steps")
            steps, block_length = s_pow, None
        else:
            block_length = block_length or gen
            if gen % block_length:
                raise SamplerError(f"gen_length {gen} is not a multiple of block_length {block_length}")
            n_blocks = gen // block_length
            steps = steps if steps is not None else gen
            if threshold is None and steps % n_blocks:
                raise SamplerError(f"steps {steps} is not a multiple of the number of blocks {n_blocks}")
        return cls(**cls.common_fields(call), remasking=remasking, cfg_scale=cfg_scale,
                   temperature=float(call.temperature or 0.0), threshold=threshold, use_cache=use_cache, eoser=eoser,
                   ass=ass, eos_min_gamma=eos_min_gamma, eos_max_gamma=eos_max_gamma,
                   logits_eos_inf=bool(options.get("logits_eos_inf", False)),
                   confidence_eos_eot_inf=bool(options.get("confidence_eos_eot_inf", False)),
                   stop_at_eos=bool(call.stop_at_eos or False), steps=steps, ass_blocks=ass_blocks,
                   block_length=block_length)

    def record(self) -> dict[str, Any]:
        out = super().record()
        out.update(remasking=self.remasking, cfg_scale=self.cfg_scale, temperature=self.temperature,
                   threshold=self.threshold, use_cache=self.use_cache, eoser=self.eoser, ass=self.ass,
                   eos_min_gamma=self.eos_min_gamma, eos_max_gamma=self.eos_max_gamma,
                   logits_eos_inf=self.logits_eos_inf, confidence_eos_eot_inf=self.confidence_eos_eot_inf,
                   stop_at_eos=self.stop_at_eos, token_sampler="llada", steps=self.steps)
        if self.ass:
            out["ass_blocks"] = self.ass_blocks
        out["block_length"] = self.block_length
        return out

    def blocks(self, prompt_length: int) -> list[SemiARBlock]:
        if not self.ass:
            return uniform_blocks(prompt_length, self.gen_length, self.block_length, self.steps, self.threshold)
        sizes, counts = ass_plan(self.gen_length, self.steps, self.ass_blocks)
        plan, cur = [], prompt_length
        for size, step_ids in sizes:
            plan.append(SemiARBlock(cur, cur + size, tuple(step_ids), tuple(counts)))
            cur += size
        return plan

    def propose(self, logits: torch.Tensor, step_i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Gumbel-max tokens and their remasking confidence (low_confidence: softmax probability, EOSER-scaled for
        eos; random: uniform)."""
        if self.logits_eos_inf:
            logits = logits.clone()
            logits[..., self.eos_id] = -torch.inf
        x0 = gumbel_argmax(logits, self.temperature, self.generator)
        eot_ids = [t for t in self.stop_ids if t != self.eos_id]
        if self.confidence_eos_eot_inf and eot_ids:
            # upstream's chained assignment only reaches the EoT logits used by the confidence softmax
            logits = logits.clone()
            logits[..., eot_ids] = -torch.inf
        if self.remasking == "low_confidence":
            # LLaDA's current generate(): softmax in the logits' dtype; Fast-dLLM (threshold): float64
            lp = logits.to(torch.float64) if self.threshold is not None else logits
            conf = torch.gather(F.softmax(lp, dim=-1), -1, x0.unsqueeze(-1)).squeeze(-1)
            if self.eoser:
                gamma = eoser_gamma(step_i, min_gamma=self.eos_min_gamma, max_gamma=self.eos_max_gamma,
                                    steps=self.steps, ass=self.ass)
                conf = torch.where(x0 == self.eos_id, conf * gamma, conf)
        else:
            conf = uniform((x0.shape[0], x0.shape[1]), torch.float32, x0.device, self.generator)
        return conf, x0

    def proposal_prob(self, logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Probability of the drawn tokens under the distribution `propose` samples from (Gumbel-max at T)."""
        if self.logits_eos_inf:
            logits = logits.clone()
            logits[..., self.eos_id] = -torch.inf
        return sampling_prob(logits, tokens, self.temperature)

    def decode(self, model, prompt_ids, attention_mask, run: SamplerRun) -> Decoded:
        return semi_ar_decode(model, prompt_ids, run, mask_id=self.mask_id, gen_length=self.gen_length,
                              blocks=self.blocks(prompt_ids.shape[1]), threshold=self.threshold,
                              use_cache=self.use_cache, cfg_scale=self.cfg_scale,
                              window_kwargs=llada_window_kwargs(attention_mask, self.gen_length),
                              propose=self.propose, stop_at_eos=self.stop_at_eos, stop_ids=self.stop_ids,
                              eos_id=self.eos_id, proposal_prob=self.proposal_prob,
                              # greedy low-confidence proposals draw nothing and score each position alone
                              deterministic_propose=self.temperature == 0 and self.remasking == "low_confidence")
