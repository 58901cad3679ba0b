"""`dare-bench sweep`: many reproductions x seeds in one command, into one store, resumable.

What it does: selects reproductions (names, globs, `--backbone / --algorithm / --task` filters, each repeatable or a
comma list) at one `--scale`, takes every seed the scale pins (or `--seeds`), and runs the grid entries x seeds as
`dare-bench reproduce NAME --seed S --scale X --json --db URL` worker processes, `--jobs N` at a time, each on
`--threads` threads (default 1: tiny models run as fast on one thread, and several OpenMP pools spinning on shared
cores slow every run down many times), all writing one store. A cell whose identical run already finished is
skipped (`pipeline.previous_run`, as `reproduce` skips it; `--force` runs it again); at tiny / micro scale identical
includes the base: a finished run from another base than the one this machine's cache holds for the recipe (another
CPU kind's) is in another leaderboard row, so the cell runs again here and says why; a cell whose last attempt in
the store was interrupted (a killed worker, a crash, a Slurm time limit: its row failed, or running in a process
that is gone) and left a checkpoint is resumed (`reproduce --resume`, from the run directory every attempt of that
config and seed shares). Entries that cannot run here at that scale (no such
scale, GPU-only, missing data, no plug-in: `registry.runnable`) are listed as not-runnable with the reason, not as
failures. A failed or killed cell is marked failed and the others go on; the exit code is 1 when any cell failed,
2 for bad input (a pattern that matches nothing, `--jobs 0`). One progress bar with an ETA covers the whole grid;
the end is a table (entry, seed, status, metric base -> final, wall time) and, per entry with several seeds, the
mean ± 95% CI. `--json` prints {"cells": [...], "summary": {...}}; `--dry-run` prints the grid with each cell's
decision (run, resume, skip) and its `reproduce --dry-run` plan, and writes nothing. `--controls`: every RL run's
compute-matched SFT control (`reproduce --control`), run after all the RL runs, smallest budget first: the controls
of one base and seed are one SFT trajectory, each continuing where the one before it stopped (pipeline/control.py).
Before any compute, a row whose finished runs in the store all started from bases this machine's cache lacks gets a
note: the base trained here follows this CPU's kernels, so its runs would likely form a group of their own
(`foreign_base_notes`; a bundle that ships the base, `export --bundle --bases`, avoids it).

    dare-bench sweep --scale tiny --backbone llada --task sudoku --jobs 2          # every algorithm x 3 seeds
    dare-bench sweep '*-llada-sudoku' --scale micro --jobs 2 --json
    dare-bench sweep d1-llada-sudoku bgpo-llada-sudoku --seeds 0,1 --scale tiny --set train.steps=20
    dare-bench sweep --scale tiny --task sudoku,countdown --dry-run
    dare-bench sweep --scale tiny --backbone llada --task sudoku --jobs 2 --controls   # + compute-matched SFT
    dare-bench sweep --scale tiny --backbone llada --device cuda --jobs 16          # one GPU machine
    dare-bench sweep --scale tiny --task sudoku --executor submitit --slurm-partition cpu --jobs 64 \\
        --db postgresql://user@dbhost/dare                                          # a Slurm cluster

Several writers: SQLite (the default store) runs in WAL mode with a busy timeout and BEGIN IMMEDIATE writes
(`store/engine.py`), which is safe for the workers of one machine. Workers on many machines need a database
server: `--db postgresql://...` (any SQLAlchemy URL), and `DARE_BENCH_HOME` (cached bases, run directories with
their checkpoints) on a filesystem every node sees.

Workers are processes, one per cell, rather than a pool: a worker killed by the kernel (out of memory, SIGKILL)
takes only its cell with it (a multiprocessing pool would break or hang), each cell starts with a fresh interpreter
and its own thread settings, and the cell's command line is exactly the `reproduce` a user would type, whose logs
are kept under `$DARE_BENCH_HOME/sweeps/logs/`. Cells sharing a cached tiny base (same backbone, task, scale and
base recipe) wait until the first of them has logged its base evaluation, so the base is trained (and evaluated)
once instead of by every worker; when that first cell fails before its base is evaluated (a base target the replica
never reaches, a crash), the group's other cells are marked failed without training the base again, and a rerun
of the sweep retries them.

More than one machine: `--executor submitit` hands the same cell commands to submitit (the optional extra
`pip install -e ".[sweep]"`), which submits one Slurm job per cell (`--slurm-partition`, `--slurm-time`,
`--slurm-gpus`, `--jobs` jobs in flight) or, with `--submitit-cluster local`, runs them as local processes (how it
is tested). Submitit rather than Ray: it is one small pure-Python package with no server to start, Slurm is what
academic GPU clusters run, and its local executor exercises the same submission path on a laptop; a Ray cluster
would need its own head node and a much larger dependency.
"""

