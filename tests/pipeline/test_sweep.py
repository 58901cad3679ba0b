"""`dare-bench sweep`: a micro grid on 2 workers into one SQLite store, finished cells skipped on a rerun, a killed
cell failed while the others finish and resumed by the next sweep, bad input, --json, --dry-run (writes nothing),
and the submitit executor (its local cluster runs a cell; Slurm flags reach the sbatch script).

The tests share one DARE_BENCH_HOME, so the micro LLaDA-Sudoku base is trained once for the module.

    OMP_NUM_THREADS=1 pytest tests/pipeline/test_sweep.py -q
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections import deque
from pathlib import Path

import pytest

from dare_bench.cli import main
from dare_bench.pipeline import sweep
from dare_bench.store import Store

GRID = ["baseline-llada-sudoku", "d1-llada-sudoku"]  # the two cheapest kinds: an evaluation, an RL run


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sweep")


@pytest.fixture
def home(shared, monkeypatch) -> Path:
    monkeypatch.setenv("DARE_BENCH_HOME", str(shared / "home"))
    return shared / "home"


def run_cli(capsys, monkeypatch, *args: str) -> tuple[int, str, str]:
    """`dare-bench sweep ARGS` in this process (the workers are still separate processes): exit code, out, err."""
    monkeypatch.setattr(sys, "argv", ["dare-bench", "sweep", *args])
    capsys.readouterr()
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


def payload(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def by_name(cells: list[dict]) -> dict[str, dict]:
    return {c["name"]: c for c in cells}


# ------------------------------------------------------------------------------------------------ bad input

@pytest.mark.parametrize("args, says", [
    (["zzz-*-sudoku", "--scale", "micro"], "matches no reproduction"),
    (["d1-llada-sudokku", "--scale", "micro"], "did you mean"),
    (["--backbone", "lladda", "--scale", "micro"], "unknown backbone"),
    (["d1-llada-sudoku", "--task", "countdown", "--scale", "micro"], "selects no reproduction"),
    (["d1-llada-sudoku", "--scale", "micro", "--jobs", "0"], "--jobs must be at least 1"),
    (["d1-llada-sudoku", "--scale", "micro", "--seeds", "a,b"], "--seeds expects integers"),
    (["d1-llada-sudoku", "--scale", "micro", "--slurm-partition", "gpu"], "only apply with --executor submitit"),
])
def test_bad_input_is_one_line_and_exit_2(args, says, tmp_path, capsys, monkeypatch):
    db = tmp_path / "runs.db"
    code, out, err = run_cli(capsys, monkeypatch, *args, "--db", str(db))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], err
    assert not db.exists()


def test_selection_globs_filters_and_comma_lists():
    names = [s.name for s in sweep.select_entries(["*-llada-sudoku"], algorithm=["sft,d1"])]
    assert names == ["d1-llada-sudoku", "sft-llada-sudoku"]
    both = sweep.select_entries(None, backbone=["llada", "dream"], algorithm="d1", task="sudoku")
    assert [s.name for s in both] == ["d1-dream-sudoku", "d1-llada-sudoku"]
    assert sweep.parse_seeds("2,0,2") == [2, 0]


# ------------------------------------------------------------------------------------------------ dry run

def test_dry_run_plans_every_cell_and_writes_nothing(tmp_path, capsys, monkeypatch):
    home = tmp_path / "fresh-home"
    monkeypatch.setenv("DARE_BENCH_HOME", str(home))
    db = tmp_path / "runs.db"
    code, out, _ = run_cli(capsys, monkeypatch, "sft-llada-sudoku", "d1-llada-gsm8k", "--scale", "micro",
                           "--seeds", "0,1", "--dry-run", "--json", "--db", str(db))
    assert code == 0
    got = payload(out)
    cells = got["cells"]
    assert [(c["name"], c["seed"], c["status"]) for c in cells] == [
        ("sft-llada-sudoku", 0, "dry-run"), ("sft-llada-sudoku", 1, "dry-run"),
        ("d1-llada-gsm8k", None, "not-runnable")]
    for c in cells[:2]:  # each cell's `reproduce --dry-run` plan
        assert c["action"] == "run" and c["plan"]["config"]["content_hash"] == c["config_hash"]
        assert c["plan"]["model_preset"] == "tiny-llada"
    # gsm8k has no micro scale: the registry's reason, naming the CPU stand-in, not a failure
    assert cells[2]["message"].startswith("no such scale:") and "arith" in cells[2]["message"]
    assert got["summary"]["status"] == {"dry-run": 2, "not-runnable": 1} and got["summary"]["failed"] == 0
    assert not db.exists() and not home.exists()


# ------------------------------------------------------------------------------------------------ the grid

@pytest.mark.integration
def test_two_workers_fill_one_store_and_a_rerun_skips_every_cell(home, shared, capsys, monkeypatch):
    db = shared / "grid.db"
    code, out, err = run_cli(capsys, monkeypatch, *GRID, "--scale", "micro", "--jobs", "2", "--db", str(db),
                             "--json")
    assert code == 0, err
    got = payload(out)
    cells = by_name(got["cells"])
    assert set(cells) == set(GRID) and {c["status"] for c in cells.values()} == {"finished"}
    assert got["summary"]["status"] == {"finished": 2} and got["summary"]["failed"] == 0
    for c in cells.values():
        assert c["seed"] == 0 and c["metric"] == "accuracy" and c["base"] is not None and c["final"] is not None
        assert Path(c["log"]).exists()
    runs = Store(f"sqlite:///{db}").latest_runs(limit=None)
    assert sorted(r["reproduction"] for r in runs) == sorted(GRID) and {r["status"] for r in runs} == {"finished"}
    assert {r["hardware"]["torch_threads"] for r in runs} == {1}  # --threads 1 (the default) reached every worker
    assert {c["run_id"] for c in cells.values()} == {r["id"] for r in runs}
    assert len({r["pid"] for r in runs}) == 2 and os.getpid() not in {r["pid"] for r in runs}

    logs = {c["log"]: Path(c["log"]).stat().st_mtime_ns for c in cells.values()}
    code, out, _ = run_cli(capsys, monkeypatch, *GRID, "--scale", "micro", "--jobs", "2", "--db", str(db))
    assert code == 0
    assert {log: Path(log).stat().st_mtime_ns for log in logs} == logs  # decided here: no worker started
    rows = [line.split() for line in out.splitlines() if line.split()[:1] and line.split()[0] in GRID]
    assert [r[2] for r in rows] == ["skipped"] * 2 and "2 skipped of 2 cells" in out
    assert len(Store(f"sqlite:///{db}").latest_runs(limit=None)) == 2


@pytest.mark.integration
def test_controls_on_a_finished_grid_run_only_the_missing_controls(home, shared, capsys, monkeypatch):
    """`--controls` added to a grid whose RL runs finished: each RL cell runs just its control (the RL run is not
    repeated), the evaluation-only cell stays skipped; a rerun then skips every cell and still shows the control."""
    db = shared / "controls.db"
    code, _, err = run_cli(capsys, monkeypatch, *GRID, "--scale", "micro", "--jobs", "2", "--db", str(db))
    assert code == 0, err
    store = Store(f"sqlite:///{db}")
    rl_run = next(r for r in store.latest_runs(limit=None) if r["reproduction"] == "d1-llada-sudoku")

    # another sweep's live worker runs the control now (this process stands in for it): not started twice
    from dare_bench.pipeline import resolve

    other = store.start_run(resolve("sft-llada-sudoku", "micro", [])[1], seed=0, control_of=rl_run["uid"])
    code, out, _ = run_cli(capsys, monkeypatch, *GRID, "--scale", "micro", "--db", str(db), "--controls",
                           "--dry-run", "--json")
    cells = by_name(payload(out)["cells"])
    assert code == 0 and cells["d1-llada-sudoku"]["action"] == "skip"
    assert f"its control (run {other}" in cells["d1-llada-sudoku"]["message"]
    store.fail_run(other, "stood in for another sweep's worker")

    code, out, _ = run_cli(capsys, monkeypatch, *GRID, "--scale", "micro", "--db", str(db), "--controls",
                           "--dry-run")
    assert code == 0 and "dry-run:control" in out and "dry-run:skip" in out

    code, out, err = run_cli(capsys, monkeypatch, *GRID, "--scale", "micro", "--jobs", "2", "--db", str(db),
                             "--controls", "--json")
    assert code == 0, err
    cells = by_name(payload(out)["cells"])
    rl, ev = cells["d1-llada-sudoku"], cells["baseline-llada-sudoku"]
    assert (rl["action"], rl["status"], rl["run_id"]) == ("control", "finished", rl_run["id"])
    assert (ev["action"], ev["status"], ev["control"]) == ("skip", "skipped", None)
    runs = store.latest_runs(limit=None)
    controls = store.controls_of(rl_run["uid"])
    assert len(runs) == 4 and len(controls) == 1 and controls[0]["reproduction"] == "sft-llada-sudoku"
    assert [r["id"] for r in runs if r["reproduction"] == "d1-llada-sudoku"] == [rl_run["id"]]  # not repeated
    finals = [e for e in store.evaluations(controls[0]["id"]) if e["checkpoint"] == "final"]
    assert rl["control"] == finals[0]["metrics"]["accuracy"]

    code, out, _ = run_cli(capsys, monkeypatch, *GRID, "--scale", "micro", "--db", str(db), "--controls", "--json")
    cells = by_name(payload(out)["cells"])
    assert code == 0 and {c["status"] for c in cells.values()} == {"skipped"}
    assert cells["d1-llada-sudoku"]["control"] == rl["control"] and len(store.latest_runs(limit=None)) == 4


@pytest.mark.integration
def test_controls_on_a_fresh_grid_run_each_rl_run_then_its_control(home, shared, capsys, monkeypatch):
    db = shared / "fresh-controls.db"
    code, out, err = run_cli(capsys, monkeypatch, *GRID, "--scale", "micro", "--jobs", "2", "--db", str(db),
                             "--controls", "--json")
    assert code == 0, err
    cells = by_name(payload(out)["cells"])
    rl, ev = cells["d1-llada-sudoku"], cells["baseline-llada-sudoku"]
    assert (rl["action"], rl["status"]) == ("control", "finished") and ev["status"] == "finished"
    store = Store(f"sqlite:///{db}")
    rl_run = store.get_run(rl["run_id"])
    controls = store.controls_of(rl_run["uid"])
    assert rl_run["reproduction"] == "d1-llada-sudoku" and len(controls) == 1
    finals = [e for e in store.evaluations(controls[0]["id"]) if e["checkpoint"] == "final"]
    assert rl["control"] == finals[0]["metrics"]["accuracy"] and ev["control"] is None
    assert len(store.latest_runs(limit=None)) == 3  # the evaluation, the RL run, its control


@pytest.mark.integration
def test_a_killed_cell_fails_the_others_finish_and_the_next_sweep_resumes_it(home, shared, capsys, monkeypatch):
    db = shared / "kill.db"
    url = f"sqlite:///{db}"
    args = ["sft-llada-sudoku", "baseline-llada-sudoku", "--scale", "micro", "--jobs", "2", "--db", str(db),
            "--set", "train.steps=30", "--set", "train.checkpoint_every=3", "--json"]
    killed: dict = {}

    def kill_after_first_checkpoint():
        from dare_bench.trainers.checkpoint import latest_checkpoint

        deadline = time.time() + 600
        while time.time() < deadline:
            time.sleep(0.05)
            if not db.exists():
                continue
            with Store(url) as store:
                rows = store.latest_runs(reproduction="sft-llada-sudoku", status="running")
            if not rows:
                continue
            row = rows[0]
            ckpt = home / "runs" / f"sft-llada-sudoku-micro-{row['config_hash'][:12]}-seed0" / "checkpoints"
            if latest_checkpoint(ckpt) is not None and row["pid"] != os.getpid():
                os.kill(row["pid"], signal.SIGKILL)
                killed.update(row)
                return

    killer = threading.Thread(target=kill_after_first_checkpoint, daemon=True)
    killer.start()
    code, out, err = run_cli(capsys, monkeypatch, *args)
    killer.join(5)
    assert killed, "the SFT cell finished before a checkpoint was seen"
    assert code == 1, err
    cells = by_name(payload(out)["cells"])
    assert cells["sft-llada-sudoku"]["status"] == "failed" and "SIGKILL" in cells["sft-llada-sudoku"]["message"]
    assert cells["baseline-llada-sudoku"]["status"] == "finished"
    store = Store(url)
    assert store.get_run(killed["id"])["status"] == "failed"  # not left "running"
    assert cells["sft-llada-sudoku"]["run_id"] == killed["id"]

    code, out, err = run_cli(capsys, monkeypatch, *args)
    assert code == 0, err
    cells = by_name(payload(out)["cells"])
    sft = cells["sft-llada-sudoku"]
    assert sft["action"] == "resume" and sft["status"] == "finished" and sft["message"].startswith("resumes from step-")
    assert cells["baseline-llada-sudoku"]["status"] == "skipped"
    # the resumed run carries the whole curve: the steps logged before the kill (from the checkpoint), then the rest
    # (0-based: the last of 30 steps is 29)
    before = [m["step"] for m in store.metrics(killed["id"])]
    steps = [m["step"] for m in store.metrics(sft["run_id"])]
    assert steps[:len(before)] == before and steps == sorted(set(steps)) and steps[-1] == 29, (before, steps)


# ------------------------------------------------------------------------------------------------ submitit

@pytest.mark.integration
def test_submitit_local_cluster_runs_a_cell(home, shared, capsys, monkeypatch):
    db = shared / "submitit.db"
    code, out, err = run_cli(capsys, monkeypatch, "baseline-llada-sudoku", "--scale", "micro", "--executor",
                             "submitit", "--submitit-cluster", "local", "--db", str(db), "--json")
    assert code == 0, err
    (cell,) = payload(out)["cells"]
    assert cell["status"] == "finished"
    (run,) = Store(f"sqlite:///{db}").latest_runs(limit=None)
    assert run["id"] == cell["run_id"] and run["status"] == "finished" and run["hardware"]["torch_threads"] == 1
    assert any((home / "sweeps" / "submitit").glob("*_result.pkl"))  # it went through submitit's job files


def test_slurm_options_reach_the_sbatch_script(tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text("#!/bin/sh\nexit 1\n")  # submitit's Slurm executor looks for srun; nothing is run
    (fake / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    workers = sweep.SubmititWorkers(tmp_path / "jobs", cluster="slurm", threads=2, partition="gpu", time_min=90,
                                    gpus=1)
    script = workers.executor._executor._make_submission_file_text("cmd", "uid")  # the sbatch file it would submit
    for line in ("--partition=gpu", "--time=90", "--gpus-per-node=1", "--cpus-per-task=2",
                 "--job-name=dare-bench-sweep"):
        assert f"#SBATCH {line}\n" in script


# ------------------------------------------------------------------------------------------------ PostgreSQL

def _postgres_bin() -> Path | None:
    """The server binaries: the system's, else the ones the `pgserver` wheel bundles (the `postgres` extra)."""
    import glob
    import shutil

    found = shutil.which("initdb") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))), None)
    if found is None:
        try:
            import pgserver
        except ImportError:
            return None
        bundled = Path(pgserver.__file__).parent / "pginstall" / "bin" / "initdb"
        found = str(bundled) if bundled.is_file() else None
    return Path(found).resolve().parent if found else None  # the real bin dir (createdb beside initdb)


