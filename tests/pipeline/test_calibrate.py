"""`dare-bench calibrate`: the scan trains exactly as the base cache does, and evaluating between steps changes
nothing, so the scan's step-k model is the base that `base.start_step: k` builds."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from dare_bench.cli import app
from dare_bench.errors import ConfigError
from dare_bench.pipeline.calibrate import Scan, calibrate, parse_steps, parse_window


def test_the_scan_model_is_the_base_of_that_start_step(tmp_path, monkeypatch):
    monkeypatch.setenv("DARE_BENCH_HOME", str(tmp_path))
    from dare_bench.pipeline.base_cache import build_base
    from dare_bench.pipeline.plan import _train_items_needed, resolve
    from dare_bench.tasks.mixtures import load_mixture
    from dare_bench.tasks.tokenizer import build_task_tokenizer

    scan = calibrate("sft-llada-arith", "micro", at=[3, 6], log=lambda _: None)
    assert [r["step"] for r in scan.rows] == [3, 6] and scan.metric == "accuracy"
    assert all(0.0 <= r["metrics"]["accuracy"] <= 1.0 for r in scan.rows)

    _, cfg = resolve("sft-llada-arith", "micro", ["base.start_step=6"])
    task, tokenizer = cfg.run_task(), build_task_tokenizer("arith")  # with the scale's task_options
    items = load_mixture(task, cfg.profile.train.data, _train_items_needed(cfg))
    base, _, cached = build_base(cfg, task, tokenizer, list(items), data_fingerprint=str(items.fingerprint),
                                 log=lambda _: None, progress=False)
    assert not cached
    scanned, built = scan.model.state_dict(), base.state_dict()
    assert scanned.keys() == built.keys()
    for key in built:
        assert torch.equal(scanned[key], built[key]), key


def test_suggestion_is_the_first_step_in_the_window():
    scan = Scan(name="x", scale="tiny", metric="accuracy", window=(0.1, 0.3), recipe={})
    scan.rows = [{"step": s, "metrics": {"accuracy": a}, "seconds": 1.0}
                 for s, a in [(100, 0.02), (150, 0.12), (200, 0.35)]]
    assert scan.suggested_step == 150
    assert "suggested start_step: 150" in scan.lines()[-1]
    scan.window = (0.5, 0.6)
    assert scan.suggested_step is None and "no scanned step" in scan.lines()[-1]


@pytest.mark.parametrize("bad", ["", "10,5", "0,10", "a,b", "10,10"])
def test_bad_steps_are_refused(bad):
    with pytest.raises(ConfigError, match="--at"):
        parse_steps(bad)


@pytest.mark.parametrize("bad", ["0.3", "0.5,0.1", "x,y", "0,2"])
def test_bad_window_is_refused(bad):
    with pytest.raises(ConfigError, match="--window"):
        parse_window(bad)


def test_a_paper_only_entry_has_nothing_to_calibrate():
    with pytest.raises(ConfigError, match="gsm8k has no tiny scale"):
        calibrate("d1-llada-gsm8k", "tiny", at=[1])


def test_cli_json(tmp_path, monkeypatch):
    monkeypatch.setenv("DARE_BENCH_HOME", str(tmp_path))
    r = CliRunner().invoke(app, ["calibrate", "sft-llada-sudoku", "--scale", "micro", "--at", "2", "--window",
                                 "0,1", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output.strip().splitlines()[-1])
    assert out["suggested_start_step"] == 2 and out["rows"][0]["step"] == 2
    assert not any(tmp_path.iterdir())  # a scan writes nothing (no cached base)
