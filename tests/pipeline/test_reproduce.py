"""`dare-bench reproduce` end to end at micro scale, and its bad-input paths."""

import dataclasses
import json
import shutil

import pytest
from typer.testing import CliRunner

from dare_bench.cli import app

from testpaths import DARE_DATA, PARITY


def _run(*args):
    return CliRunner().invoke(app, list(args))


def _json_tail(output: str) -> dict:
    return json.loads(output.strip().splitlines()[-1])


@pytest.fixture
def db(tmp_path):
    return f"sqlite:///{tmp_path / 'runs.db'}"


def test_sft_then_d1_micro_share_the_base_and_land_in_the_store(db):
    from dare_bench.store import Store

    sft = _run("reproduce", "sft-llada-sudoku", "--scale", "micro", "--db", db, "--json")
    assert sft.exit_code == 0, sft.output
    out = _json_tail(sft.output)
    assert out["status"] == "finished" and out["scale"] == "micro" and out["name"] == "sft-llada-sudoku"
    assert {"accuracy", "mean_reward"} <= set(out["metrics"]) and "accuracy" in out["base_metrics"]
    assert set(out) >= {"run_id", "name", "scale", "status", "base_metrics", "metrics", "wall_seconds", "db"}

    d1 = _run("reproduce", "d1-llada-sudoku", "--scale", "micro", "--db", db, "--json")
    assert d1.exit_code == 0, d1.output
    res = _json_tail(d1.output)
    assert "cached SFT base" in d1.output  # both algorithms start from the same weights
    assert res["base_metrics"]["accuracy"] == out["base_metrics"]["accuracy"]

    store = Store(db)
    run = store.get_run(res["run_id"])
    assert run["status"] == "finished" and run["reproduction"] == "d1-llada-sudoku" and not run["modified"]
    curve = store.metrics(res["run_id"])
    assert len(curve) == 3 and all(m["reward_mean"] is not None for m in curve)
    evals = {e["checkpoint"]: e for e in store.evaluations(res["run_id"])}
    assert set(evals) == {"base", "final"}
    assert len(store.samples(evals["final"]["id"])) == evals["final"]["n_items"] == 16

    again = _run("reproduce", "d1-llada-sudoku", "--scale", "micro", "--db", db, "--json")
    assert _json_tail(again.output)["status"] == "skipped"

    # train.eval_every: the final evaluation's settings on the policy mid-training, logged with the step's metrics
    mid = _run("reproduce", "d1-llada-sudoku", "train.eval_every=2", "--scale", "micro", "--db", db, "--json")
    assert mid.exit_code == 0, mid.output
    mid_id = _json_tail(mid.output)["run_id"]
    evaluated = [m for m in store.metrics(mid_id) if "eval_accuracy" in m["extra"]]
    assert [m["step"] for m in evaluated] == [2] and 0 <= evaluated[0]["extra"]["eval_score"] <= 1
    evals = {e["checkpoint"]: e for e in store.evaluations(mid_id)}
    assert set(evals) == {"base", "step-2", "final"} and evals["step-2"]["step"] == 2
    assert evals["step-2"]["metrics"]["accuracy"] == evaluated[0]["extra"]["eval_accuracy"]


@pytest.mark.integration
def test_overrides_mark_the_run_modified(db):
    from dare_bench.store import Store

    r = _run("reproduce", "baseline-llada-sudoku", "eval.limit=4", "--scale", "micro", "--db", db, "--json")
    assert r.exit_code == 0, r.output
    out = _json_tail(r.output)
    assert out["modified"] is True and out["metrics"]["n"] == 4
    assert Store(db).get_run(out["run_id"])["modified"] is True


@pytest.mark.integration
def test_failed_run_is_marked_failed(db, monkeypatch):
    from dare_bench import pipeline
    from dare_bench.store import Store

    def boom(*a, **k):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(pipeline.evaluation, "evaluate_model", boom)  # the stage module that evaluates
    with pytest.raises(RuntimeError):
        pipeline.reproduce("baseline-llada-sudoku", "micro", db=db, progress=False, log=lambda m: None)
    runs = Store(db).latest_runs(reproduction="baseline-llada-sudoku")
    assert runs and runs[0]["status"] == "failed" and "injected failure" in runs[0]["error"]


