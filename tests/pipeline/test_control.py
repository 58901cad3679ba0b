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