from __future__ import annotations

import fnmatch
import json
import os
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from dare_bench.errors import ConfigError, DareBenchError, missing_extra

EXECUTORS = ("local", "submitit")
SUBMITIT_CLUSTERS = ("auto", "slurm", "local", "debug")
POLL_SECONDS = 0.5
GLOB_CHARS = "*?["


@dataclass
class Cell:
    """One reproduction x seed of the grid and what became of it."""

    name: str
    scale: str
    seed: int | None  # None: an entry that was not resolved (not runnable here, or its config is invalid)
    status: str = "pending"  # finished | skipped | failed | not-runnable | dry-run (then `action` says what)
    action: str = "run"  # run | resume | skip | control (--controls: the RL run finished, its control did not)
    run_id: int | None = None
    metric: str = "accuracy"
    base: float | None = None
    final: float | None = None
    control: float | None = None  # --controls: the final metric of its compute-matched SFT control
    budget: float | None = None  # a control-only cell: the FLOPs its RL run counted (its control's budget)
    wall_seconds: float | None = None
    message: str = ""
    log: str | None = None  # the worker's stderr log
    plan: dict[str, Any] | None = None  # --dry-run: the cell's `reproduce --dry-run` plan
    cfg: Any = field(default=None, repr=False)  # the resolved RunConfig (not in the JSON)

    def to_json(self) -> dict[str, Any]:
        keys = ("name", "scale", "seed", "status", "action", "run_id", "metric", "base", "final", "control",
                "wall_seconds", "message", "log")
        out = {k: getattr(self, k) for k in keys}
        out["config_hash"] = self.cfg.content_hash if self.cfg is not None else None
        if self.plan is not None:
            out["plan"] = self.plan
        return out


# --------------------------------------------------------------------------------------------------- the grid

def select_entries(patterns: list[str] | None = None, *, backbone=None, algorithm=None, task=None,
                   registry=None) -> list:
    """The reproductions named by `patterns` (exact names or globs such as '*-llada-sudoku'; none: all) and kept by
    the filters (`Registry.select`). A pattern that matches nothing, or an empty selection, is a ConfigError."""
    from dare_bench.registry import load_registry

    reg = registry if registry is not None else load_registry()
    kept = reg.select(backbone=backbone, algorithm=algorithm, task=task)
    if not patterns:
        chosen = kept
    else:
        names: list[str] = []
        for pattern in patterns:
            if any(c in pattern for c in GLOB_CHARS):
                hits = fnmatch.filter(reg.names(), pattern)
                if not hits:
                    raise ConfigError(f"sweep pattern {pattern!r} matches no reproduction (`dare-bench list`)")
            else:
                hits = [reg.get(pattern).name]  # an unknown name: one error with a suggestion
            names += [n for n in hits if n not in names]
        allowed = {s.name for s in kept}
        chosen = [reg.get(n) for n in names if n in allowed]
    if not chosen:
        raise ConfigError("the sweep selects no reproduction: no entry matches both the names and the filters")
    return chosen


def parse_seeds(text: str | None) -> list[int] | None:
    """'0,1,2' -> [0, 1, 2]; None -> None (every seed the scale pins)."""
    if text is None:
        return None
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--seeds expects integers separated by commas (e.g. 0,1,2), got {text!r}") from None
    if not seeds:
        raise ConfigError("--seeds names no seed")
    return list(dict.fromkeys(seeds))


def plan_grid(specs: list, scale: str, *, seeds: list[int] | None = None,
              overrides: list[str] | tuple[str, ...] = ()) -> list[Cell]:
    """One cell per entry x seed; an entry that cannot run here at `scale` is one not-runnable cell with the
    registry's reason, one whose config fails to resolve (a bad override, data) one failed cell."""
    from dare_bench.pipeline.plan import resolve
    from dare_bench.registry.runnable import why_not_runnable

    cells: list[Cell] = []
    for spec in specs:
        verdict = why_not_runnable(spec, scale)
        if verdict is not None:
            cells.append(Cell(spec.name, scale, None, status="not-runnable", message=f"{verdict[0]}: {verdict[1]}"))
            continue
        try:
            _, cfg = resolve(spec.name, scale, overrides)
        except DareBenchError as exc:
            cells.append(Cell(spec.name, scale, None, status="failed", message=str(exc)))
            continue
        for seed in seeds if seeds is not None else list(cfg.profile.seeds):
            cells.append(Cell(spec.name, scale, int(seed), metric=cfg.profile.eval.metric, cfg=cfg))
    return cells


