"""`dare-bench data`: get, list and verify the real data of every task (DARE's verl parquet files, pinned in
`dare_bench/tasks/data_manifest.yaml`; see `dare_bench/tasks/data.py` for where each file comes from).

    dare-bench data list [--json] [--dir DIR]              # each file: task, split, present / pin ok, its sources
    dare-bench data get gsm8k math500 countdown sudoku     # DARE's files from GitHub raw at yjyddq/DARE@83ae8a3
    dare-bench data get all --from ~/src/DARE              # from a DARE checkout / its data/preprocessed/rl folder
    dare-bench data get gsm8k humaneval mbpp --hf          # the Hugging Face datasets, converted to DARE's rows
    dare-bench data get rl/test/mbpp_1.parquet --from mbpp_test.jsonl     # a local raw file, converted
    dare-bench data get lcbv5-K8 primeintellect-K8 taco-K8 --dry-run --json
    dare-bench data verify [--json] [--dir DIR]            # exit 2 when a present file is not the pinned one

Files go to `--out DIR`, else `$DARE_BENCH_DATA` (what the loaders read), laid out `rl/<split>/<file>`, each with a
`<file>.source.json` provenance record. arith and pyfunc are procedural: they need no files.
"""

from __future__ import annotations

import json
from typing import List, Optional

import typer

DIR_HELP = "Data directory (default: $DARE_BENCH_DATA)."


def register(app: typer.Typer) -> None:
    data_app = typer.Typer(help="The real data of every task: DARE's verl parquet files, pinned (get, list, "
                                "verify).", no_args_is_help=True)
    app.add_typer(data_app, name="data")

    @data_app.command("list")
    def list_cmd(
        directory: Optional[str] = typer.Option(None, "--dir", help=DIR_HELP, show_default=False),
        as_json: bool = typer.Option(False, "--json", help="Print JSON: {root, dare, procedural, files: [...]}."),
    ) -> None:
        """List every pinned data file: task, split, rows, whether it is present and pinned, where it comes from."""
        import os

        from dare_bench.tasks import data
        from dare_bench.tasks.base import DATA_ENV

        root = data.data_root(directory) if (directory or os.environ.get(DATA_ENV)) else None
        payload = data.listing(root)
        if as_json:
            typer.echo(json.dumps(payload, indent=1))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"{len(payload['files'])} data files (DARE {payload['dare']['repo']}@"
                            f"{payload['dare']['commit'][:7]}); root: {payload['root'] or '$DARE_BENCH_DATA unset'}")
        for col in ("file", "name", "tasks", "rows", "here", "sources", "license"):
            table.add_column(col, overflow="fold")
        for f in payload["files"]:
            table.add_row(f["file"], f["name"], ", ".join(f["tasks"]), "?" if f["rows"] is None else str(f["rows"]),
                          f.get("status", "-"), ", ".join(f["sources"]), f["license"])
        console = Console(width=200)
        console.print(table)
        console.print(f"procedural (no files): {', '.join(payload['procedural'])}")

    @data_app.command("get")
    def get_cmd(
        names: List[str] = typer.Argument(..., help="Tasks (gsm8k, math500, humaneval, mbpp, countdown, sudoku), "
                                                    "DARE data names (countdown-n20000, lcbv5-K8, ...), files "
                                                    "(rl/test/gsm8k_1.parquet) or all.", show_default=False),
        from_path: Optional[str] = typer.Option(None, "--from", help="A DARE checkout / folder to copy from, or a "
                                                "local raw file (jsonl / json / parquet / csv) to convert into the "
                                                "one named file.", show_default=False),
        hf: bool = typer.Option(False, "--hf", help="Convert the task's Hugging Face dataset (network) instead of "
                                                    "copying DARE's file."),
        revision: Optional[str] = typer.Option(None, "--revision", help="Hub revision for --hf (default: the "
                                               "manifest's, main).", show_default=False),
        out: Optional[str] = typer.Option(None, "--out", help="Data directory to write (default: "
                                          "$DARE_BENCH_DATA).", show_default=False),
        dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be fetched and written; touch "
                                     "nothing (no network)."),
        as_json: bool = typer.Option(False, "--json", help="Print a JSON report."),
    ) -> None:
        """Fetch or convert the named data files, check them against their pins, write them atomically."""
        from dare_bench.tasks import data

        report = data.get(names, from_path=from_path, hf=hf, out=out, dry_run=dry_run, revision=revision,
                          progress=not as_json, log=(lambda m: None) if as_json else
                          (lambda m: typer.echo(m, err=True)))
        if as_json:
            typer.echo(json.dumps({"status": "ok", **report}, indent=1))
            return
        for name in report["procedural"]:
            typer.echo(f"{name}: procedural (generated at load time), no files needed")
        for f in report["files"]:
            extra = f" ({f['rows']} rows, checked by {f['checked_by']})" if f["action"] == "written" else ""
            if f["action"] == "present":
                typer.echo(f"{f['path']}: already present, {f['status']}")
            else:
                typer.echo(f"{f['path']}: {f['action']}{extra} <- {f['source']}")
        if report["files"] and not dry_run:
            import os

            from dare_bench.tasks.base import DATA_ENV

            if os.path.abspath(os.environ.get(DATA_ENV) or "") != os.path.abspath(report["root"]):
                typer.echo(f"the loaders read ${DATA_ENV}: export {DATA_ENV}={report['root']}", err=True)

    @data_app.command("verify")
    def verify_cmd(
        directory: Optional[str] = typer.Option(None, "--dir", help=DIR_HELP, show_default=False),
        as_json: bool = typer.Option(False, "--json", help="Print JSON: {root, status, files, mismatched}."),
    ) -> None:
        """Check every present data file against its pin (sha256, git blob id or DARE's rows); exit 2 on a mismatch."""
        from dare_bench.errors import DataError
        from dare_bench.tasks import data

        report = data.verify(data.data_root(directory))
        if as_json:
            typer.echo(json.dumps(report, indent=1))
            if report["status"] != "ok":
                raise typer.Exit(DataError.exit_code)
            return
        for f in report["files"]:
            typer.echo(f"{f['status']:>10}  {f['path']}" + (f"  (expected {f['expected']}, got {f['sha256']})"
                                                          if f["status"] == "mismatch" else ""))
        if report["status"] != "ok":
            raise DataError(f"{len(report['mismatched'])} data file(s) differ from their pins: "
                            f"{', '.join(report['mismatched'])}")
