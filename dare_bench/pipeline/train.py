"""Stage 4, training: post-train the base with the reproduction's trainer, chosen by `train.kind`.

rl -> `trainers.loop.train_rl` with the algorithm plug-in; sft -> `trainers.sft.train_sft`; preference ->
`trainers.preference.train_preference` (VRPO on pairs from the base's own samples); wsd -> `trainers.wsd.train_wsd`
(LLaDA2.0's block-level WSD conversion, evaluated at every stage boundary: pipeline/wsd.py); none -> the base as
it is. Each kind's stage is one entry of `TRAINERS` (kind -> "module:function"), so `train` names none. Every
trainer takes the whole optimizer recipe of `train.*` (lr, adam_betas, weight_decay, lr_schedule + warmup_steps,
max_grad_norm, steps or epochs, lora), checkpoints under the run dir every `train.checkpoint_every` steps and at
the end, and continues from them with `--resume`; `train.eval_every` evaluates mid-training (rl). Step metrics go
to the store as they come.

    dare-bench reproduce d1-llada-sudoku --scale micro              # rl
    dare-bench reproduce d1-llada-sudoku --scale micro --resume     # rl, after an interruption
    dare-bench reproduce lora-llada-sudoku --scale micro            # sft with LoRA
    dare-bench reproduce vrpo-llada-sudoku --scale micro            # preference (--resume likewise)

    from dare_bench.pipeline.train import train
    model, final_step = train(ctx, base)    # ctx: pipeline.context.RunContext, base: pipeline.context.Base
"""

from __future__ import annotations

from pathlib import Path

from dare_bench.errors import DareBenchError
from dare_bench.fileio import atomic_directory
from dare_bench.pipeline.context import Base, RunContext
from dare_bench.pipeline.evaluation import _mid_training_eval
from dare_bench.pipeline.examples import preference_pairs, sft_examples
from dare_bench.pipeline.plan import _answer_length, _plugin_name
from dare_bench.pipeline.summary import ReproduceResult

# The stage of each `train.kind` (catalogue.Kind; a test keeps the two equal), imported when its kind runs.
TRAINERS = {
    "rl": "dare_bench.pipeline.train:train_rl_stage",
    "sft": "dare_bench.pipeline.train:train_sft_stage",
    "preference": "dare_bench.pipeline.train:train_vrpo_stage",
    "wsd": "dare_bench.pipeline.wsd:train_wsd_stage",
}


def train(ctx: RunContext, base: Base):
    """(trained model, its final step) with the trainer of `train.kind`; the base itself for "none". The training
    compute every trainer spends is counted the same way (trainers/compute.py) into `ctx.result.compute`."""
    import importlib

    import torch

    from dare_bench.trainers.compute import ComputeMeter

    kind = ctx.cfg.profile.train.kind
    if kind == "none":
        return base.model, 0  # evaluate the base as it is
    sink = _metrics_sink(ctx.store, ctx.run_id, ctx.result)
    torch.manual_seed(ctx.seed)
    module, _, function = TRAINERS[kind].partition(":")
    stage = getattr(importlib.import_module(module), function)
    with ComputeMeter(base.model) as meter:
        model, steps = stage(ctx, base, sink, meter)
    ctx.result.compute = _all_ranks(meter.summary())
    return model, steps


def _all_ranks(compute: dict) -> dict:
    """The job's compute: every rank's count summed (one process: its own)."""
    from dare_bench.trainers.distributed import dist_info, gather_objects

    info = dist_info()
    if not info.enabled:
        return compute
    parts = gather_objects(compute, info)
    total = dict(compute)
    for key in ("flops", "token_forwards", "grad_token_forwards"):
        total[key] = sum(p[key] for p in parts)
    return total