def base_group(cfg) -> tuple | None:
    """Cells with the same key train the same cached tiny base (`base_cache.build_base` keys it by the preset, task,
    scale and base recipe); None: nothing to build (paper scale: the real checkpoint)."""
    if cfg is None or cfg.profile.base is None or cfg.scale in ("paper", "official"):
        return None
    return (cfg.backbone, cfg.task, cfg.scale, cfg.profile.model.preset, cfg.profile.model.block_size,
            cfg.profile.base.model_dump_json())


# --------------------------------------------------------------------------------------------------- workers

def cell_command(cell: Cell, *, db: str, overrides: list[str] | tuple[str, ...] = (), device: str | None = None,
                 force: bool = False, controls: bool = False) -> list[str]:
    """The `dare-bench reproduce` line of one cell (what a user would type to run it alone); `controls`: an RL
    cell runs its compute-matched SFT control after it (`reproduce --control`)."""
    cmd = [sys.executable, "-m", "dare_bench.cli", "reproduce", cell.name, *overrides, "--seed", str(cell.seed),
           "--scale", cell.scale, "--json", "--db", db]
    if controls and _is_rl(cell):
        cmd.append("--control")
    if cell.action == "resume":
        cmd.append("--resume")
    if force:
        cmd.append("--force")
    if device:
        cmd += ["--device", device]
    return cmd


def cell_environment(threads: int) -> dict[str, str]:
    """The worker's environment: this one, `threads` OpenMP / MKL threads (torch reads them at start; the run
    record's hardware.torch_threads shows the count), and the resolved DARE_BENCH_HOME (a Slurm node must use the
    same cached bases and run directories)."""
    from dare_bench.fileio import dare_bench_home

    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), DARE_BENCH_HOME=str(dare_bench_home()))
    return env


def run_logged(cmd: list[str], env: dict[str, str], out_path: str, err_path: str) -> int:
    """Run one cell's command with its stdout / stderr in files; its exit status (negative: killed by a signal).
    What a submitit job executes on its node."""
    with open(out_path, "w") as out, open(err_path, "w") as err:
        return subprocess.run(cmd, env=env, stdout=out, stderr=err, check=False).returncode


class LocalWorkers:
    """Cells as child processes of this one."""

    def start(self, cmd: list[str], env: dict[str, str], out_path: Path, err_path: Path):
        with open(out_path, "w") as out, open(err_path, "w") as err:
            return subprocess.Popen(cmd, env=env, stdout=out, stderr=err)

    def poll(self, handle) -> tuple[int, str | None] | None:
        """None while the cell runs, else (exit status, None)."""
        rc = handle.poll()
        return None if rc is None else (rc, None)

    def stop(self, handle) -> None:
        handle.kill()
        handle.wait()


class SubmititWorkers:
    """Cells as submitit jobs (Slurm, or local processes with cluster="local")."""

    def __init__(self, folder: Path, *, cluster: str = "auto", threads: int = 1, partition: str | None = None,
                 time_min: int | None = None, gpus: int | None = None):
        try:
            import submitit
        except ImportError:
            raise missing_extra("submitit", "sweep") from None
        self.executor = submitit.AutoExecutor(folder=str(folder), cluster=None if cluster == "auto" else cluster)
        params: dict[str, Any] = {"name": "dare-bench-sweep", "cpus_per_task": threads}
        if time_min is not None:
            params["timeout_min"] = time_min
        if gpus is not None:
            params["gpus_per_node"] = gpus
        if partition is not None:
            params["slurm_partition"] = partition
        self.executor.update_parameters(**params)

    def start(self, cmd: list[str], env: dict[str, str], out_path: Path, err_path: Path):
        return self.executor.submit(run_logged, cmd, env, str(out_path), str(err_path))

    def poll(self, job) -> tuple[int, str | None] | None:
        """None while the job runs, else (the cell's exit status, None), or (-1, why) when the job itself died
        (a time limit, a lost node): the cell failed, and a rerun resumes it from its last checkpoint."""
        if not job.done():
            return None
        try:
            return int(job.result()), None
        except Exception as exc:  # noqa: BLE001 - submitit re-raises whatever ended the job
            last = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
            return -1, f"submitit job {job.job_id} failed: {last}"

    def stop(self, job) -> None:
        job.cancel(check=False)


