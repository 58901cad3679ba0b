"""Diffusion samplers: LLaDA semi-AR, Dream, block diffusion (SDAR / LLaDA2), Fast-dLLM caches and threshold decoding.

    from dare_bench.diffusion.sampling import generate, replay_trajectory
    out = generate(model, prompt_ids, attention_mask, gen_length=256, steps=256, block_length=32)
    out.sequences        # shaped like the official function's return (prompt + generated, or LLaDA2's cut)
    out.stats            # forwards, token_forwards, generated_tokens, tokens_per_forward, wall_seconds
    out = generate(model, prompt_ids, return_trajectory=True); replay_trajectory(model, out.trajectory)

The sampler follows `model.traits` (never a family name): bidirectional + logit_shift 0 -> "llada" (ML-GSAI/LLaDA
`generate`), logit_shift 1 -> "dream" (Dream `diffusion_generate`), block_causal -> "block" (SDAR
`block_diffusion_generate` or LLaDA2 `generate`, chosen by `convention`). `sampler=` overrides. Mask / eos ids come
from the traits (`mask_id=` / `eos_id=` override them, as the official functions take them as arguments).

Settings (official names): steps, gen_length (Dream: max_new_tokens), block_length, temperature, cfg_scale,
remasking (low_confidence | random), threshold, alg (origin | maskgit_plus | topk_margin | entropy), alg_temp, eps,
top_p, top_k, denoising_steps, remasking_strategy (low_confidence_static | low_confidence_dynamic | sequential),
confidence_threshold, use_cache (none | prefix | dual for MDLM; block diffusion: exact | none), eoser, ass,
stop_at_eos, logits_eos_inf, confidence_eos_eot_inf, eos_early_stop, minimal_topk, convention (sdar | llada2),
generator, return_trajectory, progress.

Exactness (shared/docs/models.md; fixtures in shared/fixtures/parity, test
`pytest tests/diffusion/test_generation_parity.py`): with `generator=None` every official global-RNG call is made in
the official order and shape, so seeded fixture cases match too. Deliberate deviations, all documented at the code:
- LLaDA `cfg_scale > 0` without an attention_mask works (upstream raises NameError).
- LLaDA `logits_eos_inf` / `confidence_eos_eot_inf` use the model's eos / stop ids instead of the hard-coded real
  ids; `confidence_eos_eot_inf` keeps upstream's effect (only the EoT confidence is zeroed, eos is untouched).
- Fast-dLLM threshold decoding uses the Fast-dLLM LLaDA rule (every masked position of the block with confidence
  >= threshold, always at least the top-1) for Dream too (upstream Dream defers below-threshold positions to later
  quotas); the cached Dream window starts one position before the block so that the shifted logits of the block's
  first position are fresh (upstream Dream commits that position from the refresh forward).
- SDAR temperature 0 is a SamplerError (upstream divides by zero); greedy is `top_k=1` as upstream.
- SDAR: a block still masked after `denoising_steps` (only if the model commits the mask token) gets more steps with
  quota 1 (upstream raises IndexError).
- Block samplers (SDAR, LLaDA2) decode equal-length prompts as one batch (rows are independent; a finished row is
  frozen). The block grid is absolute, so a left-padded batch is decoded row by row (same tokens as one prompt at a
  time, no joint trajectory) and laid out like the input (pads, prompt, canvas; right-filled with the mask id).
  LLaDA2 rows of different cut lengths are right-padded with the pad id. `eos_early_stop` needs batch 1.
- Dream with `stop_at_eos` is refused (the official sampler always decodes the whole canvas).
- LLaDA `stop_at_eos` (not in the official sampler; off by default): after a block, if every row has an eos / stop id
  in its generated part, the remaining masks become eos and decoding stops.
- Block samplers with `use_cache="exact"` (default) store a finished block's keys / values in the next block's first
  forward instead of a separate commit forward (same tokens, one model call fewer per block).

Upstream quirks kept on purpose: LLaDA's confidence softmax runs in the logits' dtype (current generate.py) but in
float64 under `threshold` (Fast-dLLM); earlier-block leftovers stay eligible; the mask token is never suppressed.
Dream uses the batch-mean mask count with int() truncation (so a row that commits the mask token changes the other
rows' quotas) and `origin` draws torch.rand even at temperature 0. SDAR asks topk for the scheduled count even when
fewer masks are left (rewriting unmasked positions); `sequential` may rewrite too. LLaDA2 `temperature=0` still
samples (multinomial), `steps = min(steps, gen_length // minimal_topk)`, returns only the generated tokens cut after
the first eos, and `eos_early_stop` returns prompt + tokens (searching eos from position 0). EOSER's factor uses the
step index inside the block over the total step count (as CJ-GRPO eval/generate.py).
Dream settings left out of the call take the official call's effective defaults (`DREAM_CALL_DEFAULTS`: temperature
1.0, top_k 50, top_p 1.0, inherited by upstream from transformers' PretrainedConfig), not DreamGenerationConfig's
nominal ones (temperature 0.0, top_k / top_p None); pass them explicitly (None = no filter) to choose.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from dare_bench.diffusion.cache import ExactBlockCache, FastDLLMCache
from dare_bench.errors import SamplerError
from dare_bench.models.base import shift_logits
from dare_bench.models.layers import block_causal_mask, query_key_padding_mask

SAMPLERS = ("llada", "dream", "block")
_COMMON = {
    "sampler", "gen_length", "max_new_tokens", "steps", "block_length", "temperature", "top_p", "top_k",
    "use_cache", "threshold", "stop_at_eos", "generator", "return_trajectory", "progress", "mask_id", "eos_id",
}
_ONLY = {
    "llada": {"cfg_scale", "remasking", "eoser", "ass", "ass_blocks", "eos_min_gamma", "eos_max_gamma",
              "logits_eos_inf", "confidence_eos_eot_inf"},
    "dream": {"alg", "alg_temp", "eps"},
    "block": {"denoising_steps", "remasking_strategy", "confidence_threshold", "convention", "minimal_topk",
              "eos_early_stop"},
}
DREAM_ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")
# what the official Dream call uses for settings it is not given (see the Dream branch of `_resolve`)
DREAM_CALL_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0}
REMASKING = ("low_confidence", "random")
REMASKING_STRATEGIES = ("low_confidence_static", "low_confidence_dynamic", "sequential")
BLOCK_CONVENTIONS = ("sdar", "llada2")
# Which official block sampler a family ships with (its own generate function), by traits.family.
DEFAULT_BLOCK_CONVENTION = {"llada2": "llada2"}


# --------------------------------------------------------------------------------------------------------------
# results


@dataclass
class GenerationStats:
    forwards: int = 0
    token_forwards: int = 0  # sum over forwards of batch x query length: a hardware-free FLOP proxy
    generated_tokens: int = 0  # per sequence (mean over the batch) committed in the generated region
    tokens_per_forward: float = 0.0
    wall_seconds: float = 0.0


@dataclass
class TrajectoryStep:
    state: torch.Tensor  # [B, T] canvas before the step
    unmasked: torch.Tensor  # bool [B, T]: positions that went from mask to a token in this step
    region_end: int  # canvas end the step's model call could see (block end for block diffusion)


@dataclass
class Trajectory:
    steps: list[TrajectoryStep]
    prompt_length: int
    kind: str  # "mdlm" | "block"
    mask_id: int
    logit_shift: int = 0
    block_size: int | None = None
    model_kwargs: dict[str, Any] = field(default_factory=dict)  # padding mask / positions of the full canvas
    cfg_scale: float = 0.0
    prompt_index: torch.Tensor | None = None


@dataclass
class GenerationOutput:
    sequences: torch.Tensor
    canvas: torch.Tensor  # [B, T] full canvas (prompt + every generated position) before any cut
    prompt_length: int
    stats: GenerationStats
    settings: dict[str, Any]
    trajectory: Trajectory | None = None


class _Run:
    """Counts forwards, records the trajectory and drives the optional progress bar."""

    def __init__(self, model, record: bool, progress: bool, total: int | None):
        self.model = model
        self.stats = GenerationStats()
        self.steps: list[TrajectoryStep] | None = [] if record else None
        self.bar = None
        if progress:
            try:
                from tqdm.auto import tqdm
            except ModuleNotFoundError:  # pragma: no cover - tqdm ships with the base install
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(total=total, desc="diffusion forwards", leave=False)

    def forward(self, ids: torch.Tensor, **kwargs) -> torch.Tensor:
        self.stats.forwards += 1
        self.stats.token_forwards += int(ids.numel())
        if self.bar is not None:
            self.bar.update(1)
        out = self.model(ids, **kwargs)
        return out.logits if hasattr(out, "logits") else out

    def record(self, state: torch.Tensor, before: torch.Tensor, after: torch.Tensor, mask_id: int, end: int):
        if self.steps is not None:
            unmasked = (before == mask_id) & (after != mask_id)
            self.steps.append(TrajectoryStep(state=state, unmasked=unmasked, region_end=end))

    def close(self):
        if self.bar is not None:
            self.bar.close()


# --------------------------------------------------------------------------------------------------------------
# settings


def _check_int(name, value, low=1):
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise SamplerError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def _check_unit(name, value, allow_none=True):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < float(value) <= 1:
        raise SamplerError(f"{name} must be in (0, 1], got {value!r}")
    return float(value)


def _resolve(model, prompt_ids, attention_mask, settings: dict[str, Any]) -> dict[str, Any]:
    traits = model.traits
    s = dict(settings)
    sampler = s.pop("sampler", None)
    if sampler is None:
        if traits.attention == "block_causal":
            sampler = "block"
        else:
            sampler = "dream" if traits.logit_shift == 1 else "llada"
    if sampler not in SAMPLERS:
        raise SamplerError(f"unknown sampler {sampler!r}; use one of {SAMPLERS}")
    allowed = _COMMON | _ONLY[sampler]
    unknown = sorted(set(s) - allowed)
    if unknown:
        others = [k for k in unknown if any(k in v for v in _ONLY.values())]
        hint = f" ({others} belong to another sampler)" if others else ""
        raise SamplerError(f"unknown setting(s) {unknown} for sampler {sampler!r}{hint}; known: {sorted(allowed)}")

    if not isinstance(prompt_ids, torch.Tensor) or prompt_ids.dim() != 2 or prompt_ids.dtype not in (
            torch.int64, torch.int32):
        raise SamplerError("prompt_ids must be an integer tensor [batch, prompt_length]")
    if prompt_ids.shape[0] < 1:
        raise SamplerError("prompt_ids has an empty batch")
    if attention_mask is not None:
        if attention_mask.shape != prompt_ids.shape:
            raise SamplerError(f"attention_mask {tuple(attention_mask.shape)} does not match prompt_ids "
                               f"{tuple(prompt_ids.shape)}")
        m = attention_mask.bool()
        # left padding only: once a row has a real token, the rest of it is real
        if bool((m[:, :-1] & ~m[:, 1:]).any()):
            raise SamplerError("attention_mask must be left-padded (zeros only before the prompt tokens)")
        if not bool(m.any(dim=1).all()):
            raise SamplerError("a row of attention_mask is all padding")

    gen = s.pop("gen_length", None)
    mnt = s.pop("max_new_tokens", None)
    if gen is not None and mnt is not None and gen != mnt:
        raise SamplerError(f"gen_length {gen} and max_new_tokens {mnt} disagree")
    gen = _check_int("gen_length", gen if gen is not None else (mnt if mnt is not None else 128))

    r: dict[str, Any] = {
        "sampler": sampler,
        "gen_length": gen,
        "mask_id": int(s.pop("mask_id", traits.mask_token_id)),
        "eos_id": int(s.pop("eos_id", traits.eos_token_id)),
        "stop_ids": tuple(dict.fromkeys((int(traits.eos_token_id), *map(int, traits.stop_token_ids)))),
        "generator": s.pop("generator", None),
        "return_trajectory": bool(s.pop("return_trajectory", False)),
        "progress": bool(s.pop("progress", False)),
    }
    if "eos_id" in settings:
        r["stop_ids"] = (r["eos_id"],) + tuple(t for t in r["stop_ids"] if t != r["eos_id"])
    if r["generator"] is not None and not isinstance(r["generator"], torch.Generator):
        raise SamplerError("generator must be a torch.Generator or None")
    temperature = s.pop("temperature", None)
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
                                    or temperature < 0):
        raise SamplerError(f"temperature must be >= 0, got {temperature!r}")
    top_p = s.pop("top_p", None)
    if top_p is not None:
        top_p = _check_unit("top_p", top_p)
    top_k = s.pop("top_k", None)
    if top_k is not None:
        top_k = _check_int("top_k", top_k, low=0)
    threshold = _check_unit("threshold", s.pop("threshold", None))
    block_length = s.pop("block_length", None)
    if block_length is not None:
        _check_int("block_length", block_length)
        if block_length > gen:
            raise SamplerError(f"block_length {block_length} is longer than gen_length {gen}")
    steps = s.pop("steps", None)
    if steps is not None:
        _check_int("steps", steps)
    use_cache = s.pop("use_cache", None)
    stop_at_eos = s.pop("stop_at_eos", None)

    if sampler == "llada":
        remasking = s.pop("remasking", "low_confidence")
        if remasking not in REMASKING:
            raise SamplerError(f"unknown remasking {remasking!r}; use one of {REMASKING}")
        cfg_scale = float(s.pop("cfg_scale", 0.0))
        if cfg_scale < 0:
            raise SamplerError(f"cfg_scale must be >= 0, got {cfg_scale}")
        ass = bool(s.pop("ass", False))
        eoser = bool(s.pop("eoser", False))
        use_cache = use_cache or "none"
        if use_cache not in ("none", "prefix", "dual"):
            raise SamplerError(f"use_cache {use_cache!r} is not one of ('none', 'prefix', 'dual') for MDLM")
        if use_cache != "none" and cfg_scale > 0:
            raise SamplerError("cfg_scale > 0 is not supported with a Fast-dLLM cache (use_cache='none')")
        if (eoser or ass) and remasking != "low_confidence":
            raise SamplerError("eoser / ass need remasking='low_confidence' (as in the official CJ-GRPO code)")
        r.update(remasking=remasking, cfg_scale=cfg_scale, temperature=float(temperature or 0.0),
                 threshold=threshold, use_cache=use_cache, eoser=eoser, ass=ass,
                 eos_min_gamma=s.pop("eos_min_gamma", None), eos_max_gamma=float(s.pop("eos_max_gamma", 1.0)),
                 logits_eos_inf=bool(s.pop("logits_eos_inf", False)),
                 confidence_eos_eot_inf=bool(s.pop("confidence_eos_eot_inf", False)),
                 stop_at_eos=bool(stop_at_eos or False), token_sampler="llada")
        if top_p is not None or top_k is not None:
            raise SamplerError("top_p / top_k do not apply to the LLaDA sampler (Gumbel-max over full logits)")
        if r["eos_min_gamma"] is None:
            r["eos_min_gamma"] = 0.01 if ass else 0.4
        if ass:
            if threshold is not None:
                raise SamplerError("ass fixes its own per-step quotas; it cannot be combined with threshold")
            s_pow = int(math.floor(math.log2(gen)))
            if steps is not None and steps != s_pow:
                raise SamplerError(f"ass decodes gen_length {gen} in floor(log2(gen_length)) = {s_pow} steps; "
                                   f"got steps={steps}")
            ass_blocks = _check_int("ass_blocks", s.pop("ass_blocks", min(4, s_pow)))
            if ass_blocks > s_pow:
                raise SamplerError(f"ass_blocks {ass_blocks} exceeds the {s_pow} ASS steps")
            r.update(steps=s_pow, ass_blocks=ass_blocks, block_length=None)
        else:
            s.pop("ass_blocks", None)
            block_length = block_length or gen
            if gen % block_length:
                raise SamplerError(f"gen_length {gen} is not a multiple of block_length {block_length}")
            nb = gen // block_length
            steps = steps if steps is not None else gen
            if threshold is None and steps % nb:
                raise SamplerError(f"steps {steps} is not a multiple of the number of blocks {nb}")
            r.update(steps=steps, block_length=block_length)
    elif sampler == "dream":
        alg = s.pop("alg", "origin")
        if alg not in DREAM_ALGS:
            raise SamplerError(f"unknown alg {alg!r}; use one of {DREAM_ALGS}")
        alg_temp = s.pop("alg_temp", None)
        if alg_temp is not None and (not isinstance(alg_temp, (int, float)) or alg_temp < 0):
            raise SamplerError(f"alg_temp must be >= 0 or None, got {alg_temp!r}")
        eps = float(s.pop("eps", 1e-3))
        if not 0 < eps < 1:
            raise SamplerError(f"eps must be in (0, 1), got {eps}")
        if stop_at_eos:
            raise SamplerError("stop_at_eos is not supported by the Dream sampler (it decodes the whole canvas)")
        use_cache = use_cache or "none"
        if use_cache not in ("none", "prefix", "dual"):
            raise SamplerError(f"use_cache {use_cache!r} is not one of ('none', 'prefix', 'dual') for MDLM")
        steps = steps if steps is not None else 512
        # Left-out settings take the values the official diffusion_generate ends up with (transformers 4.46):
        # DreamGenerationConfig.from_model_config(config) inherits PretrainedConfig's generation defaults, so a call
        # without them samples at temperature 1.0 with top_k 50 (the fixture gen_entropy_padded_b2 depends on it).
        # An explicit None means "no filter", as upstream.
        if "temperature" not in settings:
            temperature = DREAM_CALL_DEFAULTS["temperature"]
        if "top_k" not in settings:
            top_k = DREAM_CALL_DEFAULTS["top_k"]
        if "top_p" not in settings:
            top_p = DREAM_CALL_DEFAULTS["top_p"]
        official = threshold is None and use_cache == "none" and block_length in (None, gen)
        r.update(alg=alg, alg_temp=alg_temp, eps=eps, temperature=float(temperature or 0.0), top_p=top_p,
                 top_k=top_k, threshold=threshold, use_cache=use_cache, steps=steps, official=official,
                 stop_at_eos=False)
        if not official:
            if alg == "origin":
                raise SamplerError("alg='origin' has no confidence; use maskgit_plus / topk_margin / entropy with "
                                   "block_length / threshold / use_cache (Fast-dLLM)")
            if alg_temp:
                raise SamplerError("alg_temp sampling is not supported with Fast-dLLM block decoding")
            block_length = block_length or gen
            if gen % block_length:
                raise SamplerError(f"gen_length {gen} is not a multiple of block_length {block_length}")
            nb = gen // block_length
            if threshold is None and steps % nb:
                raise SamplerError(f"steps {steps} is not a multiple of the number of blocks {nb}")
            r.update(block_length=block_length, remasking="low_confidence", cfg_scale=0.0, eoser=False, ass=False,
                     logits_eos_inf=False, confidence_eos_eot_inf=False, token_sampler="dream")
    else:  # block
        convention = s.pop("convention", DEFAULT_BLOCK_CONVENTION.get(traits.family, "sdar"))
        if convention not in BLOCK_CONVENTIONS:
            raise SamplerError(f"unknown block convention {convention!r}; use one of {BLOCK_CONVENTIONS}")
        if not traits.is_block_diffusion and traits.logit_shift != 0:
            raise SamplerError("the block sampler needs a model whose logits are not shifted")
        if attention_mask is not None and not bool(attention_mask.bool().all()) and settings.get("return_trajectory"):
            raise SamplerError("block diffusion decodes a left-padded batch row by row (the block grid is absolute), "
                               "so it has no joint trajectory; pass equal-length prompts with return_trajectory")
        b = block_length or traits.block_size or 32
        if b > gen:
            raise SamplerError(f"block_length {b} is longer than gen_length {gen}")
        ds = s.pop("denoising_steps", None)
        if ds is not None and steps is not None and ds != steps:
            raise SamplerError(f"denoising_steps {ds} and steps {steps} disagree (both are steps per block)")
        steps = _check_int("denoising_steps", ds if ds is not None else (steps if steps is not None else b))
        ct = s.pop("confidence_threshold", None)
        if ct is not None and threshold is not None and float(ct) != threshold:
            raise SamplerError(f"confidence_threshold {ct} and threshold {threshold} disagree")
        thr = _check_unit("confidence_threshold", ct) if ct is not None else threshold
        strategy = s.pop("remasking_strategy", "low_confidence_dynamic")
        if strategy not in REMASKING_STRATEGIES:
            raise SamplerError(f"unknown remasking_strategy {strategy!r}; use one of {REMASKING_STRATEGIES}")
        minimal_topk = _check_int("minimal_topk", s.pop("minimal_topk", 1))
        eos_early_stop = bool(s.pop("eos_early_stop", False))
        padded = attention_mask is not None and not bool(attention_mask.bool().all())
        if eos_early_stop and (convention != "llada2" or prompt_ids.shape[0] != 1 or padded):
            raise SamplerError("eos_early_stop is the LLaDA2 sampler's batch-1 option (convention='llada2')")
        use_cache = use_cache or "exact"
        if use_cache not in ("exact", "none"):
            raise SamplerError(f"use_cache {use_cache!r} is not one of ('exact', 'none') for block diffusion")
        if convention == "sdar":
            temperature = 1.0 if temperature is None else float(temperature)
            if temperature == 0:
                raise SamplerError("the SDAR sampler divides by the temperature; for greedy decoding use top_k=1")
            top_k = 0 if top_k is None else top_k
            top_p = 1.0 if top_p is None else top_p
            thr = 0.85 if thr is None else thr
            stop_at_eos = bool(stop_at_eos or False)
        else:
            temperature = 0.0 if temperature is None else float(temperature)
            thr = 0.95 if thr is None else thr
            steps = min(steps, gen // minimal_topk)
            stop_at_eos = True if stop_at_eos is None else bool(stop_at_eos)
        r.update(convention=convention, block_length=b, steps=steps, threshold=thr, remasking_strategy=strategy,
                 temperature=temperature, top_k=top_k, top_p=top_p, use_cache=use_cache,
                 eos_early_stop=eos_early_stop, stop_at_eos=stop_at_eos, minimal_topk=minimal_topk)
    if s:
        raise SamplerError(f"settings {sorted(s)} do not apply here")  # pragma: no cover - consumed above
    return r


# --------------------------------------------------------------------------------------------------------------
# entry points


@torch.no_grad()
def generate(model, prompt_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
             **settings) -> GenerationOutput:
    """Run the diffusion sampler that fits `model.traits` (see the module docstring for settings)."""
    r = _resolve(model, prompt_ids, attention_mask, settings)
    device = next(model.parameters()).device
    prompt_ids = prompt_ids.to(device=device, dtype=torch.long)
    if attention_mask is not None:
        attention_mask = attention_mask.to(device)
    run = _Run(model, r["return_trajectory"], r["progress"], None)
    was_training = model.training
    model.eval()
    t0 = time.perf_counter()
    try:
        if r["sampler"] == "block":
            if attention_mask is not None and not bool(attention_mask.bool().all()):
                out = _block_generate_rows(model, prompt_ids, attention_mask, r, run)
            else:
                out = _block_generate(model, prompt_ids, r, run)
        elif r["sampler"] == "dream" and r["official"]:
            out = _dream_generate(model, prompt_ids, attention_mask, r, run)
        else:
            out = _mdlm_generate(model, prompt_ids, attention_mask, r, run)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    finally:
        run.close()
        model.train(was_training)
    sequences, canvas, traj, seq_prompt = out
    st = run.stats
    st.wall_seconds = time.perf_counter() - t0
    p = prompt_ids.shape[1]
    st.generated_tokens = int((canvas[:, p:] != r["mask_id"]).sum().item()) // canvas.shape[0]
    st.tokens_per_forward = st.generated_tokens / st.forwards if st.forwards else 0.0
    public = {k: v for k, v in r.items() if k != "generator"}
    return GenerationOutput(sequences=sequences, canvas=canvas, prompt_length=seq_prompt, stats=st,
                            settings=public, trajectory=traj)


@torch.no_grad()
def replay_trajectory(model, trajectory: Trajectory) -> torch.Tensor:
    """Re-run the model on every recorded state and write its greedy token at the positions unmasked in that step.

    For a greedy rollout this reproduces the final canvas (the CJ-GRPO consistency check); for a sampled one it
    tells how far the rollout was from the model's argmax. Each state is re-encoded without a cache (block
    diffusion: the prefix up to the step's block end, block-causal), which gives the cached samplers' logits up to
    float rounding.
    """
    if not trajectory.steps:
        raise SamplerError("empty trajectory")
    x = trajectory.steps[0].state.clone()
    for step in trajectory.steps:
        state = step.state
        if trajectory.kind == "block":
            end = step.region_end
            pos = torch.arange(end, device=state.device).expand(state.shape[0], end)
            mask = block_causal_mask(end, end, trajectory.block_size, device=state.device)
            logits = _call(model, state[:, :end], position_ids=pos, attn_mask=mask)
            tokens = torch.full_like(state, trajectory.mask_id)
            tokens[:, :end] = logits.argmax(-1)
        else:
            kw = trajectory.model_kwargs
            if trajectory.cfg_scale > 0:
                un = state.clone()
                un[trajectory.prompt_index] = trajectory.mask_id
                kw2 = {k: torch.cat([v, v]) for k, v in kw.items()}
                cond, unc = _call(model, torch.cat([state, un]), **kw2).chunk(2)
                logits = unc + (trajectory.cfg_scale + 1) * (cond - unc)
            else:
                logits = _call(model, state, **kw)
            tokens = shift_logits(logits, trajectory.logit_shift).argmax(-1)
        x[step.unmasked] = tokens[step.unmasked]
    return x


def _call(model, ids, **kw):
    out = model(ids, **kw)
    return out.logits if hasattr(out, "logits") else out


# --------------------------------------------------------------------------------------------------------------
# token samplers


def _rand(shape, dtype, device, generator):
    # torch.rand(shape) draws from the same stream as the official torch.rand_like(...) calls
    return torch.rand(shape, dtype=dtype, device=device, generator=generator)


def _gumbel_argmax(logits: torch.Tensor, temperature: float, generator) -> torch.Tensor:
    """LLaDA's add_gumbel_noise + argmax: float64 `exp(l) / (-log u)^T`; plain argmax at T = 0."""
    if temperature == 0:
        return logits.argmax(-1)
    l64 = logits.to(torch.float64)
    u = _rand(l64.shape, torch.float64, l64.device, generator)
    return (l64.exp() / (-torch.log(u)) ** temperature).argmax(-1)