def _server_user() -> str | None:
    """PostgreSQL refuses to run as root: as root, the `postgres` account where there is one, else `nobody`."""
    import pwd

    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name).pw_name
        except KeyError:
            continue
    pytest.skip("running as root with neither a `postgres` nor a `nobody` account to run the server as")


@pytest.fixture
def postgres_url():
    """A throw-away PostgreSQL server on a unix socket (as another user when the tests run as root, which PostgreSQL
    refuses to run as); the URL of its database."""
    import shutil
    import subprocess
    import tempfile

    pytest.importorskip("psycopg2", reason="the PostgreSQL driver (pip install psycopg2-binary)")
    bindir = _postgres_bin()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries (initdb) on this machine")
    user = _server_user()
    as_user = ["runuser", "-u", user, "--"] if user else []
    root = Path(tempfile.mkdtemp(prefix="dare-pg-"))
    if user:
        shutil.chown(root, user)
    port = "55439"
    subprocess.run([*as_user, str(bindir / "initdb"), "-D", str(root / "data"), "-A", "trust", "-U", "dare"],
                   check=True, capture_output=True)
    subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(root / "data"), "-w", "-l", str(root / "log"), "-o",
                    f"-p {port} -k {root} -c listen_addresses=''", "start"], check=True, capture_output=True)
    try:
        subprocess.run([*as_user, str(bindir / "createdb"), "-h", str(root), "-p", port, "-U", "dare", "dare"],
                       check=True, capture_output=True)
        yield f"postgresql+psycopg2://dare@/dare?host={root}&port={port}"
    finally:
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(root / "data"), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.integration
@pytest.mark.extra
def test_two_workers_write_one_postgresql_store(home, postgres_url, capsys, monkeypatch):
    code, out, err = run_cli(capsys, monkeypatch, "baseline-llada-sudoku", "--seeds", "0,1", "--scale", "micro",
                             "--jobs", "2", "--db", postgres_url, "--json")
    assert code == 0, err
    assert [c["status"] for c in payload(out)["cells"]] == ["finished", "finished"]
    runs = Store(postgres_url).latest_runs(limit=None)
    assert sorted(r["seed"] for r in runs) == [0, 1] and {r["status"] for r in runs} == {"finished"}
    code, out, _ = run_cli(capsys, monkeypatch, "baseline-llada-sudoku", "--seeds", "0,1", "--scale", "micro",
                           "--db", postgres_url, "--json")
    assert [c["status"] for c in payload(out)["cells"]] == ["skipped", "skipped"]


