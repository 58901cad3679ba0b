"""Sampler settings objects: the registry picks the family from the traits, each call resolves into a frozen, typed
settings object (block diffusion: the convention's subclass), and `GenerationOutput.settings` keeps its recorded
layout (evaluation records store it)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dare_bench.diffusion.sampling import (
    SAMPLER_REGISTRY,
    SAMPLERS,
    BlockSettings,
    DreamSettings,
    Llada2Settings,
    LladaSettings,
    SdarSettings,
    generate,
    resolve_settings,
    sampler_for,
)
from dare_bench.errors import SamplerError


@pytest.fixture(scope="module")
def models():
    from dare_bench.models import load_pretrained

    return {name: load_pretrained(f"tiny-{name}").eval() for name in ("llada", "dream", "sdar", "llada2")}


def _prompt(n=6):
    return torch.randint(0, 500, (1, n), generator=torch.Generator().manual_seed(0))


def test_registry_and_default_sampler(models):
    assert SAMPLERS == ("block", "dream", "llada")
    assert SAMPLER_REGISTRY == {"llada": LladaSettings, "dream": DreamSettings, "block": BlockSettings}
    assert {name: sampler_for(m.traits) for name, m in models.items()} == {
        "llada": "llada", "dream": "dream", "sdar": "block", "llada2": "block"}


@pytest.mark.parametrize("name,settings,cls", [
    ("llada", dict(gen_length=16, steps=8, block_length=8), LladaSettings),
    ("llada", dict(gen_length=16, ass=True), LladaSettings),
    ("dream", dict(gen_length=16, steps=8), DreamSettings),
    ("dream", dict(gen_length=16, steps=8, block_length=8, alg="entropy"), DreamSettings),
    ("sdar", dict(gen_length=16, block_length=4), SdarSettings),
    ("llada2", dict(gen_length=32), Llada2Settings),
    ("sdar", dict(gen_length=16, block_length=4, convention="llada2"), Llada2Settings),
    ("llada", dict(gen_length=16, block_length=4, sampler="block"), SdarSettings),
])
def test_settings_are_frozen_typed_objects(models, name, settings, cls):
    resolved = resolve_settings(models[name], _prompt(), None, settings)
    assert type(resolved) is cls and dataclasses.is_dataclass(resolved)
    with pytest.raises(dataclasses.FrozenInstanceError):
        resolved.gen_length = 1
    out = generate(models[name], _prompt(), **settings)
    assert out.settings == resolved.record()
    assert "generator" not in out.settings


def test_recorded_settings_layout(models):
    """The keys (and their order) stored in evaluation records as `sampler`."""
    common = ["sampler", "gen_length", "mask_id", "eos_id", "stop_ids", "return_trajectory", "progress"]
    llada = ["remasking", "cfg_scale", "temperature", "threshold", "use_cache", "eoser", "ass", "eos_min_gamma",
             "eos_max_gamma", "logits_eos_inf", "confidence_eos_eot_inf", "stop_at_eos", "token_sampler", "steps"]
    dream = ["alg", "alg_temp", "eps", "temperature", "top_p", "top_k", "threshold", "use_cache", "steps", "official",
             "stop_at_eos"]
    fast_dllm = ["block_length", "remasking", "cfg_scale", "eoser", "ass", "logits_eos_inf", "confidence_eos_eot_inf",
                 "token_sampler"]
    block = ["convention", "block_length", "steps", "threshold", "remasking_strategy", "temperature", "top_k", "top_p",
             "use_cache", "eos_early_stop", "stop_at_eos", "minimal_topk"]

    def keys(name, **settings):
        return list(resolve_settings(models[name], _prompt(), None, settings).record())

    assert keys("llada", gen_length=16, steps=16) == common + llada + ["block_length"]
    assert keys("llada", gen_length=16, ass=True) == common + llada + ["ass_blocks", "block_length"]
    assert keys("dream", gen_length=16, steps=16) == common + dream
    assert keys("dream", gen_length=16, steps=16, threshold=0.9, alg="entropy") == common + dream + fast_dllm
    assert keys("sdar", gen_length=16) == keys("llada2", gen_length=32) == common + block
    record = resolve_settings(models["dream"], _prompt(), None, dict(gen_length=16, threshold=0.9,
                                                                     alg="entropy")).record()
    assert record["token_sampler"] == "dream" and record["official"] is False and record["block_length"] == 16


def test_convention_defaults(models):
    sdar = resolve_settings(models["sdar"], _prompt(), None, dict(gen_length=16, block_length=4))
    assert (sdar.temperature, sdar.top_k, sdar.top_p, sdar.threshold, sdar.stop_at_eos) == (1.0, 0, 1.0, 0.85, False)
    llada2 = resolve_settings(models["llada2"], _prompt(), None, dict(gen_length=32, steps=32, minimal_topk=4))
    assert (llada2.temperature, llada2.top_k, llada2.top_p, llada2.threshold, llada2.stop_at_eos) == (
        0.0, None, None, 0.95, True)
    assert llada2.steps == 8  # min(steps, gen_length // minimal_topk)
    with pytest.raises(SamplerError, match="convention"):
        resolve_settings(models["sdar"], _prompt(), None, dict(gen_length=16, convention="bd3lm"))


def test_presets_name_exactly_the_registered_samplers():
    """evaluators/presets.py stays torch-free, so it names the sampler kinds itself; they must be the registry's."""
    from dare_bench.evaluators.presets import SAMPLER_KINDS

    assert sorted(SAMPLER_KINDS) == list(SAMPLERS)
