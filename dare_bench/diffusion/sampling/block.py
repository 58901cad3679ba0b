"""Block diffusion samplers: SDAR `block_diffusion_generate` (convention "sdar") and LLaDA2 `generate` (convention
"llada2"), with their `sample_with_temperature_topk_topp`, remasking strategies (low_confidence_static |
low_confidence_dynamic | sequential) and the exact block KV cache (`use_cache="exact"`, cache.py).

Each convention is a subclass of `BlockSettings` (`SdarSettings`, `Llada2Settings`, looked up by name in
`BLOCK_CONVENTION_SETTINGS`); what differs between the two official functions is a method of the subclass.
LLaDA2.1's editing decode is the third convention, "llada2.1" (`Llada21Settings` in llada21.py); its own options
(`CONVENTION_ONLY_OPTIONS`) are refused by the other conventions.

Deliberate deviations (shared/docs/models.md):
- SDAR temperature 0 is a SamplerError (upstream divides by zero); greedy is `top_k=1` as upstream.
- SDAR: a block still masked after `denoising_steps` (only if the model commits the mask token) gets more steps with
  quota 1 (upstream raises IndexError).
- Equal-length prompts are decoded as one batch (rows are independent; a finished row is frozen). The block grid is
  absolute, so a left-padded batch is decoded row by row (same tokens as one prompt at a time) and laid out like the
  input (pads, prompt, canvas; right-filled with the mask id). LLaDA2 rows of different cut lengths are right-padded
  with the pad id. `eos_early_stop` needs batch 1. Such a batch has no joint trajectory: `return_trajectory` gives
  one batch-of-one `Trajectory` per row (its own steps, laid out like the canvas, `start` = its left pads).
- With `use_cache="exact"` (default) a finished block's keys / values are stored in the next block's first forward
  instead of a separate commit forward (same tokens, one model call fewer per block).
Upstream quirks kept on purpose (comments at the code): SDAR asks topk for the scheduled count even when fewer masks
are left (rewriting unmasked positions); `sequential` may rewrite too. LLaDA2 `temperature=0` still samples
(multinomial), `steps = min(steps, gen_length // minimal_topk)`, returns only the generated tokens cut after the first
eos, and `eos_early_stop` returns prompt + tokens (searching eos from position 0).
"""

from __future__ import annotations

import functools
from abc import abstractmethod
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from dare_bench.diffusion.cache import ExactBlockCache
from dare_bench.diffusion.sampling.core import (
    CallSettings,
    Decoded,
    SamplerRun,
    SamplerSettings,
    Trajectory,
    TrajectoryStep,
    check_int,
    check_unit,
    is_left_padded,
    register_sampler,
)
from dare_bench.errors import SamplerError
from dare_bench.models.base import DiffusionLM
from dare_bench.models.layers import block_causal_mask

REMASKING_STRATEGIES = ("low_confidence_static", "low_confidence_dynamic", "sequential")
BLOCK_CACHES = ("exact", "none")
# options that belong to one block convention (all LLaDA2.1's joint threshold decoding, llada21.py)
CONVENTION_ONLY_OPTIONS = frozenset({"editing_threshold", "max_post_steps", "num_to_transfer"})


