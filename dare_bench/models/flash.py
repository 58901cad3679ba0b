"""flash-attn (varlen) backend of `layers.attention`: GPU only, imported lazily (extra `gpu`).

flash-attn has no arbitrary masks, only packed variable-length sequences with full (non-causal) attention inside
each. Any boolean mask can be written that way: per batch row, the queries that see the same set of keys form one
"sequence" whose keys are exactly that set (gathered, wherever they are). Padding masks give one group per row,
packed rows one group per segment, block-causal masks one group per block; queries that see no key get 0, as the
sdpa backend does. Without a mask it is plain `flash_attn_func`. Exactness vs sdpa is tested by
`tests/models/test_mdlm_backbones.py::test_flash_attn_backend_matches_sdpa` (marker `gpu`).

    # needs CUDA, bfloat16/float16 weights, `pip install 'dare-bench[gpu]'`
    model.set_attention_backend("flash_attn")
"""

from __future__ import annotations

import torch

from dare_bench.errors import DareBenchError, missing_extra


def _flash():
    try:
        import flash_attn
    except ImportError:
        raise missing_extra("flash-attn", "gpu") from None
    return flash_attn


def _as_bool(mask: torch.Tensor) -> torch.Tensor:
    if mask.dtype == torch.bool:
        return mask
    # additive float masks are only expressible when every entry is "keep" (0) or "drop" (very negative / -inf)
    drop = mask <= torch.finfo(mask.dtype).min / 2
    if not bool(((mask == 0) | drop).all()):
        raise DareBenchError("flash_attn backend: float attention bias other than 0 / -inf is not supported; "
                             "use the sdpa backend")
    return ~drop


def group_queries(mask: torch.Tensor, b: int, lq: int, lk: int):
    """Split a bool mask broadcastable to `[B, 1, Lq, Lk]` into (batch row, query indices, key indices) groups
    of queries with the same non-empty key set, plus the `[B, Lq]` indicator of queries that see nothing."""
    if mask.dim() != 4 or mask.shape[1] != 1:
        raise DareBenchError(f"flash_attn backend: mask must be [B, 1, Lq, Lk] (one mask for all heads), got "
                             f"{tuple(mask.shape)}")
    m = mask.expand(b, 1, lq, lk)[:, 0]
    groups = []
    empty = ~m.any(-1)
    for row in range(b):
        rows, inverse = torch.unique(m[row], dim=0, return_inverse=True)
        for g in range(rows.shape[0]):
            keys = rows[g].nonzero().squeeze(-1)
            if keys.numel() == 0:
                continue
            groups.append((row, (inverse == g).nonzero().squeeze(-1), keys))
    return groups, empty


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                    scale: float | None = None) -> torch.Tensor:
    """q `[B, H, Lq, D]`, k/v `[B, H_kv, Lk, D]` (H divisible by H_kv) -> `[B, H, Lq, D]`, same contract as
    `layers.attention`."""
    fa = _flash()
    if not q.is_cuda:
        raise DareBenchError("flash_attn backend needs CUDA tensors; use 'sdpa' on CPU")
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise DareBenchError(f"flash_attn backend needs float16/bfloat16 activations, got {q.dtype}; "
                             "load the model with dtype='bfloat16' or use 'sdpa'")
    return varlen_attention(fa, q, k, v, mask, scale)


def varlen_attention(fa, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                     scale: float | None = None) -> torch.Tensor:
    """The packing around `fa.flash_attn_func` / `fa.flash_attn_varlen_func` (`fa` = the flash_attn module)."""
    b, h, lq, d = q.shape
    lk = k.shape[2]
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, L, H, D] as flash-attn wants
    if mask is None:
        out = fa.flash_attn_func(qt, kt, vt, dropout_p=0.0, softmax_scale=scale, causal=False)
        return out.transpose(1, 2)
    groups, empty = group_queries(_as_bool(mask), b, lq, lk)
    out = torch.zeros_like(qt)
    if not groups:
        return out.transpose(1, 2)
    q_idx = [row * lq + qi for row, qi, _ in groups]
    k_idx = [row * lk + ki for row, _, ki in groups]
    q_lens = torch.tensor([0] + [len(i) for i in q_idx], device=q.device)
    k_lens = torch.tensor([0] + [len(i) for i in k_idx], device=q.device)
    q_flat, k_flat = torch.cat(q_idx), torch.cat(k_idx)
    packed = fa.flash_attn_varlen_func(
        qt.reshape(b * lq, h, d)[q_flat],
        kt.reshape(b * lk, k.shape[1], d)[k_flat],
        vt.reshape(b * lk, v.shape[1], d)[k_flat],
        cu_seqlens_q=q_lens.cumsum(0).to(torch.int32),
        cu_seqlens_k=k_lens.cumsum(0).to(torch.int32),
        max_seqlen_q=int(q_lens.max()),
        max_seqlen_k=int(k_lens.max()),
        dropout_p=0.0,
        softmax_scale=scale,
        causal=False,
    )
    out = out.reshape(b * lq, h, d).index_copy(0, q_flat, packed).reshape(b, lq, h, d)
    return out.transpose(1, 2)
