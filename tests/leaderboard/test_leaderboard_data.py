"""Leaderboard queries on databases written by the store's own API: winners, CI, scales, reported vs ours."""

import json
import math
import sqlite3

import pandas as pd
import pytest
from typer.testing import CliRunner

from dare_bench.cli import app
from dare_bench.errors import StoreError
from dare_bench.leaderboard import data as L
from dare_bench.store import EvaluationRecord, Store

from lb_helpers import add_run, config, evaluation


def _cell(cells, algorithm, task="sudoku"):
    row = cells[(cells["algorithm"] == algorithm) & (cells["task"] == task)]
    assert len(row) == 1, cells
    return row.iloc[0]


def test_winner_mean_ci_and_run_counts(winners_db):
    cells = L.winners(L.open_reader(winners_db), backbone="llada", scale="micro")
    assert L.task_winners(cells) == {"sudoku": ["d1"]}
    d1, sft, base = _cell(cells, "d1"), _cell(cells, "sft"), _cell(cells, "baseline")
    assert (d1.n, sft.n, base.n) == (2, 2, 1)  # the modified d1 run is not counted by default
    assert (d1["mean"] == pytest.approx(0.45) and sft["mean"] == pytest.approx(0.25)
            and base["mean"] == pytest.approx(0.1))
    std = math.sqrt(((0.4 - 0.45) ** 2 + (0.5 - 0.45) ** 2) / 1)
    assert d1["std"] == pytest.approx(std)
    assert d1["ci95"] == pytest.approx(12.706 * std / math.sqrt(2))
    assert math.isnan(base["ci95"])  # one run: no interval, not a zero-width one
    matrix = L.winner_matrix(cells)
    assert matrix.loc["d1", "sudoku"].startswith("★ 0.450 ±") and "(n=2)" in matrix.loc["d1", "sudoku"]
    assert not matrix.loc["sft", "sudoku"].startswith("★")


def test_scales_are_never_mixed(winners_db):
    engine = L.open_reader(winners_db)
    assert L.scales_for(engine, "llada") == ["tiny", "micro"]
    tiny = L.winners(engine, backbone="llada", scale="tiny")
    assert L.task_winners(tiny) == {"sudoku": ["sft"]}
    assert set(tiny["n"]) == {1} and _cell(tiny, "sft")["mean"] == pytest.approx(0.95)
    micro = L.winners(engine, backbone="llada", scale="micro")
    assert 0.95 not in set(micro["max"]) and 0.05 not in set(micro["min"])
    dream = L.winners(engine, backbone="dream", scale="micro")
    assert list(dream["algorithm"]) == ["d1"] and list(dream["task"]) == ["gsm8k"]


def test_modified_runs_only_on_request(winners_db):
    cells = L.winners(L.open_reader(winners_db), backbone="llada", scale="micro", include_modified=True)
    assert _cell(cells, "d1").n == 3 and _cell(cells, "d1")["max"] == pytest.approx(0.99)


def test_ties_all_win(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 't.db'}")
    add_run(store, "d1", 0.3)
    add_run(store, "sft", 0.3)
    add_run(store, "baseline", 0.2)
    cells = L.winners(L.open_reader(store.url), backbone="llada", scale="micro")
    assert L.task_winners(cells) == {"sudoku": ["d1", "sft"]}


def test_runs_on_different_bases_are_different_groups(tmp_path):
    """Two machines' tiny bases (other weight hashes) are never pooled: a column per base, a winner per base."""
    store = Store(f"sqlite:///{tmp_path / 't.db'}")
    a, b = "a" * 64, "b" * 64
    add_run(store, "d1", 0.5, seed=0, base_sha=a)
    add_run(store, "d1", 0.7, seed=1, base_sha=a)
    add_run(store, "sft", 0.4, seed=0, base_sha=a)
    add_run(store, "d1", 0.1, seed=0, base_sha=b)
    add_run(store, "sft", 0.3, seed=0, base_sha=b)
    cells = L.winners(L.open_reader(store.url), backbone="llada", scale="micro")
    assert L.task_winners(cells) == {"sudoku @ aaaaaaaa": ["d1"], "sudoku @ bbbbbbbb": ["sft"]}
    d1_a = cells[(cells["algorithm"] == "d1") & (cells["base"] == a)].iloc[0]
    assert d1_a.n == 2 and d1_a["mean"] == pytest.approx(0.6)  # only base a's two seeds
    matrix = L.winner_matrix(cells)
    assert list(matrix.columns) == ["sudoku @ aaaaaaaa", "sudoku @ bbbbbbbb"]
    assert matrix.loc["sft", "sudoku @ bbbbbbbb"].startswith("★ 0.300")
    assert Store(store.url).get_run(1)["base_sha256"] == a


