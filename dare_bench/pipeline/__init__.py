"""`dare-bench reproduce NAME`: base model -> trainer with one algorithm plug-in -> evaluator -> store.

What it does, at `tiny` / `micro` scale (CPU): builds the task tokenizer and the backbone's tiny preset, trains the
shared **base** (an SFT of the preset on the task's training data, cached under `DARE_BENCH_HOME/bases/` by content
hash, so every algorithm of a backbone x task x scale starts from the same weights), evaluates it, post-trains it
with the reproduction's algorithm (RL through `trainers.loop.train_rl`, SFT / LoRA through `trainers.sft`,
VRPO through `trainers.preference`), evaluates the result on the same items, and records everything in the store:
the run (resolved config + hash, seed, code / package versions, hardware), per-step metrics, and the base and final
evaluations with per-sample records. At `paper` scale the base is the real checkpoint (`--checkpoint DIR` or
`$DARE_BENCH_CHECKPOINTS/<name>`) and a GPU is required, unless `--device cpu` is asked for explicitly (the whole
recipe on CPU, for checks with shrunk checkpoints: `dare-bench checkpoint shrink`); `--dry-run` prints the plan
without running it. `--nproc N` runs the reproduction under torchrun, one process per GPU (or CPU core with
gloo): the model is FSDP2-sharded, every rank trains and evaluates its share, only rank 0 writes (one run row, its
metrics, checkpoints, the final model).

    dare-bench reproduce d1-llada-sudoku                      # tiny (the default without a GPU), its 3 pinned seeds
    dare-bench reproduce d1-llada-sudoku --seed 1             # one seed
    dare-bench reproduce d1-llada-sudoku --scale micro --json # seconds; what CI runs
    dare-bench reproduce bgpo-llada-sudoku --scale paper --checkpoint /ckpt/LLaDA-8B-Instruct --dry-run
    dare-bench reproduce d1-llada-gsm8k --scale paper --checkpoint /ckpt/LLaDA-8B-Instruct --nproc 8
    dare-bench checkpoint shrink LLaDA-8B-Instruct /tmp/llada-shrunk --layers 2 --hidden 256
    dare-bench reproduce d1-llada-gsm8k --scale paper --checkpoint /tmp/llada-shrunk --device cpu --nproc 2 \
        train.steps=2 eval.limit=4                            # the paper path end to end on a CPU machine

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
import warnings
from pathlib import Path

from dare_bench.pipeline.base_cache import build_base, load_base
from dare_bench.pipeline.context import Base, Log, RunContext
from dare_bench.pipeline.evaluation import _new_uid, evaluate_base, evaluate_final, evaluate_model
from dare_bench.pipeline.examples import preference_pairs, sft_examples
from dare_bench.pipeline.launch import check_nproc, launch_torchrun, torchrun_command, under_torchrun
from dare_bench.pipeline.plan import (
    _require_gpu_and_checkpoint,
    check_checkpoint_option,
    default_scale,
    local_plan,
    paper_plan,
    resolve,
)
from dare_bench.pipeline.summary import ReproduceResult, summary_lines
from dare_bench.pipeline.train import save_final_model, train

# --------------------------------------------------------------------------------------------------- main entry

TINY_THREADS = 1  # torch threads of a tiny / micro run unless OMP_NUM_THREADS is set (default_threads)


@contextlib.contextmanager
def pinned_threads(threads: int | None):
    """Run torch with `threads` intra-op threads for the duration, then restore the count (None: leave it)."""
    if threads is None:
        yield
        return
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(old)


@contextlib.contextmanager
def default_threads(scale: str):
    """tiny / micro: one torch thread, unless the user set OMP_NUM_THREADS. Why (issue #16): a tiny model runs
    about as fast on one thread, while the default pool (one thread per core) on a machine other jobs share was seen
    running a tiny base SFT 18x slower (OpenMP threads spinning on busy cores); and the reduction order, hence the
    tiny base's weights, then does not depend on the machine's core count. paper: torch's default (all cores)."""
    import os

    tiny = scale in ("tiny", "micro") and not os.environ.get("OMP_NUM_THREADS")
    with pinned_threads(TINY_THREADS if tiny else None):
        yield


def reproduce(name: str, scale: str | None = None, *, seed: int | None = None, db: str | None = None,
              resume: bool = False, dry_run: bool = False, overrides: list[str] | tuple[str, ...] = (),
              force: bool = False, checkpoint: str | None = None, device: str | None = None,
              nproc: int | None = None, progress: bool = True, log: Log = print,
              control_of: str | None = None) -> ReproduceResult:
    """Plan (dry runs stop here), skip an identical finished run unless `force`, then run the stages (`_run`)
    under a store record that is marked failed if any stage raises. `nproc` > 1: the same call under torchrun
    (`pipeline/launch.py`); inside torchrun every rank runs this function and rank 0 alone writes. `control_of`:
    the uid of the RL run this run is the compute-matched SFT control of (`pipeline.control`)."""
    start = time.perf_counter()
    chosen_scale = scale or default_scale()
    if scale is None and chosen_scale == "tiny":
        log("no GPU found: running the `tiny` scale (use --scale paper with a GPU and --checkpoint for the recipe)")
    spec, cfg = resolve(name, chosen_scale, overrides)
    if cfg.profile.eval.engine == "opencompass":
        from dare_bench.evaluators.opencompass import require_opencompass

        require_opencompass()  # the missing extra fails the dry run too, not only the run after it
    run_seed = cfg.profile.seeds[0] if seed is None else int(seed)
    common = dict(name=spec.name, scale=chosen_scale, seed=run_seed, config_hash=cfg.content_hash,
                  modified=cfg.modified, metric=cfg.profile.eval.metric)
    paper = chosen_scale in ("paper", "official")
    check_checkpoint_option(chosen_scale, checkpoint)
    run_device = device or ("cuda" if paper else "cpu")
    launcher = dict(name=name, scale=chosen_scale, seed=seed, db=db, resume=resume, overrides=list(overrides),
                    force=force, checkpoint=checkpoint, device=run_device)
    nproc = None if (nproc or 1) <= 1 or under_torchrun() else int(nproc)
    if nproc is not None:
        check_nproc(nproc, run_device, cfg)

    if paper:
        plan = paper_plan(cfg, checkpoint)
        if nproc is not None:
            plan["command"] = " ".join(torchrun_command(nproc=nproc, **launcher))
        if dry_run:
            return ReproduceResult(run_id=None, status="dry-run", plan=plan, db="", **common)
        _require_gpu_and_checkpoint(plan, run_device)
    elif dry_run:
        plan = local_plan(cfg)
        if nproc is not None:
            plan["command"] = " ".join(torchrun_command(nproc=nproc, **launcher))
        return ReproduceResult(run_id=None, status="dry-run", plan=plan, db="", **common)
    from dare_bench.models.layers import check_backend

    check_backend(cfg.profile.model.attention)  # a missing extra (flash-attn) fails here, before any row
    if paper and run_device == "cpu":
        warnings.warn(f"{spec.name}: running the paper recipe on CPU (--device cpu); meant for checks with shrunk "
                      "checkpoints, a full-size model is far too slow", stacklevel=2)
    if nproc is not None:
        return launch_torchrun(nproc=nproc, progress=progress, log=log, **launcher)
    paper_dir = Path(plan["checkpoint_dir"]) if paper else None

    with default_threads(chosen_scale):  # also what the run record's hardware.torch_threads reports
        from dare_bench.trainers.distributed import broadcast_object, init_distributed, leave_distributed, rank_device

        info = init_distributed(device=run_device)  # joins torchrun's group (a no-op in one process)
        store, decision = None, None
        if info.is_main:
            from dare_bench.store import Store

            store = Store(db)
            store.mark_orphans_failed()
            decision = previous_run(store, cfg, run_seed, common, start, control_of) if not force else None
            if decision is None:
                decision = ReproduceResult(run_id=store.start_run(cfg, seed=run_seed, control_of=control_of),
                                           status="running", db=store.url, **common)
        result = broadcast_object(decision, info)  # every rank follows rank 0: skip, or run under its run id
        if result.status == "skipped":
            leave_distributed(info)
            return result
        try:
            _run(RunContext(cfg, store, result.run_id, result, seed=run_seed, resume=resume,
                            device=rank_device(run_device, info), progress=progress,
                            log=log if info.is_main else _quiet, paper_dir=paper_dir, rank=info.rank))
        except BaseException as exc:
            if store is not None:
                store.fail_run(result.run_id, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}")
            raise
        leave_distributed(info)
        result.status = "finished"
        result.wall_seconds = time.perf_counter() - start
        return result


def reproduce_seeds(name: str, scale: str | None = None, *, seeds: list[int] | None = None,
                    overrides: list[str] | tuple[str, ...] = (), **options) -> list[ReproduceResult]:
    """Every seed the scale pins (`seeds` in its profile; tiny: 3), or the given `seeds`: one `reproduce` call each,
    in order (finished seeds are skipped as usual). `summary.seed_table_lines` prints them with mean ± 95% CI."""
    if seeds is None:
        _, cfg = resolve(name, scale or default_scale(), overrides)
        seeds = list(cfg.profile.seeds)
    return [reproduce(name, scale, seed=s, overrides=overrides, **options) for s in seeds]


def previous_run(store, cfg, seed: int, common: dict, start: float,
                 control_of: str | None = None) -> ReproduceResult | None:
    """The skipped-run result when an identical run (same config hash and seed; a control: of the same RL run)
    already finished (`reproduce` and `dare-bench sweep` skip it unless forced). At tiny / micro scale, identical
    also means from the same base: a run that started from another base than the one this machine's cache holds
    for the recipe (trained on another CPU kind) belongs to another leaderboard group, so this one runs."""
    from dare_bench.pipeline.base_cache import cached_base_hash

    done = store.find_runs(config_hash=cfg.content_hash, seed=seed)
    if control_of is not None:
        done = [r for r in done if r.get("control_of") == control_of]
    here = cached_base_hash(cfg) if done else None
    if here is not None:  # a run recorded before bases had identities (no hash) still counts
        done = [r for r in done if r.get("base_sha256") in (None, here)]
    if not done:
        return None
    prev = done[0]
    evals = store.evaluations(prev["id"])
    finals = [e for e in evals if e.get("checkpoint") == "final"]
    bases = [e for e in evals if e.get("checkpoint") == "base"]
    return ReproduceResult(
        run_id=prev["id"], status="skipped", db=store.url, wall_seconds=time.perf_counter() - start,
        metrics=finals[0]["metrics"] if finals else {}, base_metrics=bases[0]["metrics"] if bases else {},
        compute=prev.get("compute") or {}, message="an identical finished run exists (use --force to run again)",
        **common)


def _quiet(message: str) -> None:
    """The log of ranks other than 0: rank 0 speaks for the job."""


def _run(ctx: RunContext) -> None:
    """The stages of one run, in order: base -> base evaluation -> training -> final model -> final evaluation."""
    from dare_bench.trainers.distributed import barrier, dist_info

    cfg, result = ctx.cfg, ctx.result
    stages = result.stage_seconds
    info = dist_info()
    with _timed(stages, "base"):
        if not ctx.is_main:  # rank 0 builds (or finds) the cached tiny base first; the others then load it
            barrier(info)
        base = load_base(ctx)
        if ctx.is_main:
            barrier(info)
    base.model = base.model.to(ctx.device)
    if base.identity is not None:
        sel = base.identity["selection"]
        ctx.log(f"base: weights {base.identity['weights_sha256'][:12]}, SFT step {sel['step']} ({sel['rule']} rule)")

    with _timed(stages, "base_eval"):
        base_record = evaluate_base(ctx, base)
    # (`dare-bench sweep` reads this line in a worker's log: the shared base is cached and evaluated from here on)
    ctx.log(f"{base_ready_prefix(cfg.profile.eval.metric)}{result.base_metrics.get(cfg.profile.eval.metric)}")

    with _timed(stages, "train"):
        model, final_step = train(ctx, base)
    if cfg.profile.train.kind != "none":
        save_final_model(model, base.tokenizer, ctx.run_dir / "final")
        result.final_model = str(ctx.run_dir / "final")

    with _timed(stages, "final_eval"):
        final_record = evaluate_final(ctx, base, model, final_step, base_record)
    if ctx.store is not None:
        ctx.store.finish_run(ctx.run_id, [base_record.model_copy(update={"uid": _new_uid()}), final_record],
                             base=base.identity, compute=result.compute or None)


def base_ready_prefix(metric: str) -> str:
    """The start of the log line a run writes once its base is built (or loaded) and evaluated."""
    return f"base: {metric} = "


@contextlib.contextmanager
def _timed(stages: dict[str, float], name: str):
    """`stages[name]` = seconds the block took (not recorded when it raises: the run fails)."""
    t0 = time.perf_counter()
    yield
    stages[name] = time.perf_counter() - t0


# The entry point and the stages' public names; the stages' helpers are imported from their own modules.
__all__ = [
    "Base", "Log", "ReproduceResult", "RunContext", "base_ready_prefix", "build_base", "default_scale",
    "evaluate_base", "evaluate_final", "evaluate_model", "load_base", "local_plan", "paper_plan", "preference_pairs",
    "previous_run", "reproduce", "reproduce_seeds", "resolve", "save_final_model", "sft_examples", "summary_lines",
    "train",
]