def _dream_filter(logits, temperature, top_p, top_k):
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


def _dream_sample_tokens(logits, temperature, top_p, top_k, alg, generator):
    """(confidence, token) per row of `logits [N, V]`, as Dream's sample_tokens with the alg's confidence."""
    probs = torch.softmax(_dream_filter(logits, temperature, top_p, top_k), dim=-1)
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


def _block_sample_tokens(logits, r, generator):
    """SDAR / LLaDA2 `sample_with_temperature_topk_topp`: one multinomial call over `[B*b, V]`."""
    shape = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    t, k, p = r["temperature"], r["top_k"], r["top_p"]
    if r["convention"] == "sdar":
        if t != 1.0:
            flat = flat / t
    elif t > 0 and t != 1.0:
        flat = flat / t
    if k is not None and k > 0:
        kth = torch.topk(flat, k)[0][..., -1, None]
        flat = torch.where(flat < kth, torch.full_like(flat, float("-inf")), flat)
    if p is not None and p < 1.0:
        sorted_logits, sorted_idx = torch.sort(flat, descending=True)
        cum = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
        drop = cum > p
        drop[..., 1:] = drop[..., :-1].clone()
        drop[..., 0] = False
        flat = flat.masked_fill(torch.zeros_like(flat, dtype=torch.bool).scatter(-1, sorted_idx, drop), float("-inf"))
    probs = F.softmax(flat, dim=-1)
    tok = torch.multinomial(probs, num_samples=1, generator=generator)
    return tok.view(shape), torch.gather(probs, -1, tok).view(shape)