def test_latest_final_evaluation_counts_once_per_run(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 't.db'}")
    run_id = add_run(store, "d1", 0.3)
    store.add_evaluation(run_id, evaluation("sudoku", 0.6, "final"))  # a later re-evaluation
    cells = L.winners(L.open_reader(store.url), backbone="llada", scale="micro")
    assert _cell(cells, "d1").n == 1 and _cell(cells, "d1")["mean"] == pytest.approx(0.6)


def test_reported_vs_reproduced_normalises_to_percent(winners_db):
    engine = L.open_reader(winners_db)
    cells = L.winners(engine, backbone="llada", scale="micro")
    reported, origin = L.reported_scores(engine, "llada")
    assert origin == "store"
    cmp = L.reported_vs_reproduced(cells, reported, "dare-algorithm-comparison").set_index(["algorithm", "task"])
    d1 = cmp.loc[("d1", "sudoku")]
    assert d1.reported == pytest.approx(31.8) and d1.reproduced == pytest.approx(45.0)
    assert d1.difference == pytest.approx(45.0 - 31.8) and d1.status == "ok" and d1.runs == 2
    assert "yjyddq/DARE@83ae8a3" in d1.source and d1.unit.startswith("percent")
    assert cmp.loc[("baseline", "sudoku")].difference == pytest.approx(10.0 - 26.2)
    assert cmp.loc[("sft", "sudoku")].status == "no report" and pd.isna(cmp.loc[("sft", "sudoku")].reported)
    bgpo = cmp.loc[("bgpo", "sudoku")]
    assert bgpo.status == "no run" and bgpo.reported == pytest.approx(42.6) and pd.isna(bgpo.reproduced)
    assert list(cmp["status"])[:3] == ["ok", "ok", "no report"]


def test_reported_vs_reproduced_below_paper_scale_is_not_comparable(winners_db):
    """A micro / tiny replica is not the published experiment: both numbers, no difference (issue #16)."""
    engine = L.open_reader(winners_db)
    cells = L.winners(engine, backbone="llada", scale="micro")
    reported, _ = L.reported_scores(engine, "llada")
    cmp = L.reported_vs_reproduced(cells, reported, "dare-algorithm-comparison", "micro")
    d1 = cmp.set_index(["algorithm", "task"]).loc[("d1", "sudoku")]
    assert d1.reported == pytest.approx(31.8) and d1.reproduced == pytest.approx(45.0)
    assert pd.isna(d1.difference) and d1.status == "not comparable (micro replica)"
    paper = L.reported_vs_reproduced(cells, reported, "dare-algorithm-comparison", "paper")
    assert paper.set_index(["algorithm", "task"]).loc[("d1", "sudoku")].difference == pytest.approx(45.0 - 31.8)
    assert list(cmp["status"]).index("no report") > list(cmp["status"]).index("not comparable (micro replica)")


def test_reported_matches_our_metric_under_another_name(tmp_path):
    """At paper scale sudoku's primary metric is "score", which DARE's table calls "accuracy"."""
    store = Store(f"sqlite:///{tmp_path / 't.db'}")
    run_id = store.start_run(config("d1", "llada", "sudoku", "paper"), seed=0, code_version="v", packages={},
                             hardware={})
    store.finish_run(run_id, [EvaluationRecord(task="sudoku", split="test", data_fingerprint="fp",
                                               metrics={"score": 0.3, "accuracy": 0.1}, primary_metric="score",
                                               checkpoint="final")])
    engine = L.open_reader(store.url)
    cells = L.winners(engine, backbone="llada", scale="paper")
    reported, _ = L.reported_scores(engine, "llada")
    cmp = L.reported_vs_reproduced(cells, reported, "dare-algorithm-comparison").set_index(["algorithm", "task"])
    d1 = cmp.loc[("d1", "sudoku")]
    assert (d1.metric, d1.reported_metric, d1.status) == ("score", "accuracy", "ok")
    assert d1.difference == pytest.approx(30.0 - 31.8)