def train_rl_stage(ctx: RunContext, base: Base, sink, meter):
    """The shared RL loop with the reproduction's plug-in; a resumed run's earlier steps join this run's curve."""
    from dare_bench.trainers import loop

    cfg, store, run_id, seed, resume = ctx.cfg, ctx.store, ctx.run_id, ctx.seed, ctx.resume
    model, tokenizer, task, train_data, template = base.model, base.tokenizer, base.task, base.train_data, base.template
    train = cfg.profile.train
    options = loop.RLRunOptions(seed=seed, sink=sink, progress=ctx.progress, checkpoint_dir=_checkpoint_dir(ctx),
                                resume=resume, items=list(train_data), prompt_template=template,
                                grader=cfg.grader, compute_dtype=_compute_dtype(cfg),
                                unit_prompts=_unit_prompts(cfg),
                                evaluate=_mid_training_eval(tokenizer, task, cfg, seed, store, run_id))
    out = loop.train_rl(model, tokenizer, task, _plugin_name(cfg.algorithm), train, options=options)
    if out.resumed_from and store is not None:  # steps trained before the interruption belong to this run too
        for step, metrics in enumerate(out.history[: out.resumed_from], start=1):
            store.log_metrics(run_id, step, metrics)
    ctx.result.reward_curve = [float(h["reward_mean"]) for h in out.history if "reward_mean" in h]
    return out.policy, out.optimizer_steps


