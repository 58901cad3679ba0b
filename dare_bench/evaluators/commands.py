"""`dare-bench eval` and `dare-bench score`: evaluate a backbone on a task, or grade existing completions.

    dare-bench eval --model tiny-llada --task sudoku --limit 8                  # CPU, tiny replica, `tiny` preset
    dare-bench eval --model /ckpt/LLaDA-8B-Instruct --task gsm8k --preset d1-llada --device cuda --json
    dare-bench eval --model tiny-llada --task sudoku --limit 4 --engine opencompass   # needs the opencompass extra
    dare-bench eval --model tiny-llada --task sudoku --limit 4 --preset tiny --set gen_length=64 --set steps=64
    dare-bench eval --model /ckpt/LLaDA-8B-Instruct --task gsm8k --device cuda --dtype bfloat16 --attention flash_attn
    dare-bench score --task gsm8k --predictions preds.jsonl [--data test.parquet] [--grader strict] --json

`score` reads one JSON object per line, `{"index": <item index in the data>, "completion": "..."}` (a `"task"`
field, when present, must name the task scored: a predictions file of another benchmark is refused), and prints
`{"task", "items": [{"index", "correct", "reward", "extracted"}, ...], "metrics": {...}}` (one item per input line,
in input order). Bad input (unknown task, unreadable data, missing indices) is one `error: ...` line, exit 2; a
malformed completion is scored wrong and logged. torch and OpenCompass are imported only inside the commands.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from dare_bench.errors import DareBenchError


def _fail(exc: DareBenchError) -> None:
    typer.echo(f"error: {exc}", err=True)
    raise typer.Exit(exc.exit_code)


def _print_items(items, metrics, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=title)
    for col in ("index", "verdict", "reward", "extracted"):
        table.add_column(col)
    for r in items:
        extracted = r.get("extracted")
        table.add_row(str(r["index"]), "correct" if r["correct"] else "wrong", f"{r['reward']:.3g}",
                      "" if extracted is None else str(extracted)[:60])
    console.print(table)
    shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in metrics.items()}
    console.print(" ".join(f"{k}={v}" for k, v in shown.items()))


def _parse_overrides(pairs: list[str]) -> dict:
    """key=value pairs; values parse as JSON when they can (64, 0.9, true, null), else stay strings."""
    from dare_bench.errors import ConfigError

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {pair!r}")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def _evaluate_with_attention(model_ref: str, task_name: str, attention: str, **kw):
    """`evaluate` on a model loaded here (as the evaluator loads it) with its attention backend switched; the
    checkpoint path the evaluator records for a directory is kept."""
    from dare_bench.evaluators.evaluator import evaluate, load_model, resolve_task
    from dare_bench.models import set_attention

    loaded = load_model(model_ref, resolve_task(task_name), device=kw["device"], dtype=kw["dtype"], seed=kw["seed"])
    set_attention(loaded.model, attention)
    result = evaluate(loaded.model, task_name, tokenizer=loaded.tokenizer, **kw)
    result.model, result.checkpoint = loaded.name, loaded.checkpoint
    return result


def register(app: typer.Typer) -> None:
    @app.command("eval")
    def eval_command(
        model: str = typer.Option(..., "--model", help="Checkpoint directory or model preset (tiny-llada, ...)."),
        task: str = typer.Option(..., "--task", help="Task name (sudoku, countdown, gsm8k, math500, humaneval, mbpp)."),
        preset: Optional[str] = typer.Option(
            None, "--preset", help="Sampler preset (default: pinned per backbone x task; `tiny` for tiny models)."
        ),
        limit: Optional[int] = typer.Option(None, "--limit", help="Evaluate the first N items only (smoke runs)."),
        as_json: bool = typer.Option(
            False, "--json", help="Print one JSON object: task, model, preset, metrics, items."
        ),
        engine: str = typer.Option("native", "--engine", help="native | opencompass"),
        grader: Optional[str] = typer.Option(None, "--grader", help="Task grader (default: the task's own default)."),
        data: Optional[str] = typer.Option(
            None, "--data", help="Data source (file, generator[:seed], hf:id@rev); default: the task's test split."
        ),
        split: str = typer.Option("test", "--split"),
        seed: int = typer.Option(0, "--seed"),
        batch_size: Optional[int] = typer.Option(None, "--batch-size"),
        device: str = typer.Option("cpu", "--device"),
        dtype: str = typer.Option("float32", "--dtype"),
        output: Optional[Path] = typer.Option(
            None, "--output",
            help="Also write the full evaluation report (with completions) to this JSON file "
                 "(a report, not an `ingest` result file).",
        ),
        work_dir: Optional[Path] = typer.Option(
            None, "--work-dir", help="OpenCompass work directory (engine opencompass)."
        ),
        overrides: list[str] = typer.Option(
            [], "--set",
            help="Override a sampler setting of the preset: key=value (repeatable), e.g. --set gen_length=64.",
        ),
        attention: str = typer.Option(
            "sdpa", "--attention",
            help="Attention backend: sdpa | flash_attn (CUDA, the gpu extra) | flex (native engine only).",
        ),
    ) -> None:
        """Evaluate a backbone on a task with a pinned sampler preset; print metrics (and items with --json)."""
        try:
            if engine not in ("native", "opencompass"):
                from dare_bench.errors import ConfigError

                raise ConfigError(f"unknown engine {engine!r}; use native or opencompass")
            progress = sys.stderr.isatty()
            settings = _parse_overrides(overrides)
            if settings and engine == "opencompass":
                from dare_bench.errors import ConfigError

                raise ConfigError("--set works with the native engine only; pin a preset for OpenCompass runs")
            from dare_bench.models.layers import check_backend

            check_backend(attention)  # before any loading: a missing extra is one line naming it
            if attention != "sdpa" and engine == "opencompass":
                from dare_bench.errors import ConfigError

                raise ConfigError("--attention works with the native engine only")
            if engine == "opencompass":
                from dare_bench.evaluators.opencompass import run_opencompass_eval

                result = run_opencompass_eval(model, task, preset=preset, limit=limit, grader=grader, source=data,
                                              split=split, seed=seed, batch_size=batch_size, device=device,
                                              dtype=dtype, work_dir=work_dir)
            elif attention == "sdpa":  # what every load gives
                from dare_bench.evaluators.evaluator import evaluate

                result = evaluate(model, task, preset=preset, limit=limit, grader=grader, source=data, split=split,
                                  seed=seed, batch_size=batch_size, device=device, dtype=dtype, progress=progress,
                                  overrides=settings)
            else:
                result = _evaluate_with_attention(model, task, attention, preset=preset, limit=limit, grader=grader,
                                                  source=data, split=split, seed=seed, batch_size=batch_size,
                                                  device=device, dtype=dtype, progress=progress, overrides=settings)
        except DareBenchError as exc:
            _fail(exc)
        payload = result.to_json()
        payload["engine"] = engine
        payload["attention"] = attention
        if output is not None:
            from dare_bench.fileio import atomic_write_json

            atomic_write_json(output, payload)
        if as_json:
            typer.echo(json.dumps(payload))
        else:
            _print_items(payload["items"], payload["metrics"],
                         f"{payload['task']} - {payload['model']} - preset {payload['preset']} ({engine})")

    @app.command("score")
    def score_command(
        task: str = typer.Option(..., "--task", help="Task name."),
        predictions: Path = typer.Option(
            ..., "--predictions", help='JSONL: {"index": int, "completion": str} per line.'
        ),
        data: Optional[str] = typer.Option(
            None, "--data", help="File whose rows the indices refer to (default: the task's standard test split)."
        ),
        grader: Optional[str] = typer.Option(None, "--grader", help="Task grader (default: the task's own default)."),
        as_json: bool = typer.Option(False, "--json", help='Print {"task", "items", "metrics"} as one JSON object.'),
    ) -> None:
        """Grade a file of existing completions without any model; print per-item verdicts and the aggregate."""
        try:
            from dare_bench.evaluators.evaluator import score_predictions

            result = score_predictions(task, predictions, data=data, grader=grader, progress=sys.stderr.isatty())
        except DareBenchError as exc:
            _fail(exc)
        payload = result.to_json()
        if as_json:
            typer.echo(json.dumps(payload))
        else:
            _print_items(payload["items"], payload["metrics"], f"{payload['task']} - {predictions}")
