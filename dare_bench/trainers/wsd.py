"""LLaDA2.0's block-level Warmup-Stable-Decay (WSD) conversion of an autoregressive model into a block-diffusion one.

The schedule (`catalogue.wsd.WsdKnobs`: stages of (phase, block size, steps, layout) over packed rows of `seq_len`
tokens) is walked step by step: before each optimizer step the model's block size is set to the current stage's
(`model.config["block_size"]`, which the family's `traits` read), and the step's loss is the block-diffusion SFT
loss of `trainers.sft.sft_loss` at that block size: one t per document, answer tokens masked with p, the BD3
`[x_t ; x_0]` layout (or, in a full-sequence stage with layout `single`, the noisy copy alone), the 1/p-weighted
cross-entropy over the answer length; at block size 1 every answer token is masked, the next-token loss itself.
Documents (prompt + answer + EOS, each at its own length) are packed (`train.packing`) into rows of `seq_len`
tokens (first-fit decreasing; `2 x seq_len` in the BD3 layout, whose rows hold both copies) under a document-level
attention mask: each document sees only itself, with its own positions and its own block grid
(`diffusion.packing`), so a packed batch computes what the documents one by one compute (tests/trainers/test_wsd.py).
After the last stage the model keeps the final block size (its config.json says so when saved). With
`confidence_beta` > 0 (`wsd-cap`) the decay stages add CAP's confidence loss (`sft.confidence_loss`).

Every stage boundary calls `on_stage_end(stage_index, step)` and is a checkpoint (`SupervisedRun.checkpoint_due`),
where the pipeline evaluates the model at that stage's block size (accuracy and tokens per forward, stored as
evaluation `stage-<i>-<phase>-b<block>`). The run machinery (AdamW, the LR schedule of `train.lr_schedule` over the
whole conversion, data parallelism, `--resume`) is `sft.SupervisedRun`'s; a resumed run restores the block size of
the stage its step is in.

    from dare_bench.catalogue.wsd import WsdKnobs
    from dare_bench.trainers.wsd import WsdConfig, train_wsd
    schedule = WsdKnobs(seq_len=8, stages=[{"phase": "warmup", "block_size": 2, "steps": 2},
                                            {"phase": "stable", "block_size": 8, "steps": 2, "layout": "single"},
                                            {"phase": "decay", "block_size": 4, "steps": 2}])
    train_wsd(model, examples, WsdConfig(schedule=schedule, lr=1e-3, batch_size=8, steps=None),
              on_stage_end=lambda i, step: print(i, step))
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from dare_bench.catalogue.wsd import WsdKnobs
from dare_bench.errors import ConfigError, DataError
from dare_bench.trainers import sft
from dare_bench.trainers.precision import master_weights
from dare_bench.trainers.sft import SFTConfig, SFTExample, SFTResult, SFTRunOptions, SupervisedRun, collate_own_length


@dataclass
class WsdConfig(SFTConfig):
    """The SFT recipe fields (lr, batch, optimizer, schedule over the whole run) plus the WSD `schedule`; `steps`
    is the schedule's total (given or not, it must be)."""

    schedule: WsdKnobs | None = None

    def __post_init__(self):
        if self.schedule is None:
            raise ConfigError("WSD needs a schedule (train.algorithm: seq_len + stages)")
        if self.steps is None:
            self.steps = self.schedule.total_steps
        if self.steps != self.schedule.total_steps:
            raise ConfigError(f"WSD steps {self.steps} are not the schedule's {self.schedule.total_steps}")
        if self.epochs is not None:
            raise ConfigError("WSD runs the steps its stages pin, not epochs")
        super().__post_init__()


def set_block_size(model, block_size: int) -> None:
    """The block size every block-diffusion family reads from its config (`traits.block_size`); through LoRA /
    FSDP wrappers too."""
    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not target.traits.is_block_diffusion:
        raise ConfigError(f"WSD needs a block-diffusion backbone; {target.traits.family} is {target.traits.attention}")
    target.config["block_size"] = int(block_size)


