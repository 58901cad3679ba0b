"""Stages 3 and 5, evaluation: the base (cached beside it, shared by every algorithm on it) and the trained model,
on the same items with the reproduction's pinned sampler (`eval.sampler`); also the mid-training evaluations of
`train.eval_every` (stored as evaluation `step-N`). Under torchrun every rank decodes and grades its share of the
items (with the model's full weights gathered, so no rank waits in a collective) and rank 0 joins the shards and
writes (the store, the cached base evaluation).

    dare-bench reproduce baseline-llada-sudoku --scale micro    # train.kind none: the base's evaluation is final

    from dare_bench.pipeline.evaluation import evaluate_model
    result, record = evaluate_model(model, tokenizer, task, cfg, seed=0, progress=False, label="final", step=3)
"""

from __future__ import annotations

import json
from pathlib import Path

from dare_bench.fileio import atomic_write_json
from dare_bench.pipeline.base_cache import _hash
from dare_bench.pipeline.context import Base, RunContext


def evaluate_base(ctx: RunContext, base: Base):
    """The base's evaluation record (cached); its metrics become `result.base_metrics`."""
    base_eval, base_record = _cached_base_eval(base.model, base.tokenizer, base.task, ctx.cfg, base.directory,
                                               seed=ctx.seed, progress=ctx.progress and ctx.is_main,
                                               checkpoint_dir=ctx.paper_dir)
    ctx.result.base_metrics = dict(base_eval["metrics"])
    return base_record


def evaluate_final(ctx: RunContext, base: Base, model, final_step: int, base_record):
    """The trained model's evaluation record (label "final"); `train.kind: none` reuses the base's. The
    `eval.thresholds` evaluations of the same model are stored here too (their own rows)."""
    if ctx.cfg.profile.train.kind == "none":
        ctx.result.metrics = dict(ctx.result.base_metrics)
        final_record = base_record.model_copy(update={"checkpoint": "final", "uid": _new_uid()})
    else:
        final_eval, final_record = evaluate_model(model, base.tokenizer, base.task, ctx.cfg, seed=ctx.seed,
                                                  progress=ctx.progress and ctx.is_main, label="final",
                                                  step=final_step)
        ctx.result.metrics = dict(final_eval.metrics)
    for threshold in ctx.cfg.profile.eval.thresholds:
        evaluate_at_threshold(ctx, base, model, final_step, threshold)
    return final_record


def threshold_label(threshold: float) -> str:
    """The evaluation label of the final model decoded at a confidence threshold (`eval.thresholds`)."""
    return f"final-thr{threshold:g}"


def with_eval_sampler(cfg, sampler):
    """`cfg` with `sampler` as its evaluation sampler, the rest of the evaluation as pinned."""
    profile = cfg.profile
    ev = profile.eval.model_copy(update={"sampler": sampler})
    return cfg.model_copy(update={"profile": profile.model_copy(update={"eval": ev})})


def threshold_sampler(sampler, threshold: float):
    """`sampler` decoding at `threshold` (every sampler family reads `threshold`)."""
    return sampler.model_copy(update={"threshold": threshold})


def evaluate_stored(ctx: RunContext, base: Base, model, sampler, label: str, step: int) -> dict:
    """An extra evaluation of `model` with `sampler` in place of the pinned one (a confidence threshold of
    `eval.thresholds`, a WSD stage's block size): stored as its own evaluation row `label` (rank 0), its metrics
    logged and returned."""
    result, record = evaluate_model(model, base.tokenizer, base.task, with_eval_sampler(ctx.cfg, sampler),
                                    seed=ctx.seed, progress=False, label=label, step=step)
    if ctx.store is not None:
        ctx.store.add_evaluation(ctx.run_id, record)
    metric = ctx.cfg.profile.eval.metric
    ctx.log(f"{label} (step {step}): {metric} = {result.metrics.get(metric)}, "
            f"tokens/forward = {result.metrics.get('tokens_per_forward')}")
    return dict(result.metrics)


def evaluate_at_threshold(ctx: RunContext, base: Base, model, step: int, threshold: float) -> None:
    """One `eval.thresholds` evaluation of the final model, its metrics in `result.threshold_metrics` under the
    label."""
    label = threshold_label(threshold)
    sampler = threshold_sampler(ctx.cfg.profile.eval.sampler, threshold)
    ctx.result.threshold_metrics[label] = evaluate_stored(ctx, base, model, sampler, label, step)


def sampler_preset_from_config(sampler, template: str = "plain", batch_size: int = 16):
    """A SamplerPreset holding exactly the reproduction's pinned decoding settings, for every sampler kind."""
    from dare_bench.evaluators.presets import SAMPLER_KINDS, SamplerPreset
    from dare_bench.trainers.loop import rollout_settings

    settings = rollout_settings(sampler)
    return SamplerPreset(name=sampler.name or "reproduction", settings={k: dict(settings) for k in SAMPLER_KINDS},
                         source="reproduction config (eval.sampler)", template=template, batch_size=batch_size)


