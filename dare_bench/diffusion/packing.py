"""Packed (varlen) training forwards: the real tokens of a padded batch in fewer rows, no padding computed.

`packed_forward(model, input_ids, attention_mask=..., position_ids=..., attn_mask=...)` takes any training-time call
of a backbone in its padded form and runs it packed: the tokens of each row that take part in the call (its real
tokens: `attention_mask` 1 and, with a 4-D pattern, visible as a key to some query) are laid one sequence after
another into rows of at most the longest sequence (first-fit decreasing), each keeping the position id the padded
call gives it, under the block diagonal of each sequence's own mask (no attention across sequences). The outputs
(logits, or `HiddenStates` with `return_hidden`) are moved back to the padded `[N, L, ...]` grid; positions that
took no part are 0. A real token therefore sees exactly the keys it sees in the padded call, and gets the padded
call's output up to float rounding (tests/diffusion/test_packing.py).

That one rule covers every layout the estimators use: MDLM rows (LLaDA, Dream: bidirectional within a sequence,
Dream's shift applied by the caller on the unpacked grid), left-aligned rows (positions restart at 0 per sequence),
and the BD3 `[x_t ; x_0]` layout of `models.block.training_forward` (SDAR, LLaDA2: each sequence's noisy and clean
copies, its own BD3 mask, block boundaries from its first real token). Masks and Monte-Carlo draws are made on the
padded grid before the forward, so the packed path uses the very same draws.

Attention: the packed mask goes to the model's backend as a boolean `attn_mask`. sdpa / flex get the block-diagonal
mask; the `flash_attn` backend turns it into `flash_attn_varlen_func` groups (`models/flash.py`: one `cu_seqlens`
segment per sequence for MDLM rows, per BD3 block for block diffusion), so on a GPU packing is flash-attn varlen.

`PackedModel(model, traits)` is the same as a drop-in model: the trainers wrap the policy (and the reference) in it
when `train.packing` is on (SFT, VRPO, the RL update of every plug-in whose Config does not set `packing_refused`);
the likelihood estimators, `training_forward` and `common.model_logits` then pack without knowing it.

Library module (no command line); `pytest tests/diffusion/test_packing.py -q`; `dare-bench bench packing` times it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dare_bench.errors import DareBenchError
from dare_bench.models.layers import block_causal_mask
from dare_bench.models.lm_head import HiddenStates

__all__ = ["PackedLayout", "PackedModel", "first_fit_decreasing", "pack_layout", "packed_forward"]


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Bins of row indices, each summing to <= capacity: longest first, into the first bin with room (ties by
    index, so the plan is deterministic). Zero-length rows go nowhere."""
    if any(n > capacity for n in lengths):
        raise DareBenchError(f"packing: a sequence of {max(lengths)} tokens exceeds the row capacity {capacity}")
    bins: list[list[int]] = []
    fill: list[int] = []
    for r in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        n = lengths[r]
        if n == 0:
            continue
        for b in range(len(bins)):
            if fill[b] + n <= capacity:
                bins[b].append(r)
                fill[b] += n
                break
        else:
            bins.append([r])
            fill.append(n)
    return bins


