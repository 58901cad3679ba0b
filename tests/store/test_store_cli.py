"""`dare-bench runs / export / ingest`: result files from fan-out jobs, idempotent re-ingest, bad input."""

import csv
import io
import json

import pytest
from typer.testing import CliRunner

from dare_bench.cli import app
from dare_bench.errors import DataError, StoreError
from dare_bench.store import EvaluationRecord, SampleRecord, Store, write_result_file

runner = CliRunner()


def _ev(task="sudoku", value=0.5) -> EvaluationRecord:
    return EvaluationRecord(task=task, split="test", data_fingerprint="sha256:x", sampler_preset="tiny-llada-sudoku",
                            metrics={"accuracy": value}, primary_metric="accuracy",
                            samples=[SampleRecord(idx=i, completion=str(i), score=float(i % 2)) for i in range(4)])


def _results(tmp_path, spec, n=2):
    out = tmp_path / "results"
    for i in range(n):
        write_result_file(out / f"job-{i}.json", config=spec.resolve("micro"), seed=i, evaluations=[_ev(value=i / 4)],
                          metrics=[(0, {"loss": 1.0}), (1, {"loss": 0.5})])
    return out


def test_ingest_is_idempotent_and_runs_lists_it(tmp_path, spec, db_url):
    out = _results(tmp_path, spec)
    first = runner.invoke(app, ["ingest", str(out), "--db", db_url, "--no-sync-reported"])
    assert first.exit_code == 0, first.output
    assert "2 new run(s), 2 new evaluation(s)" in first.output
    again = runner.invoke(app, ["ingest", str(out), "--db", db_url, "--no-sync-reported"])
    assert "0 new run(s), 0 new evaluation(s)" in again.output and "2 already present" in again.output
    runs = json.loads(runner.invoke(app, ["runs", "--json", "--db", db_url]).output)
    assert len(runs) == 2 and {r["origin"] for r in runs} == {"ingest"} and {r["status"] for r in runs} == {"finished"}
    store = Store(db_url)
    assert all(len(store.metrics(r["id"])) == 2 for r in runs)
    assert sum(len(store.samples(e["id"])) for r in runs for e in r["evaluations"]) == 8
    table = runner.invoke(app, ["runs", "--db", db_url])
    assert table.exit_code == 0 and "d1-llada-sudoku" in table.output


def test_runs_table_names_each_checkpoint_in_training_order(tmp_path, spec, db_url):
    # stored in the order a tiny run writes them: a periodic evaluation, then the base, then the final one
    evs = [_ev(value=v).model_copy(update={"checkpoint": c, "step": st})
           for c, st, v in (("step-25", 25, 0.5), ("base", 0, 0.25), ("final", 50, 0.75))]
    path = write_result_file(tmp_path / "r.json", config=spec.resolve("micro"), seed=0, evaluations=evs)
    assert runner.invoke(app, ["ingest", str(path), "--db", db_url, "--no-sync-reported"]).exit_code == 0
    table = runner.invoke(app, ["runs", "--db", db_url])
    assert table.exit_code == 0 and "sudoku test accuracy: base 0.25, step-25 0.5, final 0.75" in table.output


def test_ingest_attaches_to_a_run_the_database_saw_start(tmp_path, spec, db_url):
    from dare_bench.store import run_record

    store = Store(db_url)
    cfg = spec.resolve("micro")
    run_id = store.start_run(cfg, seed=0)
    uid = store.get_run(run_id)["uid"]
    path = write_result_file(tmp_path / "final.json", run=run_record(cfg, seed=0, uid=uid), evaluations=[_ev()])
    assert store.ingest(path)["evaluations"] == 1
    run = store.get_run(run_id)
    assert run["status"] == "finished" and len(store.evaluations(run_id)) == 1


