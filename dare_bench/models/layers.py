"""Layers shared by the backbones: RMSNorm, rotary embeddings, SwiGLU MLP, attention with backends and KV cache.

Numerics follow the official code: RMSNorm computes in float32, casts back to the input dtype and then multiplies
by the weight; rotary angles are computed in float32. Attention backends: `sdpa` (default, CPU and GPU),
`flash_attn` (varlen, GPU, extra `gpu`) and `flex` (FlexAttention: a `BlockMask` from `models/block.py` for the
block-causal and BD3 patterns, which skips the masked tiles; a dense mask as a score_mod). Under `flex`, CUDA runs
the compiled (fused, tile-sparse) kernel, forward and backward; the CPU runs torch's eager FlexAttention, forward only
(torch 2.13 refuses its backward on CPU, and eager FlexAttention materialises the scores: a check of exactness, not
a speed-up; `dare-bench bench flex` times the compiled CPU kernel). Optional ones are imported lazily.
`check_backend` is the one place that says whether a backend can run here (one-line errors naming what to install).
"""

from __future__ import annotations

import functools
import importlib.util

import torch
import torch.nn.functional as F
from torch import nn

from dare_bench.errors import DareBenchError, missing_extra

BACKENDS = ("sdpa", "flash_attn", "flex")


def check_backend(backend: str) -> None:
    """Raise a one-line `DareBenchError` unless `backend` can run on this installation."""
    if backend not in BACKENDS:
        raise DareBenchError(f"unknown attention backend {backend!r}; use one of {', '.join(BACKENDS)}")
    if backend == "flash_attn":
        if importlib.util.find_spec("flash_attn") is None:
            raise missing_extra("flash-attn", "gpu")
        if not torch.cuda.is_available():
            raise DareBenchError("attention backend 'flash_attn' needs a CUDA GPU; use 'sdpa' (or 'flex') on CPU")
    if backend == "flex":
        try:
            from torch.nn.attention import flex_attention  # noqa: F401  (torch >= 2.5)
        except ImportError:
            raise DareBenchError(f"attention backend 'flex' needs torch.nn.attention.flex_attention (torch >= 2.5), "
                                 f"this is torch {torch.__version__}; upgrade torch or use 'sdpa'") from None


class RMSNorm(nn.Module):
    """`weight * cast_back(x_fp32 * rsqrt(mean(x^2) + eps)) (+ bias)`.

    `elementwise_affine=False` drops the weight and `bias=True` adds one (LLaDA's `layer_norm_with_affine` /
    `bias_for_layer_norm`); the defaults are the Llama / Qwen form every family uses.
    """

    def __init__(self, dim: int, eps: float, elementwise_affine: bool = True, bias: bool = False):
        super().__init__()
        self.eps = eps
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(dim))
            self.bias = nn.Parameter(torch.zeros(dim)) if bias else None
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        # autocast would otherwise run the reduction in low precision (the official norms disable it too)
        with torch.autocast(device_type=x.device.type, enabled=False):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
            h = h.to(dtype)
        if self.weight is None:
            return h
        if self.bias is None:
            return self.weight * h
        return self.weight * h + self.bias


