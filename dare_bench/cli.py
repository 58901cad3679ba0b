"""`dare-bench` command line.

What it does: one entry point for the registry (list, show), the store (runs, export, ingest), evaluation (eval,
score), the real data (data get | list | verify), the main job (reproduce), CI checks (check), the leaderboard and
benchmarks (bench ...).

    dare-bench --help
    dare-bench reproduce bgpo-llada-sudoku          # tiny scale on CPU
    dare-bench leaderboard
    dare-bench check --run

Each area keeps its commands next to its code (`dare_bench/<area>/commands.py`, a `register(app)` function), so
this file only wires them together. Command modules import torch and friends lazily, inside the commands.
"""

from __future__ import annotations

import importlib
import os
import sys

import typer

from dare_bench.errors import DareBenchError, print_error

app = typer.Typer(
    name="dare-bench",
    help="Reproduce, evaluate and compare post-training algorithms for diffusion language models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Modules whose `register(app)` adds commands. Order = order in `--help`.
COMMAND_MODULES = [
    "dare_bench.registry.commands",
    "dare_bench.store.commands",
    "dare_bench.evaluators.commands",
    "dare_bench.models.commands",
    "dare_bench.tasks.commands",
    "dare_bench.pipeline.commands",
    "dare_bench.check",
    "dare_bench.leaderboard.commands",
    "dare_bench.bench",
]


def _register_all() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)


_register_all()


# invoke_without_command: else `dare-bench --version` alone is refused as "Missing command" (no arguments at all
# still print the help, exit 2: no_args_is_help)
@app.callback(invoke_without_command=True)
def _root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit.", is_eager=True),
) -> None:
    if version:
        from dare_bench import __version__

        typer.echo(__version__)
        raise typer.Exit(0)


def main() -> None:
    try:
        try:
            app()
        except DareBenchError as exc:
            print_error(exc, as_json="--json" in sys.argv[1:])
            sys.exit(exc.exit_code)
    except SystemExit as exc:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # a torchrun worker: skip the teardown gloo can abort in
            from dare_bench.trainers.distributed import exit_worker

            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
            exit_worker(exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1))
        raise


if __name__ == "__main__":
    main()
