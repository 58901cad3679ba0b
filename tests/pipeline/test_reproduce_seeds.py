"""`reproduce` without `--seed` runs every seed the scale pins and prints a per-seed table with mean ± 95% CI;
`--seed S` runs one."""

import json
import math

import pytest
from typer.testing import CliRunner

from dare_bench.cli import app
from dare_bench.pipeline.summary import ReproduceResult, seed_summary, student_t_quantile


def test_student_t_quantiles_match_the_tables():
    assert student_t_quantile(0.975, 1) == pytest.approx(12.7062, abs=1e-3)
    assert student_t_quantile(0.975, 2) == pytest.approx(4.3027, abs=1e-3)
    assert student_t_quantile(0.975, 30) == pytest.approx(2.0423, abs=1e-3)


def test_seed_summary_is_mean_and_t_interval():
    runs = [ReproduceResult(run_id=i, name="x", scale="tiny", status="finished", seed=i,
                            base_metrics={"accuracy": 0.1}, metrics={"accuracy": v})
            for i, v in enumerate([0.2, 0.3, 0.4])]
    s = seed_summary(runs)
    assert s["final"]["mean"] == pytest.approx(0.3) and s["final"]["n"] == 3
    assert s["final"]["ci95"] == pytest.approx(4.3027 * 0.1 / math.sqrt(3), rel=1e-4)
    assert s["gain"]["values"] == pytest.approx([0.1, 0.2, 0.3])


@pytest.mark.integration
def test_no_seed_runs_every_pinned_seed_and_one_seed_runs_one(tmp_path):
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    runner = CliRunner()
    r = runner.invoke(app, ["reproduce", "sft-llada-sudoku", "seeds=[0,1]", "--scale", "micro", "--db", db, "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output.strip().splitlines()[-1])
    assert [run["seed"] for run in out["runs"]] == [0, 1] and all(x["status"] == "finished" for x in out["runs"])
    assert out["summary"]["final"]["n"] == 2 and out["summary"]["final"]["ci95"] is not None
    table = runner.invoke(app, ["reproduce", "sft-llada-sudoku", "seeds=[0,1]", "--scale", "micro", "--db", db])
    assert table.exit_code == 0 and "(95% CI)" in table.output and "skipped" in table.output  # both seeds done
    one = runner.invoke(app, ["reproduce", "sft-llada-sudoku", "seeds=[0,1]", "--scale", "micro", "--seed", "1",
                              "--db", db, "--json"])
    assert json.loads(one.output.strip().splitlines()[-1])["seed"] == 1  # one seed: the single-run object
