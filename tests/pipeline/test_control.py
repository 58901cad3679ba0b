"""The compute-matched SFT control (`reproduce --control`): an sft-<backbone>-<task> continuation from the same base
for the FLOPs the RL run counted, stored linked to it, and the leaderboard's RL - control."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dare_bench.cli import app

RL = "d1-llada-sudoku"


@pytest.fixture(scope="module")
def controlled(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    db = f"sqlite:///{home / 'runs.db'}"
    mp = pytest.MonkeyPatch()
    mp.setenv("DARE_BENCH_HOME", str(home))
    result = CliRunner().invoke(app, ["reproduce", RL, "--scale", "micro", "--seed", "0", "--control", "--db", db,
                                      "--json", "train.steps=1"])
    mp.undo()
    assert result.exit_code == 0, result.output
    return db, json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.integration
def test_the_control_spends_the_rl_runs_counted_compute_from_the_same_base(controlled):
    from dare_bench.store import Store

    db, out = controlled
    store = Store(db)
    rl, control = store.get_run(out["run_id"]), store.get_run(out["control"]["run_id"])
    budget = rl["compute"]["flops"]
    assert budget > 0 and rl["compute"]["grad_token_forwards"] > 0 and rl["compute"]["token_forwards"] > 0
    assert control["reproduction"] == "sft-llada-sudoku" and control["control_of"] == rl["uid"]
    assert control["config"]["profile"]["train"]["compute_budget_flops"] == budget
    spent = control["compute"]["flops"]
    steps = len(store.metrics(control["id"]))
    per_step = spent / steps
    assert budget <= spent < budget + per_step * 1.5  # it stops at the first step past the budget
    assert control["base_sha256"] == rl["base_sha256"] is not None
    assert rl["control_of"] is None


@pytest.mark.integration
def test_the_leaderboard_shows_rl_minus_control(controlled):
    from dare_bench.leaderboard import data as L
    from dare_bench.store import Store

    db, out = controlled
    store = Store(db)
    rl_final = out["metrics"]["accuracy"]
    control_final = out["control"]["metrics"]["accuracy"]
    cells = L.winners(L.open_reader(db), backbone="llada", scale="micro", include_modified=True)
    d1 = cells[cells["algorithm"] == "d1"].iloc[0]
    assert d1.controls == 1 and d1.vs_control == pytest.approx(rl_final - control_final)
    assert "sft" not in set(cells["algorithm"])  # a control is never an SFT entry's result
    table = L.gain_table(cells)
    assert table.loc[table["algorithm"] == "d1", "controls"].item() == 1
    assert store.get_run(out["run_id"])["compute"]["counted"].startswith("weight-matmul")


def test_control_needs_an_rl_reproduction(tmp_path, monkeypatch):
    monkeypatch.setenv("DARE_BENCH_HOME", str(tmp_path))
    result = CliRunner().invoke(app, ["reproduce", "sft-llada-sudoku", "--scale", "micro", "--seed", "0",
                                      "--control", "--db", f"sqlite:///{tmp_path / 'r.db'}"])
    assert result.exit_code != 0 and "--control applies to RL reproductions" in str(result.exception)
    assert not (tmp_path / "r.db").exists()


def test_a_budget_on_a_non_sft_kind_is_a_config_error():
    from dare_bench.errors import ConfigError
    from dare_bench.pipeline.plan import resolve

    with pytest.raises(ConfigError, match="compute_budget_flops applies to train.kind=sft"):
        resolve(RL, "micro", ["train.compute_budget_flops=1e9"])


def _budgeted_sft(home, monkeypatch, budget: float):
    """sft-llada-sudoku at micro for `budget` FLOPs in the store and run directories of `home`."""
    from dare_bench.pipeline import reproduce
    from dare_bench.store import Store

    monkeypatch.setenv("DARE_BENCH_HOME", str(home))
    db = f"sqlite:///{home / 'runs.db'}"
    result = reproduce("sft-llada-sudoku", "micro", seed=0, db=db, progress=False, log=lambda _: None,
                       overrides=[f"train.compute_budget_flops={budget!r}", "train.steps=60"])
    store = Store(db)
    return result, store.get_run(result.run_id), store.metrics(result.run_id)


@pytest.mark.integration
def test_budgeted_sft_runs_continue_one_trajectory_bit_for_bit(tmp_path, monkeypatch):
    """A control continues the longest kept stretch of its trajectory below its budget and ends where training
    from step 0 ends: the same weights, step metrics (logged every 10 steps), counted compute and final scores."""
    import torch

    from dare_bench.models.io import read_state_dict
    from dare_bench.pipeline.control import STRETCHES, kept_stretches

    shared, alone = tmp_path / "shared", tmp_path / "alone"
    _, first, _ = _budgeted_sft(shared, monkeypatch, 1.0)  # stops after its first step
    per_step = first["compute"]["flops"]
    _, short, _ = _budgeted_sft(shared, monkeypatch, 12.5 * per_step)
    cont, cont_run, cont_metrics = _budgeted_sft(shared, monkeypatch, 25.5 * per_step)
    ref, ref_run, ref_metrics = _budgeted_sft(alone, monkeypatch, 25.5 * per_step)

    assert short["compute"]["continued_from"] == {"step": 1, "flops": per_step, "run_uid": first["uid"]}
    assert cont_run["compute"]["continued_from"]["step"] == 13  # the 12.5-step budget stopped after step 13
    assert cont_run["compute"]["continued_from"]["run_uid"] == short["uid"]
    assert "continued_from" not in ref_run["compute"]
    assert {k: v for k, v in cont_run["compute"].items() if k != "continued_from"} == ref_run["compute"]
    assert cont_run["config_hash"] == ref_run["config_hash"]
    assert [m["step"] for m in ref_metrics] == [0, 10, 20]  # two of them from the earlier stretches
    assert cont_metrics == ref_metrics
    mine, theirs = read_state_dict(cont.final_model), read_state_dict(ref.final_model)
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    def scores(metrics):
        return {k: v for k, v in metrics.items() if not k.endswith("_seconds")}  # timings differ run to run

    assert scores(cont.metrics) == scores(ref.metrics) and "accuracy" in scores(ref.metrics)
    monkeypatch.setenv("DARE_BENCH_HOME", str(shared))
    (key,) = [p.name for p in (shared / STRETCHES).iterdir()]
    assert [s.step for s in kept_stretches(key)] == [1, 13, 26]
    # another budget that stops at step 26 too (25 steps' count < budget <= 26 steps'): the kept stretch is that
    # run already, taken with no step
    same, same_run, same_metrics = _budgeted_sft(shared, monkeypatch, 25.2 * per_step)
    assert same_run["compute"]["continued_from"]["step"] == 26
    assert {k: v for k, v in same_run["compute"].items() if k != "continued_from"} == ref_run["compute"]
    assert same_metrics == ref_metrics and scores(same.metrics) == scores(ref.metrics)
    mine = read_state_dict(same.final_model)
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    assert [s.step for s in kept_stretches(key)] == [1, 13, 26]