def _unit_prompts(cfg) -> int | None:
    """Paper scale: rollout units of the published per-GPU share of the batch (batch_prompts / train.gpus, or a
    divisor of the batch when the override is smaller), seeded by their place in the batch, so a paper run's numbers
    do not depend on how many ranks run it (1 == N processes). tiny / micro: one unit per rank (None)."""
    train = cfg.profile.train
    if cfg.scale not in ("paper", "official") or train.batch_prompts is None:
        return None
    import math

    return math.gcd(train.batch_prompts, max(1, train.batch_prompts // (train.gpus or 1)))


def _compute_dtype(cfg) -> str | None:
    """`model.dtype` below float32 (paper scale: bfloat16) means mixed precision: the trainers keep fp32 master
    weights and compute in that dtype; float32 (tiny / micro) trains as before."""
    dtype = cfg.profile.model.dtype
    return None if dtype == "float32" else dtype


def train_sft_stage(ctx: RunContext, base: Base, sink, meter):
    """Continued SFT (LoRA adapters when `train.lora`) on the gold answers, EOS-padded to the answer length.
    `train.compute_budget_flops` (a compute-matched control): stop once `meter` has counted that much, `train.steps`
    being the cap; a cap reached first is an error (the control would be short of its RL run's compute)."""
    from dare_bench.trainers.lora import apply_lora
    from dare_bench.trainers.sft import SFTConfig, SFTRunOptions, train_sft

    train, model = ctx.cfg.profile.train, base.model
    if train.lora is not None:
        model = apply_lora(model, train.lora)
    from dare_bench import catalogue

    knobs = catalogue.algorithm(ctx.cfg.algorithm).settings(train)
    # CAP (the `cap` algorithm): SFT + confidence_beta x the confidence loss; every other SFT algorithm: none
    beta = getattr(knobs, "confidence_beta", 0.0)
    if getattr(knobs, "block_size", None) is not None:  # `ar`: trains (and saves the model) at this block size
        from dare_bench.trainers.wsd import set_block_size

        set_block_size(model, knobs.block_size)
    cfg = SFTConfig(batch_size=train.batch_prompts or 32, seed=ctx.seed + 1, confidence_beta=beta, **_recipe(train))
    examples = sft_examples(base.task, base.tokenizer, base.train_data, base.template, ctx.cfg.grader,
                            _answer_length(ctx.cfg))
    budget = train.compute_budget_flops
    if budget is not None and ctx.resume:
        raise DareBenchError("a compute-matched control does not resume (its count starts at 0): run it again "
                             "without --resume")
    trajectory, stretch, ends_here = _budgeted_trajectory(ctx, base, train)
    if stretch is not None:  # the same trajectory already ran part of the way: continue where it stopped
        meter.carry(stretch.compute, {"step": stretch.step, "flops": stretch.compute["flops"],
                                      "run_uid": stretch.run_uid})
        ctx.log(f"control: {'is' if ends_here else 'continues'} its SFT trajectory "
                f"{'up to' if ends_here else 'from'} step {stretch.step} ({stretch.compute['flops']:.3e} FLOPs, "
                f"where run {str(stretch.run_uid)[:12]} stopped)")
    out = train_sft(model, examples, cfg, SFTRunOptions(sink=sink, progress=ctx.progress,
                                                        compute_dtype=_compute_dtype(ctx.cfg),
                                                        after_step=meter.stop_at(budget) if budget else None,
                                                        continue_from=stretch.checkpoint if stretch else None,
                                                        stop_after=0 if ends_here else None,
                                                        **_checkpointing(ctx)))
    if budget is not None and meter.flops < budget:
        raise DareBenchError(f"the control reached train.steps={train.steps} with {meter.flops:.3e} of its "
                             f"{budget:.3e} FLOPs budget; raise train.steps")
    if trajectory is not None and out.checkpoint is not None and not ends_here:
        from dare_bench.pipeline.control import keep_stretch

        uid = ctx.store.get_run(ctx.run_id)["uid"] if ctx.store is not None else None
        keep_stretch(trajectory, out.checkpoint, out.steps, meter.summary(), uid,
                     flops_before=meter.flops_before_last_step)
    _log_resumed_steps(ctx, out)
    return model, out.steps


def _budgeted_trajectory(ctx: RunContext, base: Base, train):
    """(trajectory key, the kept stretch to continue, whether it ends exactly at the budget) of a compute-budgeted
    SFT run in one process from a tiny / micro base (pipeline/control.py): a stretch ending where the budget stops
    (no step left to train), else the longest below the budget; (None, None, False) for any other run, which trains
    from step 0."""
    from dare_bench.trainers.distributed import dist_info
    from dare_bench.trainers.sft import LENGTH_FREE_SCHEDULES

    # Not under torchrun (each rank would need its own stretch) nor for LoRA (its checkpoints hold the adapters
    # alone; no budgeted LoRA run exists to test the continuation with).
    if (train.compute_budget_flops is None or base.identity is None or dist_info().enabled or train.lora
            or train.lr_schedule not in LENGTH_FREE_SCHEDULES):
        return None, None, False
    from dare_bench.pipeline.control import longest_stretch_below, stretch_ending_at, trajectory_key

    key = trajectory_key(ctx.cfg, ctx.seed, base.identity["weights_sha256"], ctx.device)
    exact = stretch_ending_at(key, train.compute_budget_flops)
    if exact is not None:
        return key, exact, True
    return key, longest_stretch_below(key, train.compute_budget_flops), False


def train_vrpo_stage(ctx: RunContext, base: Base, sink, meter):
    """VRPO at tiny scale: preference pairs from the base's own rollouts (chosen = the gold answer, rejected = the
    base's lowest-reward sample when it is worse than gold); LoRA adapters when `train.lora` (the reference is then
    the policy with adapters disabled, else a frozen copy of the base)."""
    from dare_bench.trainers.distributed import broadcast_object, dist_info
    from dare_bench.trainers.lora import apply_lora
    from dare_bench.trainers.preference import PreferenceConfig, PreferenceRunOptions, train_preference

    cfg, model, seed = ctx.cfg, base.model, ctx.seed
    train = cfg.profile.train
    from dare_bench import catalogue

    knobs = catalogue.algorithm(cfg.algorithm).settings(train)  # VrpoKnobs, preference_data checked by the plan
    # VRPO has no rollouts of its own (rollout: null): the base answers with the pinned evaluation sampler.
    sampler = train.rollout or cfg.profile.eval.sampler
    pairs = preference_pairs(model, base.tokenizer, base.task,
                             list(base.train_data)[: max(8, (train.batch_prompts or 8) * 4)],
                             sampler, cfg.grader, seed, base.template)
    # Under torchrun every rank must train on the same pairs: rank 0's (sampling kernels need not agree bit for bit).
    pairs = broadcast_object(pairs, dist_info())
    if not pairs:
        raise DareBenchError("VRPO: the base model solved every training prompt; no preference pair to learn from")
    if train.lora is not None:
        model = apply_lora(model, train.lora)
    pcfg = PreferenceConfig(batch_pairs=train.batch_prompts or 4, beta=knobs.dpo_beta, mc_samples=train.mc_samples,
                            seed=seed, **_recipe(train))
    out = train_preference(model, pairs, pcfg, PreferenceRunOptions(sink=sink, progress=ctx.progress,
                                                                    compute_dtype=_compute_dtype(cfg),
                                                                    **_checkpointing(ctx)))
    _log_resumed_steps(ctx, out)
    return model, out.steps


def _recipe(train) -> dict:
    """The optimizer / schedule / length / loss-head / packing fields of `train.*` as SFTConfig / PreferenceConfig
    keywords. Passes over the data (`epochs`, when `steps` is unset) walk shuffled epochs; a fixed number of steps draws
    batches at random (the tiny / micro recipes, whose numbers this keeps)."""
    return {"steps": train.steps, "epochs": train.epochs, "lr": train.lr, "betas": tuple(train.adam_betas),
            "weight_decay": train.weight_decay, "lr_schedule": train.lr_schedule, "warmup_steps": train.warmup_steps,
            "grad_clip": train.max_grad_norm, "order": "epochs" if train.steps is None else "with_replacement",
            "lm_head_chunk_tokens": train.lm_head_chunk_tokens, "packing": train.packing}


def _checkpoint_dir(ctx: RunContext) -> Path:
    """`run_dir/checkpoints`, which every trainer writes; a fresh run clears it first (rank 0), so it never resumes
    later from a previous run's checkpoints."""
    ckpt = ctx.run_dir / "checkpoints"
    if not ctx.resume and ctx.is_main:
        import shutil

        shutil.rmtree(ckpt, ignore_errors=True)
    return ckpt


def _checkpointing(ctx: RunContext) -> dict:
    """Checkpoint keywords of the SFT / VRPO run options: every `train.checkpoint_every` steps, `--resume`."""
    return {"checkpoint_dir": _checkpoint_dir(ctx), "checkpoint_every": ctx.cfg.profile.train.checkpoint_every,
            "resume": ctx.resume}


def _log_resumed_steps(ctx: RunContext, out) -> None:
    """Steps sunk before the interruption belong to this run's curve too (the resumed call sinks only its own)."""
    if out.resumed_from and ctx.store is not None:  # rank 0 writes; the other ranks of a torchrun job hold no store
        for step, metrics in out.logged:
            if step < out.resumed_from:
                ctx.store.log_metrics(ctx.run_id, step, metrics)


def _metrics_sink(store, run_id: int, result: ReproduceResult):
    def sink(step: int, metrics: dict) -> None:
        if store is not None:  # rank 0 writes; the trainers call the sink on rank 0 only
            store.log_metrics(run_id, int(step), metrics)
        if "reward_mean" in metrics:
            result.reward_curve.append(float(metrics["reward_mean"]))

    return sink


def save_final_model(model, tokenizer, directory: Path) -> None:
    """The trained model, atomically: a Hugging Face checkpoint dir, or PEFT-format adapters for LoRA runs (both load
    with `dare-bench eval --model DIR`). An FSDP2-sharded model's full weights are gathered (every rank takes part)
    and rank 0 writes them."""
    from dare_bench.trainers.distributed import barrier, dist_info, full_state_dict, is_sharded

    info = dist_info()
    state = full_state_dict(model) if is_sharded(model) else None
    if info.is_main:
        with atomic_directory(directory) as tmp:
            if hasattr(model, "peft_config"):
                model.save_pretrained(str(tmp), state_dict=state)
                tokenizer.save_pretrained(str(tmp))
            else:
                model.save_pretrained(tmp, tokenizer=tokenizer, state_dict=state)
    barrier(info)  # the directory exists for every rank afterwards


__all__ = ["TRAINERS", "save_final_model", "train", "train_rl_stage", "train_sft_stage", "train_vrpo_stage"]
