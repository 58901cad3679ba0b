"""Block diffusion (BDLM) attention patterns, training layouts and losses shared by SDAR and LLaDA2.

Inference uses the block-causal pattern: a query at absolute position i may see key j iff j // b <= i // b.
Training uses the BD3-LM "two copies" trick: the model reads `[x_t ; x_0]` (noisy copy, clean copy, both with the
sample's own position ids) under a mask where (1) each copy is bidirectional inside a block, (2) a noisy block sees
the clean copy of strictly earlier blocks and (3) the clean copy is block-causal; noisy tokens never see other
blocks' noisy tokens, clean tokens never see noisy ones. Two layouts exist upstream:

- dFactory (LLaDA2): all noisy tokens, then all clean tokens: `bd3_attention_mask(L, b)`, positions `[0..L-1, 0..L-1]`;
- SDAR (LlamaFactory packing): per packed sample `[xt_1, x0_1, xt_2, x0_2, ...]`, the mask is the block diagonal of
  each sample's BD3 mask; padding after the last sample counts as one more sample (`sdar_packed_training_mask`).

`training_forward(model, noisy_ids, clean_ids)` runs any block-diffusion backbone on the dFactory layout and returns
the logits of the noisy copy, so likelihood / SFT code never needs to know the family. The two official losses are
`sdar_bd_loss` (1/t weighted, SDAR) and `dfactory_bd_loss` (unweighted, LLaDA2 / dFactory).

FlexAttention (attention backend `flex`): the two patterns as `BlockMask`s, built by `create_block_mask` with the
rules above as mask_mods (`bd3_block_mask`, `block_causal_block_mask`), never as a dense `[2L, 2L]` tensor. Their
structure depends on the shape only and is cached per (lengths, block size, offset, device); a batch's key padding is
folded in at tile level (a tile with a pad key loses "full", a tile of pad keys only is skipped) and into the
mask_mod, so a padded batch costs O(tiles), not O(L^2). Explicit dense masks under `flex` (official 4-D masks, the
SDAR packed layout) become a BlockMask once per forward (`dense_block_mask`). The dense masks stay the reference.

Library module (no command line); exercised by `pytest tests/models/test_block_diffusion.py
tests/models/test_flex_block_masks.py -q` (the latter: tile tables and model outputs, flex vs the dense masks).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from dare_bench.errors import DareBenchError
from dare_bench.models.layers import block_causal_mask, explicit_mask
from dare_bench.models.lm_head import HiddenStates


def bd3_rule(q_idx: torch.Tensor, k_idx: torch.Tensor, n: int, block_size: int) -> torch.Tensor:
    """The BD3-LM mask over `[x_t ; x_0]` of one sample of length n (indices 0..2n-1), broadcast over q/k."""
    clean_q, clean_k = q_idx >= n, k_idx >= n
    blk_q = torch.where(clean_q, q_idx - n, q_idx) // block_size
    blk_k = torch.where(clean_k, k_idx - n, k_idx) // block_size
    block_diagonal = (blk_q == blk_k) & (clean_q == clean_k)
    offset_block_causal = (blk_q > blk_k) & clean_k & ~clean_q
    block_causal = (blk_q >= blk_k) & clean_k & clean_q
    return block_diagonal | offset_block_causal | block_causal


def _check_block_size(block_size: int) -> int:
    if not isinstance(block_size, int) or block_size < 1:
        raise DareBenchError(f"block_size must be a positive integer, got {block_size!r}")
    return block_size


def bd3_attention_mask(seq_len: int, block_size: int, device=None) -> torch.Tensor:
    """Bool `[1, 1, 2L, 2L]` (True = may attend) for the dFactory layout `[x_t (L) ; x_0 (L)]`."""
    _check_block_size(block_size)
    idx = torch.arange(2 * seq_len, device=device)
    return bd3_rule(idx[:, None], idx[None, :], seq_len, block_size)[None, None]


def inference_block_causal_mask(q_len: int, k_len: int | None = None, block_size: int = 4, q_offset: int = 0,
                                device=None) -> torch.Tensor:
    """Bool `[1, 1, q_len, k_len]`: query at absolute position `q_offset + i` sees key j
    iff j // b <= (q_offset+i) // b.

    With a KV cache of P positions the new queries start at `q_offset = P` and `k_len = P + q_len`, so every cached
    committed block is fully visible and the current block is bidirectional.
    """
    _check_block_size(block_size)
    k_len = q_offset + q_len if k_len is None else k_len
    return block_causal_mask(q_len, k_len, block_size, q_offset=q_offset, device=device)


def dfactory_training_inputs(noisy_ids: torch.Tensor, clean_ids: torch.Tensor, block_size: int,
                             attention_mask: torch.Tensor | None = None, *, flex: bool = False):
    """(input_ids `[B, 2L]`, position_ids `[B, 2L]`, attn_mask bool `[B or 1, 1, 2L, 2L]`) of the dFactory layout.

    `attention_mask` `[B, L]` (1 = real token) hides padding keys in both copies, so real tokens see exactly what
    they would see without the padding (the official dFactory run pads to max length and keeps pad keys visible;
    the loss then ignores them, but the real tokens' logits change, so we hide them). `flex`: the mask as a
    FlexAttention `BlockMask` (`bd3_block_mask`, same pattern) instead of the dense tensor.
    """
    if noisy_ids.shape != clean_ids.shape or noisy_ids.dim() != 2:
        raise DareBenchError(f"noisy and clean ids must both be [B, L]; got {tuple(noisy_ids.shape)} and "
                             f"{tuple(clean_ids.shape)}")
    b, L = noisy_ids.shape
    device = noisy_ids.device
    ids = torch.cat([noisy_ids, clean_ids], dim=1)
    pos = torch.arange(L, device=device).repeat(2)[None].expand(b, 2 * L)
    keep = None
    if attention_mask is not None:
        if attention_mask.shape != (b, L):
            raise DareBenchError(f"attention_mask must be [B, L] = {(b, L)}, got {tuple(attention_mask.shape)}")
        keep = attention_mask.to(device).bool().repeat(1, 2)
    if flex:
        return ids, pos, bd3_block_mask(L, block_size, keep_keys=keep, device=device)
    mask = bd3_attention_mask(L, block_size, device=device)
    if keep is not None:
        mask = mask & keep[:, None, None, :]
    return ids, pos, mask


def training_forward(model, noisy_ids: torch.Tensor, clean_ids: torch.Tensor,
                     attention_mask: torch.Tensor | None = None, *, return_hidden: bool = False):
    """Logits `[B, L, V]` of the noisy copy, from one forward over `[x_t ; x_0]` with the BD3 mask.

    The block size comes from `model.traits.block_size`; works for every block-diffusion family. `return_hidden`:
    the noisy copy's `HiddenStates` (final hidden states `[B, L, d]` + the head) instead of logits. Under the
    `flex` attention backend the mask is the cached `BlockMask` of the same pattern (`bd3_block_mask`).
    """
    traits = model.traits
    if not traits.is_block_diffusion or not traits.block_size:
        raise DareBenchError(f"training_forward needs a block-diffusion backbone; {traits.family} is "
                             f"{traits.attention}")
    flex = getattr(model, "attn_backend", "sdpa") == "flex"
    ids, pos, mask = dfactory_training_inputs(noisy_ids, clean_ids, traits.block_size, attention_mask, flex=flex)
    if return_hidden:
        out = model(ids, position_ids=pos, attn_mask=mask, return_hidden=True)
        return HiddenStates(out.states[:, : noisy_ids.shape[1]], out.head)
    logits = model(ids, position_ids=pos, attn_mask=mask)
    return logits[:, : noisy_ids.shape[1]]


# --- SDAR packed layout ---------------------------------------------------------------------------------------

def pad_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """SDAR's `modify_padded_position_ids_2d`: positions after the last non-zero one restart at 0, 1, 2, ...

    So trailing padding (whose positions are 0 upstream) becomes one more sample.
    """
    if position_ids.dim() != 2:
        raise DareBenchError(f"position_ids must be [B, L], got {tuple(position_ids.shape)}")
    b, L = position_ids.shape
    col = torch.arange(L, device=position_ids.device, dtype=position_ids.dtype).expand(b, L)
    nonzero = position_ids != 0
    last = (col * nonzero).max(dim=1).values
    start = torch.where(nonzero.any(dim=1), last + 1, torch.zeros_like(last))
    pad = col >= start[:, None]
    return torch.where(pad, col - start[:, None], position_ids)


def sample_lengths(position_ids: torch.Tensor) -> list[list[int]]:
    """Length of every packed sample of each row: a sample starts wherever the position id is 0."""
    out = []
    for row in position_ids:
        starts = torch.nonzero(row == 0).flatten().tolist()
        if not starts or starts[0] != 0:
            raise DareBenchError("packed position_ids must start every row with 0")
        bounds = starts + [row.shape[0]]
        out.append([bounds[i + 1] - bounds[i] for i in range(len(starts))])
    return out


def sdar_packed_training_mask(lengths: Sequence[Sequence[int]], block_size: int, device=None) -> torch.Tensor:
    """Bool `[B, 1, 2T, 2T]`: block diagonal over packed samples of each sample's BD3 mask (SDAR layout).

    `lengths[b]` lists the sample lengths of row b (padding included as its own sample); all rows must sum to T.
    """
    _check_block_size(block_size)
    totals = {sum(row) for row in lengths}
    if len(totals) != 1:
        raise DareBenchError(f"packed rows must have equal total length, got {sorted(totals)}")
    masks = []
    for row in lengths:
        parts = []
        for n in row:
            idx = torch.arange(2 * n, device=device)
            parts.append(bd3_rule(idx[:, None], idx[None, :], n, block_size))
        masks.append(torch.block_diag(*parts))
    return torch.stack(masks)[:, None]


def sdar_packed_layout(noisy_ids: torch.Tensor, clean_ids: torch.Tensor, position_ids: torch.Tensor,
                       block_size: int):
    """SDAR's `prepare_for_bd_training` layout of packed rows.

    Returns (input_ids `[B, 2T]`, position_ids `[B, 2T]`, attn_mask bool `[B, 1, 2T, 2T]`, noisy_index `[B, T]`)
    where `noisy_index[b, i]` is the column of token i's noisy copy (use it to gather the noisy logits back into
    the original order). `position_ids` are the packed positions (restarting at 0 per sample); trailing padding is
    handled as in SDAR (`pad_position_ids`).
    """
    if not (noisy_ids.shape == clean_ids.shape == position_ids.shape) or noisy_ids.dim() != 2:
        raise DareBenchError("noisy_ids, clean_ids and position_ids must all be [B, T]")
    position_ids = pad_position_ids(position_ids)
    lengths = sample_lengths(position_ids)
    b, T = noisy_ids.shape
    device = noisy_ids.device
    noisy_index = torch.empty(b, T, dtype=torch.long, device=device)
    clean_index = torch.empty(b, T, dtype=torch.long, device=device)
    for r, row in enumerate(lengths):
        start = 0
        for n in row:
            noisy_index[r, start:start + n] = 2 * start + torch.arange(n, device=device)
            clean_index[r, start:start + n] = 2 * start + n + torch.arange(n, device=device)
            start += n
    ids = torch.empty(b, 2 * T, dtype=noisy_ids.dtype, device=device)
    ids.scatter_(1, noisy_index, noisy_ids)
    ids.scatter_(1, clean_index, clean_ids)
    pos = torch.empty(b, 2 * T, dtype=position_ids.dtype, device=device)
    pos.scatter_(1, noisy_index, position_ids)
    pos.scatter_(1, clean_index, position_ids)
    mask = sdar_packed_training_mask(lengths, block_size, device=device)
    return ids, pos, mask, noisy_index


def packed_training_forward(model, noisy_ids: torch.Tensor, clean_ids: torch.Tensor,
                            position_ids: torch.Tensor) -> torch.Tensor:
    """Noisy-copy logits `[B, T, V]` (original token order) of packed rows in SDAR's interleaved layout."""
    traits = model.traits
    if not traits.is_block_diffusion or not traits.block_size:
        raise DareBenchError(f"packed_training_forward needs a block-diffusion backbone; {traits.family} is "
                             f"{traits.attention}")
    ids, pos, mask, noisy_index = sdar_packed_layout(noisy_ids, clean_ids, position_ids, traits.block_size)
    logits = model(ids, position_ids=pos, attn_mask=mask)
    return logits.gather(1, noisy_index[..., None].expand(-1, -1, logits.shape[-1]))