def test_reported_falls_back_to_the_registry(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 't.db'}")  # never synced: the reported table is empty
    add_run(store, "d1", 0.5)
    reported, origin = L.reported_scores(L.open_reader(store.url), "llada")
    assert origin == "registry"
    row = reported[(reported["algorithm"] == "d1") & (reported["task"] == "sudoku")
                   & (reported["table"] == "dare-algorithm-comparison")]
    assert list(row["value"]) == [31.8]


def test_rows_of_two_published_tables_never_mix(tmp_path):
    """d1-llada-sudoku has DARE's cell (31.8) and d1 Table 1's six (two recipes x three lengths): choosing a table
    shows its rows only, one per setting it reports, in the source's order, each against our one cell."""
    store = Store(f"sqlite:///{tmp_path / 't.db'}")
    add_run(store, "d1", 0.5)
    engine = L.open_reader(store.url)
    cells = L.winners(engine, backbone="llada", scale="micro")
    reported, origin = L.reported_scores(engine, "llada")
    assert origin == "registry"

    def d1_sudoku(table):
        cmp = L.reported_vs_reproduced(cells, reported, table)
        return cmp[(cmp["algorithm"] == "d1") & (cmp["task"] == "sudoku")]

    dare = d1_sudoku("dare-algorithm-comparison")
    assert list(dare["reported"]) == [31.8] and set(dare["table"]) == {"dare-algorithm-comparison"}
    paper = d1_sudoku("d1-paper-table1")
    assert set(paper["table"]) == {"d1-paper-table1"} and 31.8 not in list(paper["reported"])
    assert list(paper["reported"]) == [18.4, 12.9, 11.0, 22.1, 16.7, 9.5]
    assert [json.loads(s)["gen_length"] for s in paper["settings"]] == [128, 256, 512] * 2
    assert list(paper["reproduced"]) == pytest.approx([50.0] * 6) and set(paper["status"]) == {"ok"}
    assert list(paper["difference"]) == pytest.approx([50.0 - v for v in paper["reported"]])
    everything = d1_sudoku(None)  # no table chosen (exports): every row, still one per table and setting
    assert sorted(everything["reported"]) == sorted([31.8, *paper["reported"]])


def test_curves_stage_times_and_drilldown(winners_db):
    engine = L.open_reader(winners_db)
    curves = L.curves(engine, backbone="llada", task="sudoku", scale="micro")
    assert set(curves["algorithm"]) == {"d1", "sft"}  # baseline runs do not train
    d1 = curves[curves["algorithm"] == "d1"].sort_values("step")
    assert list(d1["step"]) == [1, 2, 3, 4] and set(d1["runs"]) == {2}
    assert list(d1["reward_mean"]) == pytest.approx([0.45 * s / 4 for s in (1, 2, 3, 4)])
    stages = L.stage_times(engine, backbone="llada", task="sudoku", scale="micro").set_index(["algorithm", "stage"])
    assert stages.loc[("d1", "rollout")].seconds_per_run == pytest.approx(8.0)  # 4 steps × 2 s
    runs = L.runs_page(engine, backbone="llada", task="sudoku", scale="micro", algorithms=["d1"])
    assert list(runs["final_score"]) == pytest.approx([0.5, 0.4])
    detail = L.run_detail(engine, int(runs["run_id"].iloc[-1]))
    assert (detail["run"]["modified"] is False and detail["run"]["code_version"] == "test-version"
            and detail["run"]["config"]["algorithm"] == "d1")
    final = [e for e in detail["evaluations"] if e["checkpoint"] == "final"][0]
    assert final["sampler_preset"] == "tiny-sudoku" and final["data_fingerprint"] == "fp-sudoku"
    page0, total = L.samples_page(engine, final["id"], page=0)
    page1, _ = L.samples_page(engine, final["id"], page=1)
    assert total == 30 and len(page0) == L.SAMPLE_PAGE and list(page1["idx"]) == list(range(25, 30))
    wrong, n_wrong = L.samples_page(engine, final["id"], only="wrong")
    assert n_wrong == 15 and set(wrong["verdict"]) == {"wrong"}


def test_curves_downsample_long_runs(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 't.db'}")
    add_run(store, "d1", 0.5, steps=120)
    curves = L.curves(L.open_reader(store.url), backbone="llada", task="sudoku", scale="micro", max_points=25)
    assert 20 <= len(curves) <= 25 and curves["step"].is_monotonic_increasing


