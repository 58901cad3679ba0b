"""`dare-bench check` against the store (no --run): synthetic runs of a real reproduction config, so no training.

Covers the exit codes of the issue: 0 on an unchanged run and on seed noise, 1 on a tampered score beyond the
tolerance, 2 on a config-hash mismatch, a missing run or bad input; and the JSON / JUnit reports.
"""

import json
import shutil
import xml.etree.ElementTree as ET

import pytest
from check_fakes import NAME, add_run, config, write_baseline
from typer.testing import CliRunner

from dare_bench.cli import app


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A baseline directory holding a baseline of 3 synthetic seeds (written once per module)."""
    root = tmp_path_factory.mktemp("recorded")
    write_baseline(f"sqlite:///{root / 'record.db'}", root / "baselines")
    return root / "baselines"


@pytest.fixture
def setup(tmp_path, recorded):
    """(check db url, baseline dir): a private copy of the recorded baselines; the check store starts empty."""
    directory = tmp_path / "baselines"
    shutil.copytree(recorded, directory)
    return f"sqlite:///{tmp_path / 'check.db'}", directory


def _check(db, directory, *args):
    result = CliRunner().invoke(app, ["check", "--db", db, "--baselines", str(directory), *args])
    return result


def _report(db, directory, *args):
    result = _check(db, directory, "--json", *args)
    return result, json.loads(result.stdout)


def _tamper(db: str, run_id: int, metric: str, value: float) -> None:
    """Overwrite one stored final metric, as a changed grader would have written it."""
    from sqlalchemy import select

    from dare_bench.store import Store
    from dare_bench.store.models import Evaluation

    store = Store(db)
    with store._tx() as s:
        ev = s.scalars(select(Evaluation).where(Evaluation.run_id == run_id, Evaluation.checkpoint == "final")).one()
        metrics = json.loads(ev.metrics_json)
        metrics[metric] = value
        ev.metrics_json = json.dumps(metrics)
    store.close()


def test_a_new_seed_of_the_same_code_passes(setup):
    db, directory = setup
    run_id = add_run(db, seed=7)  # not a recorded seed: seed-to-seed noise must pass
    result, report = _report(db, directory)
    assert result.exit_code == 0, result.output
    (entry,) = report["reproductions"]
    assert entry["name"] == NAME and entry["run_id"] == run_id and entry["status"] == "pass"
    names = {c["name"] for c in entry["checks"]}
    assert {"final/accuracy", "final/score", "final/mean_reward", "base/score", "curve/reward_mean/mean",
            "curve/reward_mean/sign", "curve/loss/mean"} <= names
    assert all(c["tolerance"] > 0 for c in entry["checks"] if c["tolerance"] is not None)
    assert report["tests"] == len(entry["checks"])


def test_the_table_names_every_check_and_the_verdict(setup):
    db, directory = setup
    add_run(db, seed=7)
    result = _check(db, directory)
    assert result.exit_code == 0, result.output
    assert "final/score" in result.stdout and "curve/loss/mean" in result.stdout
    assert result.stdout.strip().splitlines()[-1].startswith("PASS")


def test_a_tampered_score_beyond_the_tolerance_fails_and_within_it_passes(setup):
    db, directory = setup
    run_id = add_run(db, seed=0)  # identical to the recorded seed 0
    _, report = _report(db, directory)
    score = next(c for c in report["reproductions"][0]["checks"] if c["name"] == "final/score")
    assert report["exit_code"] == 0 and score["status"] == "pass"

    _tamper(db, run_id, "score", score["baseline"] - 0.5 * score["tolerance"])
    result, report = _report(db, directory)
    assert result.exit_code == 0, result.output

    _tamper(db, run_id, "score", score["baseline"] - 1.5 * score["tolerance"])
    result, report = _report(db, directory)
    assert result.exit_code == 1
    entry = report["reproductions"][0]
    failed = [c["name"] for c in entry["checks"] if c["status"] == "fail"]
    assert failed == ["final/score"] and entry["status"] == "fail" and "final/score" in entry["message"]


def test_a_shifted_reward_curve_fails_on_its_mean_residual(setup):
    db, directory = setup
    add_run(db, seed=0, reward_shift=-0.3)
    result, report = _report(db, directory)
    assert result.exit_code == 1
    failed = {c["name"] for c in report["reproductions"][0]["checks"] if c["status"] == "fail"}
    assert failed == {"curve/reward_mean/mean"}


def test_changed_evaluation_items_fail(setup):
    db, directory = setup
    add_run(db, seed=0, fingerprint="sha256:other-items")
    result, report = _report(db, directory)
    assert result.exit_code == 1
    final = next(c for c in report["reproductions"][0]["checks"] if c["name"] == "final/accuracy")
    assert final["status"] == "fail" and "fingerprint" in final["detail"]


def test_a_config_hash_mismatch_exits_2(setup):
    db, directory = setup
    add_run(db, seed=0)
    path = directory / f"{NAME}.micro.json"
    doc = json.loads(path.read_text())
    doc["config_hash"] = "0" * 64  # recorded for another config
    path.write_text(json.dumps(doc))
    result, report = _report(db, directory)
    assert result.exit_code == 2
    entry = report["reproductions"][0]
    assert entry["status"] == "error" and entry["message"].startswith("config hash mismatch")
    assert entry["checks"] == []


def test_only_runs_of_another_config_in_the_store_exit_2(setup):
    db, directory = setup
    add_run(db, seed=0, cfg=config(overrides=["train.lr=1e-3"]))
    result, report = _report(db, directory)
    assert result.exit_code == 2
    assert "config hash mismatch" in report["reproductions"][0]["message"]


def test_a_missing_run_exits_2_and_is_never_a_pass(setup):
    db, directory = setup
    result = _check(db, directory)
    assert result.exit_code == 2
    assert "missing run" in result.stdout and "PASS" not in result.stdout


def test_a_regression_wins_over_an_unchecked_reproduction(tmp_path, setup):
    db, directory = setup
    write_baseline(f"sqlite:///{tmp_path / 'record2.db'}", directory, cfg=config("sft-llada-sudoku"))
    add_run(db, seed=0, reward_shift=-0.3)  # d1 regresses; sft has no run
    result, report = _report(db, directory)
    assert result.exit_code == 1
    assert {e["name"]: e["status"] for e in report["reproductions"]} == {NAME: "fail", "sft-llada-sudoku": "error"}


def test_junit_report(tmp_path, setup):
    db, directory = setup
    add_run(db, seed=0, reward_shift=-0.3)
    out = tmp_path / "reports" / "check.xml"
    result = _check(db, directory, "--junit", str(out))
    assert result.exit_code == 1
    root = ET.parse(out).getroot()
    (suite,) = root.findall("testsuite")
    cases = suite.findall("testcase")
    assert int(suite.get("tests")) == len(cases) and int(suite.get("failures")) == 1
    failed = [c.get("name") for c in cases if c.find("failure") is not None]
    assert failed == ["curve/reward_mean/mean"]


@pytest.mark.parametrize("args, message", [
    (["no-such-reproduction"], "unknown reproduction"),
    (["sft-llada-sudoku"], "no baseline"),
    (["--alpha", "2"], "--alpha"),
    (["--scale", "tiny"], "no baselines at scale 'tiny'"),
])
def test_bad_input_is_one_error_with_exit_2(setup, args, message):
    db, directory = setup
    result = CliRunner().invoke(app, ["check", "--db", db, "--baselines", str(directory), *args])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and message in result.stderr and result.stdout == ""


def test_a_corrupt_baseline_is_one_error(setup):
    db, directory = setup
    (directory / f"{NAME}.micro.json").write_text("{not json")
    result = _check(db, directory)
    assert result.exit_code == 2 and "not valid JSON" in result.stderr


def test_record_needs_names_and_two_seeds(setup):
    db, directory = setup
    for args, message in [(["--record"], "--record needs"), (["--record", NAME, "--seeds", "1"], "--seeds")]:
        result = _check(db, directory, *args)
        assert result.exit_code == 2 and message in result.stderr


def test_another_recording_environment_is_reported_never_failed(setup):
    db, directory = setup
    add_run(db, seed=7)
    path = directory / f"{NAME}.micro.json"
    doc = json.loads(path.read_text())
    assert doc["packages"].get("torch")
    doc["packages"]["torch"] = "0.0-recorded-elsewhere"
    path.write_text(json.dumps(doc))
    result, report = _report(db, directory)
    assert result.exit_code == 0, result.output
    (entry,) = report["reproductions"]
    from dare_bench.store import environment

    assert entry["environment_changes"]["torch"] == ["0.0-recorded-elsewhere",
                                                     environment.package_versions()["torch"]]


def test_another_cpu_generation_or_isa_is_reported(setup):
    # a base's bits depend on the kernels' ISA: a recording made on another CPU generation says so
    import torch  # noqa: F401  (the record's ISA is read from an imported torch)

    from dare_bench.store import environment

    db, directory = setup
    add_run(db, seed=7)
    path = directory / f"{NAME}.micro.json"
    doc = json.loads(path.read_text())
    elsewhere = {"cpu_id": "OtherVendor family 0 model 0 stepping 0", "cpu_isa": "OTHER-ISA"}  # no real CPU's
    doc["hardware"] = {**(doc.get("hardware") or {}), **elsewhere}
    path.write_text(json.dumps(doc))
    result, report = _report(db, directory)
    assert result.exit_code == 0, result.output
    changes = report["reproductions"][0]["environment_changes"]
    now = environment.hardware()
    assert changes["cpu_id"] == [elsewhere["cpu_id"], now["cpu_id"]]
    assert changes["cpu_isa"] == [elsewhere["cpu_isa"], now["cpu_isa"]]


def test_a_run_on_another_base_is_reported_as_compared_across_bases(setup):
    db, directory = setup
    add_run(db, seed=7)
    result, report = _report(db, directory)
    assert report["reproductions"][0]["base"]["group"] == "same"
    add_run(db, seed=8, base_sha="c" * 64)  # another machine's numerics built other base weights
    result, report = _report(db, directory)
    (entry,) = report["reproductions"]
    assert entry["base"] == {"group": "other", "baseline": ["b" * 64], "current": "c" * 64}
    table = _check(db, directory).stdout
    assert "started from another base (weights cccccccccccc; the baseline's bbbbbbbbbbbb)" in table


def test_re_recording_keeps_the_overrides_the_baseline_pins(setup, monkeypatch):
    from dare_bench.check import baseline as bl

    db, directory = setup
    path = directory / f"{NAME}.micro.json"
    doc = json.loads(path.read_text())
    doc["overrides"] = ["base.start_step=160"]
    path.write_text(json.dumps(doc))
    calls = []

    def fake_record(name, scale, seeds, *, db, log, overrides):
        calls.append((name, scale, seeds, overrides))
        return {**doc, "recorded_at": "again"}

    monkeypatch.setattr(bl, "record", fake_record)
    result = _check(db, directory, "--record", NAME)
    assert result.exit_code == 0, result.output
    assert calls == [(NAME, "micro", [0, 1, 2], doc["overrides"])]
    assert json.loads(path.read_text())["recorded_at"] == "again"
    result = _check(db, directory, "--record", NAME, "-o", "base.start_step=80", "--seeds", "2")
    assert result.exit_code == 0, result.output
    assert calls[-1] == (NAME, "micro", [0, 1], ["base.start_step=80"])