# --- losses ---------------------------------------------------------------------------------------------------

def sdar_bd_loss(noisy_logits: torch.Tensor, clean_ids: torch.Tensor, masked: torch.Tensor, p_mask: torch.Tensor,
                 labels: torch.Tensor) -> torch.Tensor:
    """SDAR training loss: Σ_masked CE(noisy logits, clean token) / p  ÷  count(labels != -100).

    noisy_logits `[B, L, V]` (row i predicts token i); masked bool `[B, L]`; p_mask: the mask rate of each masked
    token in `masked` order (`[n_masked]`) or per position (`[B, L]`); labels `[B, L]` with -100 on prompt tokens.
    """
    if p_mask.shape == masked.shape:
        p_mask = p_mask[masked]
    ce = F.cross_entropy(noisy_logits[masked].float(), clean_ids[masked], reduction="none")
    return (ce / p_mask.to(ce.dtype)).sum() / (labels != -100).sum()


def dfactory_bd_loss(noisy_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """dFactory (LLaDA2) block-diffusion SFT loss: Σ CE(noisy logits, labels) ÷ count(labels != -100), no 1/t.

    labels `[B, L]`: the clean token where x_t is masked, -100 elsewhere ("same token labels": no shift).
    """
    ce = F.cross_entropy(noisy_logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
    return ce / (labels != -100).sum()


# --- FlexAttention block masks (attention backend "flex") -------------------------------------------------------

def _flex_api():
    from dare_bench.models.layers import check_backend

    check_backend("flex")  # one-line error on a torch without FlexAttention
    from torch.nn.attention import flex_attention

    return flex_attention


def _device_key(device) -> torch.device:
    device = torch.device("cpu" if device is None else device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


@functools.lru_cache(maxsize=32)
def _bd3_structure(seq_len: int, block_size: int, device: torch.device, tile: int):
    def bd3(b, h, q_idx, kv_idx):
        return bd3_rule(q_idx, kv_idx, seq_len, block_size)

    return _flex_api().create_block_mask(bd3, None, None, 2 * seq_len, 2 * seq_len, device=device, BLOCK_SIZE=tile)


@functools.lru_cache(maxsize=64)
def _block_causal_structure(q_len: int, k_len: int, block_size: int, q_offset: int, device: torch.device,
                            tile: int):
    def block_causal(b, h, q_idx, kv_idx):
        return kv_idx // block_size <= (q_idx + q_offset) // block_size

    return _flex_api().create_block_mask(block_causal, None, None, q_len, k_len, device=device, BLOCK_SIZE=tile)


def block_tables(block_mask) -> tuple[torch.Tensor, torch.Tensor]:
    """(partial, full) bool `[B, H, Q tiles, KV tiles]` of a BlockMask: tiles where the kernel evaluates the
    mask_mod, and tiles it computes without it. Every other tile is skipped."""
    def dense(num, idx):
        valid = torch.arange(idx.shape[-1], device=idx.device) < num[..., None]
        return torch.zeros(idx.shape, dtype=torch.bool, device=idx.device).scatter_(-1, idx.long(), valid)

    partial = dense(block_mask.kv_num_blocks, block_mask.kv_indices)
    if block_mask.full_kv_num_blocks is None:
        return partial, torch.zeros_like(partial)
    return partial, dense(block_mask.full_kv_num_blocks, block_mask.full_kv_indices)


def _from_tables(partial: torch.Tensor, full: torch.Tensor, mask_mod, seq_lengths: tuple[int, int], tile):
    def ordered(table):
        table = table.to(torch.int32)
        return (table.sum(-1).to(torch.int32),
                torch.argsort(table, dim=-1, descending=True, stable=True).to(torch.int32))

    return _flex_api().BlockMask.from_kv_blocks(*ordered(partial), *ordered(full), BLOCK_SIZE=tile,
                                                mask_mod=mask_mod, seq_lengths=seq_lengths)


def _with_key_padding(structure, keep_keys: torch.Tensor):
    """The shape-only BlockMask `structure` restricted to the keys `keep_keys` `[B or 1, Lk]` (True = real) of one
    batch: a tile with a hidden key is evaluated with the mask_mod (never "full"), a tile of hidden keys only is
    skipped, and the mask_mod also asks `keep_keys`."""
    q_len, k_len = structure.seq_lengths
    q_tile, k_tile = structure.BLOCK_SIZE
    if keep_keys.dim() != 2 or keep_keys.shape[-1] != k_len:
        raise DareBenchError(f"key padding mask must be [B, {k_len}], got {tuple(keep_keys.shape)}")
    keep = keep_keys.to(structure.kv_indices.device).bool()
    partial, full = block_tables(structure)
    n_k_tiles = partial.shape[-1]
    # the tail beyond k_len is no key at all: pad with True so it does not change a tile's class
    tiles = torch.nn.functional.pad(keep, (0, n_k_tiles * k_tile - k_len), value=True).view(keep.shape[0], n_k_tiles,
                                                                                            k_tile)
    any_hidden, all_hidden = (~tiles.all(-1))[:, None, None, :], (~tiles.any(-1))[:, None, None, :]
    partial = (partial | (full & any_hidden)) & ~all_hidden
    full = full & ~any_hidden
    base = structure.mask_mod
    if keep.shape[0] == 1:
        def padded(b, h, q_idx, kv_idx):
            return base(b, h, q_idx, kv_idx) & keep[0, kv_idx]
    else:
        def padded(b, h, q_idx, kv_idx):
            return base(b, h, q_idx, kv_idx) & keep[b, kv_idx]
    return _from_tables(partial, full, padded, (q_len, k_len), (q_tile, k_tile))


def bd3_block_mask(seq_len: int, block_size: int, keep_keys: torch.Tensor | None = None, device=None,
                   tile: int = 128):
    """FlexAttention `BlockMask` of `bd3_attention_mask(seq_len, block_size)` (the dFactory `[x_t ; x_0]` layout,
    mask_mod = `bd3_rule`), `tile` x `tile` tiles; `keep_keys` `[B, 2L]` (True = real key) hides padding keys of
    both copies as the dense path does. The padding-free structure is built once per shape and device (cached)."""
    _check_block_size(block_size)
    structure = _bd3_structure(int(seq_len), block_size, _device_key(device), int(tile))
    return structure if keep_keys is None else _with_key_padding(structure, keep_keys)


def block_causal_block_mask(q_len: int, k_len: int, block_size: int, q_offset: int = 0,
                            keep_keys: torch.Tensor | None = None, device=None, tile: int = 128):
    """FlexAttention `BlockMask` of `inference_block_causal_mask(q_len, k_len, block_size, q_offset)` (query at
    absolute position q_offset + i sees key j iff j // b <= (q_offset + i) // b), with optional key padding
    `keep_keys` `[B or 1, k_len]` (True = real key). Structure cached per shape, offset and device."""
    _check_block_size(block_size)
    structure = _block_causal_structure(int(q_len), int(k_len), block_size, int(q_offset), _device_key(device),
                                        int(tile))
    return structure if keep_keys is None else _with_key_padding(structure, keep_keys)


def dense_block_mask(mask: torch.Tensor, tile: int = 128):
    """A dense bool mask `[B or 1, 1, Lq, Lk]` (True = may attend) as a BlockMask whose mask_mod reads it; its tile
    tables come from the mask itself (the rows' tiles that are all-False are skipped, all-True ones run unmasked).
    For masks the caller gives explicitly (official 4-D masks, the SDAR packed layout): built once per forward."""
    if mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1:
        raise DareBenchError(f"dense_block_mask needs a bool [B, 1, Lq, Lk] mask, got {mask.dtype} "
                             f"{tuple(mask.shape)}")
    b, _, q_len, k_len = mask.shape
    nq, nk = -(-q_len // tile), -(-k_len // tile)
    # pad with False as create_block_mask does: a tile crossing the end is never "full"
    padded = torch.nn.functional.pad(mask, (0, nk * tile - k_len, 0, nq * tile - q_len))
    tiles = padded.view(b, 1, nq, tile, nk, tile)
    any_true, all_true = tiles.any(dim=(3, 5)), tiles.all(dim=(3, 5))
    if b == 1:
        def lookup(bi, h, q_idx, kv_idx):
            return mask[0, 0, q_idx, kv_idx]
    else:
        def lookup(bi, h, q_idx, kv_idx):
            return mask[bi, 0, q_idx, kv_idx]
    return _from_tables(any_true & ~all_true, all_true, lookup, (q_len, k_len), (tile, tile))


def is_block_mask(mask) -> bool:
    """True for a FlexAttention BlockMask (False on a torch without FlexAttention, where none can exist)."""
    if mask is None or isinstance(mask, torch.Tensor):
        return False
    try:
        from torch.nn.attention.flex_attention import BlockMask
    except ImportError:
        return False
    return isinstance(mask, BlockMask)


# --- forward plumbing shared by the block-diffusion families -------------------------------------------------

def resolve_attention(
    input_ids: torch.Tensor,
    *,
    block_size: int,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    attn_mask: torch.Tensor | None,
    kv_cache,
    replace_position: tuple[int, int] | None,
    family: str = "block diffusion",
    official_mask_forms: tuple[str, ...] = ("bool", "additive"),
    backend: str = "sdpa",
):
    """(position_ids `[B, L]`, mask for `layers.attention` or None) of one forward call.

    Default pattern (no 4-D mask): block-causal over absolute positions. With a KV cache of P positions the new
    queries sit at P.. (or at `replace_position[0]..` for a dual-cache replacement), so committed blocks in the cache
    are fully visible. Default positions are those absolute positions (the official `cache_position`).
    `attention_mask` is either
    - `[B, Lk]` (1 = real token; Lk = number of keys): hides padding keys on top of the pattern, or
    - the official 4-D mask `[B or 1, 1, L, Lk]` in one of `official_mask_forms` (see `layers.explicit_mask`;
      LLaDA2: bool or additive float, SDAR: bool or integer 0/1), which replaces the pattern.
    An explicit `attn_mask` (the native keyword) may be bool (True = attend) or additive float, `[B or 1, 1, L, Lk]`;
    giving both it and a 4-D `attention_mask` is an error. A mask that allows everything is returned as None
    (attention without a mask, as the official decoding branch).

    `backend="flex"`: the mask comes back as a FlexAttention BlockMask of the same pattern: the default pattern from
    `block_causal_block_mask` (cached structure + the padding), an explicit bool mask through `dense_block_mask`
    (once per forward, shared by every layer); an additive float mask stays dense (flex reads it as a score_mod).
    `attn_mask` may itself be a BlockMask (`training_forward` under flex); it cannot be combined with a padding mask.
    """
    b, L = input_ids.shape
    device = input_ids.device
    past = len(kv_cache) if kv_cache is not None else 0
    if replace_position is not None:
        if kv_cache is None:
            raise DareBenchError("replace_position needs a kv_cache")
        q_offset, k_len = int(replace_position[0]), past
    else:
        q_offset, k_len = past, past + L
    if position_ids is None:
        position_ids = torch.arange(q_offset, q_offset + L, device=device)[None].expand(b, L)
    elif position_ids.dim() != 2 or position_ids.shape[-1] != L or position_ids.shape[0] not in (1, b):
        raise DareBenchError(f"{family}: position_ids must be [B or 1, {L}] like input_ids, got "
                             f"{tuple(position_ids.shape)}")
    if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
        raise DareBenchError(f"{family}: attention_mask must be a tensor ([B, {k_len}] padding mask or a 4-D "
                             f"[B, 1, {L}, {k_len}] mask), got {type(attention_mask).__name__}")
    if attention_mask is not None and attention_mask.dim() == 4:
        if attn_mask is not None:
            raise DareBenchError(f"{family}: got a 4-D attention_mask and attn_mask; pass the 4-D mask once")
        attn_mask = explicit_mask(attention_mask, arg="attention_mask", family=family, forms=official_mask_forms,
                                  q_len=L, k_len=k_len, batch=b)
        attention_mask = None
    elif is_block_mask(attn_mask):
        if attention_mask is not None:
            raise DareBenchError(f"{family}: a BlockMask attn_mask already holds the padding; pass no attention_mask")
        if tuple(attn_mask.seq_lengths) != (L, k_len):
            raise DareBenchError(f"{family}: BlockMask attn_mask is for {tuple(attn_mask.seq_lengths)} queries x keys, "
                                 f"this call has {(L, k_len)}")
        return position_ids, attn_mask
    elif attn_mask is not None:
        attn_mask = explicit_mask(attn_mask, arg="attn_mask", family=family, forms=("bool", "additive"),
                                  q_len=L, k_len=k_len, batch=b)
    if attention_mask is not None and (attention_mask.dim() != 2 or tuple(attention_mask.shape) not in
                                       ((b, k_len), (1, k_len))):
        raise DareBenchError(f"{family}: attention_mask must be a [B, {k_len}] padding mask covering every key "
                             f"(1 = real token) or a 4-D [B or 1, 1, {L}, {k_len}] mask, got "
                             f"{tuple(attention_mask.shape)}")
    if attn_mask is None:
        if attention_mask is None and (k_len - 1) // block_size <= q_offset // block_size:
            # every key is in a block <= the first query's block: attend to all (no device sync needed to see it)
            return position_ids, None
        if backend == "flex":
            keep = None if attention_mask is None else attention_mask.to(device).bool()
            return position_ids, block_causal_block_mask(L, k_len, block_size, q_offset, keep_keys=keep,
                                                         device=device)
        mask = block_causal_mask(L, k_len, block_size, q_offset=q_offset, device=device)
    else:
        mask = attn_mask.to(device)
    if attention_mask is not None:
        keep = attention_mask.to(device).bool()[:, None, None, :]
        if mask.dtype == torch.bool:
            mask = mask & keep
        else:
            mask = mask.masked_fill(~keep, float("-inf"))
    if mask.dtype == torch.bool and bool(mask.all()):
        mask = None
    if backend == "flex" and mask is not None and mask.dtype == torch.bool and mask.shape[1] == 1:
        mask = dense_block_mask(mask)
    return position_ids, mask


def full_attention_mask(q_len: int, k_len: int | None = None, device=None) -> torch.Tensor:
    """Bool `[1, 1, q_len, k_len]` of all True: fully bidirectional attention (LLaDA2's official no-mask call)."""
    return torch.ones(1, 1, q_len, q_len if k_len is None else k_len, dtype=torch.bool, device=device)


@contextlib.contextmanager
def skip_init_on_meta() -> Iterator[None]:
    """Skip nn.Linear / nn.Embedding random init while building on the meta device (nothing to initialise there).

    Building the real MoE configs (15-18 k expert matrices) on meta otherwise spends half its time in kaiming_uniform_.
    On a real device this does nothing: the usual init runs.
    """
    if torch.empty(0).device.type != "meta":
        yield
        return
    saved = nn.Linear.reset_parameters, nn.Embedding.reset_parameters
    nn.Linear.reset_parameters = nn.Embedding.reset_parameters = lambda self: None
    try:
        yield
    finally:
        nn.Linear.reset_parameters, nn.Embedding.reset_parameters = saved
