"""LLaDA2.1 joint threshold decoding (block convention "llada2.1"): Mask-to-Token (M2T) threshold commits plus
Token-to-Token (T2T) editing of already committed tokens, with post-block editing steps.

    from dare_bench.diffusion.sampling import generate
    out = generate(model, prompt_ids, convention="llada2.1", gen_length=4096, block_length=32, steps=32,
                   temperature=0.0, threshold=0.95, editing_threshold=0.9, max_post_steps=16, num_to_transfer=1,
                   minimal_topk=1, eos_early_stop=False)       # DARE's pinned LLaDA2.1-mini settings
    out.sequences   # generated tokens only, cut after the first eos (the official return value)
    out.stats       # forwards (= the official function's model calls for one prompt), tokens_per_forward

Reference: `LLaDA2MoeModelLM.generate` of the HF remote code of inclusionAI/LLaDA2.1-mini (`modeling_llada2_moe.py`,
sha256 3bbf1e30...cc5), read from yjyddq/DARE @ 5877371 `models/LLaDA2.1-mini/` (the same bytes as ZHZisZZ/dllm @
9268328a `dllm/pipelines/llada21/models/`); DARE's OpenCompass wrapper `LLaDA2Dot1MoEModel` calls it one prompt at a
time. Token parity: `pytest tests/diffusion/test_sampling_llada21.py` (fixture `tests/fixtures/llada21/`).

Per block of the absolute grid, the official loop (no step schedule: `steps` is only capped by
`gen_length // minimal_topk` and then unused, as upstream) repeats one forward of the whole prefix up to the block
end and then:
- M2T: of the block's masks, commit those whose confidence is > `threshold`; if fewer than `num_to_transfer` pass,
  commit the `min(num_to_transfer, masks left)` most confident instead;
- T2T: every non-mask, non-prompt position of the block whose newly drawn token differs from the current one and
  whose confidence is > `editing_threshold` takes the new token (in the same forward as M2T);
- a forward that starts with no mask left is a post step; the block ends after a post step that edits nothing, or
  before the forward that would be post step `max_post_steps + 1`.
The confidence is the probability of the drawn token (temperature 0: argmax of the raw logits and its softmax
probability, no top-k / top-p; otherwise `sample_with_temperature_topk_topp`'s multinomial from torch's global RNG or
`generator`). `eos_early_stop` ends decoding after a block once the generated region has no mask and holds an eos;
the return value is the same (only fewer forwards).

Upstream quirk kept on purpose: the official generate passes its block mask as 0/1 values (no `.log()`, unlike
LLaDA2.0's 0/-inf), which SDPA adds to the attention scores: positions are not hidden, a key of a later block just
gets a bias 1 lower. So earlier blocks see the current block and every forward re-encodes the prefix (no KV cache:
`use_cache` is "none"; "exact" is refused because it would change the tokens).

Deliberate deviations:
- Batches: the official function takes one prompt. Equal-length prompts are decoded together (a row that has ended
  its block waits; each row's tokens are those of the prompt alone, up to float rounding of batched matmuls);
  a left-padded batch is decoded row by row (block.py). Sampled rows of a batch draw from one RNG call, so seeded
  sampled batches differ from one-prompt-at-a-time runs, as for the other block conventions.
- Upstream loops forever if the model keeps drawing the mask token; here a block makes at most
  `4 * (block_length + max_post_steps)` forwards and is then left as it is. Without a drawn mask token the official
  loop makes at most `block_length + max_post_steps` (each M2T forward fills a mask, post steps are capped); each
  position committed or edited to the mask token (a T2T edit can re-mask a token) adds at most one, so the bound
  only binds on a model that draws the mask token over and over.
- `stop_at_eos=True` (default False, as upstream) ends a row after a block whose generated region holds an eos
  even if masks are left; same tokens, fewer forwards.
- No trajectory: T2T rewrites committed tokens, which `replay_trajectory` does not model (return_trajectory is
  refused).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dare_bench.diffusion.sampling.block import (
    BLOCK_CONVENTION_SETTINGS,
    Llada2Settings,
    block_sample_tokens,
)
from dare_bench.diffusion.sampling.core import CallSettings, Decoded, SamplerRun, check_int
from dare_bench.errors import SamplerError
from dare_bench.models.layers import block_causal_mask

# forwards one block may make, in units of the most the official loop makes when the mask token is never drawn
MAX_FORWARDS_FACTOR = 4


def joint_sample_tokens(logits, temperature: float, top_k: int | None, top_p: float | None, generator):
    """LLaDA2.1 `_sample_with_temperature_topk_topp`: temperature 0 is the argmax with its softmax probability (no
    top-k / top-p); otherwise LLaDA2's multinomial sampler."""
    if temperature == 0:
        probs = torch.softmax(logits, dim=-1)
        tok = logits.argmax(dim=-1, keepdim=True)
        return tok.squeeze(-1), torch.gather(probs, -1, tok).squeeze(-1)
    return block_sample_tokens(logits, temperature, top_k, top_p, generator)