def outcome(cell: Cell, rc: int, job_error: str | None, out_path: Path, err_path: Path) -> None:
    """Fill `cell` from its worker: the `reproduce --json` object on stdout, else the error / signal."""
    lines = [ln for ln in _read(out_path).splitlines() if ln.strip().startswith("{")]
    result = None
    if lines:
        try:
            result = json.loads(lines[-1])
        except ValueError:
            result = None
    if rc == 0 and result is not None and result.get("status") in ("finished", "skipped"):
        # a control-only cell: reproduce skipped the finished RL run and ran its control, the cell's work
        cell.status = "finished" if cell.action == "control" else result["status"]
        cell.run_id = result.get("run_id")
        cell.base = (result.get("base_metrics") or {}).get(cell.metric)
        cell.final = (result.get("metrics") or {}).get(cell.metric)
        cell.control = ((result.get("control") or {}).get("metrics") or {}).get(cell.metric)
        cell.message = result.get("message") or cell.message  # else what was decided ("resumes from step-N")
        return
    cell.status = "failed"
    if job_error:
        cell.message = job_error
    elif rc < 0:
        try:
            cell.message = f"worker killed by {signal.Signals(-rc).name}"
        except ValueError:
            cell.message = f"worker killed by signal {-rc}"
    elif result is not None and result.get("status") == "error":
        cell.message = result.get("error", "")
    else:
        err = [ln for ln in _read(err_path).splitlines() if ln.strip()]
        cell.message = (err[-1] if err else f"worker exited with status {rc}")[:500]


def _read(path: Path) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


# --------------------------------------------------------------------------------------------------- the sweep

def run_sweep(patterns: list[str] | None = None, *, scale: str | None = None, backbone=None, algorithm=None,
              task=None, seeds: list[int] | None = None, overrides: list[str] | tuple[str, ...] = (),
              jobs: int = 1, threads: int = 1, db: str | None = None, force: bool = False, device: str | None = None,
              dry_run: bool = False, executor: str = "local", submitit_cluster: str = "auto",
              slurm_partition: str | None = None, slurm_time: int | None = None, slurm_gpus: int | None = None,
              controls: bool = False, progress: bool = True, log: Callable[[str], Any] = print) -> list[Cell]:
    """Plan the grid, decide each cell (skip / resume / run), run the rest `jobs` at a time; failures are recorded
    in their cells, never raised. Bad input (no match, jobs < 1, an unknown executor) raises ConfigError first."""
    from dare_bench.pipeline.plan import default_scale
    from dare_bench.store import resolve_url

    if jobs < 1:
        raise ConfigError(f"--jobs must be at least 1, got {jobs}")
    if threads < 1:
        raise ConfigError(f"--threads must be at least 1, got {threads}")
    if executor not in EXECUTORS:
        raise ConfigError(f"--executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    if submitit_cluster not in SUBMITIT_CLUSTERS:
        raise ConfigError(f"--submitit-cluster must be one of {', '.join(SUBMITIT_CLUSTERS)}, "
                          f"got {submitit_cluster!r}")
    slurm = {"--slurm-partition": slurm_partition, "--slurm-time": slurm_time, "--slurm-gpus": slurm_gpus,
             "--submitit-cluster": None if submitit_cluster == "auto" else submitit_cluster}
    given = [k for k, v in slurm.items() if v is not None]
    if executor != "submitit" and given:
        raise ConfigError(f"{', '.join(given)} only apply with --executor submitit")
    chosen_scale = scale or default_scale()
    specs = select_entries(patterns, backbone=backbone, algorithm=algorithm, task=task)
    cells = plan_grid(specs, chosen_scale, seeds=seeds, overrides=overrides)
    url = resolve_url(db)
    todo = [c for c in cells if c.status == "pending"]
    _decide(todo, url, force=force, dry_run=dry_run, controls=controls)
    for note in foreign_base_notes([c for c in todo if c.action != "skip"], url):
        log(note)
    todo = controls_by_budget(todo)
    if dry_run:
        _dry_run_plans(todo, overrides=overrides, device=device)
        return cells
    if executor == "submitit":
        from dare_bench.fileio import dare_bench_home

        workers: Any = SubmititWorkers(dare_bench_home() / "sweeps" / "submitit", cluster=submitit_cluster,
                                       threads=threads, partition=slurm_partition, time_min=slurm_time,
                                       gpus=slurm_gpus)
    else:
        workers = LocalWorkers()
    pending = [c for c in todo if c.status == "pending"]
    # --controls: the RL runs first, then every control in order of budget. The controls of one base and seed are
    # one SFT trajectory (pipeline/control.py), so each continues where the one before it stopped; run beside or
    # right after its RL run, a control would often start that trajectory again from step 0.
    runs = [c for c in pending if c.action != "control"]
    rl_runs = [c for c in runs if controls and _is_rl(c)]
    bar = None
    if progress and pending:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(pending) + len(rl_runs), desc="sweep", unit="run", file=sys.stderr)
    try:
        common = dict(url=url, jobs=jobs, threads=threads, overrides=overrides, device=device, log=log, bar=bar)
        _execute(runs, workers, force=force, controls=False, **common)
        finished = [c for c in rl_runs if c.status == "finished"]
        if bar is not None:
            bar.update(len(rl_runs) - len(finished))  # a failed RL run has no control to run
        _decide(finished, url, force=False, dry_run=False, controls=True)  # now control-only (or skipped)
        for cell in finished:
            if cell.action == "control":
                cell.status = "pending"
                continue
            cell.status = "finished"  # its control finished elsewhere meanwhile: this sweep still ran its RL run
            if bar is not None:
                bar.update(1)
        later = [c for c in pending if c.action == "control" and c.status == "pending"]
        _execute(controls_by_budget(later), workers, force=False, controls=True, **common)
    finally:
        if bar is not None:
            bar.close()
    return cells


