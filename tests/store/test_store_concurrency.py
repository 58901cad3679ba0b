"""Several processes writing one SQLite file at once lose nothing; a killed writer leaves nothing finished."""

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap

from dare_bench.store import Store

WRITERS = 4
RUNS_PER_WRITER = 3
STEPS = 10


def _writer(url: str, spec_dict: dict, worker: int) -> None:
    from dare_bench.config import ReproductionSpec
    from dare_bench.store import EvaluationRecord, SampleRecord, Store

    spec = ReproductionSpec.model_validate(spec_dict)
    store = Store(url)  # all writers also race to create + migrate the new database
    for r in range(RUNS_PER_WRITER):
        run_id = store.start_run(spec.resolve("micro"), seed=worker * 100 + r, code_version="test", packages={},
                                 hardware={})
        for step in range(STEPS):
            store.log_metrics(run_id, step, {"loss": float(step), "reward_mean": 0.1 * worker})
        ev = EvaluationRecord(task="sudoku", split="test", data_fingerprint="fp", metrics={"accuracy": 0.5},
                              primary_metric="accuracy",
                              samples=[SampleRecord(idx=i, completion="x", score=1.0) for i in range(5)])
        store.finish_run(run_id, [ev])
    store.close()


def test_four_writer_processes_lose_nothing(tmp_path, spec):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    # fork: the children reuse the parent's imports (spawning 4 fresh interpreters costs seconds on 2 cores);
    # each child opens its own engine, nothing database-related exists in the parent before the fork.
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(url, spec.model_dump(mode="json"), w)) for w in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * WRITERS
    store = Store(url)
    runs = store.latest_runs(limit=None)
    assert len(runs) == WRITERS * RUNS_PER_WRITER
    assert {r["status"] for r in runs} == {"finished"}
    assert sorted(r["seed"] for r in runs) == sorted(w * 100 + r for w in range(WRITERS)
                                                     for r in range(RUNS_PER_WRITER))
    for r in runs:
        assert len(store.metrics(r["id"])) == STEPS
        (ev,) = r["evaluations"]
        assert len(store.samples(ev["id"])) == 5


def test_killed_process_leaves_no_finished_run(tmp_path, spec):
    url = f"sqlite:///{tmp_path / 'killed.db'}"
    script = textwrap.dedent(f"""
        import json, os, signal, sys
        from dare_bench.config import ReproductionSpec
        from dare_bench.store import Store
        from dare_bench.store.models import Evaluation, Run
        from dare_bench.store.records import utcnow
        spec = ReproductionSpec.model_validate(json.loads(sys.stdin.read()))
        store = Store({url!r})
        run_id = store.start_run(spec.resolve("micro"), seed=0)
        store.log_metrics(run_id, 0, {{"loss": 1.0}})
        with store._tx() as s:  # the same writes finish_run makes, then die before the commit
            run = s.get(Run, run_id)
            s.add(Evaluation(run_id=run_id, task="sudoku", split="test", data_fingerprint="fp", metrics_json="{{}}",
                             primary_metric="accuracy", primary_value=1.0, n_items=0, sampler_json="{{}}",
                             created_at=utcnow()))
            run.status = "finished"
            s.flush()
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    import json

    proc = subprocess.run([sys.executable, "-c", script], input=json.dumps(spec.model_dump(mode="json")),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    store = Store(url)
    (run,) = store.latest_runs()
    assert run["status"] == "running" and run["evaluations"] == []
    assert len(store.metrics(run["id"])) == 1
    assert os.path.exists(tmp_path / "killed.db")


def test_readers_do_not_wait_for_a_writer(tmp_path, spec):
    import time

    from sqlalchemy import text

    store = Store(f"sqlite:///{tmp_path / 'rw.db'}")
    run_id = store.start_run(spec.resolve("micro"), seed=0, code_version="t", packages={}, hardware={})
    other = Store(store.url)
    with store.engine.begin() as conn:  # a writer holds the write lock ...
        conn.execute(text("UPDATE runs SET seed = 5"))
        t0 = time.monotonic()
        assert other.get_run(run_id)["seed"] == 0  # ... a reader still sees the last committed state at once
        assert time.monotonic() - t0 < 5
    assert other.get_run(run_id)["seed"] == 5
