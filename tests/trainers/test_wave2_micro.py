"""RL wave 2 through the real loop in the default suite: each plug-in's sudoku entry at micro scale (a 2-step base,
4 evaluation items), end to end through `reproduce` — base, rollouts, the plug-in's loss, optimizer steps, final
evaluation, store rows. The whole grid of (algorithm, backbone, task kind) runs under `slow`
(tests/pipeline/test_micro_grid.py)."""

from __future__ import annotations

import pytest

from dare_bench.pipeline import reproduce
from dare_bench.registry import get
from dare_bench.store import Store

FAST = ["base.start_step=2", "eval.limit=4"]
WAVE2 = ["mdpo-llada-sudoku", "dtreerpo-llada-sudoku", "justgrpo-llada-sudoku", "espo-llada-sudoku",
         "wd1-llada-sudoku", "gdpo-llada-sudoku", "tracerl-sdar-sudoku", "tracerl-llada2-sudoku"]


@pytest.mark.integration
@pytest.mark.parametrize("name", WAVE2)
def test_wave2_entry_runs_at_micro(name, tmp_path, monkeypatch):
    monkeypatch.setenv("DARE_BENCH_HOME", str(tmp_path / "home"))
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    res = reproduce(name, "micro", seed=0, db=db, overrides=FAST, progress=False, log=lambda _: None)
    assert res.status == "finished" and res.metric in res.metrics
    store = Store(db)
    logged = [m for m in store.metrics(res.run_id) if m.get("reward_mean") is not None]
    # rollouts ran and their rewards were logged, step by step, up to the pinned number of steps
    assert 1 <= len(res.reward_curve) == len(logged) <= get(name).scales["micro"].train.steps
    run = store.get_run(res.run_id)
    assert run["status"] == "finished" and run["algorithm"] == name.split("-")[0]
    assert res.compute["grad_token_forwards"] > 0  # the plug-in's loss was back-propagated