def test_ingest_syncs_reported_scores(tmp_path, spec, db_url):
    result = runner.invoke(app, ["ingest", str(_results(tmp_path, spec, 1)), "--db", db_url])
    assert result.exit_code == 0 and "reported scores synced" in result.output
    rows = Store(db_url).reported("bgpo-llada-sudoku")
    assert [r["value"] for r in rows] == [42.6]


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON"),
    ('{"format": "something-else"}', "not a dare-bench result file"),
    ('{"format": "dare-bench-result", "version": 7}', "version 7"),
    ('{"format": "dare-bench-result", "version": 1, "run": {"uid": "x"}}', "invalid result file at run."),
])
def test_corrupt_result_file_writes_nothing(tmp_path, spec, db_url, content, message):
    out = _results(tmp_path, spec)
    (out / "zz-bad.json").write_text(content)
    result = runner.invoke(app, ["ingest", str(out), "--db", db_url])
    assert isinstance(result.exception, DataError) and message in str(result.exception)
    assert "zz-bad.json" in str(result.exception)
    assert Store(db_url).latest_runs() == []


def test_export_csv_and_json(tmp_path, spec, db_url):
    Store(db_url).ingest(_results(tmp_path, spec))
    js = json.loads(runner.invoke(app, ["export", "--format", "json", "--db", db_url]).output)
    assert len(js) == 2 and sorted(r["value"] for r in js) == [0.0, 0.25]
    text = runner.invoke(app, ["export", "--format", "csv", "--db", db_url]).output
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 2 and rows[0]["reproduction"] == "d1-llada-sudoku" and "metric:accuracy" in rows[0]
    target = tmp_path / "out.csv"
    assert runner.invoke(app, ["export", "--format", "csv", "--db", db_url, "-o", str(target)]).exit_code == 0
    assert target.read_text() == text
    bad = runner.invoke(app, ["export", "--format", "xml", "--db", db_url])
    assert "csv or json" in str(bad.exception)


def test_bad_database_via_cli(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"garbage" * 200)
    result = runner.invoke(app, ["runs", "--db", str(junk)])
    assert isinstance(result.exception, StoreError) and "not an SQLite database" in str(result.exception)
    for cmd in ("runs", "export", "ingest"):
        assert runner.invoke(app, [cmd, "--help"]).exit_code == 0


def test_export_reported_scores(tmp_path, spec, db_url):
    runner.invoke(app, ["ingest", str(_results(tmp_path, spec, 1)), "--db", db_url])
    text = runner.invoke(app, ["export", "--format", "csv", "--what", "reported", "--db", db_url]).output
    rows = list(csv.DictReader(io.StringIO(text)))
    bgpo = [r for r in rows if r["reproduction"] == "bgpo-llada-sudoku"]
    assert len(bgpo) == 1 and float(bgpo[0]["value"]) == 42.6 and "yjyddq/DARE" in bgpo[0]["source"]
    tables = {r["reproduction"]: {x["table"] for x in rows if x["reproduction"] == r["reproduction"]} for r in rows}
    assert tables["baseline-llada-gsm8k"] == {"dare-algorithm-comparison"}  # the two protocols: two entries
    assert tables["released-llada-gsm8k"] == {"dare-eval-reproduction"}


def test_find_runs_by_config(spec, db_url):
    store = Store(db_url)
    cfg = spec.resolve("micro")
    run_id = store.start_run(cfg, seed=1)
    assert store.find_runs(config_hash=cfg.content_hash) == []
    store.finish_run(run_id, [_ev()])
    assert [r["id"] for r in store.find_runs(config_hash=cfg.content_hash, seed=1)] == [run_id]
    assert store.find_runs(config_hash=cfg.content_hash, seed=2) == []
    other = spec.resolve("micro", ["eval.limit=4"])
    assert store.find_runs(config_hash=other.content_hash) == []


def test_unwritable_database_location(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="cannot open database"):
        Store(str(blocker / "sub" / "results.db"))


