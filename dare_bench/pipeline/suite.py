"""`dare-bench eval-suite BACKBONE`: every benchmark of DARE's evaluation table for one released model, in one command.

What it does: runs the model's `released-<backbone>-<benchmark>` reproductions (DARE's pinned OpenCompass settings,
one per benchmark, in the table's row order) through the pipeline, so each result is a stored run with its full
sampler settings and tokens per forward; skips a benchmark whose identical run already finished (an interrupted
suite resumes where it stopped; `--force` re-runs); prints ours vs DARE's reported value per benchmark. Exit 1 if
any benchmark failed (the others still run).

    dare-bench eval-suite llada --checkpoint /ckpt/LLaDA-8B-Instruct          # one GPU, the 12 benchmarks
    dare-bench eval-suite sdar --checkpoint /ckpt/SDAR-8B-Chat --shard 0/4   # this job's quarter of them
    dare-bench eval-suite llada2 --checkpoint DIR --nproc 4                  # each benchmark data-parallel
    dare-bench eval-suite dream --benchmarks gsm8k,mmlu --json
    dare-bench eval-suite llada --shrunk --limit 2                           # CPU: the same path, shrunk weights
    dare-bench eval-suite sdar --checkpoint DIR --engine opencompass         # through the OpenCompass plug-in
    dare-bench eval-suite llada --checkpoint DIR --set eval.sampler.extra.use_cache=none   # a protocol variant

Several GPUs: `--nproc N` shards each benchmark's items over N ranks (torchrun); `--shard K/N` gives job K of N
every N-th benchmark, for N independent jobs (e.g. one Slurm array task each) writing one store (`--db`).
`--shrunk` builds (once, under DARE_BENCH_HOME/shrunk/) a shrunk checkpoint of the backbone's released config with
random weights and runs on CPU with a short generation (`shrunk_overrides`): it checks the path, not the score.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from dare_bench.errors import ConfigError, DareBenchError

SUITE_ALGORITHM = "released"
TABLE = "dare-eval-reproduction"
# DARE's table, top to bottom (the row a benchmark belongs to; SDAR-8B's MATH row is MATH-500)
ROW_ORDER = ("mmlu", "mmlupro", "hellaswag", "arcc", "gsm8k", "math", "math500", "gpqa", "aime2024", "aime2025",
             "olympiadbench", "humaneval", "mbpp")
SHRUNK_GEN_LENGTH = 16  # tokens a shrunk check generates (at least one block of a block-diffusion backbone)


@dataclass
class SuiteRow:
    benchmark: str
    name: str
    status: str  # finished | skipped (an identical run exists) | failed | other-shard | dry-run
    ours: float | None = None  # percent
    reported: float | None = None
    difference: float | None = None
    tokens_per_forward: float | None = None
    run_id: int | None = None
    modified: bool = False
    message: str = ""


def suite_entries(backbone: str, benchmarks: list[str] | None = None, registry=None) -> list:
    """The backbone's evaluation-table reproductions, in table order; `benchmarks` picks a subset by task name."""
    from dare_bench import catalogue
    from dare_bench.registry import load_registry

    catalogue.backbone(backbone)  # an unknown backbone: one error with a suggestion
    reg = registry if registry is not None else load_registry()
    specs = sorted(reg.select(backbone=backbone, algorithm=SUITE_ALGORITHM),
                   key=lambda s: ROW_ORDER.index(s.task) if s.task in ROW_ORDER else len(ROW_ORDER))
    if not specs:
        raise ConfigError(f"no {SUITE_ALGORITHM}-{backbone}-* reproductions: {backbone} is not in DARE's evaluation "
                          "table")
    if benchmarks:
        known = [s.task for s in specs]
        unknown = [b for b in benchmarks if b not in known]
        if unknown:
            raise ConfigError(f"--benchmarks: {', '.join(unknown)} not in {backbone}'s suite (it has: "
                              f"{', '.join(known)})")
        specs = [s for s in specs if s.task in benchmarks]
    return specs


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """`K/N` -> (K, N), 0 <= K < N: job K runs every N-th benchmark of the suite."""
    if text is None:
        return None
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ConfigError(f"--shard expects K/N (e.g. 0/4), got {text!r}") from None
    if n < 1 or not 0 <= k < n:
        raise ConfigError(f"--shard {text}: need 0 <= K < N")
    return k, n