def evaluate_model(model, tokenizer, task, cfg, *, seed: int, progress: bool, label: str, step: int,
                   checkpoint_dir: Path | None = None):
    """(EvalResult, EvaluationRecord) of `model` with the run's pinned evaluation; data-parallel under torchrun
    (every rank its contiguous share of the items, joined in rank order: the same records as one process).
    `eval.engine: opencompass`: the checkpoint at `checkpoint_dir` through OpenCompass instead (one process)."""
    from dare_bench.evaluators.evaluator import evaluate, merge_shards
    from dare_bench.store.records import EvaluationRecord
    from dare_bench.trainers.distributed import dist_info, gather_objects, gathered_for_inference

    ev = cfg.profile.eval
    info = dist_info()
    template = "plain" if cfg.scale in ("tiny", "micro") else "chat"
    preset = sampler_preset_from_config(ev.sampler, template=template, batch_size=ev.batch_size)
    if ev.engine == "opencompass":
        result = _opencompass_evaluation(model, task, cfg, preset, seed=seed, checkpoint_dir=checkpoint_dir)
        record = EvaluationRecord(**{**result.evaluation_record(), "checkpoint": label, "step": step,
                                     "primary_metric": ev.metric})
        return result, record
    with gathered_for_inference(model):
        result = evaluate(model, task, preset=preset, tokenizer=tokenizer, limit=ev.limit, split=ev.split,
                          grader=cfg.grader, seed=seed, batch_size=ev.batch_size, progress=progress,
                          shard=(info.rank, info.world_size) if info.enabled else None, repeats=ev.repeats)
    if info.enabled:
        result = merge_shards(gather_objects(result, info), task)
    record = EvaluationRecord(**{**result.evaluation_record(), "checkpoint": label, "step": step,
                                 "primary_metric": ev.metric})
    return result, record


def validation_metric(model, tokenizer, task, cfg, items, *, seed: int) -> float:
    """The run's primary metric on `items` (the tiny base's held-out validation items) with its pinned sampler and
    grader, in one process and without a record: what the base's validation-target rule compares to its target."""
    from dare_bench.evaluators.evaluator import evaluate

    ev = cfg.profile.eval
    preset = sampler_preset_from_config(ev.sampler, template="plain", batch_size=ev.batch_size)
    was_training = model.training
    model.eval()
    try:
        result = evaluate(model, task, preset=preset, tokenizer=tokenizer, items=items, split="train",
                          grader=cfg.grader, seed=seed, batch_size=ev.batch_size, progress=False)
    finally:
        model.train(was_training)
    return float(result.metrics[ev.metric])


def _opencompass_evaluation(model, task, cfg, preset, *, seed: int, checkpoint_dir: Path | None):
    """The run's evaluation through OpenCompass: same checkpoint, sampler settings, task options and grader."""
    from dare_bench.errors import ConfigError
    from dare_bench.evaluators.opencompass import run_opencompass_eval
    from dare_bench.trainers.distributed import dist_info

    if checkpoint_dir is None:  # the schema allows the engine only for evaluation-only paper-scale entries
        raise ConfigError("eval.engine opencompass needs the checkpoint directory (--checkpoint)")
    if dist_info().enabled:
        raise ConfigError("eval.engine opencompass runs in one process; drop --nproc")
    ev = cfg.profile.eval
    device = str(next(model.parameters()).device)
    return run_opencompass_eval(
        str(checkpoint_dir), task.name, preset=preset.name, limit=ev.limit, grader=cfg.grader, split=ev.split,
        seed=seed, batch_size=ev.batch_size, device=device, dtype=cfg.profile.model.dtype,
        template=str(Path(checkpoint_dir).resolve()), settings=preset.settings_for("llada"),
        task_options=dict(cfg.profile.task_options), repeats=ev.repeats)


def _new_uid() -> str:
    from dare_bench.store.records import new_uid

    return new_uid()


def _cached_base_eval(model, tokenizer, task, cfg, base_dir: Path, *, seed: int, progress: bool,
                      checkpoint_dir: Path | None = None):
    """The base's evaluation is shared by every algorithm on it: cached beside the base, keyed by eval settings."""
    from dare_bench.store.records import EvaluationRecord
    from dare_bench.trainers.distributed import broadcast_object, dist_info

    info = dist_info()
    # task_options: a harder arith generates another test set, even over a base trained from the same file
    key = _hash({"eval": cfg.profile.eval.model_dump(), "grader": cfg.grader, "seed": seed,
                 "task_options": cfg.profile.task_options})[:16]
    path = base_dir / f"eval-{key}.json"
    if broadcast_object(path.exists(), info):  # rank 0's view decides: every rank then takes the same branch
        record = EvaluationRecord.model_validate_json(path.read_text())
        return {"metrics": record.metrics}, record
    res, record = evaluate_model(model, tokenizer, task, cfg, seed=seed, progress=progress, label="base", step=0,
                                 checkpoint_dir=checkpoint_dir)
    if info.is_main:
        atomic_write_json(path, json.loads(record.model_dump_json()))
    return {"metrics": res.metrics}, record


def _mid_training_eval(tokenizer, task, cfg, seed: int, store, run_id: int):
    """`train.eval_every`: the final evaluation's settings on the current policy, stored as evaluation `step-N`;
    its primary metric and score also join the step's metrics as `eval_*` (the RL gain at tiny scale peaks early,
    so the curve matters)."""
    metric = cfg.profile.eval.metric

    def run(policy, step: int) -> dict[str, float]:
        res, record = evaluate_model(policy, tokenizer, task, cfg, seed=seed, progress=False, label=f"step-{step}",
                                     step=step)
        if store is not None:  # rank 0 (the other ranks have no store)
            store.add_evaluation(run_id, record)
        return {k: res.metrics[k] for k in dict.fromkeys((metric, "score")) if k in res.metrics}

    return run


__all__ = ["evaluate_at_threshold", "evaluate_base", "evaluate_final", "evaluate_model", "evaluate_stored",
           "sampler_preset_from_config", "threshold_label", "threshold_sampler", "validation_metric",
           "with_eval_sampler"]