def check_documents(examples: Sequence[SFTExample], seq_len: int) -> None:
    """Every document fits in one packed row; DataError naming the longest otherwise (before any step)."""
    longest = max(len(e.prompt_ids) + len(e.answer_ids) for e in examples)
    if longest > seq_len:
        raise DataError(f"WSD packs documents into rows of seq_len {seq_len} tokens; the longest training document "
                        f"(prompt + answer) has {longest}: raise train.algorithm.seq_len (block sizes must divide it)")


def wsd_batch_loss(model, examples: Sequence[SFTExample], cfg: WsdConfig, stage: int, generator, *,
                   rows: slice | None = None):
    """One WSD step's loss on `examples` at schedule stage `stage` (the model's block size already set to it): each
    document at its own length, packed into `seq_len` rows with `cfg.packing` (train.packing; the same numbers
    padded), the stage's layout. What `train_wsd` steps with, and the gradient snapshot (check/gradients.py)."""
    st = cfg.schedule.stages[stage]
    traits = model.traits if hasattr(model, "traits") else model.get_base_model().traits
    if traits.block_size != st.block_size:
        raise ConfigError(f"WSD stage {stage} trains at block size {st.block_size}; the model is at "
                          f"{traits.block_size} (set_block_size first)")
    ids, plen, alen, lengths = collate_own_length(examples, traits.pad_token_id)
    # CAP (wsd-cap: cfg.confidence_beta > 0) trains the converted model at its decoding block: the decay stages
    beta = cfg.confidence_beta if st.phase == "decay" else 0.0
    return sft.sft_loss(model, ids, plen, alen, generator, cfg.eps, rows=rows,
                        head_chunk_tokens=cfg.lm_head_chunk_tokens, lengths=lengths, packing=cfg.packing,
                        capacity=cfg.schedule.seq_len, single_copy=st.layout == "single", confidence_beta=beta)


class _WsdRun(SupervisedRun):
    """SFT's run with the block size of the current stage set before each step and a checkpoint at each boundary."""

    kind = "wsd"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ends = self.cfg.schedule.stage_ends()

    def loss(self, examples):
        stage = self.cfg.schedule.stage_at(self.step)
        set_block_size(self.model, self.cfg.schedule.stages[stage].block_size)
        picked = [examples[i] for i in self.draw_indices()]
        value = wsd_batch_loss(self.model, picked, self.cfg, stage, self.gen, rows=self.local)
        return value, {"block_size": float(self.cfg.schedule.stages[stage].block_size), "stage": float(stage)}

    def checkpoint_due(self) -> bool:
        return self.step in self.ends


def train_wsd(model, examples: Sequence[SFTExample], cfg: WsdConfig, options: SFTRunOptions | None = None,
              on_stage_end: Callable[[int, int], Any] | None = None) -> SFTResult:
    """Train `model` in place through the schedule; `on_stage_end(stage, step)` after each stage's last step (the
    model in eval mode at that stage's block size, every rank; then that step's checkpoint is written; a resumed run
    does not repeat the boundaries before its checkpoint). Returns SFT's result; the model ends at the final block
    size."""
    opts = options or SFTRunOptions()
    if not examples:
        raise ConfigError("WSD needs at least one document")
    check_documents(examples, cfg.schedule.seq_len)
    start = time.perf_counter()
    model = master_weights(model) if opts.compute_dtype else model
    ends = cfg.schedule.stage_ends()

    def after_step(step: int) -> None:
        if opts.after_step is not None:
            opts.after_step(step)
        if on_stage_end is not None and step in ends:  # the step just taken was at that stage's block size
            model.eval()
            on_stage_end(ends.index(step), step)
            model.train()

    run = _WsdRun(model, cfg, SFTRunOptions(**{**vars(opts), "after_step": after_step}), len(examples),
                  cfg.batch_size)
    model.train()
    run.run_steps(examples)
    model.eval()
    set_block_size(model, cfg.schedule.final_block_size)
    return SFTResult(steps=run.step, losses=run.losses, seconds=time.perf_counter() - start, logged=run.logged,
                     resumed_from=run.resumed_from, checkpoint=run.last_ckpt)


__all__ = ["WsdConfig", "check_documents", "set_block_size", "train_wsd", "wsd_batch_loss"]