def foreign_base_notes(cells: list[Cell], url: str) -> list[str]:
    """One line per base group the cells will train or use whose finished runs in the store all started from bases
    this machine's cache does not hold. The first cell then trains the base here, and its bits follow this CPU's
    kernels: unless this machine reproduces them, its runs form a new group beside the store's (the leaderboard
    groups runs by base). Said before any compute is spent; a bundle that ships the base (`export --bases`) fixes it.
    A store that does not exist yet has no runs to compare with."""
    from dare_bench.pipeline.base_cache import cached_bases
    from dare_bench.store import Store

    groups: dict[tuple, Cell] = {}
    for cell in cells:
        group = base_group(cell.cfg)
        if group is not None:
            groups.setdefault(group, cell)
    if not groups or (url.startswith("sqlite") and not _sqlite_file(url).exists()):
        return []
    cached = set(cached_bases())
    store = Store(url)
    try:
        runs = [r for r in store.latest_runs(status="finished", limit=None) if r.get("base_sha256")]
    finally:
        store.close()
    notes = []
    for (backbone, task, scale, preset, block_size, recipe), cell in groups.items():
        recipe = json.loads(recipe)
        theirs = sorted({r["base_sha256"] for r in runs
                         if (r["backbone"], r["task"], r["scale"]) == (backbone, task, scale)
                         and r["config"]["profile"]["model"]["preset"] == preset
                         and r["config"]["profile"]["model"].get("block_size") == block_size
                         and r["config"]["profile"]["base"] == recipe})
        if theirs and not cached.intersection(theirs):
            notes.append(f"note: {backbone} x {task} ({scale}): the store's runs started from base "
                         f"{', '.join(h[:8] for h in theirs)}, which this machine's base cache does not hold; "
                         f"{cell.name} seed {cell.seed} trains a base here, and unless this CPU reproduces its bits, "
                         "the new runs form a group of their own. To extend the store's group, ingest a bundle that "
                         "ships its base (`dare-bench export --bundle DIR --bases` on the machine that has it).")
    return notes


def _is_rl(cell: Cell) -> bool:
    return cell.cfg is not None and cell.cfg.profile.train.kind == "rl"


def controls_by_budget(cells: list[Cell]) -> list[Cell]:
    """The control-only cells in order of budget, smallest first, in the places they held: controls of one row
    and seed share one SFT trajectory (pipeline/control.py), so each continues where the one before it stopped."""
    slots = [i for i, c in enumerate(cells) if c.action == "control"]
    ordered = sorted((cells[i] for i in slots), key=lambda c: (c.budget is None, c.budget or 0.0))
    out = list(cells)
    for i, cell in zip(slots, ordered):
        out[i] = cell
    return out