def rotary_cos_sin(position_ids: torch.Tensor, rot_dim: int, theta: float, dtype: torch.dtype):
    """cos/sin `[B, L, rot_dim]` for rotate-half RoPE (angles in float32, then cast to `dtype`)."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, rot_dim, 2, dtype=torch.int64, device=position_ids.device).float() / rot_dim)
    )
    angles = position_ids.float()[..., None] * inv_freq  # [B, L, rot/2]
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """q, k: `[B, H, L, D]`; cos/sin `[B, L, rot]` with rot <= D (partial rotary passes the rest through)."""
    cos, sin = cos[:, None], sin[:, None]
    rot = cos.shape[-1]
    if rot == q.shape[-1]:
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    q_r, q_p = q[..., :rot], q[..., rot:]
    k_r, k_p = k[..., :rot], k[..., rot:]
    q_r = q_r * cos + rotate_half(q_r) * sin
    k_r = k_r * cos + rotate_half(k_r) * sin
    return torch.cat([q_r, q_p], dim=-1), torch.cat([k_r, k_p], dim=-1)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)); attribute names are set by the family (official key names)."""

    def __init__(self, dim: int, hidden: int, names=("gate_proj", "up_proj", "down_proj"), bias: bool = False):
        super().__init__()
        self._names = names
        setattr(self, names[0], nn.Linear(dim, hidden, bias=bias))
        setattr(self, names[1], nn.Linear(dim, hidden, bias=bias))
        setattr(self, names[2], nn.Linear(hidden, dim, bias=bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up, down = (getattr(self, n) for n in self._names)
        return down(F.silu(gate(x)) * up(x))


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, H_kv, L, D] -> [B, H_kv*n_rep, L, D]; kv head j serves query heads j*n_rep .. j*n_rep+n_rep-1."""
    if n_rep == 1:
        return x
    b, h, l, d = x.shape
    return x[:, :, None].expand(b, h, n_rep, l, d).reshape(b, h * n_rep, l, d)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              backend: str = "sdpa", scale: float | None = None, dropout_p: float = 0.0) -> torch.Tensor:
    """q `[B, H, Lq, D]`, k/v `[B, H_kv, Lk, D]`; mask bool (True = attend) or additive float, broadcastable to
    `[B, H, Lq, Lk]`, or (backend `flex` only) a FlexAttention BlockMask of `[B or 1, 1, Lq, Lk]`. Rows that may
    attend to nothing return 0 (not NaN), as torch >= 2.5 SDPA does.
    `dropout_p` (attention-probability dropout, training only) is supported by the sdpa backend."""
    if dropout_p and backend != "sdpa":
        raise DareBenchError(f"attention dropout is only implemented for the sdpa backend, not {backend!r}")
    if isinstance(mask, torch.Tensor) and mask.dtype != torch.bool and mask.dtype != q.dtype:
        mask = mask.to(q.dtype)  # additive masks in the query dtype (SDPA needs it; 0 / -inf casts losslessly)
    if mask is not None and not isinstance(mask, torch.Tensor) and backend != "flex":
        raise DareBenchError(f"a FlexAttention BlockMask needs the 'flex' attention backend, not {backend!r}")
    if backend == "flash_attn":
        # flash-attn handles grouped KV heads itself: no repeat
        from dare_bench.models.flash import flash_attention

        return flash_attention(q, k, v, mask, scale=scale)
    n_rep = q.shape[1] // k.shape[1]
    # decoding on CPU (no grad): SDPA's grouped heads read each key / value head n_rep times instead of a copy of the
    # whole KV cache n_rep-fold per layer and step; bit-identical there (tests/models/test_attention_backend.py).
    # Training keeps the explicit repeat, whose backward sums the repeated heads as before.
    gqa = backend == "sdpa" and n_rep > 1 and q.device.type == "cpu" and not torch.is_grad_enabled()
    if not gqa:
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    if backend == "sdpa" or mask is None and backend == "flex":
        if mask is not None and mask.dtype == torch.bool:
            empty = ~mask.any(dim=-1, keepdim=True)
            if bool(empty.any()):
                mask = mask | empty  # avoid NaN; zeroed below
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, dropout_p=dropout_p,
                                                     enable_gqa=gqa)
                return out.masked_fill(empty, 0.0)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, dropout_p=dropout_p,
                                              enable_gqa=gqa)
    if backend == "flex":
        if q.device.type == "cpu" and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad
                                                                    or v.requires_grad):
            raise DareBenchError(f"attention backend 'flex' has no backward on CPU (torch {torch.__version__} "
                                 f"refuses it); train on CPU with 'sdpa', or run 'flex' on a CUDA GPU")
        flex_attention = _flex_kernel(q.device.type)
        if not isinstance(mask, torch.Tensor):  # a BlockMask (models/block.py): tiles it skips are never computed
            return flex_attention(q, k, v, block_mask=mask, scale=scale)
        if mask.dtype != torch.bool:
            bias = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
            return flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s + bias[b, h, i, j], scale=scale)
        m = mask.expand(q.shape[0], 1, q.shape[2], k.shape[2])
        return flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: torch.where(m[b, 0, i, j], s, -float("inf")),
                              scale=scale)
    raise DareBenchError(f"unknown attention backend {backend!r}")


@functools.cache
def _flex_kernel(device_type: str):
    """FlexAttention for tensors on `device_type`: compiled on CUDA (the fused kernel that reads the BlockMask's
    tiles), eager elsewhere (CPU: forward only; compiling costs ~45 s per shape there, more than a tiny forward)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention) if device_type == "cuda" else flex_attention


def block_causal_mask(q_len: int, k_len: int, block_size: int, q_offset: int = 0, device=None) -> torch.Tensor:
    """Bool `[1, 1, q_len, k_len]`: query at absolute position i may see key j iff j // b <= i // b."""
    qi = torch.arange(q_offset, q_offset + q_len, device=device)[:, None] // block_size
    kj = torch.arange(k_len, device=device)[None, :] // block_size
    return (kj <= qi)[None, None]