# --------------------------------------------------------------------------------------------------------------
# LLaDA-style semi-autoregressive sampler (also Fast-dLLM caches / threshold, EOSER, ASS, and Dream's Fast-dLLM)


def _quotas(n_masks: torch.Tensor, steps: int) -> torch.Tensor:
    """`[B, steps]`: n // steps each, the first n % steps steps one more (get_num_transfer_tokens)."""
    base = n_masks // steps
    rem = n_masks % steps
    q = base[:, None].expand(-1, steps).clone()
    q += (torch.arange(steps, device=n_masks.device)[None, :] < rem[:, None]).long()
    return q


def _ass_plan(gen: int, steps: int, n_blocks: int) -> tuple[list[tuple[int, list[int]]], list[int]]:
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


def _mdlm_generate(model, prompt, am, r, run: _Run):
    traits = model.traits
    mask_id, gen = r["mask_id"], r["gen_length"]
    b_sz, p = prompt.shape
    length = p + gen
    device = prompt.device
    x = torch.full((b_sz, length), mask_id, dtype=torch.long, device=device)
    x[:, :p] = prompt
    prompt_index = x != mask_id
    shift = traits.logit_shift
    dream = r["token_sampler"] == "dream"
    g = r["generator"]

    # what every model call needs besides the ids, for canvas window [w0, w1)
    if dream:
        if am is not None and bool((am == 0).any()):
            full = torch.cat([am, torch.ones(b_sz, gen, dtype=am.dtype, device=device)], 1)
            pos = full.long().cumsum(-1) - 1
            pos.masked_fill_(full == 0, 1)
            mask4 = query_key_padding_mask(full)
        else:
            pos = torch.arange(length, device=device).expand(b_sz, length)
            mask4 = None

        def model_kwargs(w0, w1):
            kw = {"position_ids": pos[:, w0:w1]}
            if mask4 is not None:
                kw["attn_mask"] = mask4[:, :, w0:w1, :]
            return kw
        traj_kwargs = model_kwargs(0, length)
    else:
        am_full = None
        if am is not None:
            am_full = torch.cat([am, torch.ones(b_sz, gen, dtype=am.dtype, device=device)], 1)

        def model_kwargs(w0, w1):
            return {} if am_full is None else {"attention_mask": am_full}
        traj_kwargs = model_kwargs(0, length)

    cfg = r["cfg_scale"]

    def full_logits():
        if cfg > 0:
            un = x.clone()
            un[prompt_index] = mask_id
            kw = {k: torch.cat([v, v]) for k, v in model_kwargs(0, length).items()}
            cond, unc = run.forward(torch.cat([x, un]), **kw).chunk(2)
            logits = unc + (cfg + 1) * (cond - unc)
        else:
            logits = run.forward(x, **model_kwargs(0, length))
        return shift_logits(logits, shift)

    cache = FastDLLMCache(model, r["use_cache"], run.forward) if r["use_cache"] != "none" else None

    # block plan: (start, end, step ids, quota table or None)
    if r["ass"]:
        sizes, counts = _ass_plan(gen, r["steps"], r["ass_blocks"])
        plan, cur = [], p
        for size, st in sizes:
            plan.append((cur, cur + size, st))
            cur += size
    else:
        bl = r["block_length"]
        nb = gen // bl
        spb = r["steps"] // nb if r["threshold"] is None else None
        plan = [(p + k * bl, p + (k + 1) * bl, spb) for k in range(nb)]
        counts = None

    eot_ids = [t for t in r["stop_ids"] if t != r["eos_id"]]
    threshold = r["threshold"]
    stop_at_eos = r["stop_at_eos"]

    def step_select(logits, w0, end, quota, step_i):
        """Commit tokens for one step from logits of canvas window [w0, w0 + logits.shape[1])."""
        w1 = w0 + logits.shape[1]
        if r["logits_eos_inf"]:
            logits = logits.clone()
            logits[..., r["eos_id"]] = -torch.inf
        if dream:
            conf, x0 = _dream_sample_tokens(logits, r["temperature"], r["top_p"], r["top_k"], r["alg"], g)
        else:
            x0 = _gumbel_argmax(logits, r["temperature"], g)
            if r["confidence_eos_eot_inf"] and eot_ids:
                # upstream's chained assignment only reaches the EoT logits used by the confidence softmax
                logits = logits.clone()
                logits[..., eot_ids] = -torch.inf
            if r["remasking"] == "low_confidence":
                # LLaDA's current generate(): softmax in the logits' dtype; Fast-dLLM: float64
                lp = logits.to(torch.float64) if threshold is not None else logits
                conf = torch.gather(F.softmax(lp, dim=-1), -1, x0.unsqueeze(-1)).squeeze(-1)
                if r["eoser"]:
                    gamma = _eoser_gamma(r, step_i)
                    conf = torch.where(x0 == r["eos_id"], conf * gamma, conf)
            else:
                conf = _rand((x0.shape[0], x0.shape[1]), torch.float32, x0.device, g)
        conf = conf.clone()
        conf[:, max(end - w0, 0):] = -torch.inf
        window = x[:, w0:w1]
        mask_index = window == mask_id
        x0 = torch.where(mask_index, x0, window)
        conf = torch.where(mask_index, conf, torch.full_like(conf, -torch.inf))
        transfer = torch.zeros_like(mask_index)
        if threshold is not None:
            eligible = mask_index.clone()
            eligible[:, max(end - w0, 0):] = False
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
        before = x.clone() if run.steps is not None else None
        window[transfer] = x0[transfer]
        if before is not None:
            run.record(before, before, x, mask_id, length)

    step_counter = 0
    for start, end, spb in plan:
        if r["ass"]:
            step_ids = spb
            quota_of = lambda i: torch.full((b_sz,), counts[i], dtype=torch.long, device=device)  # noqa: E731
        elif spb is not None:
            q = _quotas((x[:, start:end] == mask_id).sum(1), spb)
            step_ids = list(range(spb))
            quota_of = lambda i, q=q: q[:, i]  # noqa: E731
        else:
            step_ids = None
            quota_of = lambda i: None  # noqa: E731

        def one_step(i, first):
            if cache is None:
                step_select(full_logits(), 0, end, quota_of(i), i)
            elif first:
                lead = start - shift
                logits = cache.refresh(x, lead, **model_kwargs(0, length))
                step_select(shift_logits(logits, shift), 0, end, quota_of(i), i)
            else:
                lead = start - shift
                w1 = length if cache.mode == "prefix" else end
                logits = cache.window_logits(x, lead, w1, **model_kwargs(lead, w1))
                logits = shift_logits(logits, shift)[:, shift:]
                step_select(logits, start, end, quota_of(i), i)

        if step_ids is not None:
            for n, i in enumerate(step_ids):
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
        step_counter += 1
        if stop_at_eos and end < length:
            gen_part = x[:, p:end]
            hit = torch.zeros(b_sz, dtype=torch.bool, device=device)
            for t in r["stop_ids"]:
                hit |= (gen_part == t).any(1)
            if bool(hit.all()):
                rest = x[:, end:]
                rest[rest == mask_id] = r["eos_id"]
                break

    traj = None
    if run.steps is not None:
        traj = Trajectory(steps=run.steps, prompt_length=p, kind="mdlm", mask_id=mask_id, logit_shift=shift,
                          model_kwargs=traj_kwargs, cfg_scale=cfg, prompt_index=prompt_index)
    return x, x, traj, p


