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
generator, return_trajectory, progress. Each call resolves them into the family's frozen settings object
(`LladaSettings`, `DreamSettings`, `SdarSettings` / `Llada2Settings`), checked before any forward (SamplerError);
`GenerationOutput.settings` is its record (everything but the generator).

Layout: core.py (results, forward counting, trajectory recording, setting checks, the sampler registry, `generate`,
`replay_trajectory`), llada.py (LLaDA / Fast-dLLM / EOSER / ASS, and the semi-AR loop Dream's Fast-dLLM path shares),
dream.py (Dream diffusion_generate and its Fast-dLLM decoding), block.py (SDAR / LLaDA2, exact KV cache).

Exactness (shared/docs/models.md; fixtures in shared/fixtures/parity, test
`pytest tests/diffusion/test_generation_parity.py`): with `generator=None` every official global-RNG call is made in
the official order and shape, so seeded fixture cases match too. The deliberate deviations and the upstream quirks
kept on purpose are listed in each family module's docstring and commented at the code that reproduces them.
"""

from dare_bench.diffusion.sampling.block import (  # registers "block"
    BLOCK_CONVENTIONS,
    DEFAULT_BLOCK_CONVENTION,
    REMASKING_STRATEGIES,
    BlockSettings,
    Llada2Settings,
    SdarSettings,
)
from dare_bench.diffusion.sampling.core import (
    SAMPLER_REGISTRY,
    GenerationOutput,
    GenerationStats,
    SamplerSettings,
    Trajectory,
    TrajectoryStep,
    generate,
    replay_trajectory,
    resolve_settings,
    sampler_for,
)
from dare_bench.diffusion.sampling.dream import DREAM_ALGS, DREAM_CALL_DEFAULTS, DreamSettings  # registers "dream"
from dare_bench.diffusion.sampling.llada import REMASKING, LladaSettings  # registers "llada"

# sorted: registration follows import order, which is the import sorter's business, not a meaning
SAMPLERS = tuple(sorted(SAMPLER_REGISTRY))

__all__ = [
    "BLOCK_CONVENTIONS", "DEFAULT_BLOCK_CONVENTION", "DREAM_ALGS", "DREAM_CALL_DEFAULTS", "REMASKING",
    "REMASKING_STRATEGIES", "SAMPLERS", "SAMPLER_REGISTRY", "BlockSettings", "DreamSettings", "GenerationOutput",
    "GenerationStats", "Llada2Settings", "LladaSettings", "SamplerSettings", "SdarSettings", "Trajectory",
    "TrajectoryStep", "generate", "replay_trajectory", "resolve_settings", "sampler_for",
]