def block_sample_tokens(logits, temperature: float, top_k: int | None, top_p: float | None, generator,
                        rows: torch.Tensor | None = None):
    """SDAR / LLaDA2 `sample_with_temperature_topk_topp`: one multinomial call over `[B*b, V]`.

    `rows` (bool `[B, b]`): only these positions' tokens are wanted and `logits` holds just their rows (`[n, V]`,
    row-major order); the random stream advances exactly as the call over all `B*b` rows does, so the wanted
    tokens are the ones the full call samples. The others come back as 0 with probability 0."""
    flat = logits.reshape(-1, logits.shape[-1])
    shape = logits.shape[:-1] if rows is None else rows.shape
    total = flat.shape[0] if rows is None else rows.numel()
    # LLaDA2 at temperature 0 does not scale and still samples (multinomial), as upstream; SDAR never gets here
    # with temperature 0 (refused in SdarSettings.resolve)
    if temperature > 0 and temperature != 1.0:
        flat = flat / temperature
    if top_k is not None and top_k > 0:
        kth = torch.topk(flat, top_k)[0][..., -1, None]
        flat = torch.where(flat < kth, torch.full_like(flat, float("-inf")), flat)
    if top_p is not None and top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(flat, descending=True)
        cum = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
        drop = cum > top_p
        drop[..., 1:] = drop[..., :-1].clone()
        drop[..., 0] = False
        flat = flat.masked_fill(torch.zeros_like(flat, dtype=torch.bool).scatter(-1, sorted_idx, drop), float("-inf"))
    probs = F.softmax(flat, dim=-1)
    index = None if rows is None else rows.reshape(-1).nonzero().squeeze(-1)
    tok = multinomial_one(probs, generator, total, index)
    p0 = torch.gather(probs, -1, tok[:, None]).squeeze(-1)
    if index is None:
        return tok.view(shape), p0.view(shape)
    tokens = torch.zeros(total, dtype=torch.long, device=probs.device)
    conf = torch.zeros(total, dtype=p0.dtype, device=probs.device)
    tokens[index], conf[index] = tok, p0
    return tokens.view(shape), conf.view(shape)


def multinomial_one(probs: torch.Tensor, generator, total: int, index: torch.Tensor | None = None) -> torch.Tensor:
    """`torch.multinomial(full, 1, generator=generator)[index]` for a `[total, V]` distribution `full` of which
    `probs` holds the rows `index` (None: all of them), as `[n]` tokens.

    torch draws one sample as argmax(p / q) with q = Exp(1) from `exponential_` over the whole `[total, V]` input.
    On CPU a float32 Exp(1) draw is float32(-log1p(-u)) of one float64 uniform `u` per entry, so drawing the
    uniforms and taking the log of the wanted rows only gives the same tokens and leaves the generator where the
    full call does, at about a third of `exponential_`'s cost (`multinomial_matches_torch` checks this once per
    process, `tests/diffusion/test_sampling_block.py` on many draws). Elsewhere the full call runs, with a uniform
    placeholder in the rows not wanted (the draw of a row does not depend on the other rows)."""
    vocab = probs.shape[-1]
    if probs.device.type == "cpu" and probs.dtype == torch.float32 and multinomial_matches_torch():
        u = torch.empty((total, vocab), dtype=torch.float64, device=probs.device).uniform_(generator=generator)
        q = torch.log1p(-(u if index is None else u[index])).neg_().to(torch.float32)
        return (probs / q).argmax(-1)
    if index is None:
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    full = probs.new_full((total, vocab), 1.0 / vocab)
    full[index] = probs
    return torch.multinomial(full, 1, generator=generator).squeeze(-1)[index]


@functools.cache
def multinomial_matches_torch() -> bool:
    """Whether `multinomial_one`'s CPU draw is torch's own on this build: the same tokens and the same generator
    state after a few draws (else `multinomial_one` calls torch.multinomial)."""
    probs = torch.softmax(torch.randn(7, 61, generator=torch.Generator().manual_seed(11)) * 3, dim=-1)
    ours, theirs = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    for _ in range(3):
        u = torch.empty((7, 61), dtype=torch.float64).uniform_(generator=ours)
        mine = (probs / torch.log1p(-u).neg_().to(torch.float32)).argmax(-1)
        if not torch.equal(mine, torch.multinomial(probs, 1, generator=theirs).squeeze(-1)):
            return False
    return torch.equal(ours.get_state(), theirs.get_state())