def test_runs_filters(tmp_path, spec, db_url):
    Store(db_url).ingest(_results(tmp_path, spec))
    rows = json.loads(runner.invoke(app, ["runs", "--json", "--db", db_url, "--reproduction", "d1-llada-sudoku",
                                          "--status", "finished", "--limit", "1"]).output)
    assert len(rows) == 1 and rows[0]["status"] == "finished"
    typo = runner.invoke(app, ["runs", "--db", db_url, "--reproduction", "d1-lada-sudoku"])
    assert "did you mean d1-llada-sudoku" in str(typo.exception)
    bad = runner.invoke(app, ["runs", "--db", db_url, "--status", "done"])
    assert "unknown status" in str(bad.exception)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["run"]["config"]["profile"]["train"].update(lr=0.5), "is not the hash of its config"),
    (lambda d: d["run"].update(config_hash="0" * 64), "is not the hash of its config"),
    (lambda d: d["run"].update(packages={}), "no package / machine record"),
    (lambda d: d["run"].update(hardware={}), "no package / machine record"),
    (lambda d: d["run"]["config"]["profile"].update(no_such_field=1), "does not validate under this dare-bench"),
])
def test_an_edited_or_incomplete_run_record_is_refused_and_nothing_is_written(tmp_path, spec, db_url, edit, message):
    """Integrity (issue #16, bundles): the config hash is recomputed from the stored config, and the package /
    machine record must be there; one bad file refuses the whole ingest."""
    out = _results(tmp_path, spec)
    path = out / "job-1.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    result = runner.invoke(app, ["ingest", str(out), "--db", db_url])
    assert result.exit_code != 0 and isinstance(result.exception, DataError)
    assert message in str(result.exception) and "job-1.json" in str(result.exception)
    assert Store(db_url).latest_runs() == []


def test_runs_shows_where_a_running_run_is_and_its_time_left(spec, db_url, monkeypatch):
    from datetime import datetime, timedelta, timezone

    import dare_bench.store.api as api

    store = Store(db_url)
    cfg = spec.resolve("micro", ["train.steps=50"])
    steps = cfg.profile.train.steps
    waiting = store.start_run(cfg, seed=1)  # no step logged yet (its base, or its first rollouts)
    run = store.start_run(cfg, seed=0)
    start = datetime.now(timezone.utc) - timedelta(minutes=10)
    # a resumed run: steps 1-2 before a long pause, then 3-8 at 10 s a step; the pace is read from the recent steps
    times = {1: start, 2: start + timedelta(seconds=10)}
    times.update({k: start + timedelta(minutes=5, seconds=10 * (k - 3)) for k in range(3, 9)})
    for step, when in times.items():
        monkeypatch.setattr(api, "utcnow", lambda when=when: when)
        store.log_metrics(run, step, {"loss": 1.0})
    rows = {r["id"]: r for r in json.loads(runner.invoke(app, ["runs", "--json", "--db", db_url]).output)}
    progress = rows[run]["progress"]
    assert progress["step"] == 8 and progress["total"] == steps
    assert progress["seconds_per_step"] == pytest.approx(10.0)
    assert progress["eta_seconds"] == pytest.approx(10.0 * (steps - 8))
    assert rows[waiting]["progress"]["step"] is None and rows[waiting]["progress"]["seconds_per_step"] is None
    live = runner.invoke(app, ["runs", "--db", db_url]).output
    # 42 steps at 10 s from the last log (step 8, 4 min 10 s ago): about 3 min from now
    assert "step 8/50, logged 4 min ago" in live and "~3 min left" in live
    monkeypatch.setattr(api, "utcnow", lambda: start + timedelta(minutes=5, seconds=60))
    store.log_metrics(run, 49, {"loss": 1.0})  # 4 min ago, one step left at ~1 s a step: due long ago
    due = runner.invoke(app, ["runs", "--db", db_url]).output
    assert "step 49/50" in due and "its steps are due by now" in due and " left" not in due
    store.finish_run(run)
    finished = json.loads(runner.invoke(app, ["runs", "--json", "--db", db_url]).output)
    assert "progress" not in next(r for r in finished if r["id"] == run)
    table = runner.invoke(app, ["runs", "--db", db_url]).output
    assert "no step logged yet" in table


def test_a_compute_matched_control_shows_its_step_without_a_total(spec, db_url):
    # a control stops at its RL run's FLOPs, so its `train.steps` is only a cap: no total, no time left
    store = Store(db_url)
    cfg = spec.resolve("micro", ["train.kind=sft", "train.compute_budget_flops=1e12", "train.steps=500"])
    run = store.start_run(cfg, seed=0)
    store.log_metrics(run, 10, {"loss": 1.0})
    store.log_metrics(run, 20, {"loss": 0.9})
    progress = json.loads(runner.invoke(app, ["runs", "--json", "--db", db_url]).output)[0]["progress"]
    assert progress["step"] == 20 and progress["total"] is None and progress["eta_seconds"] is None
    assert progress["seconds_per_step"] is not None
    assert "step 20, logged" in runner.invoke(app, ["runs", "--db", db_url]).output