# ------------------------------------------------------------------------------------------------ pieces

def test_worker_outcomes(tmp_path):
    out, err = tmp_path / "c.out", tmp_path / "c.err"

    def cell_after(rc: int, stdout: str, stderr: str, job_error: str | None = None) -> sweep.Cell:
        out.write_text(stdout)
        err.write_text(stderr)
        cell = sweep.Cell("d1-llada-sudoku", "micro", 0)
        sweep.outcome(cell, rc, job_error, out, err)
        return cell

    done = cell_after(0, json.dumps({"status": "finished", "run_id": 7, "base_metrics": {"accuracy": 0.1},
                                     "metrics": {"accuracy": 0.25}}) + "\n", "base: accuracy = 0.1\n")
    assert (done.status, done.run_id, done.base, done.final) == ("finished", 7, 0.1, 0.25)
    error = cell_after(2, json.dumps({"status": "error", "error": "unknown reproduction"}) + "\n", "error: ...\n")
    assert (error.status, error.message) == ("failed", "unknown reproduction")
    crash = cell_after(1, "", "Traceback (most recent call last):\n  ...\nRuntimeError: out of memory\n")
    assert crash.message == "RuntimeError: out of memory"
    assert cell_after(-9, "", "").message == "worker killed by SIGKILL"
    assert cell_after(-1, "", "", "submitit job 12 failed: TIMEOUT").message == "submitit job 12 failed: TIMEOUT"
    controlled = cell_after(0, json.dumps({"status": "finished", "run_id": 8, "metrics": {"accuracy": 0.3},
                                           "control": {"run_id": 9, "metrics": {"accuracy": 0.2}}}) + "\n", "")
    assert controlled.control == 0.2