def head_outside_forward(model) -> bool:
    """Whether the sampler may apply `model`'s LM head itself to some positions: a plain backbone (not a PEFT /
    FSDP / compile wrapper, whose head may be adapted, sharded or traced with the forward)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, DiffusionLM) and not isinstance(model, FSDPModule)


@register_sampler("block")
@dataclass(frozen=True)
class BlockSettings(SamplerSettings):
    """Settings of the block diffusion sampler; `resolve` returns the subclass of the chosen convention."""

    block_length: int
    steps: int  # denoising steps per block
    threshold: float  # confidence threshold of low_confidence_dynamic
    remasking_strategy: str
    temperature: float
    top_k: int | None
    top_p: float | None
    use_cache: str  # exact | none
    eos_early_stop: bool
    stop_at_eos: bool
    minimal_topk: int

    OPTIONS: ClassVar[frozenset[str]] = frozenset({
        "denoising_steps", "remasking_strategy", "confidence_threshold", "convention", "minimal_topk",
        "eos_early_stop"}) | CONVENTION_ONLY_OPTIONS
    CONVENTION: ClassVar[str]
    # options only this convention takes (each name is in CONVENTION_ONLY_OPTIONS; any other convention refuses it)
    CONVENTION_OPTIONS: ClassVar[frozenset[str]] = frozenset()
    DEFAULT_CACHE: ClassVar[str] = "exact"
    # eos_early_stop: None = not an option of this convention, "batch1" = one unpadded prompt only, "any" = any batch
    EOS_EARLY_STOP: ClassVar[str | None] = None

    @classmethod
    def resolve(cls, call: CallSettings, options: dict[str, Any], traits, prompt_ids, attention_mask):
        gen, threshold, steps = call.gen_length, call.threshold, call.steps
        convention = options.get("convention", DEFAULT_BLOCK_CONVENTION.get(traits.family, "sdar"))
        if convention not in BLOCK_CONVENTION_SETTINGS:
            raise SamplerError(f"unknown block convention {convention!r}; use one of "
                               f"{tuple(BLOCK_CONVENTION_SETTINGS)}")
        chosen = BLOCK_CONVENTION_SETTINGS[convention]
        foreign = sorted(k for k in options if k in CONVENTION_ONLY_OPTIONS and k not in chosen.CONVENTION_OPTIONS)
        if foreign:
            owners = sorted(c.CONVENTION for c in BLOCK_CONVENTION_SETTINGS.values()
                            if set(foreign) & c.CONVENTION_OPTIONS)
            raise SamplerError(f"{foreign} are options of block convention(s) {owners}, not {convention!r}")
        if not traits.is_block_diffusion and traits.logit_shift != 0:
            raise SamplerError("the block sampler needs a model whose logits are not shifted")
        padded = is_left_padded(attention_mask)
        b = call.block_length or traits.block_size or 32
        if b > gen:
            raise SamplerError(f"block_length {b} is longer than gen_length {gen}")
        ds = options.get("denoising_steps")
        if ds is not None and steps is not None and ds != steps:
            raise SamplerError(f"denoising_steps {ds} and steps {steps} disagree (both are steps per block)")
        steps = check_int("denoising_steps", ds if ds is not None else (steps if steps is not None else b))
        ct = options.get("confidence_threshold")
        if ct is not None and threshold is not None and float(ct) != threshold:
            raise SamplerError(f"confidence_threshold {ct} and threshold {threshold} disagree")
        thr = check_unit("confidence_threshold", ct) if ct is not None else threshold
        strategy = options.get("remasking_strategy", "low_confidence_dynamic")
        if strategy not in REMASKING_STRATEGIES:
            raise SamplerError(f"unknown remasking_strategy {strategy!r}; use one of {REMASKING_STRATEGIES}")
        minimal_topk = options.get("minimal_topk", 1)
        if isinstance(minimal_topk, float) and minimal_topk.is_integer():
            minimal_topk = int(minimal_topk)  # DARE's LLaDA2.0 configs pass 1.0 (upstream only floor-divides by it)
        minimal_topk = check_int("minimal_topk", minimal_topk)
        eos_early_stop = bool(options.get("eos_early_stop", False))
        if eos_early_stop and (chosen.EOS_EARLY_STOP is None or chosen.EOS_EARLY_STOP == "batch1" and (
                prompt_ids.shape[0] != 1 or padded)):
            raise SamplerError("eos_early_stop is an option of the LLaDA2 samplers: batch 1 with convention "
                               "'llada2', any batch with 'llada2.1'")
        use_cache = call.use_cache or chosen.DEFAULT_CACHE
        if use_cache not in BLOCK_CACHES:
            raise SamplerError(f"use_cache {use_cache!r} is not one of {BLOCK_CACHES} for block diffusion")
        return chosen.with_defaults(
            call, block_length=b, steps=steps, threshold=thr, remasking_strategy=strategy, use_cache=use_cache,
            eos_early_stop=eos_early_stop, minimal_topk=minimal_topk,
            **chosen.convention_fields({k: v for k, v in options.items() if k in chosen.CONVENTION_OPTIONS},
                                       strategy_given="remasking_strategy" in options))

    @classmethod
    def convention_fields(cls, options: dict[str, Any], strategy_given: bool) -> dict[str, Any]:
        """The convention's own fields from its `CONVENTION_OPTIONS` (checked); none by default."""
        return {}

    @classmethod
    @abstractmethod
    def with_defaults(cls, call: CallSettings, **fields) -> "BlockSettings":
        """The convention's defaults for temperature / top_k / top_p / threshold / stop_at_eos (and its checks)."""

    def record(self) -> dict[str, Any]:
        out = super().record()
        out.update(convention=self.CONVENTION, block_length=self.block_length, steps=self.steps,
                   threshold=self.threshold, remasking_strategy=self.remasking_strategy,
                   temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, use_cache=self.use_cache,
                   eos_early_stop=self.eos_early_stop, stop_at_eos=self.stop_at_eos, minimal_topk=self.minimal_topk)
        return out

    # ---- what the conventions do differently

    @property
    @abstractmethod
    def block_stop_ids(self) -> tuple[int, ...]:
        """Tokens that finish a row under `stop_at_eos`."""

    @abstractmethod
    def quota_after_schedule(self, step: int) -> int | None:
        """Tokens to commit at `step >= steps` in a block that still has masks; None leaves the block as it is."""

    @abstractmethod
    def topk_count(self, quota: int, n_masked: int) -> int:
        """How many positions one step asks topk (or `sequential`) for."""

    @abstractmethod
    def stop_region(self, x: torch.Tensor, prompt_length: int, block_end: int) -> torch.Tensor:
        """Part of the canvas searched for stop ids after a block."""

    @abstractmethod
    def finish(self, model, x: torch.Tensor, prompt_length: int, run: SamplerRun) -> Decoded:
        """The official return value from the final canvas."""

    @abstractmethod
    def finish_rows(self, model, canvas: torch.Tensor, rows: list[Decoded], prompt_length: int,
                    trajectory: list[Trajectory] | None) -> Decoded:
        """The return value of a left-padded batch decoded row by row (`canvas` and the per-row `trajectory`
        already laid out)."""

    # ---- decoding

    def decode(self, model, prompt_ids, attention_mask, run: SamplerRun) -> Decoded:
        if is_left_padded(attention_mask):
            return self.decode_rows(model, prompt_ids, attention_mask, run)
        return self.decode_batch(model, prompt_ids, run)

    def trajectory(self, run: SamplerRun, prompt_length: int) -> Trajectory | None:
        if run.steps is None:
            return None
        return Trajectory(steps=run.steps, prompt_length=prompt_length, kind="block", mask_id=self.mask_id,
                          block_size=self.block_length)

    def sampled_positions(self, mask_index: torch.Tensor, quota: int) -> torch.Tensor:
        """Positions (bool `[B, b]`) whose sampled token this step may write: the masked ones, or the whole row
        where `sequential` writes from its first mask on, masked or not, or where topk is asked for more positions
        than the row has masks (SDAR's `topk_count`: it then writes unmasked positions too)."""
        masks = mask_index.sum(1)
        if self.remasking_strategy == "sequential":
            whole = masks > 0
        else:
            whole = torch.tensor([self.topk_count(quota, k) > k > 0 for k in masks.tolist()], device=masks.device)
        return mask_index | whole[:, None]

    def decode_batch(self, model, prompt: torch.Tensor, run: SamplerRun) -> Decoded:
        """Equal-length prompts: block by block over the absolute grid, `steps` steps per block."""
        mask_id, gen, b, steps = self.mask_id, self.gen_length, self.block_length, self.steps
        b_sz, p = prompt.shape
        device = prompt.device
        n_blocks = (p + gen + b - 1) // b
        total = n_blocks * b
        x = torch.full((b_sz, total), mask_id, dtype=torch.long, device=device)
        x[:, :p] = prompt
        first_block = p // b
        sched = [b // steps + (1 if i < b % steps else 0) for i in range(steps)]
        cache = None
        if self.use_cache == "exact":
            # a plain backbone hands the cache its hidden states, so only the positions a step may write go through
            # the LM head (the recompute path keeps the official whole-prefix logits)
            cache = ExactBlockCache(model, b, run.forward, hidden=head_outside_forward(model), rows_known=True)
            cache.prefill(x[:, :first_block * b])
        done = torch.zeros(b_sz, dtype=torch.bool, device=device)
        thr, strategy, eos_id = self.threshold, self.remasking_strategy, self.eos_id

        for k in range(first_block, n_blocks):
            s0, s1 = k * b, (k + 1) * b
            step = 0
            while True:
                blk = x[:, s0:s1]
                mask_index = (blk == mask_id) & ~done[:, None]
                if not bool(mask_index.any()):
                    break
                if step >= steps:
                    quota = self.quota_after_schedule(step)
                    if quota is None:
                        break
                else:
                    quota = sched[step]
                if cache is not None and cache.hidden:
                    out = cache.block_logits(blk, history=x[:, :s1])
                    need = self.sampled_positions(mask_index, quota)
                    x0, p0 = block_sample_tokens(out.head.logits(out.states[need]), self.temperature, self.top_k,
                                                 self.top_p, self.generator, rows=need)
                else:
                    if cache is not None:
                        logits = cache.block_logits(blk, history=x[:, :s1])
                    else:
                        pos = torch.arange(s1, device=device).expand(b_sz, s1)
                        logits = run.forward(x[:, :s1], position_ids=pos,
                                             attn_mask=block_causal_mask(s1, s1, b, device=device))[:, s0:s1]
                    x0, p0 = block_sample_tokens(logits, self.temperature, self.top_k, self.top_p, self.generator)
                conf = torch.where(mask_index, p0, torch.full_like(p0, -torch.inf))
                transfer = torch.zeros_like(mask_index)
                for j in range(b_sz):
                    if done[j] or not bool(mask_index[j].any()):
                        continue
                    kq = self.topk_count(quota, int(mask_index[j].sum()))
                    if strategy == "sequential":
                        # from the first mask on, kq positions, masked or not (may rewrite, as upstream)
                        first = int(mask_index[j].nonzero()[0])
                        transfer[j, first:first + kq] = True
                    elif strategy == "low_confidence_static":
                        transfer[j, torch.topk(conf[j], kq).indices] = True
                    else:
                        high = conf[j] > thr
                        if int(high.sum()) >= quota:
                            transfer[j] = high
                        else:
                            transfer[j, torch.topk(conf[j], kq).indices] = True
                before = x.clone() if run.recording else None
                blk[transfer] = x0[transfer]
                if before is not None:
                    run.record(before, before, x, mask_id, s1)
                step += 1
                if self.eos_early_stop and bool((x0[transfer] == eos_id).any()):
                    # LLaDA2: searches eos from position 0 and returns prompt + tokens up to it
                    eos_pos = (x[0, :s1] == eos_id).nonzero()
                    if len(eos_pos) > 0:
                        e = int(eos_pos[0])
                        if bool((x[0, p:e] != mask_id).all()):
                            return Decoded(x[:, :e + 1].clone(), x, self.trajectory(run, p), p)
            if self.stop_at_eos:
                region = self.stop_region(x, p, s1)
                for t in self.block_stop_ids:
                    done |= (region == t).any(1)
            if bool(done.all()):
                break
            if cache is not None and k + 1 < n_blocks:
                cache.commit(x[:, s0:s1])
        return self.finish(model, x, p, run)

    def decode_rows(self, model, prompt: torch.Tensor, am: torch.Tensor, run: SamplerRun) -> Decoded:
        """Left-padded batch: each row decoded on its own (its block grid starts at its own first token), then laid
        out like the input: row j = pads + its canvas, right-filled with the mask id (positions that row never had);
        the generated region starts at the padded prompt width for every row."""
        b_sz, p = prompt.shape
        rows = []
        for j in range(b_sz):
            start = int((am[j] == 0).sum())
            run.restart_recording()  # each row records its own trajectory
            rows.append((start, self.decode_batch(model, prompt[j:j + 1, start:], run)))
        width = max(start + out.canvas.shape[1] for start, out in rows)
        canvas = torch.full((b_sz, width), self.mask_id, dtype=torch.long, device=prompt.device)
        for j, (start, out) in enumerate(rows):
            canvas[j, :start] = prompt[j, :start]
            canvas[j, start:start + out.canvas.shape[1]] = out.canvas[0]
        trajectory = None
        if run.recording:
            trajectory = [self.laid_out(out.trajectory, canvas[j:j + 1, :start], start, width, p)
                          for j, (start, out) in enumerate(rows)]
        return self.finish_rows(model, canvas, [out for _, out in rows], p, trajectory)

    def laid_out(self, traj: Trajectory, pads: torch.Tensor, start: int, width: int, prompt_length: int) -> Trajectory:
        """A row's own trajectory laid out like the batch canvas: every state is its `pads`, then its canvas,
        right-filled with the mask id; nothing unmasked outside its canvas; region ends shifted by its pads, which
        `start` keeps out of every model call."""
        steps = []
        for st in traj.steps:
            n = st.state.shape[1]
            state = torch.full((1, width), self.mask_id, dtype=st.state.dtype, device=st.state.device)
            state[:, :start] = pads
            state[:, start:start + n] = st.state
            unmasked = torch.zeros((1, width), dtype=torch.bool, device=st.unmasked.device)
            unmasked[:, start:start + n] = st.unmasked
            steps.append(TrajectoryStep(state=state, unmasked=unmasked, region_end=start + st.region_end))
        return replace(traj, steps=steps, prompt_length=prompt_length, start=start)


@dataclass(frozen=True)
class SdarSettings(BlockSettings):
    """SDAR `block_diffusion_generate`: returns the whole canvas (prompt + every block)."""

    CONVENTION: ClassVar[str] = "sdar"

    @classmethod
    def with_defaults(cls, call: CallSettings, **fields) -> "SdarSettings":
        temperature = 1.0 if call.temperature is None else float(call.temperature)
        if temperature == 0:
            raise SamplerError("the SDAR sampler divides by the temperature; for greedy decoding use top_k=1")
        if fields["threshold"] is None:
            fields["threshold"] = 0.85
        return cls(**cls.common_fields(call), **fields, temperature=temperature,
                   top_k=0 if call.top_k is None else call.top_k, top_p=1.0 if call.top_p is None else call.top_p,
                   stop_at_eos=bool(call.stop_at_eos or False))

    @property
    def block_stop_ids(self) -> tuple[int, ...]:
        return self.stop_ids  # the stopping criteria hold every stop id

    def quota_after_schedule(self, step: int) -> int | None:
        # upstream would index past its schedule here (IndexError); at most block_length extra one-token steps, so a
        # model that keeps predicting the mask token cannot loop forever
        return None if step >= self.steps + self.block_length else 1

    def topk_count(self, quota: int, n_masked: int) -> int:
        # SDAR asks topk for the scheduled count even when fewer masks are left (then it rewrites unmasked
        # positions, as upstream does)
        return quota

    def stop_region(self, x, prompt_length, block_end):
        return x[:, prompt_length:]

    def finish(self, model, x, prompt_length, run):
        return Decoded(x, x, self.trajectory(run, prompt_length), prompt_length)

    def finish_rows(self, model, canvas, rows, prompt_length, trajectory):
        return Decoded(canvas, canvas, trajectory, prompt_length)


@dataclass(frozen=True)
class Llada2Settings(BlockSettings):
    """LLaDA2 `generate`: returns only the generated tokens, cut after the first eos."""

    CONVENTION: ClassVar[str] = "llada2"
    EOS_EARLY_STOP: ClassVar[str | None] = "batch1"

    @classmethod
    def with_defaults(cls, call: CallSettings, **fields) -> "Llada2Settings":
        if fields["threshold"] is None:
            fields["threshold"] = 0.95
        # upstream: steps = min(steps, gen_length // minimal_topk)
        fields["steps"] = min(fields["steps"], call.gen_length // fields["minimal_topk"])
        return cls(**cls.common_fields(call), **fields,
                   temperature=0.0 if call.temperature is None else float(call.temperature), top_k=call.top_k,
                   top_p=call.top_p, stop_at_eos=True if call.stop_at_eos is None else bool(call.stop_at_eos))

    @property
    def block_stop_ids(self) -> tuple[int, ...]:
        return (self.eos_id,)

    def quota_after_schedule(self, step: int) -> int | None:
        return None  # upstream leaves the block as it is after `steps` steps

    def topk_count(self, quota: int, n_masked: int) -> int:
        return min(quota, n_masked)  # capped at the masks left

    def stop_region(self, x, prompt_length, block_end):
        return x[:, prompt_length:block_end]

    def finish(self, model, x, prompt_length, run):
        gen = self.gen_length
        answer = x[:, prompt_length:prompt_length + gen]
        rows = []
        for j in range(x.shape[0]):
            hits = (answer[j] == self.eos_id).nonzero()
            cut = int(hits[0]) + 1 if len(hits) else gen
            rows.append(answer[j, :cut])
        return Decoded(self.right_padded(model, rows, x.device), x, self.trajectory(run, prompt_length), 0)

    def finish_rows(self, model, canvas, rows, prompt_length, trajectory):
        return Decoded(self.right_padded(model, [out.sequences[0] for out in rows], canvas.device), canvas,
                       trajectory, 0)

    @staticmethod
    def right_padded(model, rows: list[torch.Tensor], device) -> torch.Tensor:
        """Rows of different cut lengths, right-padded with the pad id."""
        width = max(t.shape[0] for t in rows)
        out = torch.full((len(rows), width), model.traits.pad_token_id, dtype=torch.long, device=device)
        for j, t in enumerate(rows):
            out[j, :t.shape[0]] = t
        return out


# convention name -> settings class; llada21.py adds "llada2.1" (the package exports BLOCK_CONVENTIONS once all
# conventions are registered)
BLOCK_CONVENTION_SETTINGS: dict[str, type[BlockSettings]] = {"sdar": SdarSettings, "llada2": Llada2Settings}
# Which official block sampler a family ships with (its own generate function), by traits.family.
DEFAULT_BLOCK_CONVENTION = {"llada2": "llada2"}