def segment_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """Packed rows: bool `[B, 1, L, L]` allowing attention only inside the same segment id."""
    return (segment_ids[:, None, :, None] == segment_ids[:, None, None, :])


def packed_position_ids(segment_ids: torch.Tensor) -> torch.Tensor:
    """Positions restarting at 0 at every new segment of a packed row `[B, L]`."""
    b, l = segment_ids.shape
    idx = torch.arange(l, device=segment_ids.device).expand(b, l)
    starts = torch.ones_like(segment_ids, dtype=torch.bool)
    starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    start_idx = torch.where(starts, idx, torch.zeros_like(idx)).cummax(dim=1).values
    return idx - start_idx


def key_padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """`[B, Lk]` 0/1 padding mask -> bool `[B, 1, 1, Lk]` (every query may see every non-pad key)."""
    return attention_mask.bool()[:, None, None, :]


def query_key_padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """`[B, L]` 0/1 padding mask -> bool `[B, 1, L, L]` where pad queries see nothing and pad keys are hidden
    (Dream's sampler convention: `m[:, None, None, :] & m[:, None, :, None]`)."""
    m = attention_mask.bool()
    return m[:, None, None, :] & m[:, None, :, None]


def combine_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Combine broadcastable masks, ignoring None; None if all are None.

    All boolean (True = may attend): their AND. If any is an additive float mask (0 = attend, very negative =
    blocked), the result is additive: the float masks summed, positions a boolean one blocks set to -inf.
    """
    present = [m for m in masks if m is not None]
    if not present:
        return None
    floats = [m for m in present if m.dtype != torch.bool]
    bools = [m for m in present if m.dtype == torch.bool]
    if floats and not all(m.is_floating_point() for m in floats):
        raise DareBenchError(f"attention masks must be boolean (True = may attend) or additive float, got "
                             f"{sorted({str(m.dtype) for m in floats if not m.is_floating_point()})}")
    keep = None
    for m in bools:
        keep = m if keep is None else keep & m
    if not floats:
        return keep
    out = floats[0]
    for m in floats[1:]:
        out = out + m
    if keep is not None:
        out = out.masked_fill(~keep, float("-inf"))
    return out


MASK_FORMS = ("bool", "int01", "additive")


def explicit_mask(mask, *, arg: str, family: str, forms: tuple[str, ...], q_len: int, k_len: int,
                  batch: int) -> torch.Tensor:
    """Validate an explicit 4-D attention mask `[B or 1, 1 or H, q_len, k_len]` and return it as a boolean
    (True = may attend) or additive float (0 = attend, large negative = blocked) mask.

    `forms` lists what this argument of this family accepts, as the official forward reads it:
    "bool" (True = may attend), "int01" (an integer 0/1 mask read with `.bool()`, nonzero = may attend, as SDAR's
    official attention does), "additive" (a float mask added to the attention scores, as SDPA does).
    Anything else raises a `DareBenchError` saying which forms are accepted.
    """
    unknown = set(forms) - set(MASK_FORMS)
    if unknown:
        raise ValueError(f"unknown mask forms {sorted(unknown)}")
    names = {"bool": "bool (True = may attend)", "int01": "integer 0/1 (1 = may attend)",
             "additive": "additive float (0 = attend, large negative = blocked)"}
    accepted = " or ".join(names[f] for f in forms)
    if not isinstance(mask, torch.Tensor):
        raise DareBenchError(f"{family}: {arg} must be a tensor ({accepted} [B, 1, {q_len}, {k_len}]), got "
                             f"{type(mask).__name__}")
    want = f"[B or 1, 1, {q_len}, {k_len}] (queries x keys incl. cache)"
    if mask.dim() != 4 or tuple(mask.shape[-2:]) != (q_len, k_len) or mask.shape[0] not in (1, batch):
        raise DareBenchError(f"{family}: {arg} must be {want}, got {tuple(mask.shape)}")
    if mask.dtype == torch.bool:
        form = "bool"
    elif mask.is_floating_point():
        form = "additive"
    elif not mask.is_complex():
        form = "int01"
    else:
        form = None
    if form not in forms:
        hint = ""
        if form == "additive" and "int01" in forms:
            hint = (" (the official forward reads this mask with .bool(), so an additive 0 = attend mask would be "
                    "inverted; pass mask == 0 as a bool mask)")
        raise DareBenchError(f"{family}: {arg} of dtype {mask.dtype} is not accepted; use {accepted}{hint}")
    return mask.bool() if form == "int01" else mask
