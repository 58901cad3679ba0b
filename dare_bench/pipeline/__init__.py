"""`dare-bench reproduce NAME`: base model -> trainer with one algorithm plug-in -> evaluator -> store.

What it does, at `tiny` / `micro` scale (CPU): builds the task tokenizer and the backbone's tiny preset, trains the
shared **base** (an SFT of the preset on the task's training data, cached under `DARE_BENCH_HOME/bases/` by content
hash, so every algorithm of a backbone x task x scale starts from the same weights), evaluates it, post-trains it
with the reproduction's algorithm (RL through `trainers.loop.train_rl`, SFT / LoRA through `trainers.sft`,
VRPO through `trainers.preference`), evaluates the result on the same items, and records everything in the store:
the run (resolved config + hash, seed, code / package versions, hardware), per-step metrics, and the base and final
evaluations with per-sample records. At `paper` scale the base is the real checkpoint (`--checkpoint DIR` or
`$DARE_BENCH_CHECKPOINTS/<name>`) and a GPU is required; `--dry-run` prints the plan without running it.

    dare-bench reproduce d1-llada-sudoku                      # tiny (the default without a GPU)
    dare-bench reproduce d1-llada-sudoku --scale micro --json # seconds; what CI runs
    dare-bench reproduce bgpo-llada-sudoku --scale paper --checkpoint /ckpt/LLaDA-8B-Instruct --dry-run
    torchrun: the paper-scale launcher prints its command with --dry-run (single-process execution otherwise)

    from dare_bench.pipeline import reproduce
    result = reproduce("d1-llada-sudoku", scale="micro", db="sqlite:///runs.db")

The stages, one module each, in the order `_run` calls them:
    plan.py        resolve the config, refuse an algorithm on a backbone it is not defined for, dry-run plans
    base_cache.py  the base: the cached SFT base (tiny / micro) or the real checkpoint (paper)
    evaluation.py  the base's evaluation (cached beside it), mid-training and final evaluations
    train.py       the trainer of `train.kind` (rl / sft / preference / none), metrics to the store
    summary.py     `ReproduceResult` and the one-screen summary
with `examples.py` (SFT examples, VRPO pairs), `context.py` (what the stages share) and `commands.py` (the CLI).
"""

from __future__ import annotations

import contextlib
import time
import traceback
from pathlib import Path

from dare_bench.pipeline.base_cache import build_base, load_base
from dare_bench.pipeline.context import Base, Log, RunContext
from dare_bench.pipeline.evaluation import _new_uid, evaluate_base, evaluate_final, evaluate_model
from dare_bench.pipeline.examples import preference_pairs, sft_examples
from dare_bench.pipeline.plan import _require_gpu_and_checkpoint, default_scale, local_plan, paper_plan, resolve
from dare_bench.pipeline.summary import ReproduceResult, summary_lines
from dare_bench.pipeline.train import save_final_model, train

# --------------------------------------------------------------------------------------------------- main entry

def reproduce(name: str, scale: str | None = None, *, seed: int | None = None, db: str | None = None,
              resume: bool = False, dry_run: bool = False, overrides: list[str] | tuple[str, ...] = (),
              force: bool = False, checkpoint: str | None = None, device: str | None = None,
              progress: bool = True, log: Log = print) -> ReproduceResult:
    """Plan (dry runs stop here), skip an identical finished run unless `force`, then run the stages (`_run`)
    under a store record that is marked failed if any stage raises."""
    start = time.perf_counter()
    chosen_scale = scale or default_scale()
    if scale is None and chosen_scale == "tiny":
        log("no GPU found: running the `tiny` scale (use --scale paper with a GPU and --checkpoint for the recipe)")
    spec, cfg = resolve(name, chosen_scale, overrides)
    run_seed = cfg.profile.seeds[0] if seed is None else int(seed)
    common = dict(name=spec.name, scale=chosen_scale, seed=run_seed, config_hash=cfg.content_hash,
                  modified=cfg.modified)

    if chosen_scale in ("paper", "official"):
        plan = paper_plan(cfg, checkpoint)
        if dry_run:
            return ReproduceResult(run_id=None, status="dry-run", plan=plan, db="", **common)
        _require_gpu_and_checkpoint(plan)
    elif dry_run:
        plan = local_plan(cfg)
        return ReproduceResult(run_id=None, status="dry-run", plan=plan, db="", **common)
    paper_dir = Path(plan["checkpoint_dir"]) if chosen_scale in ("paper", "official") else None

    from dare_bench.store import Store

    store = Store(db)
    store.mark_orphans_failed()
    if not force:
        done = store.find_runs(config_hash=cfg.content_hash, seed=run_seed)
        if done:
            prev = done[0]
            evals = store.evaluations(prev["id"])
            finals = [e for e in evals if e.get("checkpoint") == "final"]
            bases = [e for e in evals if e.get("checkpoint") == "base"]
            return ReproduceResult(
                run_id=prev["id"], status="skipped", db=store.url, wall_seconds=time.perf_counter() - start,
                metrics=finals[0]["metrics"] if finals else {}, base_metrics=bases[0]["metrics"] if bases else {},
                message="an identical finished run exists (use --force to run again)", **common)

    run_id = store.start_run(cfg, seed=run_seed)
    result = ReproduceResult(run_id=run_id, status="running", db=store.url, **common)
    try:
        _run(RunContext(cfg, store, run_id, result, seed=run_seed, resume=resume,
                        device=device or ("cuda" if paper_dir is not None else "cpu"), progress=progress, log=log,
                        paper_dir=paper_dir))
    except BaseException as exc:
        store.fail_run(run_id, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}")
        raise
    result.status = "finished"
    result.wall_seconds = time.perf_counter() - start
    return result


def _run(ctx: RunContext) -> None:
    """The stages of one run, in order: base -> base evaluation -> training -> final model -> final evaluation."""
    cfg, result = ctx.cfg, ctx.result
    stages = result.stage_seconds
    with _timed(stages, "base"):
        base = load_base(ctx)
    base.model = base.model.to(ctx.device)

    with _timed(stages, "base_eval"):
        base_record = evaluate_base(ctx, base)
    ctx.log(f"base: {cfg.profile.eval.metric} = {result.base_metrics.get(cfg.profile.eval.metric)}")

    with _timed(stages, "train"):
        model, final_step = train(ctx, base)
    if cfg.profile.train.kind != "none":
        save_final_model(model, base.tokenizer, ctx.run_dir / "final")
        result.final_model = str(ctx.run_dir / "final")

    with _timed(stages, "final_eval"):
        final_record = evaluate_final(ctx, base, model, final_step, base_record)
    ctx.store.finish_run(ctx.run_id, [base_record.model_copy(update={"uid": _new_uid()}), final_record])


@contextlib.contextmanager
def _timed(stages: dict[str, float], name: str):
    """`stages[name]` = seconds the block took (not recorded when it raises: the run fails)."""
    t0 = time.perf_counter()
    yield
    stages[name] = time.perf_counter() - t0


# The entry point and the stages' public names; the stages' helpers are imported from their own modules.
__all__ = [
    "Base", "Log", "ReproduceResult", "RunContext", "build_base", "default_scale", "evaluate_base", "evaluate_final",
    "evaluate_model", "load_base", "local_plan", "paper_plan", "preference_pairs", "reproduce", "resolve",
    "save_final_model", "sft_examples", "summary_lines", "train",
]