def _eoser_gamma(r, step_i: int) -> float:
    """EOS confidence factor at step `step_i` (CJ-GRPO eval/generate.py `sampling` / `ass_sampling`)."""
    lo, hi, total = r["eos_min_gamma"], r["eos_max_gamma"], r["steps"]
    if total <= 1:
        return hi
    if r["ass"]:
        t = (2 ** (step_i + 1) - 1) / 2 ** total
    else:
        # upstream passes the step index inside the block with the TOTAL step count, so with several blocks the
        # factor never reaches eos_max_gamma; kept as is
        t = min(max(step_i, 0), total - 1) / (total - 1)
    return lo + (hi - lo) * t


# --------------------------------------------------------------------------------------------------------------
# Dream diffusion_generate


def _dream_generate(model, prompt, am, r, run: _Run):
    mask_id, gen, steps = r["mask_id"], r["gen_length"], r["steps"]
    b_sz, p = prompt.shape
    length = p + gen
    device = prompt.device
    g = r["generator"]
    x = torch.full((b_sz, length), mask_id, dtype=torch.long, device=device)
    x[:, :p] = prompt
    kw: dict[str, Any] = {}
    if am is not None and bool((am == 0).any()):
        full = torch.cat([am, torch.ones(b_sz, gen, dtype=am.dtype, device=device)], 1)
        pos = full.long().cumsum(-1) - 1
        pos.masked_fill_(full == 0, 1)
        kw = {"attn_mask": query_key_padding_mask(full), "position_ids": pos}
    timesteps = torch.linspace(1, r["eps"], steps + 1, device=device)
    alg, alg_temp = r["alg"], r["alg_temp"]
    for i in range(steps):
        mask_index = x == mask_id
        logits = shift_logits(run.forward(x, **kw), 1)
        mask_logits = logits[mask_index]
        t, s = timesteps[i], timesteps[i + 1]
        before = x.clone() if run.steps is not None else None
        if alg == "origin":
            p_transfer = 1 - s / t if i < steps - 1 else 1
            x0 = torch.full((mask_logits.shape[0],), mask_id, dtype=torch.long, device=device)
            chosen = _rand(x0.shape, torch.float32, device, g) < p_transfer
            if bool(chosen.any()):
                _, x0[chosen] = _dream_sample_tokens(mask_logits[chosen], r["temperature"], r["top_p"], r["top_k"],
                                                     "maskgit_plus", g)
            x[mask_index] = x0
        else:
            conf, x0 = _dream_sample_tokens(mask_logits, r["temperature"], r["top_p"], r["top_k"], alg, g)
            # batch-mean mask count (float32) and int() truncation, as upstream
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
            run.record(before, before, x, mask_id, length)
    traj = None
    if run.steps is not None:
        traj = Trajectory(steps=run.steps, prompt_length=p, kind="mdlm", mask_id=mask_id, logit_shift=1,
                          model_kwargs=kw)
    return x, x, traj, p


