"""The leaderboard on a database written by the real pipeline (`reproduce`), not by test helpers.

Slow (about 1.5 min on 2 shared cores, most of it building and evaluating the tiny SFT base), so it runs by hand:
`pytest -m slow tests/leaderboard`. The runs are shrunk with key=value overrides, so they are "modified" runs
and the app has to be asked to include them.
"""

import pytest
from streamlit.testing.v1 import AppTest

from dare_bench.leaderboard import data as L

from lb_helpers import APP

SHRINK = ["base.start_step=4", "base.batch_size=4",
          "base.warmup_steps=1", "eval.limit=4", "eval.batch_size=4"]
RL = ["train.steps=2", "train.batch_prompts=1", "train.group_size=2"]


@pytest.fixture(scope="session")
def pipeline_db(tmp_path_factory):
    import os

    from dare_bench.pipeline import reproduce

    home = tmp_path_factory.mktemp("pipeline_home")
    url = f"sqlite:///{home / 'results.db'}"
    old = os.environ.get("DARE_BENCH_HOME")
    os.environ["DARE_BENCH_HOME"] = str(home)  # the SFT base cache is shared by both runs
    try:
        for name, extra in (("baseline-llada-sudoku", []), ("d1-llada-sudoku", RL)):
            result = reproduce(name, "micro", db=url, progress=False, log=lambda _m: None, overrides=SHRINK + extra)
            assert result.status == "finished"
    finally:
        if old is None:
            os.environ.pop("DARE_BENCH_HOME", None)
        else:
            os.environ["DARE_BENCH_HOME"] = old
    return url


@pytest.mark.slow
def test_pipeline_runs_on_the_leaderboard(monkeypatch, pipeline_db):
    engine = L.open_reader(pipeline_db)
    assert L.winners(engine, backbone="llada", scale="micro").empty  # modified runs are hidden by default
    cells = L.winners(engine, backbone="llada", scale="micro", include_modified=True)
    assert set(cells["algorithm"]) == {"baseline", "d1"} and set(cells["n"]) == {1}
    curves = L.curves(engine, backbone="llada", task="sudoku", scale="micro", include_modified=True)
    assert list(curves["algorithm"].unique()) == ["d1"] and list(curves["step"]) == [1, 2]
    stages = L.stage_times(engine, backbone="llada", task="sudoku", scale="micro", include_modified=True)
    assert {"rollout", "update"} <= set(stages["stage"])

    monkeypatch.setenv("DARE_BENCH_DB", pipeline_db)
    at = AppTest.from_file(str(APP), default_timeout=120).run()
    assert not at.exception, at.exception
    at.checkbox(key="modified").check().run()
    assert not at.exception, at.exception
    winners = next(t for t in at.tabs if t.label == "Winners")
    assert "**sudoku**:" in winners.markdown[0].value
    rep = next(t for t in at.tabs if t.label == "Reported vs reproduced").dataframe[0].value
    rep = rep.set_index(["algorithm", "task"])
    assert rep.loc[("d1", "sudoku"), "reported"] == pytest.approx(31.8)
    assert rep.loc[("baseline", "sudoku"), "reported"] == pytest.approx(26.2)
    assert rep.loc[("d1", "sudoku"), "status"] == "ok"
    run = next(t for t in at.tabs if t.label == "Run drill-down")
    assert '"modified": true' in run.json[0].value and '"reproduction": "' in run.json[0].value
    samples = run.dataframe[-1].value
    assert len(samples) == 4 and set(samples["verdict"]) <= {"correct", "wrong"}