@dataclass(frozen=True)
class PackedLayout:
    """Packed rows of a padded `[N, L]` call: input_ids / position_ids `[P, T]`, attn_mask bool `[P, 1, T, T]`,
    and the flat indices that move outputs back: padded token `src[i]` (into N*L) is packed token `dst[i]` (P*T)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attn_mask: torch.Tensor
    src: torch.Tensor
    dst: torch.Tensor
    shape: tuple[int, int]

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """`[P, T, ...]` -> `[N, L, ...]` (0 where a padded position took no part); differentiable."""
        n, length = self.shape
        flat = packed.reshape(-1, *packed.shape[2:])
        out = flat.new_zeros((n * length, *packed.shape[2:]))
        return out.index_copy(0, self.src, flat.index_select(0, self.dst)).view(n, length, *packed.shape[2:])


def pack_layout(input_ids: torch.Tensor, valid: torch.Tensor, position_ids: torch.Tensor,
                pattern: torch.Tensor | None, pad_id: int = 0, capacity: int | None = None) -> PackedLayout:
    """Pack the `valid` tokens (bool `[N, L]`) of each row; `pattern` bool `[N or 1, 1, L, L]` (None: every token
    sees every valid token of its row) restricted to each sequence's valid tokens gives its diagonal block.
    Slack at the end of a packed row is one more segment whose tokens see only themselves (no empty softmax).
    `capacity`: tokens a packed row may hold (default: the longest sequence)."""
    n, length = input_ids.shape
    device = input_ids.device
    lengths = valid.sum(dim=1).tolist()
    bins = first_fit_decreasing(lengths, capacity if capacity is not None else (max(lengths) if lengths else 0))
    width = max((sum(lengths[r] for r in b) for b in bins), default=0)
    p = len(bins)
    ids = torch.full((p, width), pad_id, dtype=input_ids.dtype, device=device)
    pos = torch.zeros((p, width), dtype=position_ids.dtype, device=device)
    mask = torch.zeros((p, 1, width, width), dtype=torch.bool, device=device)
    src, dst = [], []
    for b, rows in enumerate(bins):
        start = 0
        for r in rows:
            cols = valid[r].nonzero().squeeze(-1)
            k = cols.numel()
            ids[b, start:start + k] = input_ids[r, cols]
            pos[b, start:start + k] = position_ids[r, cols]
            if pattern is None:
                mask[b, 0, start:start + k, start:start + k] = True
            else:
                m = pattern[r if pattern.shape[0] > 1 else 0, 0]
                mask[b, 0, start:start + k, start:start + k] = m.index_select(0, cols).index_select(1, cols)
            src.append(r * length + cols)
            dst.append(b * width + start + torch.arange(k, device=device))
            start += k
        slack = torch.arange(start, width, device=device)
        mask[b, 0, slack, slack] = True
    empty = torch.zeros(0, dtype=torch.long, device=device)
    return PackedLayout(ids, pos, mask, torch.cat(src) if src else empty, torch.cat(dst) if dst else empty,
                        (n, length))


def _pattern(traits, attn_mask: torch.Tensor | None, n: int, length: int, device) -> torch.Tensor | None:
    """The bool `[N or 1, 1, L, L]` pattern the padded call applies before hiding padding keys (None: full)."""
    if attn_mask is not None:
        if attn_mask.dtype != torch.bool or attn_mask.dim() != 4 or attn_mask.shape[1] != 1 \
                or tuple(attn_mask.shape[2:]) != (length, length) or attn_mask.shape[0] not in (1, n):
            raise DareBenchError(f"packing: attn_mask must be a bool [N or 1, 1, {length}, {length}] mask, got "
                                 f"{attn_mask.dtype} {tuple(attn_mask.shape)}")
        return attn_mask
    if traits.is_block_diffusion:  # a block-diffusion call without a mask attends block-causally
        return block_causal_mask(length, length, traits.block_size, device=device)
    return None


def packed_forward(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                   position_ids: torch.Tensor | None = None, *, attn_mask: torch.Tensor | None = None,
                   return_hidden: bool = False, traits=None, capacity: int | None = None):
    """The padded call `model(input_ids, attention_mask, position_ids, attn_mask=..., return_hidden=...)`, computed
    packed (module doc). `attention_mask`: `[N, L]` 0/1 padding mask (hides keys, as every family reads it);
    `position_ids` default to 0..L-1 (every family's default without a cache); `attn_mask`: a bool pattern.
    `traits`: the backbone's (default `model.traits`). `capacity`: tokens per packed row (default: the longest
    sequence; WSD packs its documents into rows of `seq_len`, twice that in the BD3 layout). When no two sequences
    fit in one row the padded call is made as is: packing would compute the same rows."""
    traits = traits if traits is not None else model.traits
    if input_ids.dim() != 2:
        raise DareBenchError(f"packing: input_ids must be [N, L], got {tuple(input_ids.shape)}")
    n, length = input_ids.shape
    device = input_ids.device
    if attention_mask is not None and (not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2
                                       or attention_mask.shape[-1] != length or attention_mask.shape[0] not in (1, n)):
        raise DareBenchError(f"packing: attention_mask must be a [N, {length}] padding mask, got "
                             f"{getattr(attention_mask, 'shape', type(attention_mask).__name__)}")
    valid = (attention_mask.bool() if attention_mask is not None
             else torch.ones(1, length, dtype=torch.bool, device=device)).to(device).expand(n, length)
    pattern = _pattern(traits, attn_mask, n, length, device)
    if pattern is not None:  # a token no query can see takes no part (BD3 padding keys are hidden that way)
        valid = valid & pattern.expand(n, 1, length, length)[:, 0].any(dim=1)
    if position_ids is None:
        position_ids = torch.arange(length, device=device)
    position_ids = position_ids.to(device).expand(n, length)
    lengths = valid.sum(dim=1).tolist()
    capacity = max(lengths) if capacity is None else int(capacity)
    if all(len(b) == 1 for b in first_fit_decreasing(lengths, capacity)):
        # no two sequences share a row: packing would only re-lay the same rows; the padded call is the same call
        return model(input_ids, attention_mask=attention_mask, position_ids=position_ids, attn_mask=attn_mask,
                     **({"return_hidden": True} if return_hidden else {}))
    layout = pack_layout(input_ids, valid, position_ids, pattern, pad_id=int(traits.pad_token_id), capacity=capacity)
    out = model(layout.input_ids, position_ids=layout.position_ids, attn_mask=layout.attn_mask,
                **({"return_hidden": True} if return_hidden else {}))
    if return_hidden:
        if not isinstance(out, HiddenStates):
            raise DareBenchError(f"packing: return_hidden=True gave {type(out).__name__}, not HiddenStates")
        return HiddenStates(layout.unpack(out.states), out.head)
    if not isinstance(out, torch.Tensor):
        out = getattr(out, "logits", None)
        if out is None:
            raise DareBenchError("packing: the model returned neither logits nor an object with .logits")
    return layout.unpack(out)


class PackedModel:
    """`model` (a backbone, its PEFT / FSDP wrapper, or the LoRA reference callable) whose calls run packed
    (`packed_forward`). Everything else (parameters, traits, train/eval, ...) is the wrapped model's.
    Calls it cannot pack (a KV cache, official 4-D `attention_mask` forms) raise one DareBenchError. `capacity`:
    tokens per packed row (`packed_forward`)."""

    def __init__(self, model, traits, capacity: int | None = None):
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "traits", traits)
        object.__setattr__(self, "capacity", capacity)

    def __call__(self, input_ids, attention_mask=None, position_ids=None, *, attn_mask=None, return_hidden=False,
                 **other):
        if other:
            raise DareBenchError(f"packing: cannot pack a forward with {sorted(other)} (train.packing covers "
                                 "training forwards: padding mask, positions, a bool attn_mask)")
        return packed_forward(self.model, input_ids, attention_mask, position_ids, attn_mask=attn_mask,
                              return_hidden=return_hidden, traits=self.traits, capacity=self.capacity)

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "model"), name)


def maybe_packed(model, traits, packing: bool):
    """`PackedModel(model, traits)` when `packing`, else `model` (None stays None: no reference)."""
    return PackedModel(model, traits) if packing and model is not None else model
