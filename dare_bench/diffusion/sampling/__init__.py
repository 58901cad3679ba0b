"""Diffusion samplers: LLaDA semi-AR, Dream, block diffusion (SDAR / LLaDA2), Fast-dLLM caches and threshold decoding.

    from dare_bench.diffusion.sampling import generate, replay_trajectory
    out = generate(model, prompt_ids, attention_mask, gen_length=256, steps=256, block_length=32)
    out.sequences        # shaped like the official function's return (prompt + generated, or LLaDA2's cut)
    out.stats            # forwards, token_forwards, generated_tokens, tokens_per_forward, wall_seconds
    out = generate(model, prompt_ids, return_trajectory=True); replay_trajectory(model, out.trajectory)

The sampler follows `model.traits` (never a family name): bidirectional + logit_shift 0 -> "llada" (ML-GSAI/LLaDA
`generate`), logit_shift 1 -> "dream" (Dream `diffusion_generate`), block_causal -> "block" (SDAR
`block_diffusion_generate`, LLaDA2.0 `generate` or LLaDA2.1's editing `generate`, chosen by `convention`: sdar |
llada2 | llada2.1; a LLaDA2 checkpoint defaults to llada2, so LLaDA2.1 needs `convention="llada2.1"`).
`sampler=` overrides. Mask / eos ids come
from the traits (`mask_id=` / `eos_id=` override them, as the official functions take them as arguments).

Settings (official names): steps, gen_length (Dream: max_new_tokens), block_length, temperature, cfg_scale,
remasking (low_confidence | random), threshold, alg (origin | maskgit_plus | topk_margin | entropy), alg_temp, eps,
top_p, top_k, denoising_steps, remasking_strategy (low_confidence_static | low_confidence_dynamic | sequential),
confidence_threshold, use_cache (none | prefix | dual for MDLM; block diffusion: exact | none), eoser, ass,
stop_at_eos, logits_eos_inf, confidence_eos_eot_inf, eos_early_stop, minimal_topk, convention (sdar | llada2 |
llada2.1), editing_threshold, max_post_steps, num_to_transfer (llada2.1 only), generator, return_trajectory,
progress. Unknown or misspelled names, and options of another convention, are a SamplerError. Each call resolves
them into the family's frozen settings object (`LladaSettings`, `DreamSettings`, `SdarSettings` / `Llada2Settings` /
`Llada21Settings`), checked before any forward (SamplerError);
`GenerationOutput.settings` is its record (everything but the generator).

Layout: core.py (results, forward counting, trajectory recording, setting checks, the sampler registry, `generate`,
`replay_trajectory`), llada.py (LLaDA / Fast-dLLM / EOSER / ASS, and the semi-AR loop Dream's Fast-dLLM path shares),
dream.py (Dream diffusion_generate and its Fast-dLLM decoding), block.py (SDAR / LLaDA2, exact KV cache), llada21.py
(LLaDA2.1 joint M2T + T2T editing threshold decoding, a block convention).

Exactness (shared/docs/models.md; fixtures in tests/fixtures/parity and tests/fixtures/llada21, tests
`pytest tests/diffusion/test_generation_parity.py tests/diffusion/test_sampling_llada21.py`): with
`generator=None` every official global-RNG call is made in the official order and shape, so seeded fixture cases
match too. The deliberate deviations and the upstream quirks
kept on purpose are listed in each family module's docstring and commented at the code that reproduces them.
"""

from dare_bench.diffusion.sampling.block import (  # registers "block"
    BLOCK_CONVENTION_SETTINGS,
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
from dare_bench.diffusion.sampling.llada21 import Llada21Settings  # registers block convention "llada2.1"

# sorted: registration follows import order, which is the import sorter's business, not a meaning
SAMPLERS = tuple(sorted(SAMPLER_REGISTRY))
BLOCK_CONVENTIONS = tuple(BLOCK_CONVENTION_SETTINGS)  # sdar, llada2, llada2.1

__all__ = [
    "BLOCK_CONVENTIONS", "DEFAULT_BLOCK_CONVENTION", "DREAM_ALGS", "DREAM_CALL_DEFAULTS", "REMASKING",
    "REMASKING_STRATEGIES", "SAMPLERS", "SAMPLER_REGISTRY", "BlockSettings", "DreamSettings", "GenerationOutput",
    "GenerationStats", "Llada21Settings", "Llada2Settings", "LladaSettings", "SamplerSettings", "SdarSettings",
    "Trajectory", "TrajectoryStep", "generate", "replay_trajectory", "resolve_settings", "sampler_for",
]
