"""`dare-bench bench rlstep` and the pinned fast rollouts (issue #15 item 5).

- The fast path is what the paper recipes pin: Fast-dLLM's prefix cache for MDLM rollouts (DARE's recipes), the
  exact block cache, packing, the chunked head; the algorithms whose recipes decode without a cache pin `none`.
- The rollout cache is part of the run config hash.
- Where the fast path is exact (block diffusion: exact cache, packing, chunked head), one RL step through the real
  loop gives the plain path's rollouts, loss and weights.
"""

from __future__ import annotations

import pytest
import torch

from dare_bench.bench.rlstep import FAMILIES, path_settings, ratios, run_benchmark, shrunk_recipe
from dare_bench.check.gradients import _ReverseTask
from dare_bench.registry import load_registry
from tests.trainers.rl_fakes import CharTokenizer, micro_sdar, rl_settings


def _paper(name: str, *overrides: str):
    return load_registry().get(name).resolve("paper", list(overrides))


@pytest.mark.parametrize("name,cache", [("d1-llada-gsm8k", "prefix"), ("bgpo-llada-gsm8k", "prefix"),
                                        ("spg-llada-gsm8k", "prefix"), ("cj-grpo-llada-gsm8k", "prefix"),
                                        ("d1-dream-gsm8k", "prefix"), ("mdpo-llada-gsm8k", "none"),
                                        ("justgrpo-llada-gsm8k", "none"), ("wd1-llada-gsm8k", "none"),
                                        ("gdpo-llada-gsm8k", "none"), ("dtreerpo-llada-gsm8k", "none")])
def test_paper_rollouts_pin_the_cache_of_the_recipe_they_follow(name, cache):
    assert _paper(name).profile.train.rollout.extra.get("use_cache") == cache


def test_the_rollout_cache_is_part_of_the_config_hash():
    pinned = _paper("d1-llada-gsm8k")
    plain = _paper("d1-llada-gsm8k", "train.rollout.extra.use_cache=none")
    assert pinned.content_hash != plain.content_hash


def test_plain_switches_every_speed_setting_off_and_fast_is_the_recipe():
    train = _paper("d1-llada-gsm8k").profile.train
    assert (train.packing, train.lm_head_chunk_tokens) == (True, 256)
    assert _paper("bgpo-llada2-gsm8k").profile.model.moe == "grouped"  # the MoE backbone's pinned expert path
    fast, fast_moe = path_settings(train, "grouped", "fast")
    plain, plain_moe = path_settings(train, "grouped", "plain")
    assert fast is train and fast_moe == "grouped"
    assert plain.rollout.extra["use_cache"] == "none" and plain_moe == "loop"
    assert (plain.packing, plain.lm_head_chunk_tokens) == (False, None)
    # nothing else moves: the plug-in's settings and the rest of the rollout are the recipe's
    assert plain.model_copy(update={"rollout": train.rollout, "packing": True, "lm_head_chunk_tokens": 256}) == train


def test_the_shrunk_recipe_keeps_steps_per_token_and_blocks():
    llada = shrunk_recipe(_paper("d1-llada-gsm8k").profile.train, block_diffusion=False, prompts=1, group=4,
                          gen_length=64, steps=1)
    # d1's gsm8k: 512 tokens in 256 steps, blocks of 32 -> 64 tokens in 32 steps, blocks of 32
    assert (llada.rollout.gen_length, llada.rollout.steps, llada.rollout.block_length) == (64, 32, 32)
    assert (llada.steps, llada.batch_prompts, llada.group_size) == (2, 1, 4)
    sdar = _paper("bgpo-sdar-gsm8k").profile.train
    small = shrunk_recipe(sdar, block_diffusion=True, prompts=1, group=4, gen_length=64, steps=1)
    assert (small.rollout.steps, small.rollout.block_length) == (sdar.rollout.steps, sdar.rollout.block_length)
    assert small.algorithm == sdar.algorithm and small.mc_samples == sdar.mc_samples


