"""Knob schemas of LLaDA2.0's own training recipe (torch-free, ground floor): the block-level Warmup-Stable-Decay
conversion of an autoregressive model into a block-diffusion one (`WsdKnobs`, train.kind `wsd`) and confidence-aware
parallel training (`CapKnobs`, an SFT-kind algorithm).

WSD (LLaDA2.0 report, arXiv 2512.15745, "Continual Pre-training via Warmup-Stable-Decay"): training starts from an
AR model (block size 1 of the block-causal pattern), the block size grows stage by stage (warmup) up to the whole
sequence (the stable stage: full-sequence masked diffusion, MDLM), then shrinks again to a small block for fast
block-diffusion decoding (decay). Documents are packed into rows of `seq_len` tokens under a document-level
attention mask (no token sees another document). A schedule here is a list of stages, each with its phase, block
size, number of optimizer steps and layout:
- `bd3`: the BD3-LM `[x_t ; x_0]` layout of `models.block.training_forward` (noisy tokens see their own block's
  noisy tokens and the clean copy of earlier blocks);
- `single`: the noisy sequence alone, bidirectional within the document. Only a full-sequence stage may use it:
  there the BD3 layout's clean copy is never seen by a noisy token, so both compute the same loss (tested), the
  single copy at half the tokens.

Checked at load time (one line each, the registry's ConfigError): every block size divides `seq_len` (so a document
that fills its row ends on a block boundary, and the full-sequence stage is one block); phases in the order warmup,
stable, decay; warmup block sizes strictly increasing and below `seq_len`; stable stages at `seq_len`; decay block
sizes strictly decreasing below `seq_len`; `single` only at `seq_len`. The schedule's step total equals `train.steps`
and the last stage's block size is the evaluation sampler's (`config.profile_problem`).

CAP (the report's post-training section; the loss as dFactory implements it, tasks/train_llada2_bd_with_dparallel.py
`compute_confidence_loss` @ 92b6890): L = L_SFT + lambda * L_conf, where L_conf is the mean, over the masked answer
tokens the model already predicts correctly (argmax of the logits = the target), of the entropy of the predicted
distribution. `confidence_beta` is lambda.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Phase = Literal["warmup", "stable", "decay"]
PHASE_ORDER = {"warmup": 0, "stable": 1, "decay": 2}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WsdStage(_Strict):
    """One stage of the schedule: `steps` optimizer steps at block size `block_size`."""

    phase: Phase
    block_size: int = Field(..., gt=0)
    steps: int = Field(..., gt=0)
    layout: Literal["bd3", "single"] = "bd3"


class WsdKnobs(_Strict):
    """`train.algorithm` of a `wsd` reproduction: the pinned schedule (module doc)."""

    seq_len: int = Field(..., gt=0, description="packed row length: documents are packed into rows of this many "
                                                "tokens; the full-sequence (MDLM) block size")
    stages: list[WsdStage] = Field(..., min_length=1)

    @model_validator(mode="after")
    def _schedule(self) -> "WsdKnobs":
        L = self.seq_len
        last_phase, last_block = -1, None
        for i, st in enumerate(self.stages):
            where = f"stages.{i}"
            if L % st.block_size:
                raise ValueError(f"{where}: block_size {st.block_size} does not divide seq_len {L} (every block "
                                 f"size of a WSD schedule must)")
            order = PHASE_ORDER[st.phase]
            if order < last_phase:
                raise ValueError(f"{where}: a {st.phase} stage after a "
                                 f"{next(p for p, o in PHASE_ORDER.items() if o == last_phase)} stage (the phases "
                                 "run warmup, stable, decay)")
            if st.phase == "stable" and st.block_size != L:
                raise ValueError(f"{where}: a stable stage trains the full sequence: block_size must be seq_len {L}, "
                                 f"got {st.block_size}")
            if st.phase != "stable" and st.block_size >= L:
                raise ValueError(f"{where}: a {st.phase} stage's block_size must be below seq_len {L} (the "
                                 f"full-sequence stage is the stable phase), got {st.block_size}")
            same_phase = order == last_phase and last_block is not None
            if same_phase and st.phase == "warmup" and st.block_size <= last_block:
                raise ValueError(f"{where}: warmup block sizes must grow stage by stage ({last_block} then "
                                 f"{st.block_size})")
            if same_phase and st.phase == "decay" and st.block_size >= last_block:
                raise ValueError(f"{where}: decay block sizes must shrink stage by stage ({last_block} then "
                                 f"{st.block_size})")
            if st.layout == "single" and st.block_size != L:
                raise ValueError(f"{where}: layout single (the noisy copy alone) only computes the BD3 loss at the "
                                 f"full sequence (block_size {L}); at block_size {st.block_size} use bd3")
            last_phase, last_block = order, st.block_size
        if not any(st.phase == "stable" for st in self.stages):
            raise ValueError("stages: a WSD schedule needs a stable (full-sequence) stage")
        return self

    @property
    def total_steps(self) -> int:
        return sum(st.steps for st in self.stages)

    @property
    def final_block_size(self) -> int:
        return self.stages[-1].block_size

    def stage_ends(self) -> list[int]:
        """The optimizer step after which each stage ends (cumulative steps)."""
        ends, total = [], 0
        for st in self.stages:
            total += st.steps
            ends.append(total)
        return ends

    def stage_at(self, step: int) -> int:
        """Index of the stage that optimizer step `step` (0-based) trains in."""
        for i, end in enumerate(self.stage_ends()):
            if step < end:
                return i
        return len(self.stages) - 1


class WsdCapKnobs(WsdKnobs):
    """`train.algorithm` of `wsd-cap`: the WSD schedule with CAP's confidence loss added in its decay stages (the
    converted model trained at its decoding block): the tiny stand-in of LLaDA2.0's order, conversion then CAP
    post-training, in one run of the same length as `wsd`'s (so the two compare at equal compute)."""

    confidence_beta: float = Field(2.0, gt=0)


class ArKnobs(_Strict):
    """`train.algorithm` of `ar`: the block size the SFT trains (and saves) the model at, 1: causal attention, where
    the SFT loss is the next-token loss (trainers.sft.next_token_objective). Set on the model before training, so a
    real checkpoint of another block size (LLaDA2.0-mini's 32) trains as AR too."""

    block_size: Literal[1] = 1


class CapKnobs(_Strict):
    """`train.algorithm` of `cap`: lambda of L = L_SFT + lambda * L_conf (dFactory's `confidence_beta`; its docs
    recommend 2.0 for dParallel; the LLaDA2.0 report's value was not read here)."""

    confidence_beta: float = Field(2.0, gt=0)


__all__ = ["ArKnobs", "CapKnobs", "PHASE_ORDER", "Phase", "WsdCapKnobs", "WsdKnobs", "WsdStage"]
