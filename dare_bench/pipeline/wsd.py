"""Stage 4 for `train.kind: wsd`: LLaDA2.0's block-level Warmup-Stable-Decay conversion of the base (at tiny scale
the AR replica `tiny-llada2-ar`, block size 1) into a block-diffusion model, with an evaluation at every stage
boundary.

The schedule is the reproduction's `train.algorithm` (catalogue/wsd.py); the trainer is `trainers.wsd.train_wsd`
on the same SFT examples as the sft kind (prompt + gold answer, EOS-padded to the answer length), the optimizer
recipe of `train.*` over the whole conversion. The start model is evaluated at its own block size (label
`stage-start-b<block>`, the AR decoder for the AR replica), then after each stage the model is checkpointed and
evaluated at that stage's block size (`stage-<i>-<phase>-b<block>`; the block sampler decodes at most the whole
completion as one block, so a full-sequence stage is decoded with block_length = gen_length): accuracy and tokens
per forward (TPF), each an evaluation row of the run in the store. The final evaluation is the run's pinned
`eval.sampler`, whose block is the schedule's last (config.profile_problem).

    dare-bench reproduce wsd-llada2-sudoku --scale micro     # seconds: AR base -> WSD stages -> BDLM
    dare-bench reproduce wsd-llada2-sudoku --seed 0          # tiny
"""

from __future__ import annotations

from dare_bench.pipeline.context import Base, RunContext
from dare_bench.pipeline.evaluation import evaluate_stored
from dare_bench.pipeline.examples import sft_examples
from dare_bench.pipeline.plan import _answer_length


def stage_sampler(sampler, block_size: int):
    """The evaluation sampler at a stage's block size: `block_length` = steps per block = min(block, gen_length)
    (the block sampler decodes at most the whole completion as one block), the rest as pinned."""
    b = min(int(block_size), sampler.gen_length)
    return sampler.model_copy(update={"block_length": b, "steps": b})


def _evaluate_at(ctx: RunContext, base: Base, model, block_size: int, label: str, step: int) -> dict:
    """Evaluate `model` at `block_size` (an evaluation row `label` of the run)."""
    return evaluate_stored(ctx, base, model, stage_sampler(ctx.cfg.profile.eval.sampler, block_size), label, step)


def train_wsd_stage(ctx: RunContext, base: Base, sink, meter):
    """The WSD conversion of the base, evaluated at the start and at every stage boundary (module doc)."""
    from dare_bench import catalogue
    from dare_bench.pipeline.train import _checkpointing, _compute_dtype, _log_resumed_steps, _recipe
    from dare_bench.trainers.sft import SFTRunOptions
    from dare_bench.trainers.wsd import WsdConfig, train_wsd

    train, model = ctx.cfg.profile.train, base.model
    schedule = catalogue.algorithm(ctx.cfg.algorithm).settings(train)  # WsdKnobs, or wsd-cap's WsdCapKnobs
    wcfg = WsdConfig(schedule=schedule, batch_size=train.batch_prompts or 32, seed=ctx.seed + 1,
                     confidence_beta=getattr(schedule, "confidence_beta", 0.0), **_recipe(train))
    examples = sft_examples(base.task, base.tokenizer, base.train_data, base.template, ctx.cfg.grader,
                            _answer_length(ctx.cfg))
    options = SFTRunOptions(sink=sink, progress=ctx.progress, compute_dtype=_compute_dtype(ctx.cfg),
                            **_checkpointing(ctx))
    if not ctx.resume:  # a resumed run evaluated its start before the interruption
        start_block = model.traits.block_size
        _evaluate_at(ctx, base, model, start_block, f"stage-start-b{start_block}", 0)

    def on_stage_end(i: int, step: int) -> None:
        st = schedule.stages[i]
        _evaluate_at(ctx, base, model, st.block_size, f"stage-{i}-{st.phase}-b{st.block_size}", step)

    out = train_wsd(model, examples, wcfg, options, on_stage_end=on_stage_end)
    _log_resumed_steps(ctx, out)
    return model, out.steps


__all__ = ["stage_sampler", "train_wsd_stage"]
