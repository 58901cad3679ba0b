"""`dare-bench runs`, `dare-bench export`, `dare-bench ingest`: the results store on the command line.

    dare-bench runs [--reproduction NAME] [--scale tiny] [--status finished] [--limit 20] [--json]
    dare-bench export --format csv|json [--output FILE]      # one row per evaluation, joined with its run
    dare-bench export --format csv --what reported           # published scores with their sources
    dare-bench ingest PATH                                    # result files from separate evaluation jobs

Every command takes `--db` (a path or any SQLAlchemy URL; default: env DARE_BENCH_DB, else
$DARE_BENCH_HOME/results.db). `ingest` validates every file before writing anything (a run record whose
config_hash is not the hash of its stored config, i.e. an edited record, or one without its package / machine
record is refused), writes them in one
transaction, and skips what is already there (re-ingesting is a no-op); it also refreshes the reported scores
from the registry. Result files (`"format": "dare-bench-result"`) are written by jobs that run apart from the
database with `dare_bench.store.write_result_file`; the JSON of `dare-bench eval --output` is an evaluation
report with no run record, not a result file, and `ingest` refuses it.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Optional

import typer

from dare_bench.fileio import DB_HELP

DB_OPTION = typer.Option(None, "--db", help=DB_HELP, show_default=False)

EXPORT_COLUMNS = (
    "run_id", "run_uid", "reproduction", "algorithm", "backbone", "task", "scale", "seed", "status", "modified",
    "config_hash", "code_version", "evaluation_id", "split", "data_fingerprint", "sampler_preset", "step",
    "checkpoint", "metric", "value", "n_items", "created_at",
)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _progress_text(progress: dict) -> str:
    """A running run's place for the `runs` table: "step 19/50, logged 2 min ago, ~43 min left" (the time left
    counted from now)."""
    from datetime import datetime, timezone

    if progress["step"] is None:
        return "no step logged yet"
    text = f"step {progress['step']}" + (f"/{progress['total']}" if progress["total"] else "")
    ago = (datetime.now(timezone.utc) - datetime.fromisoformat(progress["logged_at"])).total_seconds()
    text += f", logged {_minutes(max(ago, 0))} ago"
    if progress["eta_seconds"] is not None:
        # the estimate is at the last log; counted from now, so a run whose steps should be over says so
        left = progress["eta_seconds"] - max(ago, 0)
        text += f", ~{_minutes(left)} left" if left > 0 else ", its steps are due by now (evaluating, or stopped)"
    return text


def _score_text(evaluations: list[dict]) -> str:
    """A run's evaluations for the `runs` table, one group per task / split / metric, each checkpoint named and in
    training order: "countdown test accuracy: base 0.3086, step-25 0.3047, final 0.3672" (unnamed ones, e.g. a plain
    `eval`, show the value alone)."""
    groups: dict[tuple, list[dict]] = {}
    for e in evaluations:
        groups.setdefault((e["task"], e["split"], e["primary_metric"]), []).append(e)
    parts = []
    for (task, split, metric), evs in groups.items():
        # base first, then by step; "final" carries the last step, so it sorts after the periodic evaluations
        evs = sorted(evs, key=lambda e: (e["checkpoint"] != "base", e["step"] or 0, e["checkpoint"] == "final"))
        values = ", ".join((f"{e['checkpoint']} " if e["checkpoint"] else "") + f"{e['value']:.4g}" for e in evs)
        parts.append(f"{task} {split} {metric}: {values}")
    return "; ".join(parts) or "-"


def register(app: typer.Typer) -> None:
    @app.command("runs")
    def runs_cmd(
        reproduction: Optional[str] = typer.Option(None, help="Only runs of this reproduction."),
        scale: Optional[str] = typer.Option(None, help="paper | official | tiny | micro"),
        status: Optional[str] = typer.Option(None, help="running | finished | failed"),
        limit: int = typer.Option(50, help="Newest N runs (0 = all)."),
        as_json: bool = typer.Option(False, "--json", help="Print a JSON array."),
        db: Optional[str] = DB_OPTION,
    ) -> None:
        """List recorded runs, newest first, with their final scores; a running one shows its last logged step,
        how long ago, and the time left at its recent pace (`--json`: its "progress")."""
        from dare_bench.errors import ConfigError
        from dare_bench.store import Store
        from dare_bench.store.models import RUN_STATUSES

        if status is not None and status not in RUN_STATUSES:
            raise ConfigError(f"unknown status {status!r} (one of {', '.join(RUN_STATUSES)})")
        if reproduction is not None:
            from dare_bench.registry import load_registry

            load_registry().get(reproduction)  # a typo gets the closest names, not an empty list
        store = Store(db)
        runs = store.latest_runs(reproduction=reproduction, scale=scale, status=status, limit=limit or None)
        if as_json:
            typer.echo(json.dumps(runs, indent=1))
            return
        if not runs:
            typer.echo(f"no runs in {store.url}")
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"runs in {store.url}")
        for col in ("id", "reproduction", "scale", "seed", "status", "score", "started", "config"):
            table.add_column(col)
        for r in runs:
            score = _score_text(r["evaluations"])
            if "progress" in r:
                score = _progress_text(r["progress"]) + ("; " + score if score != "-" else "")
            cfg = r["config_hash"][:10] + (" (modified)" if r["modified"] else "")
            table.add_row(str(r["id"]), r["reproduction"], r["scale"], str(r["seed"]), r["status"], score,
                          r["started_at"][:19], cfg)
        Console(width=200).print(table)

    @app.command("export")
    def export_cmd(
        fmt: Optional[str] = typer.Option(None, "--format", help="csv | json (one table)"),
        bundle: Optional[Path] = typer.Option(None, "--bundle", help="Write a results bundle here instead: one "
                                              "result file per finished run with its full run record, which "
                                              "`dare-bench ingest` reads (how a reproduction is published)."),
        scale: Optional[str] = typer.Option(None, "--scale", help="--bundle: only runs of this scale."),
        backbone: Optional[str] = typer.Option(None, "--backbone", help="--bundle: only runs of this backbone."),
        reproduction: Optional[str] = typer.Option(None, "--reproduction", help="--bundle: only reproductions "
                                                   "matching this glob, e.g. 'd1-*-sudoku'."),
        base: Optional[str] = typer.Option(None, "--base", help="--bundle: only runs that started from this SFT "
                                           "base (a prefix of its weight hash, as in the leaderboard's "
                                           "'task @ base' rows, e.g. 600deec0)."),
        bases: bool = typer.Option(False, "--bases", help="--bundle: also write the tiny / micro SFT bases the "
                                   "runs started from (from this machine's base cache, to <bundle>/bases/), so that "
                                   "whoever ingests the bundle extends these runs from the same weights."),
        what: str = typer.Option("evaluations", "--what", help="evaluations (one row per evaluation, with its run) "
                                 "| reported (published scores, as last synced by `ingest`)"),
        output: Optional[Path] = typer.Option(
            None, "--output", "-o", help="Write here (atomically) instead of stdout."
        ),
        db: Optional[str] = DB_OPTION,
    ) -> None:
        """Export every evaluation with its run's identity (one row each) as CSV or JSON, or runs as a bundle."""
        from dare_bench.errors import ConfigError
        from dare_bench.store import Store

        if (fmt is None) == (bundle is None):
            raise ConfigError("give exactly one of --format csv|json (a table) or --bundle DIR (result files)")
        if bundle is None and (scale or backbone or reproduction or base or bases):
            raise ConfigError("--scale / --backbone / --reproduction / --base / --bases select what a --bundle holds")
        if bundle is not None:
            from dare_bench.pipeline.shared_bases import bases_of_runs, write_bases
            from dare_bench.store.bundle import bundle_runs, export_bundle

            store = Store(db)
            # the bases are found before anything is written: a base missing here writes nothing
            runs = bundle_runs(store, scale=scale, backbone=backbone, reproduction=reproduction, base=base)
            base_dirs = bases_of_runs(runs) if bases else []
            paths = export_bundle(store, bundle, runs=runs)  # the one selection, read once
            shared = f" and {len(write_bases(base_dirs, bundle))} SFT base(s)" if bases else ""
            typer.echo(f"wrote {len(paths)} result file(s){shared} to {bundle} (load them with "
                       f"`dare-bench ingest {bundle}`)")
            return
        if fmt not in ("csv", "json"):
            raise ConfigError(f"--format must be csv or json, not {fmt!r}")
        if what not in ("evaluations", "reported"):
            raise ConfigError(f"--what must be evaluations or reported, not {what!r}")
        store = Store(db)
        rows = store.export_rows() if what == "evaluations" else store.reported()
        if fmt == "json":
            text = json.dumps(rows, indent=1) + "\n"
        elif what == "reported":
            buf = io.StringIO()
            writer = csv.writer(buf, lineterminator="\n")
            cols = ("reproduction", "algorithm", "backbone", "task", "table", "metric", "value")
            writer.writerow([*cols, "source", "settings", "note"])
            for r in rows:
                src = r["source"]
                cite = ", ".join(str(v) for v in (src["ref"], src["commit"], src["file"], src["table"]) if v)
                writer.writerow([r[c] for c in cols]
                                + [cite, json.dumps(r["settings"], sort_keys=True), r["note"] or ""])
            text = buf.getvalue()
        else:
            buf = io.StringIO()
            metric_keys = sorted({k for r in rows for k in r["metrics"]})
            writer = csv.writer(buf, lineterminator="\n")
            writer.writerow([*EXPORT_COLUMNS, *(f"metric:{k}" for k in metric_keys)])
            for r in rows:
                writer.writerow([r[c] for c in EXPORT_COLUMNS] + [r["metrics"].get(k, "") for k in metric_keys])
            text = buf.getvalue()
        if output is None:
            typer.echo(text, nl=False)
        else:
            from dare_bench.fileio import atomic_write_text

            atomic_write_text(output, text)
            typer.echo(f"wrote {len(rows)} rows to {output}", err=True)

    @app.command("ingest")
    def ingest_cmd(
        path: Path = typer.Argument(..., help="A result file, or a directory searched for *.json / *.json.gz files."),
        db: Optional[str] = DB_OPTION,
        sync_reported: bool = typer.Option(True, help="Also refresh reported scores from the registry."),
    ) -> None:
        """Load result files (dare_bench.store.write_result_file) of separate jobs (idempotent; all or nothing).
        A bundle's shared SFT bases (`export --bundle --bases`) are verified first and installed in the base cache."""
        from dare_bench.pipeline.shared_bases import bundle_bases, install_bases
        from dare_bench.store import Store

        shared = bundle_bases(path)  # verified before anything is written: an edited base refuses the ingest
        store = Store(db)
        counts = store.ingest(path)
        msg = (f"ingested {counts['files']} file(s): {counts['runs']} new run(s), {counts['evaluations']} new "
               f"evaluation(s), {counts['metrics']} metric step(s); {counts['skipped_evaluations']} already present")
        if shared:
            placed = install_bases(shared)
            msg += (f"; bases: {len(placed['installed'])} installed in the base cache, {len(placed['present'])} "
                    "already there")
            if placed["kept"]:
                msg += (f", {len(placed['kept'])} not installed because this cache holds another base of the same "
                        f"recipe ({', '.join(placed['kept'])}: your own, kept)")
            if placed["stale"]:
                msg += (f", {len(placed['stale'])} not installed because another version of dare-bench's base "
                        f"training built them ({', '.join(placed['stale'])})")
        if sync_reported:
            from dare_bench.registry import load_registry

            n = store.sync_reported(load_registry())
            msg += f"; {n} reported scores synced"
        typer.echo(msg)