@pytest.mark.parametrize("args, message", [
    (["reproduce", "d1-llada-sudokku", "--scale", "micro"], "did you mean"),
    (["reproduce", "d1-llada-sudoku", "--scale", "micro", "train.lrr=1"], "train.lr"),
    (["reproduce", "d1-llada-sudoku", "--scale", "huge"], "scale"),
    (["reproduce", "d1-llada-sudoku", "--scale", "paper"], "checkpoint"),
    # DARE's code RL sets are not in the fixtures: planning names the first missing one
    (["reproduce", "d1-llada-humaneval", "--scale", "paper"], "train.data entry 'lcbv5-K8': no file at"),
    # the plug-in's own cross-field check runs at plan time, in a dry run too
    (["reproduce", "coupled-grpo-llada-sudoku", "train.algorithm.pairs=2", "--scale", "micro"], "pairs=2"),
    (["reproduce", "coupled-grpo-llada-sudoku", "train.algorithm.pairs=2", "--scale", "micro", "--dry-run"],
     "pairs=2"),
])
def test_bad_input_fails_before_any_work(args, message, db, tmp_path):
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "dare_bench.cli", *args, "--db", db], capture_output=True, text=True,
                         env={**__import__("os").environ, "DARE_BENCH_HOME": str(tmp_path / "home"),
                              "DARE_BENCH_DATA": str(DARE_DATA)})
    assert res.returncode != 0
    assert message in res.stderr
    assert not (tmp_path / "runs.db").exists()  # config errors write nothing, not even an empty store


def test_checkpoint_of_another_backbone_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("DARE_BENCH_DATA", str(DARE_DATA))
    src = PARITY / "dream"
    shutil.copy(src / "config.json", tmp_path / "config.json")
    r = _run("reproduce", "bgpo-llada-sudoku", "--scale", "paper", "--checkpoint", str(tmp_path), "--dry-run")
    assert r.exit_code != 0
    assert "dream checkpoint" in str(r.exception) or "dream checkpoint" in r.output


def test_paper_dry_run_plans_from_the_shipped_config(monkeypatch):
    monkeypatch.setenv("DARE_BENCH_DATA", str(DARE_DATA))
    r = _run("reproduce", "bgpo-llada-sudoku", "--scale", "paper", "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    plan = _json_tail(r.output)["plan"]
    assert abs(plan["parameters"] - 8.02e9) / 8.02e9 < 0.01
    assert plan["command"].startswith("torchrun")
    assert plan["memory_gib"]["weights_bf16"] > 14
    assert [(d["entry"], d["source"]) for d in plan["data"]] == [
        ("sudoku-n20000", str((DARE_DATA / "rl" / "train" / "sudoku-n20000_1.parquet").resolve()))]


@pytest.mark.integration
def test_resume_after_interruption_ends_like_an_uninterrupted_run(db, monkeypatch):
    """An RL run interrupted after its first checkpoint resumes from it (--resume) and ends with the same metrics
    as an uninterrupted run under the same seed. (The loop's own SIGKILL test is tests/trainers.)"""
    from dare_bench import pipeline
    from dare_bench.store import Store
    from dare_bench.trainers import loop

    args = ("d1-llada-sudoku", "micro")
    kw = dict(db=db, progress=False, log=lambda m: None, overrides=["train.checkpoint_every=1"])
    full = pipeline.reproduce(*args, **kw)

    real_train = loop.train_rl

    def interrupted(*a, **k):
        real_train(*a, **{**k, "options": dataclasses.replace(k["options"], stop_after=1)})
        raise KeyboardInterrupt("killed after the first checkpoint")

    monkeypatch.setattr(loop, "train_rl", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pipeline.reproduce(*args, force=True, **kw)
    seen = {}

    def recording(*a, **k):
        out = real_train(*a, **k)
        seen["resumed_from"] = out.resumed_from
        return out

    monkeypatch.setattr(loop, "train_rl", recording)
    resumed = pipeline.reproduce(*args, force=True, resume=True, **kw)
    assert seen["resumed_from"] == 1

    assert resumed.status == "finished"
    assert resumed.metrics["mean_reward"] == full.metrics["mean_reward"]
    assert resumed.reward_curve == full.reward_curve
    runs = Store(db).latest_runs(reproduction="d1-llada-sudoku")
    assert [r["status"] for r in runs[:3]] == ["finished", "failed", "finished"]
    assert len(Store(db).metrics(resumed.run_id)) == len(full.reward_curve)


@pytest.mark.integration
def test_lora_run_saves_peft_adapters_the_evaluator_loads(db):
    r = _run("reproduce", "lora-llada-sudoku", "--scale", "micro", "--db", db, "--json")
    assert r.exit_code == 0, r.output
    out = _json_tail(r.output)
    from pathlib import Path

    final = Path(out["final_model"])
    assert (final / "adapter_config.json").exists() and (final / "adapter_model.safetensors").exists()
    assert not (final / "model.safetensors").exists()  # adapters only, in PEFT format
    ev = _run("eval", "--model", str(final), "--task", "sudoku", "--preset", "micro", "--limit", "4", "--json")
    assert ev.exit_code == 0, ev.output
    assert _json_tail(ev.output)["metrics"]["n"] == 4


def test_vrpo_refuses_preference_data_it_cannot_build(tmp_path):
    """VRPO's paper recipe names UltraFeedback, which the pipeline cannot build yet: refused before any work."""
    db = f"sqlite:///{tmp_path / 'r.db'}"
    r = _run("reproduce", "vrpo-llada-sudoku", "--scale", "paper", "--dry-run", "--db", db)
    assert r.exit_code != 0 and "preference_data" in str(r.exception or r.output)
    assert not (tmp_path / "r.db").exists()
