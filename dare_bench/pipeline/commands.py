"""`dare-bench reproduce NAME`: the main job (the stages are `dare_bench/pipeline/`, see its `__init__.py`).

    dare-bench reproduce d1-llada-sudoku                  # tiny scale on a CPU machine
    dare-bench reproduce sft-llada-sudoku --scale micro --json
    dare-bench reproduce bgpo-llada-sudoku --scale paper --checkpoint /ckpt/LLaDA-8B-Instruct --dry-run
    dare-bench reproduce d1-llada-gsm8k --scale paper --checkpoint SHRUNK --device cpu --nproc 2 train.steps=2
    dare-bench reproduce --help
    dare-bench calibrate sft-llada-arith --at 100,150,200    # scan a tiny base's SFT steps (pipeline/calibrate.py)
    dare-bench eval-suite llada --checkpoint /ckpt/LLaDA-8B-Instruct   # DARE's evaluation table (pipeline/suite.py)
    dare-bench sweep --scale tiny --backbone llada --task sudoku --jobs 2   # reproductions x seeds (pipeline/sweep.py)
"""

from __future__ import annotations

import json
import sys
from typing import List, Optional

import typer

from dare_bench.fileio import DB_HELP


def register(app: typer.Typer) -> None:
    @app.command("reproduce")
    def reproduce_cmd(
        name: str = typer.Argument(..., help="Reproduction, e.g. d1-llada-sudoku (see `dare-bench list`)."),
        overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides, e.g. train.lr=1e-5 "
                                                                   "(the run is then marked modified)."),
        scale: Optional[str] = typer.Option(None, "--scale", help="micro | tiny | paper (default: tiny without a "
                                                                  "GPU, paper with one)."),
        seed: Optional[int] = typer.Option(None, "--seed", help="Run this one seed (default: every seed the scale "
                                           "pins, e.g. 3 at tiny, then a per-seed table with mean ± 95% CI; --json "
                                           "then prints {runs, summary})."),
        db: Optional[str] = typer.Option(None, "--db", help=DB_HELP, show_default=False),
        resume: bool = typer.Option(False, "--resume", help="Continue from the run's last checkpoint."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print the resolved plan; run nothing."),
        force: bool = typer.Option(False, "--force", help="Run even if an identical finished run exists."),
        checkpoint: Optional[str] = typer.Option(None, "--checkpoint", help="Real checkpoint dir (paper scale)."),
        device: Optional[str] = typer.Option(None, "--device", help="cpu | cuda (default: cpu, cuda at paper; "
                                             "paper on cpu only when asked, for shrunk checkpoints)."),
        nproc: Optional[int] = typer.Option(None, "--nproc", min=1, help="Ranks: run under torchrun with N "
                                            "processes (GPUs, or CPU cores with gloo); FSDP2-sharded, rank 0 "
                                            "writes. --dry-run prints the torchrun command."),
        attention: Optional[str] = typer.Option(None, "--attention", help="Attention backend: sdpa | flash_attn "
                                                "| flex (= the override model.attention=...; the run is modified)."),
        control: bool = typer.Option(False, "--control", help="After each RL run, its compute-matched SFT control: "
                                     "sft-<backbone>-<task> from the same base for the FLOPs the RL run counted, "
                                     "stored linked to it (the leaderboard's RL - control)."),
        as_json: bool = typer.Option(False, "--json", help="Print a JSON object at the end (CI reads it)."),
    ) -> None:
        """Run a reproduction end to end: base -> algorithm -> evaluation -> store."""
        overrides = [*(overrides or []), *([f"model.attention={attention}"] if attention else [])]
        from dare_bench.pipeline import reproduce, reproduce_seeds, summary_lines
        from dare_bench.pipeline.launch import write_result
        from dare_bench.pipeline.summary import seed_summary, seed_table_lines
        from dare_bench.trainers.distributed import dist_info

        log = (lambda msg: typer.echo(msg, err=True)) if as_json else typer.echo
        if control:  # refused before any run: a control compares RL with SFT
            from dare_bench.errors import ConfigError
            from dare_bench.pipeline import default_scale, resolve

            kind = resolve(name, scale or default_scale(), list(overrides or []))[1].profile.train.kind
            if kind != "rl":
                raise ConfigError(f"--control applies to RL reproductions; {name} trains with kind {kind}")
        options = dict(db=db, resume=resume, overrides=list(overrides or []), force=force, checkpoint=checkpoint,
                       device=device, nproc=nproc, progress=sys.stderr.isatty() or not as_json, log=log)
        if seed is None and not dry_run:  # every pinned seed of the scale
            results = reproduce_seeds(name, scale, **options)
        else:
            results = [reproduce(name, scale, seed=seed, dry_run=dry_run, **options)]
        if not dist_info().is_main:  # a torchrun job: rank 0 reports for every rank
            return
        if control and not dry_run:
            from dare_bench.pipeline.control import run_control

            for r in results:
                r.control = run_control(r, db=db, log=log, progress=options["progress"], force=force)
        if len(results) > 1:
            metric = results[0].metric
            if as_json:
                typer.echo(json.dumps({"name": name, "scale": results[0].scale, "status": "finished",
                                       "runs": [r.to_json() for r in results],
                                       "summary": seed_summary(results, metric)}, default=str))
                return
            for r in results:
                for line in summary_lines(r, r.metric):
                    typer.echo(line)
            typer.echo("")
            for line in seed_table_lines(results, metric):
                typer.echo(line)
            return
        result = results[0]
        if write_result(result):  # a rank of a `--nproc` job: the parent reports
            return
        if as_json:
            typer.echo(json.dumps(result.to_json(), default=str))
        elif result.status == "dry-run":
            typer.echo(json.dumps(result.plan, indent=2, default=str))
        else:
            for line in summary_lines(result, result.metric):
                typer.echo(line)

    @app.command("eval-suite")
    def eval_suite_cmd(
        backbone: str = typer.Argument(..., help="A backbone of DARE's evaluation table: llada | dream | sdar | "
                                                 "sdar30b | llada2 | llada2.1."),
        overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides for every benchmark, e.g. "
                                                                   "eval.sampler.extra.use_cache=none (a protocol "
                                                                   "variant: the runs are marked modified)."),
        benchmarks: Optional[str] = typer.Option(None, "--benchmarks", help="Comma-separated subset, e.g. "
                                                 "gsm8k,mmlu (default: every benchmark the model has)."),
        checkpoint: Optional[str] = typer.Option(None, "--checkpoint", help="The released checkpoint's dir."),
        shrunk: bool = typer.Option(False, "--shrunk", help="CPU check of the path: a shrunk checkpoint of the "
                                    "released config (random weights, built once) and a short generation."),
        limit: Optional[int] = typer.Option(None, "--limit", min=1, help="First N items of each benchmark."),
        shard: Optional[str] = typer.Option(None, "--shard", help="K/N: job K of N runs every N-th benchmark."),
        device: Optional[str] = typer.Option(None, "--device", help="cpu | cuda (default: cuda; cpu with "
                                             "--shrunk)."),
        nproc: Optional[int] = typer.Option(None, "--nproc", min=1, help="Ranks per benchmark (torchrun): "
                                            "each benchmark's items sharded over N GPUs."),
        db: Optional[str] = typer.Option(None, "--db", help=DB_HELP, show_default=False),
        force: bool = typer.Option(False, "--force", help="Re-run benchmarks whose identical run finished."),
        engine: str = typer.Option("native", "--engine", help="native | opencompass (the plug-in: needs the "
                                   "opencompass extra; the runs record eval.engine)."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Plan every benchmark; run nothing."),
        as_json: bool = typer.Option(False, "--json", help="Print {backbone, rows} as JSON (CI reads it)."),
    ) -> None:
        """Every benchmark of DARE's evaluation table for one released model: stored runs and ours vs DARE's."""
        from dare_bench.pipeline.suite import parse_shard, rows_json, run_suite, table_lines

        log = (lambda msg: typer.echo(msg, err=True)) if as_json else typer.echo
        chosen = [b.strip() for b in benchmarks.split(",") if b.strip()] if benchmarks else None
        rows = run_suite(backbone, benchmarks=chosen, checkpoint=checkpoint, shrunk=shrunk, device=device,
                         limit=limit, shard=parse_shard(shard), overrides=list(overrides or []), db=db, force=force,
                         nproc=nproc, dry_run=dry_run, engine=engine,
                         progress=sys.stderr.isatty() and not as_json, log=log)
        if as_json:
            typer.echo(json.dumps({"backbone": backbone, "rows": rows_json(rows)}))
        else:
            for line in table_lines(backbone, rows):
                typer.echo(line)
        if any(r.status == "failed" for r in rows):
            raise typer.Exit(1)

    @app.command("sweep")
    def sweep_cmd(
        patterns: Optional[List[str]] = typer.Argument(None, help="Reproduction names or globs, e.g. "
                                                       "'*-llada-sudoku' (default: every entry the filters keep)."),
        scale: Optional[str] = typer.Option(None, "--scale", help="micro | tiny | paper (default: tiny without a "
                                            "GPU, paper with one)."),
        backbone: Optional[List[str]] = typer.Option(None, "--backbone", help="Only these backbones (repeatable "
                                                     "or a comma list)."),
        algorithm: Optional[List[str]] = typer.Option(None, "--algorithm", help="Only these algorithms."),
        task: Optional[List[str]] = typer.Option(None, "--task", help="Only these tasks."),
        seeds: Optional[str] = typer.Option(None, "--seeds", help="Comma list, e.g. 0,1,2 (default: every seed "
                                            "the scale pins for each entry: 3 at tiny, 1 at micro)."),
        overrides: List[str] = typer.Option([], "--set", help="key=value override for every cell (repeatable), "
                                            "e.g. --set train.steps=20 (the runs are marked modified)."),
        jobs: int = typer.Option(1, "--jobs", help="Cells run at once: local worker processes, or submitit jobs "
                                 "in flight."),
        threads: int = typer.Option(1, "--threads", help="Threads per worker (OMP_NUM_THREADS; recorded as "
                                    "hardware.torch_threads). One suits tiny models; several OpenMP pools on "
                                    "shared cores slow every run down."),
        db: Optional[str] = typer.Option(None, "--db", help=DB_HELP + " Many machines: postgresql://...",
                                         show_default=False),
        force: bool = typer.Option(False, "--force", help="Run cells whose identical run finished, from scratch."),
        device: Optional[str] = typer.Option(None, "--device", help="cpu | cuda, passed to every cell."),
        executor: str = typer.Option("local", "--executor", help="local (worker processes) | submitit (Slurm "
                                     "jobs; needs the optional extra `sweep`)."),
        submitit_cluster: str = typer.Option("auto", "--submitit-cluster", help="submitit's cluster: auto (Slurm "
                                             "when present) | slurm | local | debug."),
        slurm_partition: Optional[str] = typer.Option(None, "--slurm-partition", help="Slurm partition."),
        slurm_time: Optional[int] = typer.Option(None, "--slurm-time", help="Slurm time limit per cell, minutes."),
        slurm_gpus: Optional[int] = typer.Option(None, "--slurm-gpus", help="GPUs per Slurm job."),
        controls: bool = typer.Option(False, "--controls", help="Each RL cell also runs its compute-matched SFT "
                                      "control (`reproduce --control`): the leaderboard's RL - control. The "
                                      "controls run after every RL run, smallest budget first."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print the grid, each cell's decision (run, "
                                     "resume, skip) and its reproduce plan; write nothing."),
        as_json: bool = typer.Option(False, "--json", help="Print {cells, summary} as JSON."),
    ) -> None:
        """Run reproductions x seeds into one store: N workers, finished cells skipped, interrupted ones resumed."""
        from dare_bench.pipeline.sweep import parse_seeds, run_sweep, sweep_summary, table_lines

        log = (lambda msg: typer.echo(msg, err=True)) if as_json else typer.echo
        cells = run_sweep(patterns or None, scale=scale, backbone=backbone, algorithm=algorithm, task=task,
                          seeds=parse_seeds(seeds), overrides=list(overrides), jobs=jobs, threads=threads, db=db,
                          force=force, device=device, dry_run=dry_run, executor=executor,
                          submitit_cluster=submitit_cluster, slurm_partition=slurm_partition,
                          slurm_time=slurm_time, slurm_gpus=slurm_gpus, controls=controls,
                          progress=sys.stderr.isatty(), log=log)
        if as_json:
            typer.echo(json.dumps({"cells": [c.to_json() for c in cells], "summary": sweep_summary(cells)},
                                  default=str))
        else:
            for line in table_lines(cells):
                typer.echo(line)
        if any(c.status == "failed" for c in cells):
            raise typer.Exit(1)

    @app.command("calibrate")
    def calibrate_cmd(
        name: str = typer.Argument(..., help="A tiny-scale reproduction whose base to scan, e.g. sft-llada-arith."),
        overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides of the recipe, e.g. "
                                                                   "base.lr=2e-3."),
        scale: str = typer.Option("tiny", "--scale", help="tiny | micro."),
        at: str = typer.Option("50,100,150,200,250,300,350,400", "--at", help="SFT steps to evaluate at."),
        window: str = typer.Option("0.1,0.3", "--window", help="Target range of the primary metric: the "
                                   "suggested start_step is the first scanned step inside it."),
        as_json: bool = typer.Option(False, "--json", help="Print the scan as a JSON object."),
    ) -> None:
        """Scan a tiny base: SFT once, evaluate at several steps, suggest `base.start_step` (writes nothing)."""
        from dare_bench.pipeline.calibrate import calibrate, parse_steps, parse_window

        steps, target = parse_steps(at), parse_window(window)
        log = (lambda msg: typer.echo(msg, err=True)) if as_json else typer.echo
        scan = calibrate(name, scale, at=steps, overrides=list(overrides or []), window=target, log=log,
                         progress=sys.stderr.isatty())
        if as_json:
            typer.echo(json.dumps(scan.to_dict()))
        else:
            for line in scan.lines():
                typer.echo(line)