# --------------------------------------------------------------------------------------------------------------
# block diffusion (SDAR block_diffusion_generate / LLaDA2 generate)


def _block_generate(model, prompt, r, run: _Run):
    mask_id, gen, b, steps = r["mask_id"], r["gen_length"], r["block_length"], r["steps"]
    conv = r["convention"]
    b_sz, p = prompt.shape
    device = prompt.device
    g = r["generator"]
    n_blocks = (p + gen + b - 1) // b
    total = n_blocks * b
    x = torch.full((b_sz, total), mask_id, dtype=torch.long, device=device)
    x[:, :p] = prompt
    first_block = p // b
    sched = [b // steps + (1 if i < b % steps else 0) for i in range(steps)]
    cache = None
    if r["use_cache"] == "exact":
        cache = ExactBlockCache(model, b, run.forward)
        cache.prefill(x[:, :first_block * b])
    done = torch.zeros(b_sz, dtype=torch.bool, device=device)
    thr, strategy = r["threshold"], r["remasking_strategy"]
    stop_ids = r["stop_ids"] if conv == "sdar" else (r["eos_id"],)
    eos_id = r["eos_id"]

    for k in range(first_block, n_blocks):
        s0, s1 = k * b, (k + 1) * b
        step = 0
        while True:
            blk = x[:, s0:s1]
            mask_index = (blk == mask_id) & ~done[:, None]
            if not bool(mask_index.any()):
                break
            if step >= steps:
                if conv == "llada2" or step >= steps + b:
                    # upstream LLaDA2 leaves the block as it is after `steps` steps; SDAR gets at most b extra
                    # one-token steps, so a model that keeps predicting the mask token cannot loop forever
                    break
                quota = 1  # upstream would index past its schedule here
            else:
                quota = sched[step]
            if cache is not None:
                logits = cache.block_logits(blk)
            else:
                pos = torch.arange(s1, device=device).expand(b_sz, s1)
                logits = run.forward(x[:, :s1], position_ids=pos,
                                     attn_mask=block_causal_mask(s1, s1, b, device=device))[:, s0:s1]
            x0, p0 = _block_sample_tokens(logits, r, g)
            conf = torch.where(mask_index, p0, torch.full_like(p0, -torch.inf))
            transfer = torch.zeros_like(mask_index)
            for j in range(b_sz):
                if done[j] or not bool(mask_index[j].any()):
                    continue
                n_masked = int(mask_index[j].sum())
                # SDAR asks topk for the scheduled count even when fewer masks are left (then it rewrites
                # unmasked positions, as upstream does); LLaDA2 caps it at the masks left
                kq = quota if conv == "sdar" else min(quota, n_masked)
                if strategy == "sequential":
                    first = int(mask_index[j].nonzero()[0])
                    transfer[j, first:first + kq] = True
                elif strategy == "low_confidence_static":
                    transfer[j, torch.topk(conf[j], kq).indices] = True
                else:
                    high = conf[j] > thr
                    if int(high.sum()) >= quota:
                        transfer[j] = high
                    else:
                        transfer[j, torch.topk(conf[j], kq).indices] = True
            before = x.clone() if run.steps is not None else None
            blk[transfer] = x0[transfer]
            if before is not None:
                run.record(before, before, x, mask_id, s1)
            step += 1
            if r["eos_early_stop"] and bool((x0[transfer] == eos_id).any()):
                eos_pos = (x[0, :s1] == eos_id).nonzero()
                if len(eos_pos) > 0:
                    e = int(eos_pos[0])
                    if bool((x[0, p:e] != mask_id).all()):
                        return x[:, :e + 1].clone(), x, _block_traj(run, p, r, mask_id), p
        if r["stop_at_eos"]:
            region = x[:, p:] if conv == "sdar" else x[:, p:s1]
            for t in stop_ids:
                done |= (region == t).any(1)
        if bool(done.all()):
            break
        if cache is not None and k + 1 < n_blocks:
            cache.commit(x[:, s0:s1])

    traj = _block_traj(run, p, r, mask_id)
    if conv == "sdar":
        return x, x, traj, p
    answer = x[:, p:p + gen]
    rows = []
    for j in range(b_sz):
        hits = (answer[j] == eos_id).nonzero()
        cut = int(hits[0]) + 1 if len(hits) else gen
        rows.append(answer[j, :cut])
    width = max(t.shape[0] for t in rows)
    out = torch.full((b_sz, width), model.traits.pad_token_id, dtype=torch.long, device=device)
    for j, t in enumerate(rows):
        out[j, :t.shape[0]] = t
    return out, x, traj, 0


def _block_generate_rows(model, prompt, am, r, run: _Run):
    """Left-padded batch: each row decoded on its own (its block grid starts at its own first token), then laid out
    like the input: row j = pads + its canvas, right-filled with the mask id (positions that row never had); the
    generated region starts at the padded prompt width for every row. LLaDA2's cut answers are right-padded with
    the pad id."""
    pad_id = model.traits.pad_token_id
    b_sz, p = prompt.shape
    rows = []
    for j in range(b_sz):
        start = int((am[j] == 0).sum())
        rows.append((start, _block_generate(model, prompt[j:j + 1, start:], r, run)))
    width = max(start + out[1].shape[1] for start, out in rows)
    canvas = torch.full((b_sz, width), r["mask_id"], dtype=torch.long, device=prompt.device)
    for j, (start, out) in enumerate(rows):
        canvas[j, :start] = prompt[j, :start]
        canvas[j, start:start + out[1].shape[1]] = out[1][0]
    if r["convention"] == "sdar":
        return canvas, canvas, None, p
    seq_w = max(out[0].shape[1] for _, out in rows)
    sequences = torch.full((b_sz, seq_w), pad_id, dtype=torch.long, device=prompt.device)
    for j, (_, out) in enumerate(rows):
        sequences[j, :out[0].shape[1]] = out[0][0]
    return sequences, canvas, None, 0


def _block_traj(run, p, r, mask_id):
    if run.steps is None:
        return None
    return Trajectory(steps=run.steps, prompt_length=p, kind="block", mask_id=mask_id, block_size=r["block_length"])