def test_controls_reach_only_rl_cells_commands():
    from dare_bench.pipeline.plan import resolve

    rl = sweep.Cell("d1-llada-sudoku", "micro", 0, cfg=resolve("d1-llada-sudoku", "micro")[1])
    sft = sweep.Cell("sft-llada-sudoku", "micro", 0, cfg=resolve("sft-llada-sudoku", "micro")[1])
    assert "--control" in sweep.cell_command(rl, db="sqlite:///x.db", controls=True)
    assert "--control" not in sweep.cell_command(sft, db="sqlite:///x.db", controls=True)
    assert "--control" not in sweep.cell_command(rl, db="sqlite:///x.db")
    cells = [sweep.Cell("d1-llada-sudoku", "micro", s, status="finished", final=f, base=0.1, control=c)
             for s, f, c in ((0, 0.4, 0.3), (1, 0.5, 0.3))]
    summary = sweep.sweep_summary(cells)["entries"]["d1-llada-sudoku"]
    assert summary["vs_control"]["mean"] == pytest.approx(0.15)
    assert "RL - SFT control 0.150" in "\n".join(sweep.table_lines(cells))


def test_cells_sharing_a_base_wait_for_its_first_build():
    from dare_bench.registry import get

    a, b, c = (sweep.Cell(n, "micro", 0, cfg=get(n).resolve("micro"))
               for n in ("d1-llada-sudoku", "sft-llada-sudoku", "d1-llada-countdown"))
    assert sweep.base_group(a.cfg) == sweep.base_group(b.cfg) != sweep.base_group(c.cfg)
    queue = deque([a, b, c])
    started: set = set()
    assert sweep._next_cell(queue, started, set()) is a
    started.add(sweep.base_group(a.cfg))
    assert sweep._next_cell(queue, started, set()) is c  # b waits: a is building the llada-sudoku base
    started.add(sweep.base_group(c.cfg))
    assert sweep._next_cell(queue, started, set()) is None
    assert sweep._next_cell(queue, started, {sweep.base_group(a.cfg)}) is b  # a logged its base evaluation