def test_open_reader_refuses_bad_input_and_never_writes(tmp_path):
    missing = tmp_path / "missing.db"
    with pytest.raises(StoreError, match="no database at"):
        L.open_reader(str(missing))
    assert not missing.exists()  # Store() would have created it; the leaderboard must not
    junk = tmp_path / "junk.db"
    junk.write_text("not a database\n" * 100)
    with pytest.raises(StoreError, match="not an SQLite database"):
        L.open_reader(str(junk))
    foreign = tmp_path / "foreign.db"
    sqlite3.connect(foreign).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(StoreError, match="not a dare-bench results database"):
        L.open_reader(str(foreign))
    url = f"sqlite:///{tmp_path / 'ok.db'}"
    Store(url).close()
    odd = tmp_path / "odd name #1?.db"  # a bare path is a file name, never re-parsed as a URL
    odd.write_bytes((tmp_path / "ok.db").read_bytes())
    assert L.overview(L.open_reader(str(odd)))["runs"] == 0
    engine = L.open_reader(url)
    with pytest.raises(Exception, match="readonly|read-only|query_only|attempt to write"):
        with engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM runs")


def test_command_rejects_a_bad_database_in_one_line(tmp_path):
    result = CliRunner().invoke(app, ["leaderboard", "--db", str(tmp_path / "missing.db")])
    assert result.exit_code != 0
    assert isinstance(result.exception, StoreError) and "no database at" in str(result.exception)
    from dare_bench.leaderboard.commands import APP, streamlit_command

    argv, env = streamlit_command("sqlite:///x.db", port=8765, host="127.0.0.1")
    assert APP.is_file() and str(APP) in argv and env["DARE_BENCH_DB"] == "sqlite:///x.db"
    flags = dict(zip(argv[5::2], argv[6::2]))
    assert flags["--server.address"] == "127.0.0.1" and flags["--server.headless"] == "true"
    assert flags["--browser.gatherUsageStats"] == "false" and flags["--server.fileWatcherType"] == "none"


def test_display_url_hides_passwords():
    assert L.display_url("postgresql://user:secret@db.example/results") == "postgresql://user:***@db.example/results"
    assert L.display_url("/tmp/odd #name?.db") == "/tmp/odd #name?.db"


def test_overview_names_the_winner_the_margin_and_whether_cis_separate(winners_db, tmp_path):
    over = L.winners_overview(L.open_reader(winners_db), scale="micro").set_index(["backbone", "task"])
    llada = over.loc[("llada", "sudoku")]
    assert (llada.winner, llada.runner_up) == ("d1", "sft") and llada.margin == pytest.approx(0.2)
    assert llada.separated == "no"  # two seeds each: t(1) intervals of ±0.9 overlap
    dream = over.loc[("dream", "gsm8k")]
    assert dream.winner == "d1" and pd.isna(dream.runner_up) and dream.separated == "n/a"
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    for seed, (a, b) in enumerate([(0.80, 0.20), (0.81, 0.21), (0.79, 0.19)]):
        add_run(store, "d1", a, seed=seed)
        add_run(store, "sft", b, seed=seed)
    sep = L.winners_overview(L.open_reader(store.url), scale="micro").iloc[0]
    assert sep.separated == "yes" and sep.n == 3


