"""Store repository API: run lifecycle, metrics, evaluations with samples, reported-score sync, failure paths."""

from pathlib import Path

import pytest

from dare_bench.errors import StoreError
from dare_bench.store import EvaluationRecord, SampleRecord, Store


def _evaluation(value: float = 0.25, n: int = 4) -> EvaluationRecord:
    samples = [SampleRecord(idx=i, completion=f"c{i}", reference="r", score=float(i < n * value), correct=i < n * value)
               for i in range(n)]
    return EvaluationRecord(task="sudoku", split="test", data_fingerprint="sha256:abc", sampler_preset="tiny-sudoku",
                            sampler={"gen_length": 16}, metrics={"accuracy": value, "reward": 0.5},
                            primary_metric="accuracy", samples=samples)


def test_run_lifecycle_records_everything(spec, db_url):
    cfg = spec.resolve("micro", ["train.lr=1e-5"])
    store = Store(db_url)
    run_id = store.start_run(cfg, seed=3)
    store.log_metrics(run_id, 0, {"reward_mean": 0.5, "reward_std": 0.1, "loss": 1.5, "kl": 0.0, "entropy": 2.0,
                                  "tokens_per_forward": 1.0, "peak_memory_mb": 100,
                                  "stage_seconds": {"rollout": 1.0, "update": 0.2}, "grad_norm": 0.7})
    store.log_metrics(run_id, 1, {"loss": float("nan")})
    store.log_metrics(run_id, 1, {"loss": 1.0})  # resume re-logs a step: replaced, not duplicated
    assert store.get_run(run_id)["status"] == "running"
    store.finish_run(run_id, [_evaluation()])

    run = store.get_run(run_id)
    assert run["status"] == "finished" and run["seed"] == 3 and run["modified"] is True
    assert run["config_hash"] == cfg.content_hash and run["overrides"] == ["train.lr=1e-5"]
    assert run["config"]["profile"]["train"]["lr"] == 1e-5
    assert run["code_version"] and "python" in run["packages"] and run["hardware"]["cpu_count"] >= 1
    assert run["duration_s"] is not None and run["duration_s"] >= 0
    metrics = store.metrics(run_id)
    assert [m["step"] for m in metrics] == [0, 1]
    assert metrics[0]["stage_seconds"] == {"rollout": 1.0, "update": 0.2}
    assert metrics[0]["extra"] == {"grad_norm": 0.7} and metrics[1]["loss"] == 1.0
    (ev,) = store.evaluations(run_id)
    assert ev["value"] == 0.25 and ev["sampler_preset"] == "tiny-sudoku" and ev["n_items"] == 4
    samples = store.samples(ev["id"])
    assert [s["correct"] for s in samples] == [True, False, False, False]
    latest = store.latest_runs(reproduction="d1-llada-sudoku")
    assert latest[0]["id"] == run_id and latest[0]["evaluations"][0]["value"] == 0.25


def test_context_manager_fails_run_on_exception(spec, db_url):
    store = Store(db_url)
    with pytest.raises(RuntimeError):
        with store.run(spec.resolve("micro"), seed=0) as run_id:
            store.log_metrics(run_id, 0, {"loss": 1.0})
            raise RuntimeError("boom")
    run = store.get_run(run_id)
    assert run["status"] == "failed" and "boom" in run["error"]
    with store.run(spec.resolve("micro"), seed=0) as run_id2:
        pass  # forgot finish_run
    assert store.get_run(run_id2)["status"] == "failed"
    with pytest.raises(StoreError, match="not running"):
        store.log_metrics(run_id, 1, {"loss": 1.0})


def test_finish_is_atomic_with_its_evaluations(spec, db_url):
    store = Store(db_url)
    run_id = store.start_run(spec.resolve("micro"), seed=0)
    bad = _evaluation().model_dump()
    bad["samples"][1]["idx"] = 0  # a duplicate sample index is refused before any write
    with pytest.raises(StoreError):
        store.finish_run(run_id, [_evaluation(), bad])
    assert store.get_run(run_id)["status"] == "running" and store.evaluations(run_id) == []
    # a failure inside the transaction (duplicate evaluation uid) rolls back the status change too
    first = _evaluation()
    store.add_evaluation(run_id, first)
    with pytest.raises(StoreError, match="database write failed"):
        store.finish_run(run_id, [first])
    assert store.get_run(run_id)["status"] == "running" and len(store.evaluations(run_id)) == 1


def test_bad_metrics_are_refused(spec, db_url):
    store = Store(db_url)
    run_id = store.start_run(spec.resolve("micro"), seed=0)
    with pytest.raises(StoreError, match="must be a number"):
        store.log_metrics(run_id, 0, {"loss": "high"})
    with pytest.raises(StoreError, match="no run"):
        store.log_metrics(999, 0, {"loss": 1.0})
    assert store.metrics(run_id) == []


def test_sync_reported_replaces_rows(spec, db_url):
    from dare_bench.config import ReportedScore

    spec.reported.append(ReportedScore.model_validate({
        "value": 42.6, "metric": "accuracy", "table": "t1",
        "source": {"kind": "repo", "ref": "yjyddq/DARE", "file": "README.md"}}))
    store = Store(db_url)
    assert store.sync_reported([spec]) == 1
    assert store.sync_reported([spec]) == 1
    (row,) = store.reported("d1-llada-sudoku")
    assert row["value"] == 42.6 and row["source"]["file"] == "README.md" and row["table"] == "t1"


def test_orphaned_running_run_is_marked_failed(spec, db_url):
    import subprocess
    import sys

    store = Store(db_url)
    run_id = store.start_run(spec.resolve("micro"), seed=0)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    with store._tx() as s:  # pretend the run belongs to a process that has exited
        from dare_bench.store.models import Run

        s.get(Run, run_id).pid = int(dead.stdout)
    assert store.mark_orphans_failed() == 1
    assert store.get_run(run_id)["status"] == "failed"


def test_the_hardware_record_names_the_cpu_generation_and_the_kernel_isa():
    # "AMD EPYC" alone hid that two machines of one name trained different tiny bases: the record keeps what does
    import torch

    from dare_bench.store import environment

    record = environment.hardware()
    assert record["cpu_isa"] == torch.backends.cpu.get_cpu_capability()
    assert record["cpu_id"] and record["cpu_id"] != "unknown"
    if Path("/proc/cpuinfo").exists() and "vendor_id" in Path("/proc/cpuinfo").read_text():
        assert " family " in record["cpu_id"] and " model " in record["cpu_id"]