def test_cells_whose_base_failed_to_build_fail_without_training_it_again():
    from dare_bench.registry import get

    a, b, c = (sweep.Cell(n, "micro", 0, cfg=get(n).resolve("micro"))
               for n in ("d1-llada-sudoku", "sft-llada-sudoku", "d1-llada-countdown"))
    a.status, a.message = "failed", "base: validation accuracy never reached the target 0.3 by step 1500"
    queue = deque([b, c])
    dropped = sweep._cells_of_failed_bases(queue, {sweep.base_group(a.cfg): a})
    assert dropped == [b] and list(queue) == [c]  # c has its own base
    assert b.status == "failed" and "its base failed to build in d1-llada-sudoku seed 0" in b.message
    assert "never reached the target" in b.message and "rerun the sweep" in b.message
    assert sweep._cells_of_failed_bases(queue, {}) == [] and list(queue) == [c]


def test_a_sweep_fails_the_rest_of_a_group_when_its_base_build_fails(home, tmp_path, monkeypatch):
    from dare_bench.registry import get

    class FakeWorkers:  # the base-building cell of llada-sudoku fails; the countdown cell finishes
        started: list = []

        def start(self, cmd, env, out_path, err_path):
            name = cmd[cmd.index("reproduce") + 1]
            self.started.append(name)
            ok = name.endswith("countdown")
            Path(out_path).write_text(json.dumps({"status": "finished", "run_id": 1}) if ok else "")
            Path(err_path).write_text("" if ok else "base: validation accuracy never reached the target\n")
            return (name, 0 if ok else 1)

        def poll(self, handle):
            return handle[1], None

        def stop(self, handle):
            pass

    monkeypatch.setattr(sweep, "POLL_SECONDS", 0)
    cells = [sweep.Cell(n, "micro", 0, cfg=get(n).resolve("micro"))
             for n in ("d1-llada-sudoku", "sft-llada-sudoku", "d1-llada-countdown")]
    workers, logged = FakeWorkers(), []
    sweep._execute(cells, workers, url=f"sqlite:///{tmp_path / 'grid.db'}", jobs=1, threads=1, overrides=(),
                   device=None, force=False, controls=False, log=logged.append)
    assert any(line.startswith("sft-llada-sudoku seed 0: failed: not started") for line in logged)
    assert workers.started == ["d1-llada-sudoku", "d1-llada-countdown"]  # sft-llada-sudoku never trained it again
    assert [c.status for c in cells] == ["failed", "failed", "finished"]
    assert "its base failed to build in d1-llada-sudoku" in cells[1].message