def shrunk_overrides(spec) -> list[str]:
    """Overrides that keep the pinned sampler's shape (block length, steps per token) at a CPU-sized generation."""
    from dare_bench import catalogue

    sampler = spec.resolve("paper").profile.eval.sampler
    gen, block, steps = sampler.gen_length, sampler.block_length, sampler.steps
    if catalogue.backbone(spec.backbone).diffusion == "block":
        # steps count per block and the canvas grows a block at a time: keep the block, generate whole blocks
        new_gen = block * max(1, SHRUNK_GEN_LENGTH // block) if block else min(gen, SHRUNK_GEN_LENGTH)
        out = {"gen_length": new_gen}
    else:
        new_gen = min(gen, SHRUNK_GEN_LENGTH)
        new_block = min(block, new_gen) if block else None
        if new_block:
            new_gen = new_gen // new_block * new_block
        blocks = new_gen // new_block if new_block else 1
        # the pinned steps per generated token, rounded to whole steps per block
        new_steps = max(blocks, math.ceil(steps * new_gen / gen / blocks) * blocks)
        out = {"gen_length": new_gen, "steps": new_steps}
        if new_block:
            out["block_length"] = new_block
    return [f"eval.sampler.{k}={v}" for k, v in out.items()]


def shrunk_checkpoint(backbone: str, log: Callable[[str], Any] = print) -> Path:
    """A shrunk checkpoint of the backbone's released config (1 layer, random weights), written once and reused."""
    from dare_bench import catalogue
    from dare_bench.fileio import dare_bench_home
    from dare_bench.models.shrink import shrink_checkpoint

    source = catalogue.backbone(backbone).checkpoint.split("/")[-1]
    out = dare_bench_home() / "shrunk" / f"{source}-layers1-seed0"
    if not (out / "config.json").exists():
        log(f"shrinking {source} to {out} (1 layer, random weights)")
        shrink_checkpoint(source, out, layers=1, seed=0)
    return out


def run_suite(backbone: str, *, benchmarks: list[str] | None = None, checkpoint: str | None = None,
              shrunk: bool = False, device: str | None = None, limit: int | None = None,
              shard: tuple[int, int] | None = None, overrides: list[str] | tuple[str, ...] = (),
              db: str | None = None, force: bool = False, nproc: int | None = None, dry_run: bool = False,
              engine: str = "native", progress: bool = True,
              log: Callable[[str], Any] = print) -> list[SuiteRow]:
    """Run the suite (this shard of it); one row per benchmark, failures recorded rather than raised.
    `engine="opencompass"`: each benchmark through the OpenCompass plug-in (the override eval.engine=opencompass)."""
    from dare_bench.config import to_percent
    from dare_bench.pipeline import reproduce

    if shrunk and checkpoint is not None:
        raise ConfigError("--shrunk builds its own checkpoint; drop --checkpoint (or --shrunk)")
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be a positive integer, got {limit}")
    if engine not in ("native", "opencompass"):
        raise ConfigError(f"--engine must be native or opencompass, got {engine!r}")
    if engine == "opencompass":
        from dare_bench.evaluators.opencompass import require_opencompass

        require_opencompass()  # before anything is shrunk or stored
    specs = suite_entries(backbone, benchmarks)
    if shrunk:
        checkpoint, device = str(shrunk_checkpoint(backbone, log)), device or "cpu"
    rows: list[SuiteRow] = []
    mine = [s for i, s in enumerate(specs) if shard is None or i % shard[1] == shard[0]]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(mine), desc=f"eval-suite {backbone}", unit="benchmark")
    try:
        for spec in specs:
            reported = next((r.value for r in spec.reported if r.table == TABLE), None)
            row = SuiteRow(spec.task, spec.name, "other-shard", reported=reported)
            rows.append(row)
            if spec not in mine:
                continue
            extra = [*(shrunk_overrides(spec) if shrunk else []), *([f"eval.limit={limit}"] if limit else []),
                     *(["eval.engine=opencompass"] if engine == "opencompass" else []), *overrides]
            if bar is not None:
                bar.set_postfix_str(spec.task)
            try:
                with warnings.catch_warnings():
                    if shrunk:  # the paper recipe on CPU is the point of --shrunk: no warning per benchmark
                        warnings.filterwarnings("ignore", message=".*running the paper recipe on CPU")
                    res = reproduce(spec.name, "paper", seed=0, db=db, overrides=extra, force=force,
                                    checkpoint=checkpoint, device=device, nproc=nproc, dry_run=dry_run,
                                    progress=progress, log=log)
            except DareBenchError as exc:  # one benchmark's bad data / checkpoint must not stop the others
                row.status, row.message = "failed", str(exc)
                log(f"{spec.name}: {exc}")
            else:
                row.status, row.run_id, row.modified = res.status, res.run_id, res.modified
                value = res.metrics.get(res.metric)
                if value is not None:
                    row.ours = to_percent(float(value), res.metric)
                    row.difference = None if reported is None else row.ours - reported
                if res.metrics.get("tokens_per_forward") is not None:
                    row.tokens_per_forward = float(res.metrics["tokens_per_forward"])
                row.message = res.message
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return rows


def table_lines(backbone: str, rows: list[SuiteRow]) -> list[str]:
    """Ours vs DARE's reported value, one benchmark a line."""
    def num(v: float | None, fmt: str = "{:.2f}") -> str:
        return "-" if v is None else fmt.format(v)

    head = f"{'benchmark':<14} {'ours %':>8} {'DARE %':>8} {'diff':>8} {'TPF':>6}  status"
    lines = [f"eval-suite {backbone}: released checkpoint vs DARE's Evaluation Result Reproduction table", head,
             "-" * len(head)]
    for r in rows:
        status = r.status + (" (modified)" if r.modified and r.status in ("finished", "skipped") else "")
        lines.append(f"{r.benchmark:<14} {num(r.ours):>8} {num(r.reported):>8} {num(r.difference, '{:+.2f}'):>8} "
                     f"{num(r.tokens_per_forward):>6}  {status}" + (f": {r.message}" if r.status == "failed" else ""))
    return lines


def rows_json(rows: list[SuiteRow]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]


__all__ = ["SuiteRow", "parse_shard", "rows_json", "run_suite", "shrunk_checkpoint", "shrunk_overrides",
           "suite_entries", "table_lines"]
