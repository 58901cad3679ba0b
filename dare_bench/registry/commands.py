"""`dare-bench list` and `dare-bench show`: the reproduction registry on the command line.

    dare-bench list [--backbone llada] [--algorithm bgpo] [--task sudoku] [--json]
    dare-bench list --backbone llada,dream --task sudoku --task countdown   # filters: repeatable or comma lists
    dare-bench list --catalogue [--json]      # the algorithms (kind, plug-in, knobs), backbones and tasks
    dare-bench show bgpo-llada-sudoku [--json] [--scale tiny]

`list --json` prints a JSON array of {"name", "algorithm", "backbone", "task", "reported": [...]};
`list --catalogue --json` prints {"algorithms": [{"name", "kind", "plugin", "knobs"}], "backbones": [{"name",
"diffusion", "attention"}], "tasks": [...]} (`dare_bench.catalogue`, where every name list comes from);
`show NAME --json` prints {"name", "algorithm", "backbone", "task", "paper_ref", "grader", "file", "scales": {...},
"reported": [{"value", "metric", "source", "settings", "table", "note"}, ...]} (CI relies on these shapes).
`--reproductions DIR` (or env DARE_BENCH_REPRODUCTIONS) reads another registry directory.
"""

from __future__ import annotations

import json
from typing import List, Optional

import typer

from dare_bench import catalogue

# the filters of `list` and `sweep` (Registry.select): repeatable, each a name or a comma list
FILTER_HELP = "Repeatable or a comma list: "
REPRO_OPTION = typer.Option(None, "--reproductions", help="Registry directory (default: DARE_BENCH_REPRODUCTIONS "
                            "or the checkout's reproductions/).", show_default=False)


def _reported(spec) -> list[dict]:
    return [
        {"value": r.value, "metric": r.metric, "source": r.source.model_dump(mode="json", exclude_none=True),
         "settings": r.settings, "table": r.table, "note": r.note}
        for r in spec.reported
    ]


def catalogue_payload() -> dict:
    return {
        "algorithms": [{"name": a.name, "kind": a.kind, "plugin": a.plugin, "knobs": list(a.knob_names)}
                       for a in catalogue.algorithms().values()],
        "backbones": [{"name": b.name, "diffusion": b.diffusion, "attention": b.attention}
                      for b in catalogue.BACKBONES],
        "tasks": list(catalogue.task_names()),
    }