def test_control_only_cells_run_in_order_of_budget_in_their_places():
    from dare_bench.pipeline.sweep import Cell, controls_by_budget

    cells = [Cell("a", "tiny", 0, action="control", budget=3e13), Cell("b", "tiny", 0, action="run"),
             Cell("c", "tiny", 0, action="control", budget=1e13), Cell("d", "tiny", 0, action="control", budget=2e13)]
    ordered = controls_by_budget(cells)
    assert [c.name for c in ordered] == ["c", "b", "d", "a"]  # the RL cell keeps its place
    assert [c.name for c in cells] == ["a", "b", "c", "d"]  # the grid's own order (its summary) is left alone


def test_a_control_waits_while_a_control_of_its_trajectory_runs():
    from dare_bench.registry import get

    def control(name, seed, budget):
        return sweep.Cell(name, "micro", seed, action="control", budget=budget, cfg=get(name).resolve("micro"))

    first, same, other_seed = (control("d1-llada-sudoku", 0, 1e12), control("bgpo-llada-sudoku", 0, 2e12),
                               control("bgpo-llada-sudoku", 1, 2e12))
    rl_cell = sweep.Cell("spg-llada-sudoku", "micro", 0, cfg=get("spg-llada-sudoku").resolve("micro"))
    assert sweep.control_trajectory(first) == sweep.control_trajectory(same) != sweep.control_trajectory(other_seed)
    assert sweep.control_trajectory(rl_cell) is None
    ready = {sweep.base_group(first.cfg)}
    queue = deque([same, other_seed, rl_cell])
    busy = {sweep.control_trajectory(first)}  # `first` runs: `same` would start its trajectory from step 0
    assert sweep._next_cell(queue, set(), ready, busy) is other_seed
    assert sweep._next_cell(queue, set(), ready, busy | {sweep.control_trajectory(other_seed)}) is rl_cell
    assert sweep._next_cell(queue, set(), ready, busy) is None
    assert sweep._next_cell(queue, set(), ready, set()) is same  # `first` ended: `same` continues its stretch