def _decide(cells: list[Cell], url: str, *, force: bool, dry_run: bool, controls: bool = False) -> None:
    """Skip a cell whose identical run finished (unless `force`), and one whose run is in progress in a live process
    of this host (another sweep's); resume one whose last attempt in this store was interrupted (failed, or running
    in a process that is gone) and left a complete checkpoint in the run directory. With `controls`, a finished RL
    cell whose control has not finished runs just the control (`reproduce --control` skips the RL run). A dry run
    only reads: a store that does not exist yet is not created."""
    import socket

    from dare_bench.pipeline import previous_run
    from dare_bench.pipeline.base_cache import cached_base_hash
    from dare_bench.pipeline.context import run_directory
    from dare_bench.store import Store
    from dare_bench.trainers.checkpoint import latest_checkpoint

    if dry_run and url.startswith("sqlite") and not _sqlite_file(url).exists():
        return  # nothing recorded yet: every cell runs from the start
    store = Store(url)
    try:
        if not dry_run:
            store.mark_orphans_failed()  # rows of workers that died in an earlier sweep
        for cell in cells:
            cfg = cell.cfg
            if force:
                continue
            common = dict(name=cell.name, scale=cell.scale, seed=cell.seed, config_hash=cfg.content_hash,
                          modified=cfg.modified, metric=cell.metric)
            prev = previous_run(store, cfg, cell.seed, common, time.perf_counter())
            if prev is not None:
                cell.action, cell.run_id = "skip", prev.run_id
                cell.base, cell.final = prev.base_metrics.get(cell.metric), prev.metrics.get(cell.metric)
                run = store.get_run(prev.run_id)
                cell.wall_seconds = run["duration_s"]
                cell.message = prev.message
                if controls and cfg.profile.train.kind == "rl":
                    done = store.controls_of(run["uid"])
                    running = [] if done else [r for r in store.controls_of(run["uid"], status="running")
                                               if r["host"] == socket.gethostname()]  # alive: orphans are failed
                    if running:  # another sweep's worker runs this control now
                        cell.message = (f"its control (run {running[0]['id']}, pid {running[0]['pid']}) is running "
                                        "now; not started twice")
                        if not dry_run:
                            cell.status = "skipped"
                        continue
                    if not done:  # the RL run stands; its control is what is left to run
                        cell.action, cell.message = "control", "RL run finished; runs its compute-matched SFT control"
                        cell.budget = (run.get("compute") or {}).get("flops")
                        continue
                    cell.control = _final_metric(store, done[0]["id"], cell.metric)
                if not dry_run:
                    cell.status = "skipped"
                continue
            rows = store.find_runs(config_hash=cfg.content_hash, seed=cell.seed, status=None)
            elsewhere = [r for r in rows if r["status"] == "finished" and r.get("base_sha256")]
            if elsewhere:  # previous_run passed over them: they started from another base than this cache's
                cell.message = (f"its finished run {elsewhere[0]['id']} started from base "
                                f"{elsewhere[0]['base_sha256'][:8]}, this machine's cached base is "
                                f"{str(cached_base_hash(cfg))[:8]}: runs again here, in the row of this base")
            last = rows[0] if rows else None
            if last is not None and last["status"] == "running" and last["host"] == socket.gethostname():
                cell.action, cell.run_id = "skip", last["id"]  # alive: mark_orphans_failed left it running
                cell.message = f"run {last['id']} is running now (pid {last['pid']}); not started twice"
                if not dry_run:
                    cell.status = "skipped"
                continue
            found = latest_checkpoint(run_directory(cfg, cell.seed) / "checkpoints") if last is not None else None
            if found is not None:
                cell.action, cell.message = "resume", f"resumes from {found.name}"  # `reproduce --resume`
    finally:
        store.close()


def _final_metric(store, run_id: int, metric: str) -> float | None:
    finals = [e for e in store.evaluations(run_id) if e.get("checkpoint") == "final"]
    return finals[0]["metrics"].get(metric) if finals else None


def _sqlite_file(url: str) -> Path:
    return Path(url.split(":///", 1)[1]) if ":///" in url else Path(":memory:")


def _dry_run_plans(cells: list[Cell], *, overrides, device: str | None) -> None:
    """Each cell's `reproduce --dry-run` plan (nothing is written)."""
    from dare_bench.pipeline import reproduce

    for cell in cells:
        cell.status = "dry-run"
        try:
            res = reproduce(cell.name, cell.scale, seed=cell.seed, overrides=overrides, device=device, dry_run=True,
                            progress=False, log=lambda _msg: None)
        except DareBenchError as exc:
            cell.status, cell.message = "failed", str(exc)
        else:
            cell.plan = res.plan