def test_an_exact_tie_shares_the_win_and_the_runner_up_is_below_it(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    d1_runs = []
    for seed, (a, b) in enumerate([(0.375, 0.30), (0.36, 0.31), (0.39, 0.29)]):
        d1_runs.append(add_run(store, "d1", a, seed=seed))
        add_run(store, "cj-grpo", [0.36, 0.39, 0.375][seed], seed=seed)  # the same three finals: the same mean
        add_run(store, "sft", b, seed=seed)
    over = L.winners_overview(L.open_reader(store.url), scale="micro").iloc[0]
    assert (over.winner, over.tied_with, over.runner_up) == ("cj-grpo", ["d1"], "sft")  # co-winners by name
    assert over.margin == pytest.approx(0.375 - 0.30) and over.separated == "yes"
    from dare_bench.leaderboard.report import winners_rows

    row = winners_rows(store.url, scale="micro")[0]
    assert row["winner"] == "cj-grpo = d1 (tie)" and row["vs SFT control"] == "—"
    # only the second-named co-winner has SFT controls: the column shows them and names it
    for seed, control in enumerate([0.30, 0.31, 0.32]):
        rl = store.get_run(d1_runs[seed])
        cid = store.start_run(config("sft", "llada", "sudoku", "micro"), seed=seed, control_of=rl["uid"],
                              code_version="test-version", packages={"torch": "2.13.0"}, hardware={"cpu": "test"})
        store.finish_run(cid, [evaluation("sudoku", 0.1, "base"), evaluation("sudoku", control, "final", step=4)])
    row = winners_rows(store.url, scale="micro")[0]
    assert row["vs SFT control"].startswith("+0.065 ± ") and row["vs SFT control"].endswith("(n=3, d1)")


def test_seed_bands_and_collapse_flags(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    for seed, rewards in enumerate([[0.1, 0.5, 0.6, 0.1], [0.1, 0.3, 0.5, 0.6]]):
        run_id = store.start_run(config("d1", "llada", "sudoku", "micro"), seed=seed, code_version="t",
                                 packages={"torch": "2"}, hardware={"cpu": "t"})
        for step, r in enumerate(rewards, start=1):
            store.log_metrics(run_id, step, {"reward_mean": r, "tokens_per_forward": 2.0})
        store.finish_run(run_id, [evaluation("sudoku", 0.1, "base"), evaluation("sudoku", 0.3, "final")])
    engine = L.open_reader(store.url)
    bands = L.seed_bands(engine, backbone="llada", task="sudoku", scale="micro")
    step2 = bands[bands["step"] == 2].iloc[0]
    assert step2["mean"] == pytest.approx(0.4) and step2.runs == 2
    assert step2.high - step2["mean"] == pytest.approx(math.sqrt(0.02))  # sample std of (0.5, 0.3)
    flags = L.reward_collapses(engine, backbone="llada", task="sudoku", scale="micro", drop=0.2)
    assert list(flags["seed"]) == [0] and flags.iloc[0]["step"] == 4 and flags.iloc[0]["drop"] == pytest.approx(0.5)
    assert L.reward_collapses(engine, backbone="llada", task="sudoku", scale="micro", drop=0.6).empty


def test_accuracy_against_tokens_per_forward(winners_db, tmp_path):
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    run_id = add_run(store, "d1", 0.4)
    ev = evaluation("sudoku", 0.6, "final")
    store.add_evaluation(run_id, ev.model_copy(update={"metrics": {"accuracy": 0.6, "tokens_per_forward": 3.5}}))
    points = L.accuracy_vs_tpf(L.open_reader(store.url), backbone="llada", scale="micro")
    assert list(points["tokens_per_forward"]) == [3.5] and list(points["value"]) == [0.6]


def test_mc_sensitivity_groups_runs_by_mc_count_and_drops_confounded_ones(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    same = {"scale": "tiny", "base": 0.2, "base_sha": "b" * 64}
    for seed, (at4, at1, at8) in enumerate([(0.30, 0.22, 0.34), (0.32, 0.24, 0.36)]):
        add_run(store, "bgpo", at4, seed=seed, mc_samples=4, **same)  # the pinned count
        add_run(store, "bgpo", at1, seed=seed, mc_samples=1, overrides=["train.mc_samples=1"], **same)
        add_run(store, "bgpo", at8, seed=seed, mc_samples=8, overrides=["train.mc_samples=8"], **same)
    # a second change confounds the comparison: left out
    add_run(store, "bgpo", 0.99, seed=5, mc_samples=8, overrides=["train.mc_samples=8", "train.lr=1e-3"], **same)
    add_run(store, "spg", 0.25, mc_samples=2, **same)  # one MC count only: no sensitivity to show
    add_run(store, "d1", 0.25, **same)  # takes no MC count
    mc = L.mc_sensitivity(L.open_reader(store.url), backbone="llada", task="sudoku", scale="tiny")
    assert list(mc["algorithm"]) == ["bgpo"] * 3 and list(mc["mc_samples"]) == [1, 4, 8]
    assert list(mc["pinned"]) == [False, True, False] and list(mc["n"]) == [2, 2, 2]
    assert list(mc["mean"]) == pytest.approx([0.23, 0.31, 0.35])
    assert mc.iloc[2]["ci95"] == pytest.approx(12.706 * math.sqrt(0.0002) / math.sqrt(2))
    assert list(mc["vs_base"]) == pytest.approx([0.03, 0.11, 0.15])
    assert L.mc_sensitivity(L.open_reader(store.url), backbone="llada", task="countdown", scale="tiny").empty


def test_mc_sensitivity_counts_spg_draws_by_num_t(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    same = {"scale": "tiny", "base": 0.2, "base_sha": "b" * 64}
    add_run(store, "spg", 0.21, num_t=2, mc_samples=2, **same)  # pinned: 2 draws
    add_run(store, "spg", 0.21, seed=0, num_t=2, mc_samples=1, overrides=["train.mc_samples=1"], **same)  # still 2
    add_run(store, "spg", 0.30, num_t=4, mc_samples=4,
            overrides=["train.algorithm.num_t=4", "train.mc_samples=4"], **same)
    mc = L.mc_sensitivity(L.open_reader(store.url), backbone="llada", task="sudoku", scale="tiny")
    assert list(mc["mc_samples"]) == [2, 4] and list(mc["n"]) == [2, 1] and list(mc["pinned"]) == [True, False]


def test_a_single_run_does_not_outrank_entries_with_several(tmp_path):
    """One seed has no interval: where some entry of a row has several runs, a one-run entry with a higher mean is
    neither the winner nor the runner-up (the README table showed a one-seed CJ-GRPO above a three-seed d-TreeRPO)."""
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    add_run(store, "cj-grpo", 0.50, seed=0)
    for seed, (a, b) in enumerate([(0.40, 0.30), (0.42, 0.31), (0.41, 0.29)]):
        add_run(store, "d1", a, seed=seed)
        add_run(store, "sft", b, seed=seed)
    engine = L.open_reader(store.url)
    cells = L.winners(engine, backbone="llada", scale="micro")
    assert L.task_winners(cells) == {"sudoku": ["d1"]} and not _cell(cells, "cj-grpo").best
    over = L.winners_overview(engine, scale="micro").iloc[0]
    assert (over.winner, over.runner_up, over.n) == ("d1", "sft", 3)
    assert over.margin == pytest.approx(0.41 - 0.30) and over.separated == "yes"
    # with one run everywhere, the highest mean still wins
    solo = Store(f"sqlite:///{tmp_path / 'solo.db'}")
    add_run(solo, "cj-grpo", 0.50)
    add_run(solo, "d1", 0.40)
    assert L.winners_overview(L.open_reader(solo.url), scale="micro").iloc[0].winner == "cj-grpo"


def test_runs_of_a_superseded_config_are_left_out_and_named(tmp_path):
    """A run whose pinned config the registry has since changed (here the LLaDA2 replica before it trained at its
    decoding block, `model.block_size` unset) is superseded: the winners leave it out unless modified runs are asked
    for, and `winners` names it under the table. Runs of the current config, and of entries the registry cannot
    resolve, count as before."""
    from dare_bench.leaderboard.report import markdown_table, superseded_counts, winners_rows
    from dare_bench.pipeline.plan import resolve

    store = Store(f"sqlite:///{tmp_path / 'stale.db'}")
    _, now = resolve("sft-llada2-sudoku", "micro")
    before = now.model_copy(update={"profile": now.profile.model_copy(
        update={"model": now.profile.model.model_copy(update={"block_size": None})})})
    assert before.recipe_hash != now.recipe_hash and before.content_hash != now.content_hash
    # the data fingerprints are not part of the recipe: DARE's files and the generator judge alike
    assert now.model_copy(update={"data": []}).recipe_hash == now.recipe_hash
    for cfg, final, seed in ((now, 0.2, 0), (now, 0.3, 1), (before, 0.9, 0)):
        run_id = store.start_run(cfg, seed=seed, code_version="test", packages={"torch": "2.13.0"},
                                 hardware={"cpu": "test"})
        store.finish_run(run_id, [evaluation("sudoku", 0.1, "base"), evaluation("sudoku", final, "final", step=4)])
    add_run(store, "d1", 0.5, backbone="llada2", task="sudoku", seed=0)  # a config the registry cannot resolve
    engine = L.open_reader(store.url)
    assert L.superseded_hashes(engine) == {before.content_hash}
    assert L.superseded_runs(engine, scale="micro") == {"sft-llada2-sudoku": 1}
    cells = L.winners(engine, backbone="llada2", scale="micro")
    assert _cell(cells, "sft").n == 2 and _cell(cells, "sft")["mean"] == pytest.approx(0.25)
    assert _cell(cells, "d1").n == 1
    every = L.winners(engine, backbone="llada2", scale="micro", include_modified=True)
    assert _cell(every, "sft").n == 3
    table = markdown_table(winners_rows(store.url, scale="micro"), "micro", superseded_counts(store.url, scale="micro"))
    assert "_Not counted: 1 run of configs the registry has changed since they ran" in table
    assert "sft-llada2-sudoku (1)" in table
    assert "Not counted" not in markdown_table(winners_rows(store.url, scale="micro"), "micro", {})