def test_controls_run_after_every_rl_run_smallest_budget_first(home, tmp_path, monkeypatch):
    """`--controls` on a fresh grid: the RL runs first (without `--control`), then each one's control in order of
    budget, so the controls of one base and seed continue one SFT trajectory instead of restarting it."""
    budgets = {"d1-llada-sudoku": 3e12, "bgpo-llada-sudoku": 1e12, "spg-llada-sudoku": 2e12,
               "wd1-llada-sudoku": None}  # wd1's control finished in another sweep meanwhile
    started = []

    class FakeWorkers:
        def start(self, cmd, env, out_path, err_path):
            control = "--control" in cmd
            started.append((cmd[cmd.index("reproduce") + 1], control))
            result = {"status": "finished", "run_id": 1, "metrics": {"accuracy": 0.5}}
            if control:
                result["control"] = {"metrics": {"accuracy": 0.4}}
            Path(out_path).write_text(json.dumps(result))
            Path(err_path).write_text("")
            return 0

        def poll(self, handle):
            return handle, None

        def stop(self, handle):
            pass

    def decide(cells, url, *, force, dry_run, controls=False):  # the store's answer once the RL runs finished
        for cell in cells:
            if cell.status == "finished" and budgets[cell.name] is None:
                cell.action, cell.status, cell.control = "skip", "skipped", 0.3
            elif cell.status == "finished":
                cell.action, cell.budget, cell.wall_seconds = "control", budgets[cell.name], 10.0

    monkeypatch.setattr(sweep, "_decide", decide)
    monkeypatch.setattr(sweep, "LocalWorkers", FakeWorkers)
    monkeypatch.setattr(sweep, "POLL_SECONDS", 0)
    cells = sweep.run_sweep(list(budgets), scale="micro", controls=True, db=str(tmp_path / "grid.db"),
                            progress=False, log=lambda _msg: None)
    assert started == [(name, False) for name in budgets] + [
        ("bgpo-llada-sudoku", True), ("spg-llada-sudoku", True), ("d1-llada-sudoku", True)]
    assert [(c.status, c.final, c.control) for c in cells] == [("finished", 0.5, 0.4)] * 3 + [
        ("finished", 0.5, 0.3)]  # wd1's RL run ran in this sweep; its control is the other sweep's
    assert all(c.wall_seconds >= 10.0 for c in cells[:3])  # the RL run's time and its control's


def _store_with_a_run_from_base_abab(tmp_path, monkeypatch):
    """A fresh home and a store holding one finished micro d1-llada-sudoku run (seed 0) from base abab...:
    (url, its config, its run id)."""
    from dare_bench.pipeline.plan import resolve

    monkeypatch.setenv("DARE_BENCH_HOME", str(tmp_path / "home"))
    url = f"sqlite:///{tmp_path / 'grid.db'}"
    store = Store(url)
    _, cfg = resolve("d1-llada-sudoku", "micro")
    run_id = store.start_run(cfg, seed=0)
    store.finish_run(run_id, [], base={"weights_sha256": "ab" * 32, "selection": {"rule": "fixed", "step": 40}})
    store.close()
    return url, cfg, run_id


