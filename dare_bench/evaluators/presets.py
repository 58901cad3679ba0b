"""Pinned sampler presets for evaluation, per backbone x task, each with the source of its numbers.

A preset holds `generate()` settings per sampler kind (the kind follows `model.traits`: bidirectional and unshifted
-> "llada", shifted logits -> "dream", block-causal -> "block"), the prompt template ("chat": the tokenizer's chat
template with the task's official messages, "plain": the task's short prompt for tiny models) and a batch size.
Paper presets name one family; `tiny` / `micro` cover every family so tiny replicas evaluate in seconds on CPU.

    from dare_bench.evaluators.presets import get_preset, default_preset, list_presets
    get_preset("d1-llada").settings_for("llada")     # {'gen_length': 256, 'steps': 128, 'block_length': 32, ...}
    default_preset(family="dream", task="math500", tiny=False).name     # 'dare-dream-math'
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Mapping

from dare_bench.errors import ConfigError

SAMPLER_KINDS = ("llada", "dream", "block")


@dataclass(frozen=True)
class SamplerPreset:
    name: str
    settings: Mapping[str, Mapping[str, Any]]  # sampler kind -> generate() keyword arguments
    source: str
    template: str = "chat"  # "chat" | "plain"
    batch_size: int = 8
    families: tuple[str, ...] = ()  # families the numbers were pinned for; () = any
    notes: str = ""

    def settings_for(self, kind: str) -> dict[str, Any]:
        if kind not in self.settings:
            raise ConfigError(
                f"sampler preset {self.name!r} has no settings for a {kind!r}-sampler backbone "
                f"(it covers {sorted(self.settings)}); pick another --preset"
            )
        return dict(self.settings[kind])

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "settings": {k: dict(v) for k, v in self.settings.items()}, "source": self.source,
                "template": self.template, "batch_size": self.batch_size, "families": list(self.families),
                "notes": self.notes}


_D1 = ("algorithms.md §3: d1 eval/eval.py + run_eval.sh (gen_length in {128,256,512}, steps = gen_length/2, "
       "block 32, T=0)")
_DARE = ("algorithms.md §6: DARE MDLM recipes (recipe/llada/run_bgpo_llada_8b_instruct.sh), validation greedy (T=0) "
         "with steps = response length; block_length 32")

PRESETS: dict[str, SamplerPreset] = {}


def register(preset: SamplerPreset) -> SamplerPreset:
    for kind in preset.settings:
        if kind not in SAMPLER_KINDS:
            raise ValueError(f"preset {preset.name}: unknown sampler kind {kind!r}")
    PRESETS[preset.name] = preset
    return preset


# --- LLaDA (MDLM, semi-autoregressive low-confidence remasking) ------------------------------------------------
for _gen in (128, 256, 512):
    register(SamplerPreset(
        f"d1-llada-{_gen}",
        {"llada": {"gen_length": _gen, "steps": _gen // 2, "block_length": 32, "temperature": 0.0,
                   "remasking": "low_confidence"}},
        source=_D1, families=("llada",), batch_size=8,
    ))
register(SamplerPreset(
    "d1-llada",  # the headline length of d1 / SPG tables
    {"llada": {"gen_length": 256, "steps": 128, "block_length": 32, "temperature": 0.0,
               "remasking": "low_confidence"}},
    source=_D1 + "; SPG §5 headline: gen 256, 128 steps", families=("llada",),
))
register(SamplerPreset(
    "dare-llada-math",
    {"llada": {"gen_length": 512, "steps": 512, "block_length": 32, "temperature": 0.0,
               "remasking": "low_confidence"}},
    source=_DARE + " (math: response 512)", families=("llada",),
))
register(SamplerPreset(
    "dare-llada-code",
    {"llada": {"gen_length": 512, "steps": 512, "block_length": 32, "temperature": 0.0,
               "remasking": "low_confidence"}},
    source=_DARE + " (code: response 512, steps 512)", families=("llada",),
))
register(SamplerPreset(
    "dare-llada-puzzle",
    {"llada": {"gen_length": 256, "steps": 256, "block_length": 32, "temperature": 0.0,
               "remasking": "low_confidence"}},
    source=_DARE + " (countdown / sudoku: response 256)", families=("llada",),
))
register(SamplerPreset(
    "fastdllm-llada",
    {"llada": {"gen_length": 256, "steps": 256, "block_length": 32, "temperature": 0.0,
               "remasking": "low_confidence", "use_cache": "prefix", "threshold": 0.9}},
    source="models.md §3: Fast-dLLM default eval setting (PrefixCache, block 32, threshold 0.9), GSM8K gen 256",
    families=("llada",), notes="approximate cache: outputs differ from no-cache decoding",
))
register(SamplerPreset(
    "cj-llada-eoser-ass",
    {"llada": {"gen_length": 256, "steps": 8, "temperature": 0.0, "remasking": "low_confidence",
               "eoser": True, "ass": True}},
    source="algorithms.md §9: CJ-GRPO `--decoding eoser-ass` (ASS: log2(gen) steps; EOSER gamma_min 0.01 with ASS)",
    families=("llada",),
))

# --- Dream (MDLM, whole-canvas decoding) -----------------------------------------------------------------------
_DREAM_SRC = ("models.md §2.5 Dream README decoding order (alg 'entropy', alg_temp 0) with DARE's greedy validation "
              "(algorithms.md §6: T=0, steps = response length)")
register(SamplerPreset(
    "dare-dream-math",
    {"dream": {"max_new_tokens": 512, "steps": 512, "temperature": 0.0, "alg": "entropy", "alg_temp": 0.0}},
    source=_DREAM_SRC + "; math response 512", families=("dream",),
))
register(SamplerPreset(
    "dare-dream-code",
    {"dream": {"max_new_tokens": 512, "steps": 512, "temperature": 0.0, "alg": "entropy", "alg_temp": 0.0}},
    source=_DREAM_SRC + "; code response 512", families=("dream",),
))
register(SamplerPreset(
    "dare-dream-puzzle",
    {"dream": {"max_new_tokens": 256, "steps": 256, "temperature": 0.0, "alg": "entropy", "alg_temp": 0.0}},
    source=_DREAM_SRC + "; countdown / sudoku response 256", families=("dream",),
))
register(SamplerPreset(
    "dream-readme",
    {"dream": {"max_new_tokens": 512, "steps": 512, "temperature": 0.2, "top_p": 0.95, "alg": "entropy",
               "alg_temp": 0.0}},
    source="models.md §2.5: Dream README example (max_new_tokens 512, steps 512, T 0.2, top_p 0.95, entropy)",
    families=("dream",), notes="sampled: results depend on the seed",
))

# --- SDAR / LLaDA2 (block diffusion) ---------------------------------------------------------------------------
register(SamplerPreset(
    "tracerl-sdar",
    {"block": {"gen_length": 512, "block_length": 4, "denoising_steps": 4,
               "remasking_strategy": "low_confidence_dynamic", "confidence_threshold": 0.9, "temperature": 1.0,
               "top_k": 0, "top_p": 1.0, "convention": "sdar"}},
    source="models.md §3: TraceRL/TraDo SDAR eval (block 4, 4 steps/block, low_confidence_dynamic, threshold 0.9, "
           "T 1.0, top_k 0, top_p 1.0); gen_length 512 is ours (not stated there)",
    families=("sdar",), batch_size=1, notes="sampled: results depend on the seed",
))
register(SamplerPreset(
    "sdar-greedy",
    {"block": {"gen_length": 512, "block_length": 4, "denoising_steps": 4,
               "remasking_strategy": "low_confidence_dynamic", "confidence_threshold": 0.9, "temperature": 1.0,
               "top_k": 1, "top_p": 1.0, "convention": "sdar"}},
    source="models.md §1.6: SDAR block_diffusion_generate, greedy = top_k 1 (temperature 0 divides by zero)",
    families=("sdar",), batch_size=1,
))
register(SamplerPreset(
    "llada2-card",
    {"block": {"gen_length": 512, "block_length": 32, "steps": 32, "temperature": 0.0, "threshold": 0.95,
               "convention": "llada2"}},
    source="models.md §2.6: LLaDA2.0 model card usage (gen 512, block 32, steps 32, T 0.0) with the HF generate "
           "default threshold 0.95",
    families=("llada2",), batch_size=1,
    notes="temperature 0 still samples in the official LLaDA2 generate (use llada2-greedy for a deterministic run)",
))
register(SamplerPreset(
    "llada2-greedy",
    {"block": {"gen_length": 512, "block_length": 32, "steps": 32, "temperature": 0.0, "threshold": 0.95,
               "top_k": 1, "convention": "llada2"}},
    source="models.md §2.6: LLaDA2 generate, greedy = top_k 1", families=("llada2",), batch_size=1,
))

# --- tiny replicas (CPU) ---------------------------------------------------------------------------------------
register(SamplerPreset(
    "tiny",
    {
        "llada": {"gen_length": 32, "steps": 32, "block_length": 8, "temperature": 0.0,
                  "remasking": "low_confidence"},
        "dream": {"max_new_tokens": 32, "steps": 32, "temperature": 0.0, "alg": "maskgit_plus"},
        "block": {"gen_length": 32, "denoising_steps": 4, "remasking_strategy": "low_confidence_static",
                  "temperature": 1.0, "top_k": 1},
    },
    source="dare-bench tiny scale: greedy, one token per step, short answers (tiny models are trained on plain "
           "prompts with answers of a few dozen tokens)",
    template="plain", batch_size=16,
))
register(SamplerPreset(
    "micro",
    {
        "llada": {"gen_length": 16, "steps": 8, "block_length": 8, "temperature": 0.0,
                  "remasking": "low_confidence"},
        "dream": {"max_new_tokens": 16, "steps": 8, "temperature": 0.0, "alg": "maskgit_plus"},
        "block": {"gen_length": 16, "denoising_steps": 4, "remasking_strategy": "low_confidence_static",
                  "temperature": 1.0, "top_k": 1},
    },
    source="dare-bench micro scale (CI smoke): greedy, 2 tokens per step",
    template="plain", batch_size=16,
))

# Default paper preset per (family, task): d1-style reasoning tasks keep the d1 headline length for LLaDA (the
# leaderboard's d1 / SPG / CJ rows), DARE's lengths otherwise.
_TASK_GROUP = {"gsm8k": "math", "math500": "math", "math": "math", "humaneval": "code", "mbpp": "code",
               "countdown": "puzzle", "sudoku": "puzzle"}
DEFAULTS: dict[tuple[str, str], str] = {
    ("llada", "math"): "dare-llada-math",
    ("llada", "code"): "dare-llada-code",
    ("llada", "puzzle"): "dare-llada-puzzle",
    ("dream", "math"): "dare-dream-math",
    ("dream", "code"): "dare-dream-code",
    ("dream", "puzzle"): "dare-dream-puzzle",
    ("sdar", "math"): "sdar-greedy",
    ("sdar", "code"): "sdar-greedy",
    ("sdar", "puzzle"): "sdar-greedy",
    ("llada2", "math"): "llada2-greedy",
    ("llada2", "code"): "llada2-greedy",
    ("llada2", "puzzle"): "llada2-greedy",
}


def get_preset(name: str) -> SamplerPreset:
    try:
        return PRESETS[name]
    except KeyError:
        hint = difflib.get_close_matches(name, PRESETS, n=1)
        raise ConfigError(
            f"unknown sampler preset {name!r}" + (f"; did you mean {hint[0]!r}?" if hint else "")
            + f" (known: {', '.join(sorted(PRESETS))})"
        ) from None


def list_presets() -> list[str]:
    return sorted(PRESETS)


def default_preset(family: str, task: str, tiny: bool) -> SamplerPreset:
    """`tiny` for tiny replicas; otherwise the pinned paper preset of (family, task group)."""
    if tiny:
        return PRESETS["tiny"]
    group = _TASK_GROUP.get(task, task)
    name = DEFAULTS.get((family, group))
    if name is None:
        raise ConfigError(
            f"no pinned sampler preset for a {family!r} backbone on task {task!r}; pass --preset "
            f"(known: {', '.join(sorted(PRESETS))})"
        )
    return PRESETS[name]


def sampler_kind(traits) -> str:
    """The sampler `generate()` picks for these traits (dare_bench.diffusion.sampling.sampler_for)."""
    from dare_bench.diffusion.sampling import sampler_for  # imports torch: only when asked

    return sampler_for(traits)


