"""The tiny base's validation-target rule (issue #16, machine-stable bases): the base SFT stops at the first check
whose held-out validation metric reaches the target, that base is exactly the SFT's checkpoint at that step, its
identity (weight hash + selection) reaches the run record, and an unreachable target is one error with nothing
cached."""

from __future__ import annotations

import pytest

from dare_bench.errors import ConfigError, DataError
from dare_bench.pipeline.plan import resolve

NAME = "sft-llada-sudoku"
# micro sudoku's blank-cell score on 32 held-out items leaves 0 at ~step 70 (0.12 there, 0.29 at step 90): a target
# the micro base reaches after a few checks
TARGET = ["base.start_step=null", "eval.metric=score",
          "base.target={value: 0.1, every: 10, from_step: 40, max_steps: 120, validation_items: 32}"]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """One home for the module: the reproduction reuses the base the first test built (same recipe, same key)."""
    return tmp_path_factory.mktemp("home")


def _inputs(overrides):
    from dare_bench.pipeline.plan import _train_items_needed
    from dare_bench.tasks.mixtures import load_mixture
    from dare_bench.tasks.tokenizer import build_task_tokenizer

    _, cfg = resolve(NAME, "micro", overrides)
    task, tokenizer = cfg.run_task(), build_task_tokenizer(cfg.task)
    items = load_mixture(task, cfg.profile.train.data, _train_items_needed(cfg))
    return cfg, task, tokenizer, items


@pytest.mark.integration
def test_the_rule_stops_at_the_first_check_reaching_the_target_and_that_is_the_sft_checkpoint(home, monkeypatch):
    monkeypatch.setenv("DARE_BENCH_HOME", str(home))
    from dare_bench.pipeline.base_cache import base_identity, base_sft_setup, build_base, weights_sha256
    from dare_bench.trainers.sft import SFTRunOptions, train_sft

    cfg, task, tokenizer, items = _inputs(TARGET)
    logs: list[str] = []
    model, directory, cached = build_base(cfg, task, tokenizer, list(items), data_fingerprint=str(items.fingerprint),
                                          log=logs.append, progress=False)
    assert not cached
    identity = base_identity(directory, model)
    sel = identity["selection"]
    assert sel["rule"] == "target" and sel["metric"] == "score"
    checks = [s for s, _ in sel["validation"]]
    assert len(checks) > 1 and checks == list(range(40, sel["step"] + 1, 10))  # from_step, every 10, to the choice
    assert all(v < 0.1 for _, v in sel["validation"][:-1]) and sel["validation"][-1][1] >= 0.1
    assert identity["weights_sha256"] == weights_sha256(model)

    # the same SFT run for exactly that many steps, without any validation in between: the same weights
    fresh, examples, sft_cfg = base_sft_setup(cfg, task, tokenizer, list(items), steps=sel["step"])
    assert len(examples) == len(items) - 32  # the validation items are held out of the base's SFT
    train_sft(fresh, examples, sft_cfg, SFTRunOptions(progress=False))
    assert weights_sha256(fresh) == identity["weights_sha256"]

    again, _, cached = build_base(cfg, task, tokenizer, list(items), data_fingerprint=str(items.fingerprint),
                                  log=logs.append, progress=False)
    assert cached and base_identity(directory, again) == identity


def test_an_unreachable_target_is_one_error_and_caches_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("DARE_BENCH_HOME", str(tmp_path))
    from dare_bench.pipeline.base_cache import build_base

    cfg, task, tokenizer, items = _inputs(["base.start_step=null", "eval.metric=score",
                                           "base.target={value: 1.0, every: 4, from_step: 4, max_steps: 8, "
                                           "validation_items: 16}"])
    with pytest.raises(DataError, match=r"never reached base.target.value 1 by step 8 \(best .* at step [48]\)"):
        build_base(cfg, task, tokenizer, list(items), data_fingerprint=str(items.fingerprint), log=lambda _: None,
                   progress=False)
    assert not (tmp_path / "bases").exists() or not any((tmp_path / "bases").iterdir())


@pytest.mark.parametrize("overrides, message", [
    (["base.target={value: 0.2, every: 5, max_steps: 50}"], "exactly one of `start_step`"),
    (["base.start_step=null"], "exactly one of `start_step`"),
    (["base.start_step=null", "base.target={value: 0.2, every: 5, from_step: 60, max_steps: 50}"], "past"),
    (["base.start_step=null", "base.target={value: 1.5, every: 5, max_steps: 50}"], "value"),
])
def test_bad_rules_are_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        resolve(NAME, "micro", overrides)


def test_too_few_training_items_for_the_validation_set(tmp_path, monkeypatch):
    """The plan (dry run) refuses a validation set its training files cannot spare, before any write; the base
    build checks again on what the overlong filter left."""
    monkeypatch.setenv("DARE_BENCH_HOME", str(tmp_path))
    from dare_bench.pipeline.base_cache import validation_items

    # micro draws 10 x 32 + 5000 = 5320 training items: too few to hold 5000 out
    with pytest.raises(DataError, match="validation_items 5000 needs at least 10000 training items; sudoku has 5320"):
        resolve(NAME, "micro", ["base.start_step=null",
                                "base.target={value: 0.2, every: 5, max_steps: 10, validation_items: 5000}"])
    cfg, _, _, items = _inputs(TARGET)
    with pytest.raises(DataError, match="validation_items 32 needs at least 64 training items; sudoku has 40"):
        validation_items(cfg, list(items)[:40])
    assert not list(tmp_path.iterdir())


def test_a_reproduction_records_its_base_identity(home, tmp_path, monkeypatch):
    monkeypatch.setenv("DARE_BENCH_HOME", str(home))
    from dare_bench.pipeline import reproduce
    from dare_bench.store import Store

    db = f"sqlite:///{tmp_path / 'runs.db'}"
    result = reproduce(NAME, "micro", seed=0, db=db, overrides=[*TARGET, "train.steps=1"], log=lambda _: None,
                       progress=False)
    run = Store(db).get_run(result.run_id)
    assert run["base"]["selection"]["rule"] == "target"
    assert run["base_sha256"] == run["base"]["weights_sha256"] and len(run["base_sha256"]) == 64