def _execute(cells: list[Cell], workers, *, url: str, jobs: int, threads: int, overrides, device: str | None,
             force: bool, controls: bool, log: Callable[[str], Any], bar=None) -> None:
    """Run `cells`, at most `jobs` at once, advancing the sweep's progress `bar`."""
    from dare_bench.fileio import dare_bench_home

    logs = dare_bench_home() / "sweeps" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = cell_environment(threads)
    queue: deque[Cell] = deque(cells)
    running: dict[int, tuple[Cell, Any, Path, Path, float]] = {}
    started_groups: set = set()  # base groups with a cell started
    ready_groups: set = set()  # base groups whose base is cached (a cell logged its base evaluation, or ended)
    failed_groups: dict = {}  # base group -> the cell that failed while building that base
    try:
        while queue or running:
            for cell in _cells_of_failed_bases(queue, failed_groups):
                log(f"{cell.name} seed {cell.seed}: failed: {cell.message}")
                if bar is not None:
                    bar.update(1)
            while queue and len(running) < jobs:
                busy = {control_trajectory(c) for c, *_ in running.values()} - {None}
                cell = _next_cell(queue, started_groups, ready_groups, busy)
                if cell is None:  # every queued cell waits for its base, or for a control of its trajectory
                    break
                stem = f"{cell.name}-{cell.scale}-seed{cell.seed}"
                out_path, err_path = logs / f"{stem}.out", logs / f"{stem}.err"
                cell.log = str(err_path)
                cmd = cell_command(cell, db=url, overrides=overrides, device=device, force=force, controls=controls)
                handle = workers.start(cmd, env, out_path, err_path)
                running[id(handle)] = (cell, handle, out_path, err_path, time.perf_counter())
                started_groups.add(base_group(cell.cfg))
            if bar is not None:
                bar.set_postfix_str(", ".join(f"{c.name}/{c.seed}" for c, *_ in running.values())[:80])
            time.sleep(POLL_SECONDS)
            for key, (cell, handle, out_path, err_path, t0) in list(running.items()):
                group = base_group(cell.cfg)
                ended = workers.poll(handle)
                if ended is None:
                    if group is not None and group not in ready_groups and _base_ready(err_path, cell.metric):
                        ready_groups.add(group)
                    continue
                del running[key]
                outcome(cell, *ended, out_path, err_path)
                if (cell.status == "failed" and group is not None and group not in ready_groups
                        and not _base_ready(err_path, cell.metric)):  # its log, read after the end: no race
                    failed_groups[group] = cell  # it died before its base was evaluated: that base does not exist
                ready_groups.add(group)
                # a control-only cell's wall is its RL run's (from the store) and its control's
                base_wall = (cell.wall_seconds or 0.0) if cell.action == "control" else 0.0
                cell.wall_seconds = base_wall + time.perf_counter() - t0
                if cell.status == "failed":
                    _record_failure(cell, url)
                    log(f"{cell.name} seed {cell.seed}: failed: {cell.message} (log {cell.log})")
                if bar is not None:
                    bar.update(1)
    except BaseException:
        for cell, handle, *_ in running.values():  # Ctrl-C: no orphan workers; their rows become failed
            workers.stop(handle)
            cell.status, cell.message = "failed", "sweep interrupted"
        raise


def control_trajectory(cell: Cell) -> tuple | None:
    """Control-only cells with the same key continue one SFT trajectory (one base, one seed: pipeline/control.py);
    None for every other cell."""
    if cell.action != "control" or cell.cfg is None:
        return None
    return (cell.cfg.backbone, cell.cfg.task, base_group(cell.cfg), cell.seed)


def _next_cell(queue: deque, started: set, ready: set, busy_trajectories: frozenset | set = frozenset()
               ) -> Cell | None:
    """The first queued cell free to start: one needing no base, or whose base is not being built right now; a
    control-only cell also waits while a control of its trajectory runs (it would start that trajectory from step 0
    instead of continuing where the running one stops)."""
    for cell in list(queue):
        group = base_group(cell.cfg)
        if control_trajectory(cell) in busy_trajectories:
            continue
        if group is None or group not in started or group in ready:
            queue.remove(cell)
            return cell
    return None


def _cells_of_failed_bases(queue: deque, failed: dict) -> list[Cell]:
    """Take out of `queue` the cells whose shared base failed to build in this sweep, and mark them failed: each
    would train the same base again only to fail the same way (a base target the replica never reaches costs up to
    `max_steps` of SFT per cell). A rerun of the sweep retries them."""
    dropped = []
    for cell in list(queue):
        first = failed.get(base_group(cell.cfg))
        if first is not None:
            queue.remove(cell)
            cell.status = "failed"
            cell.message = (f"not started: its base failed to build in {first.name} seed {first.seed} "
                            f"({first.message[:200]}); rerun the sweep to retry")
            dropped.append(cell)
    return dropped