def check_probability(name: str, value) -> float:
    """A threshold in [0, 1] (0 is LLaDA2.1's S-mode editing threshold; 1 switches the rule off: the test is >)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= float(value) <= 1:
        raise SamplerError(f"{name} must be in [0, 1], got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Llada21Settings(Llada2Settings):
    """LLaDA2.1 `generate`: joint M2T threshold + T2T editing decoding; returns like LLaDA2 (generated tokens cut
    after the first eos)."""

    editing_threshold: float
    max_post_steps: int
    num_to_transfer: int

    CONVENTION: ClassVar[str] = "llada2.1"
    CONVENTION_OPTIONS: ClassVar[frozenset[str]] = frozenset({"editing_threshold", "max_post_steps",
                                                               "num_to_transfer"})
    DEFAULT_CACHE: ClassVar[str] = "none"
    EOS_EARLY_STOP: ClassVar[str | None] = "any"
    # the official generate() defaults
    OFFICIAL_DEFAULTS: ClassVar[dict[str, Any]] = {"editing_threshold": 0.9, "max_post_steps": 16,
                                                   "num_to_transfer": 1}

    @classmethod
    def convention_fields(cls, options: dict[str, Any], strategy_given: bool) -> dict[str, Any]:
        if strategy_given:
            raise SamplerError("remasking_strategy is not an option of convention 'llada2.1' (its M2T rule is the "
                               "threshold with a num_to_transfer fallback)")
        merged = {**cls.OFFICIAL_DEFAULTS, **options}
        return {"editing_threshold": check_probability("editing_threshold", merged["editing_threshold"]),
                "max_post_steps": check_int("max_post_steps", merged["max_post_steps"], low=0),
                "num_to_transfer": check_int("num_to_transfer", merged["num_to_transfer"])}

    @classmethod
    def with_defaults(cls, call: CallSettings, **fields) -> "Llada21Settings":
        if call.return_trajectory:
            raise SamplerError("return_trajectory is not available for convention 'llada2.1': T2T editing rewrites "
                               "committed tokens, which a trajectory replay does not model")
        if fields["use_cache"] != "none":
            raise SamplerError("convention 'llada2.1' re-encodes the prefix every forward (its official 0/1 block "
                               "mask lets earlier blocks see the current one); use_cache must be 'none'")
        if fields["threshold"] is None:
            fields["threshold"] = 0.95
        fields["steps"] = min(fields["steps"], call.gen_length // fields["minimal_topk"])  # as upstream; unused
        fields["remasking_strategy"] = "joint_threshold"  # recorded: the M2T + T2T rule (sglang's name for it)
        return cls(**cls.common_fields(call), **fields,
                   temperature=0.0 if call.temperature is None else float(call.temperature), top_k=call.top_k,
                   top_p=call.top_p, stop_at_eos=bool(call.stop_at_eos or False))

    def record(self) -> dict[str, Any]:
        out = super().record()
        out.update(editing_threshold=self.editing_threshold, max_post_steps=self.max_post_steps,
                   num_to_transfer=self.num_to_transfer)
        return out

    def decode_batch(self, model, prompt: torch.Tensor, run: SamplerRun) -> Decoded:
        """Equal-length prompts: block by block over the absolute grid, each row running the official loop."""
        mask_id, eos_id, b = self.mask_id, self.eos_id, self.block_length
        b_sz, p = prompt.shape
        device = prompt.device
        n_blocks = (p + self.gen_length + b - 1) // b
        x = torch.full((b_sz, n_blocks * b), mask_id, dtype=torch.long, device=device)
        x[:, :p] = prompt
        done = torch.zeros(b_sz, dtype=torch.bool, device=device)
        # upstream has no bound (it never ends if the model keeps drawing the mask token); see the module docstring
        max_forwards = MAX_FORWARDS_FACTOR * (b + self.max_post_steps)

        for k in range(p // b, n_blocks):
            s0, s1 = k * b, (k + 1) * b
            # the official 0/1 mask, added to the attention scores (upstream quirk, see the module docstring)
            soft_mask = block_causal_mask(s1, s1, b, device=device).to(torch.float32)
            positions = torch.arange(s1, device=device)
            prompt_in_block = torch.arange(s0, s1, device=device) < p
            live = ~done  # rows still running this block's loop
            post = torch.zeros(b_sz, dtype=torch.long, device=device)
            forwards = 0
            while True:
                masked = x[:, s0:s1] == mask_id
                post += (live & ~masked.any(1)).long()
                live &= post <= self.max_post_steps
                if not bool(live.any()) or forwards >= max_forwards:
                    break
                rows = live.nonzero().squeeze(1)
                old, masked = x[rows, s0:s1], masked[rows]
                logits = run.forward(x[rows, :s1], position_ids=positions.expand(len(rows), s1),
                                     attn_mask=soft_mask)[:, s0:s1]
                forwards += 1
                x0, p0 = joint_sample_tokens(logits, self.temperature, self.top_k, self.top_p, self.generator)
                commit = self.m2t(masked, p0)
                editable = ~masked & ~prompt_in_block
                edit = editable & (torch.where(editable, p0, -torch.inf) > self.editing_threshold) & (x0 != old)
                change = commit | edit
                x[rows, s0:s1] = torch.where(change, x0, old)
                live[rows[~masked.any(1) & ~edit.any(1)]] = False  # a post step that edited nothing ends the block
            region = x[:, p:s1]
            has_eos = (region == eos_id).any(1)
            if self.eos_early_stop:
                done |= has_eos & ~(region == mask_id).any(1)
            if self.stop_at_eos:
                done |= has_eos
            if bool(done.all()):
                break
        return self.finish(model, x, p, run)

    def m2t(self, masked: torch.Tensor, conf: torch.Tensor) -> torch.Tensor:
        """Masks to commit, per row: those above the threshold if at least `num_to_transfer` are, else the
        `min(num_to_transfer, masks left)` most confident."""
        mask_conf = torch.where(masked, conf, -torch.inf)
        high = (mask_conf > self.threshold) & masked
        enough = high.sum(1) >= self.num_to_transfer
        commit = high & enough[:, None]
        for j in (~enough & masked.any(1)).nonzero().squeeze(1).tolist():
            k = min(self.num_to_transfer, int(masked[j].sum()))
            commit[j, torch.topk(mask_conf[j], k).indices] = True
        return commit


BLOCK_CONVENTION_SETTINGS[Llada21Settings.CONVENTION] = Llada21Settings