def test_a_sweep_says_first_when_its_base_would_split_the_stores_group(tmp_path, monkeypatch):
    """The store's runs of a row started from a base this cache lacks: the sweep says, before training one, that its
    runs would form a new group (a tiny base's bits follow the CPU); with that base cached, it says nothing."""
    import json as _json

    url, _, _ = _store_with_a_run_from_base_abab(tmp_path, monkeypatch)
    logs: list[str] = []
    cells = sweep.run_sweep(["d1-llada-sudoku", "sft-llada-sudoku"], scale="micro", seeds=[1], db=url, dry_run=True,
                            progress=False, log=logs.append)
    notes = [line for line in logs if line.startswith("note:")]
    assert len(notes) == 1 and "llada x sudoku (micro): the store's runs started from base abababab" in notes[0]
    assert "d1-llada-sudoku seed 1 trains a base here" in notes[0] and "--bases" in notes[0]
    assert all(c.action == "run" for c in cells)

    cached = tmp_path / "home" / "bases" / "llada-sudoku-micro-0123456789abcdef"
    cached.mkdir(parents=True)
    (cached / "base.json").write_text(_json.dumps({"key": {}, "identity": {"weights_sha256": "ab" * 32}}))
    logs.clear()
    sweep.run_sweep(["d1-llada-sudoku"], scale="micro", seeds=[1], db=url, dry_run=True, progress=False,
                    log=logs.append)
    assert not [line for line in logs if line.startswith("note:")]


def test_runs_of_the_replica_at_another_block_size_are_another_base_group(tmp_path, monkeypatch):
    """The LLaDA2 replica trains at `model.block_size` 8; a stored run of the replica at its preset's 32 (before the
    fix) trained another base, so it neither joins the sweep's base group nor prompts the "would split" note."""
    from dare_bench.pipeline.plan import resolve

    monkeypatch.setenv("DARE_BENCH_HOME", str(tmp_path / "home"))
    url = f"sqlite:///{tmp_path / 'grid.db'}"
    _, now = resolve("sft-llada2-sudoku", "micro")
    before = now.model_copy(update={"profile": now.profile.model_copy(
        update={"model": now.profile.model.model_copy(update={"block_size": None})})})
    assert sweep.base_group(now) != sweep.base_group(before)
    store = Store(url)
    for cfg, sha in ((before, "ab"), (now, "cd")):
        run_id = store.start_run(cfg, seed=0)
        store.finish_run(run_id, [], base={"weights_sha256": sha * 32, "selection": {"rule": "fixed", "step": 40}})
    store.close()
    cells = sweep.run_sweep(["sft-llada2-sudoku"], scale="micro", seeds=[1], db=url, dry_run=True, progress=False,
                            log=lambda _: None)
    notes = sweep.foreign_base_notes(cells, url)
    assert len(notes) == 1 and "started from base cdcdcdcd" in notes[0] and "abababab" not in notes[0]


def test_a_finished_run_from_another_base_is_run_again_from_this_machines(tmp_path, monkeypatch):
    """A finished cell counts as done only from the base this machine's cache holds for its recipe: one that started
    from another base (another CPU kind's) sits in another leaderboard group, so the sweep runs the cell again here,
    and says why; from the same base, or with no base cached yet, it is skipped as before."""
    import json as _json

    from dare_bench.pipeline.base_cache import cached_base_hash, recipe_fields

    url, cfg, run_id = _store_with_a_run_from_base_abab(tmp_path, monkeypatch)

    def decide() -> sweep.Cell:
        cells = sweep.run_sweep(["d1-llada-sudoku"], scale="micro", seeds=[0], db=url, dry_run=True, progress=False,
                                log=lambda _: None)
        return cells[0]

    assert decide().action == "skip"  # nothing cached: this machine has no base to compare with
    cached = tmp_path / "home" / "bases" / "llada-sudoku-micro-0123456789abcdef"
    cached.mkdir(parents=True)
    key = {**_json.loads(_json.dumps(recipe_fields(cfg), default=str)), "tokenizer": "t", "data": "d"}
    (cached / "base.json").write_text(_json.dumps({"key": key, "identity": {"weights_sha256": "cd" * 32}}))
    assert cached_base_hash(cfg) == "cd" * 32
    cell = decide()
    assert cell.action == "run"
    said = f"its finished run {run_id} started from base abababab, this machine's cached base is cdcdcdcd"
    assert said in cell.message
    (cached / "base.json").write_text(_json.dumps({"key": key, "identity": {"weights_sha256": "ab" * 32}}))
    assert decide().action == "skip"
    other = {**key, "recipe": {**key["recipe"], "lr": 123.0}}  # another recipe's base is not this cell's
    (cached / "base.json").write_text(_json.dumps({"key": other, "identity": {"weights_sha256": "cd" * 32}}))
    assert cached_base_hash(cfg) is None and decide().action == "skip"