def _base_ready(err_path: Path, metric: str) -> bool:
    """Whether a running worker has logged its base evaluation (`pipeline.base_ready_prefix`)."""
    from dare_bench.pipeline import base_ready_prefix

    prefix = base_ready_prefix(metric)
    return any(line.startswith(prefix) for line in _read(err_path).splitlines())


def _record_failure(cell: Cell, url: str) -> None:
    """A killed worker left its run "running": mark it failed (its pid is gone) and name it in the cell."""
    from dare_bench.store import Store

    try:
        with Store(url) as store:
            store.mark_orphans_failed()
            rows = store.find_runs(config_hash=cell.cfg.content_hash, seed=cell.seed, status=None)
            if rows and rows[0]["status"] == "failed":
                cell.run_id = rows[0]["id"]
    except DareBenchError as exc:  # the store itself is the problem: the cell's message already says why it failed
        cell.message += f" (store: {exc})"


# --------------------------------------------------------------------------------------------------- reports

def sweep_summary(cells: list[Cell]) -> dict[str, Any]:
    """Counts per status and, per entry, the seed statistics of its finished / skipped cells (`seed_summary`)."""
    from dare_bench.pipeline.summary import ReproduceResult, seed_summary

    counts: dict[str, int] = {}
    for c in cells:
        counts[c.status] = counts.get(c.status, 0) + 1
    entries = {}
    for name in dict.fromkeys(c.name for c in cells):
        done = [c for c in cells if c.name == name and c.status in ("finished", "skipped") and c.final is not None]
        if done:
            results = [ReproduceResult(run_id=c.run_id, name=c.name, scale=c.scale, status=c.status, seed=c.seed,
                                       metrics={c.metric: c.final},
                                       base_metrics={} if c.base is None else {c.metric: c.base},
                                       control=None if c.control is None else ReproduceResult(
                                           run_id=None, name="control", scale=c.scale, status="finished",
                                           metrics={c.metric: c.control})) for c in done]
            entries[name] = seed_summary(results, done[0].metric)
    return {"cells": len(cells), "status": counts, "failed": counts.get("failed", 0), "entries": entries}


def table_lines(cells: list[Cell]) -> list[str]:
    """The end-of-sweep table, then mean ± 95% CI per entry with several seeds."""
    def num(v: float | None, fmt: str = "{:.3f}") -> str:
        return "-" if v is None else fmt.format(v)

    width = max([len(c.name) for c in cells] + [5])
    with_controls = any(c.control is not None for c in cells)  # --controls: each RL cell's SFT control final
    head = f"{'entry':<{width}} {'seed':>4}  {'status':<18} {'metric':<10} {'base':>7} -> {'final':<7} {'wall':>8}"
    head += f" {'control':>8}" if with_controls else ""
    lines = [head, "-" * len(head)]
    for c in cells:
        status = c.status + {"resume": " (resumed)", "control": " (control)"}.get(
            c.action, "") if c.status == "finished" else c.status
        if c.status == "dry-run":
            status = f"dry-run:{c.action}"
        seed = "-" if c.seed is None else str(c.seed)
        wall = "-" if c.wall_seconds is None else f"{c.wall_seconds:.0f}s"
        line = (f"{c.name:<{width}} {seed:>4}  {status:<18} {c.metric:<10} {num(c.base):>7} -> {num(c.final):<7} "
                f"{wall:>8}") + (f" {num(c.control):>8}" if with_controls else "")
        if c.status in ("failed", "not-runnable"):
            line += f"  {c.message}"
        lines.append(line)
    summary = sweep_summary(cells)
    for name, s in summary["entries"].items():
        if s["final"]["n"] > 1:
            cell = lambda st: f"{st['mean']:.3f}" + (f" ± {st['ci95']:.3f}" if st["ci95"] is not None else "")
            lines.append(f"{name}: {s['metric']} base {cell(s['base'])} -> final {cell(s['final'])} "
                         f"({s['final']['n']} seeds, 95% CI)"
                         + (f"; RL - SFT control {cell(s['vs_control'])}" if "vs_control" in s else ""))
    lines.append(", ".join(f"{n} {k}" for k, n in summary["status"].items()) + f" of {summary['cells']} cells")
    return lines


__all__ = ["Cell", "EXECUTORS", "LocalWorkers", "SubmititWorkers", "base_group", "cell_command", "cell_environment",
           "control_trajectory", "foreign_base_notes", "outcome", "parse_seeds", "plan_grid", "run_logged",
           "run_sweep", "select_entries", "sweep_summary", "table_lines"]
