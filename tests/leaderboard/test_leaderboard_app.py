"""The Streamlit app under streamlit.testing (no server, no browser) on databases written by the store."""

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from dare_bench.store import Store

from lb_helpers import APP, add_run


def _app(monkeypatch, url: str) -> AppTest:
    monkeypatch.setenv("DARE_BENCH_DB", url)
    at = AppTest.from_file(str(APP), default_timeout=90).run()
    assert not at.exception, at.exception
    return at


def _tab(at: AppTest, label: str):
    return next(t for t in at.tabs if t.label == label)


def test_winners_tab_shows_the_right_winner(monkeypatch, winners_db):
    at = _app(monkeypatch, winners_db)
    assert at.title[0].value == "dare-bench leaderboard"
    assert at.selectbox(key="backbone").value == "llada" and at.selectbox(key="scale").value == "tiny"
    at.selectbox(key="scale").select("micro").run()
    win = _tab(at, "Winners")
    assert "**sudoku**: d1 (0.450)" in win.markdown[0].value
    matrix = win.dataframe[0].value
    assert matrix.loc["d1", "sudoku"].startswith("★ 0.450 ±") and "(n=2)" in matrix.loc["d1", "sudoku"]
    assert matrix.loc["baseline", "sudoku"] == "0.100 (n=1)"
    assert "micro scale" in win.subheader[0].value


def test_scale_switch_never_mixes_scales(monkeypatch, winners_db):
    at = _app(monkeypatch, winners_db)
    at.selectbox(key="scale").select("tiny").run()
    win = _tab(at, "Winners")
    assert "**sudoku**: sft (0.950)" in win.markdown[0].value
    matrix = win.dataframe[0].value
    assert set(matrix.index) == {"d1", "sft"} and all("(n=1)" in v for v in matrix["sudoku"])
    at.checkbox(key="modified").check().run()  # modified runs at micro must not leak into tiny either
    assert "(n=1)" in _tab(at, "Winners").dataframe[0].value.loc["d1", "sudoku"]


def test_reported_vs_reproduced_tab(monkeypatch, winners_db):
    at = _app(monkeypatch, winners_db)
    at.selectbox(key="scale").select("micro").run()
    rep = _tab(at, "Reported vs reproduced")
    assert at.selectbox(key="reported_table").value == "dare-algorithm-comparison"
    df = rep.dataframe[0].value.set_index(["algorithm", "task"])
    assert df.loc[("d1", "sudoku"), "reported"] == pytest.approx(31.8)
    assert df.loc[("d1", "sudoku"), "reproduced"] == pytest.approx(45.0)
    # a micro replica is not the paper's experiment: both numbers, no difference (issue #16)
    assert pd.isna(df.loc[("d1", "sudoku"), "difference"])
    assert df.loc[("d1", "sudoku"), "status"] == "not comparable (micro replica)"
    assert df.loc[("sft", "sudoku"), "status"] == "no report" and df.loc[("bgpo", "sudoku"), "status"] == "no run"
    assert any("reproduced = ours × 100" in c.value and "not comparable" in c.value for c in rep.caption)


def test_curves_and_drilldown(monkeypatch, winners_db):
    at = _app(monkeypatch, winners_db)
    at.selectbox(key="scale").select("micro").run()
    curves = _tab(at, "Curves")
    assert len(curves.get("vega_lite_chart")) == 5  # reward, loss, KL, tokens per forward + stage times
    at.radio(key="curve_mode").set_value("selected runs").run()
    assert not at.exception, at.exception
    assert at.multiselect(key="curve_runs").value == [5, 3, 1]  # the newest run of d1, sft and baseline
    assert len(_tab(at, "Curves").get("vega_lite_chart")) == 5
    at.multiselect(key="curve_runs").set_value([1]).run()  # a baseline run alone has no training curve
    assert "No step metrics" in _tab(at, "Curves").info[0].value
    run = _tab(at, "Run drill-down")
    runs = run.dataframe[0].value
    assert set(runs["algorithm"]) == {"baseline", "sft", "d1"}
    d1_seed0 = int(runs[(runs["algorithm"] == "d1") & (runs["seed"] == 0)]["run_id"].iloc[0])
    at.selectbox(key="run_id").select(d1_seed0).run()
    run = _tab(at, "Run drill-down")
    record = run.json[0].value
    assert '"code_version": "test-version"' in record and '"seed": 0' in record
    assert at.selectbox(key="evaluation_id").format_func(at.selectbox(key="evaluation_id").value).startswith("final")
    samples = run.dataframe[-1].value
    assert len(samples) == 25 and set(samples["verdict"]) == {"correct", "wrong"}
    at.number_input(key="samples_page").set_value(2).run()
    assert list(_tab(at, "Run drill-down").dataframe[-1].value["idx"]) == list(range(25, 30))
    at.radio(key="samples_only").set_value("wrong").run()
    assert set(_tab(at, "Run drill-down").dataframe[-1].value["verdict"]) == {"wrong"}


def test_empty_database_says_so(monkeypatch, empty_db):
    at = _app(monkeypatch, empty_db)
    assert len(at.info) == 1 and "No finished runs yet" in at.info[0].value
    assert not at.dataframe and not at.tabs


def test_bad_database_is_one_clear_error(monkeypatch, tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_text("hello")
    at = _app(monkeypatch, str(junk))
    assert len(at.error) == 1 and "not an SQLite database" in at.error[0].value
    assert not at.tabs


def test_switching_backbone_keeps_filters_valid(monkeypatch, winners_db):
    at = _app(monkeypatch, winners_db)
    at.multiselect(key="tasks").set_value(["sudoku"]).run()
    at.selectbox(key="backbone").select("dream").run()
    assert not at.exception, at.exception
    assert at.selectbox(key="scale").options == ["micro"] and at.multiselect(key="tasks").value == []
    assert "**gsm8k**: d1 (0.700)" in _tab(at, "Winners").markdown[0].value


def test_overview_stability_and_speed_tabs_render(monkeypatch, winners_db):
    at = _app(monkeypatch, winners_db)
    at.selectbox(key="scale").select("micro").run()
    over = _tab(at, "Overview").dataframe[0].value.set_index(["backbone", "task"])
    assert over.loc[("llada", "sudoku"), "winner"] == "d1" and over.loc[("dream", "gsm8k"), "winner"] == "d1"
    stab = _tab(at, "Stability")
    assert at.selectbox(key="stability_task").value == "sudoku"
    assert any("Reward collapses" in m.value for m in stab.markdown)
    assert not at.exception


def test_stability_tab_shows_the_mc_sample_sensitivity(monkeypatch, winners_db, tmp_path):
    at = _app(monkeypatch, winners_db)  # no run varies its MC count there: the tab says how to sweep one
    assert any("two or more MC counts" in i.value for i in _tab(at, "Stability").info)
    url = f"sqlite:///{tmp_path / 'mc.db'}"
    store = Store(url)
    for seed in (0, 1):
        add_run(store, "bgpo", 0.30 + seed / 100, seed=seed, scale="tiny", mc_samples=4)
        add_run(store, "bgpo", 0.36 + seed / 100, seed=seed, scale="tiny", mc_samples=16,
                overrides=["train.mc_samples=16"])
    store.close()
    stab = _tab(_app(monkeypatch, url), "Stability")
    table = next(d.value for d in stab.dataframe if "mc_samples" in d.value.columns)
    assert list(table["mc_samples"]) == [4, 16] and list(table["pinned"]) == [True, False]
    assert list(table["mean"]) == pytest.approx([0.305, 0.365])