def _print_catalogue(as_json: bool) -> None:
    payload = catalogue_payload()
    if as_json:
        typer.echo(json.dumps(payload, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    algos = Table(title=f"{len(payload['algorithms'])} algorithms")
    for col in ("name", "kind", "plug-in", "knobs (train.algorithm)"):
        algos.add_column(col, overflow="fold")
    for a in payload["algorithms"]:
        algos.add_row(a["name"], a["kind"], a["plugin"] or "-", ", ".join(a["knobs"]) or "-")
    backbones = Table(title=f"{len(payload['backbones'])} backbones")
    for col in ("name", "diffusion", "attention"):
        backbones.add_column(col)
    for b in payload["backbones"]:
        backbones.add_row(b["name"], b["diffusion"], b["attention"])
    console = Console(width=200)
    console.print(algos)
    console.print(backbones)
    console.print(f"tasks: {', '.join(payload['tasks'])}")


def register(app: typer.Typer) -> None:
    @app.command("list")
    def list_cmd(
        backbone: Optional[List[str]] = typer.Option(None, help=FILTER_HELP + " | ".join(catalogue.backbone_names())),
        algorithm: Optional[List[str]] = typer.Option(None, help=FILTER_HELP + " | ".join(catalogue.algorithm_names())),
        task: Optional[List[str]] = typer.Option(None, help=FILTER_HELP + " | ".join(catalogue.task_names())),
        show_catalogue: bool = typer.Option(False, "--catalogue", help="List the algorithms, backbones and tasks "
                                            "the benchmark knows instead of the reproductions."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
        runnable: bool = typer.Option(False, "--runnable", help="Also say, per scale, whether it runs on this "
                                      "machine and if not why (no plug-in, GPU-only, missing data, not built); "
                                      "resolves every entry's data, so it takes a while."),
        reproductions: Optional[str] = REPRO_OPTION,
    ) -> None:
        """List reproductions (algorithm x backbone x task) with their scales and reported scores, or the catalogue."""
        if show_catalogue:
            _print_catalogue(as_json)
            return
        from dare_bench.registry import load_registry

        specs = load_registry(reproductions).select(backbone=backbone, algorithm=algorithm, task=task)
        here = {s.name: _runnable(s) for s in _progress(specs, runnable and not as_json)} if runnable else {}
        if as_json:
            typer.echo(json.dumps([
                {"name": s.name, "algorithm": s.algorithm, "backbone": s.backbone, "task": s.task,
                 "scales": list(s.scales), "reported": _reported(s),
                 **({"runnable": here[s.name]} if runnable else {})} for s in specs
            ], indent=1))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"{len(specs)} reproductions", show_lines=False)
        columns = ["name", "algorithm", "backbone", "task", "scales"]
        columns += ["runs here", "why not"] if runnable else []
        for col in [*columns, "reported (table: value)"]:
            table.add_column(col, overflow="fold")
        for s in specs:
            rep = "; ".join(
                f"{r.table}: {r.value:g}" + (f" (gen {r.settings['gen_length']})" if "gen_length" in r.settings else "")
                for r in s.reported
            ) or "-"
            row = [s.name, s.algorithm, s.backbone, s.task, " ".join(s.scales)]
            if runnable:
                verdicts = here[s.name]
                row.append(" ".join(k for k, v in verdicts.items() if v is None) or "-")
                row.append("; ".join(f"{k}: {v['kind']}" for k, v in verdicts.items() if v is not None) or "")
            table.add_row(*row, rep)
        Console(width=220).print(table)

    @app.command("show")
    def show_cmd(
        name: str = typer.Argument(..., help="Reproduction name, e.g. bgpo-llada-sudoku."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
        scale: Optional[str] = typer.Option(None, help="Show only this scale (paper | official | tiny | micro)."),
        reproductions: Optional[str] = REPRO_OPTION,
    ) -> None:
        """Show one reproduction: pinned config of every scale, and reported scores with their sources."""
        from dare_bench.registry import load_registry

        reg = load_registry(reproductions)
        spec = reg.get(name)
        scales = {k: v for k, v in spec.scales.items() if scale is None or k == scale}
        if scale is not None and not scales:
            spec.resolve(scale)  # raises with a suggestion
        payload = {
            "name": spec.name, "algorithm": spec.algorithm, "backbone": spec.backbone, "task": spec.task,
            "paper_ref": spec.paper_ref, "grader": spec.grader, "file": str(reg.files[spec.name]),
            "scales": {k: {**v.model_dump(mode="json"), "content_hash": _run_hash(spec, k)}
                       for k, v in scales.items()},
            "reported": _reported(spec),
        }
        if as_json:
            typer.echo(json.dumps(payload, indent=1))
            return
        import yaml

        typer.echo(f"{spec.name}: {spec.algorithm} on {spec.backbone}, task {spec.task}")
        typer.echo(f"paper: {spec.paper_ref}")
        typer.echo(f"file:  {payload['file']}")
        typer.echo("\nreported scores:" if spec.reported else "\nreported scores: none")
        for r in spec.reported:
            extra = ", ".join(f"{k}={v}" for k, v in r.settings.items())
            typer.echo(f"  {r.value:g} {r.metric}  [{r.table}]  source: {r.source.cite()}"
                       + (f"  ({extra})" if extra else ""))
            if r.note:
                typer.echo(f"      note: {r.note}")
        for k, v in scales.items():
            digest = payload["scales"][k]["content_hash"]
            typer.echo(f"\nscale {k} (config hash {digest[:12] if digest else 'unknown: ' + _data_missing(spec, k)}):")
            shown = v.model_dump(mode="json", exclude_none=True)
            if v.train.kind == "none":
                shown["train"] = {"kind": "none"}  # nothing is trained: the other fields are unused defaults
            body = yaml.safe_dump(shown, sort_keys=False, width=110)
            typer.echo("\n".join("  " + line for line in body.rstrip().splitlines()))


def _run_hash(spec, scale: str) -> str | None:
    """The hash a run of `scale` gets (its training data resolved, as the pipeline does); None when the data is
    not on this machine."""
    from dare_bench.errors import DataError

    try:
        return spec.resolve(scale, with_data=True).content_hash
    except DataError:
        return None


def _data_missing(spec, scale: str) -> str:
    from dare_bench.errors import DataError

    try:
        spec.resolve(scale, with_data=True)
    except DataError as exc:
        return str(exc)
    return ""


def _runnable(spec) -> dict[str, dict[str, str] | None]:
    """Per scale: None when it runs here, else {kind, reason} (registry.runnable)."""
    from dare_bench.registry.runnable import why_not_runnable

    out = {}
    for scale in spec.scales:
        verdict = why_not_runnable(spec, scale)
        out[scale] = None if verdict is None else {"kind": verdict[0], "reason": verdict[1]}
    return out


def _progress(items, show: bool):
    if not show:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc="checking", unit="entry", leave=False)