def _one_step(settings: dict):
    from dare_bench.trainers.loop import RLRunOptions, train_rl

    task = _ReverseTask()  # a dense reward: a random micro model's groups do not tie, so the step moves weights
    return train_rl(micro_sdar(seed=0), CharTokenizer(), task, "bgpo", settings,
                    RLRunOptions(seed=0, progress=False, items=task.items))


def test_one_rl_step_fast_equals_plain_where_the_fast_path_is_exact():
    """Block diffusion: the exact KV cache, packed update forwards and the chunked LM head change no number."""
    common = dict(steps=1, batch_prompts=2, group_size=4, mc_samples=2)
    rollout = {"gen_length": 8, "steps": 4, "block_length": 4, "temperature": 0.9}
    plain = _one_step(rl_settings(**common, packing=False, rollout={**rollout, "extra": {"use_cache": "none"}}))
    fast = _one_step(rl_settings(**common, packing=True, lm_head_chunk_tokens=4,
                                 rollout={**rollout, "extra": {"use_cache": "exact"}}))
    p, f = plain.history[0], fast.history[0]
    assert p["reward_mean"] == f["reward_mean"] and p["completion_tokens"] == f["completion_tokens"]
    assert abs(p["loss"] - f["loss"]) <= 1e-5 * max(1.0, abs(p["loss"]))
    moved = [(a - b).abs().max() for a, b in zip(micro_sdar(seed=0).state_dict().values(),
                                                  plain.policy.state_dict().values())]
    assert max(moved) > 1e-4  # the step did update the weights, so equal weights below mean equal gradients
    for (name, a), (_, b) in zip(plain.policy.state_dict().items(), fast.policy.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_ratios_are_plain_over_fast_per_part():
    rows = [{"family": "sdar", "path": "plain", "attention_kind": "block_causal", "time_rollout_s": 4.0,
             "time_prepare_s": 1.0, "time_update_s": 6.0, "time_step_s": 11.0},
            {"family": "sdar", "path": "fast", "attention_kind": "block_causal", "time_rollout_s": 1.0,
             "time_prepare_s": 1.0, "time_update_s": 2.0, "time_step_s": 4.0}]
    (r,) = ratios(rows)
    assert (r["rollout"], r["prepare"], r["update"], r["step"]) == (4.0, 1.0, 3.0, 2.75)
    assert ">14x" in r["dare_reference"]


@pytest.mark.slow
def test_the_benchmark_runs_every_family_on_a_shrunk_checkpoint():
    out = run_benchmark(list(FAMILIES), layers=1, hidden=128, prompts=1, group=2, gen_length=8, steps=1,
                        dtype="float32")
    assert {(r["family"], r["path"]) for r in out["rows"]} == {(f, p) for f in FAMILIES for p in ("plain", "fast")}
    fast = {r["family"]: r for r in out["rows"] if r["path"] == "fast"}
    assert fast["llada"]["use_cache"] == "prefix" and fast["sdar"]["use_cache"] == "exact"
    assert fast["llada2"]["moe"] == "grouped" and fast["llada"]["moe"] == "dense"
    assert all(r["step"] > 0 for r in out["ratios"])


@pytest.mark.parametrize("override,message", [("train.rollout.cfg_scale=1.0", "cfg_scale > 0 is not supported"),
                                              ("train.rollout.extra.use_cache=dual2", "use_cache 'dual2'")])
def test_the_plan_refuses_rollout_settings_the_sampler_would_refuse(override, message):
    """The dry run resolves the rollout settings through the sampler's own checks, before any store write (found:
    wd1 / GDPO on Dream remasked with `origin` under blocks, which fails at the first rollout)."""
    from dare_bench.errors import SamplerError
    from dare_bench.pipeline.plan import _check_algorithm_backbone

    with pytest.raises(SamplerError, match=message):
        _check_algorithm_backbone(_paper("d1-llada-gsm8k", override))


def test_wd1_and_gdpo_on_dream_plan_with_dreams_own_remasking():
    from dare_bench.pipeline.plan import _check_algorithm_backbone

    for name in ("wd1-dream-sudoku", "gdpo-dream-sudoku"):
        cfg = _paper(name)
        assert cfg.profile.train.rollout.remasking == "entropy"
        _check_algorithm_backbone(cfg)
