"""The output head of a backbone, and per-token log-probs through it without materialising `[tokens, vocab]` logits.

A backbone's head is an `OutputHead`: logits = linear(h, weight [V, d], bias) x scale, cast to float32 where the
family's forward does (SDAR, LLaDA2). No family has logit soft-capping. `OutputHead.logits` is the default forward's
head op for op; `chunked_token_logprobs` computes log softmax(logits)[target] (and optionally the entropy) for the
hidden states of the scored tokens only, `chunk_tokens` rows of logits at a time, in forward AND backward (a
custom autograd Function that keeps the per-token logsumexp, float32, and recomputes each chunk's logits in backward,
as Liger's fused linear cross-entropy and Cut-Cross-Entropy do). Peak memory: one chunk of logits (a few
`[chunk_tokens, V]` float32 buffers) instead of several `[N, V]` ones; gradients reach the hidden states, the weight
and the bias.

Precision mirrors the materialised path: the matmul runs in the autocast dtype (or the weight's), the logits are
upcast to float32 before the logsumexp, and gradients go back through the casts in the compute dtype, as autograd
does there; the weight gradient is accumulated over chunks in float32.

    from dare_bench.models.lm_head import chunked_token_logprobs
    out = model(noisy_ids, attention_mask=am, return_hidden=True)          # HiddenStates(states [B, L, d], head)
    lp = chunked_token_logprobs(out.states[scored], out.head, targets[scored], chunk_tokens=64)   # [N] float32
    lp, entropy = chunked_token_logprobs(h, head, targets, chunk_tokens=64, with_entropy=True)   # entropy: no grad

`dare-bench bench memory --head` measures its peak memory against materialised logits (dare_bench/bench/memory.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dare_bench.errors import ConfigError, DataError

__all__ = ["OutputHead", "HiddenStates", "linear_head", "chunked_token_logprobs"]


@dataclass(frozen=True)
class OutputHead:
    """weight `[V, d]`, bias `[V]` or None, `scale` (logits multiplied after the bias; LLaDA's `scale_logits`) or None,
    `float_logits`: the family's forward returns `.float()` logits (SDAR, LLaDA2)."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None
    scale: float | None = None
    float_logits: bool = False

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head as the family's default forward applies it (the same ops in the same order)."""
        out = F.linear(hidden, self.weight, self.bias)
        if self.scale is not None:
            out = out * self.scale
        return out.float() if self.float_logits else out


@dataclass(frozen=True)
class HiddenStates:
    """What `forward(..., return_hidden=True)` returns: the final-normed hidden states `[B, L, d]` (in the same row
    convention as the logits would be) and the head that turns them into logits."""

    states: torch.Tensor
    head: OutputHead


def linear_head(module: nn.Module, *, scale: float | None = None, float_logits: bool = False) -> OutputHead:
    """The `OutputHead` of a plain `nn.Linear` head module. A wrapped head (LoRA on the LM head) is refused: its
    weight alone is not the head the forward applies."""
    if type(module) is not nn.Linear:
        raise ConfigError(f"the LM head is a {type(module).__name__}, not a plain Linear (LoRA on the head?); "
                          "chunked log-probs need the bare weight: set train.lm_head_chunk_tokens=null")
    return OutputHead(module.weight, module.bias, scale, float_logits)


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, scale: float | None):
    z = F.linear(h, weight, bias)
    if scale is not None:
        z = z * scale
    return z.float()


class _ChunkedLogprobs(torch.autograd.Function):
    """(log p(target) `[N]` float32, entropy `[N]` float32 or empty) from hidden `[N, d]`, chunk by chunk."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, scale, chunk, with_entropy):
        n = hidden.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(logp)
        entropy = torch.empty_like(logp) if with_entropy else logp.new_empty(0)
        for s in range(0, n, chunk):
            e = min(s + chunk, n)
            z = _chunk_logits(hidden[s:e], weight, bias, scale)  # [c, V] float32: the only chunk-sized tensors
            lse[s:e] = torch.logsumexp(z, dim=-1)
            logp[s:e] = z.gather(1, targets[s:e, None])[:, 0] - lse[s:e]
            if with_entropy:
                z.sub_(lse[s:e, None])  # log softmax, in place
                entropy[s:e] = -(z.exp() * z).sum(-1)
            del z
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.scale, ctx.chunk = scale, chunk
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        scale, chunk, n = ctx.scale, ctx.chunk, hidden.shape[0]
        grad_h = torch.empty_like(hidden) if need_h else None
        # float32 accumulation over chunks, whatever the compute dtype
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
        for s in range(0, n, chunk):
            e = min(s + chunk, n)
            h, g = hidden[s:e], grad_logp[s:e].float()
            # d logp / d z = onehot(target) - softmax(z), times the incoming gradient, built in place
            gz = _chunk_logits(h, weight, bias, scale).sub_(lse[s:e, None]).exp_().mul_(-g[:, None])
            gz.scatter_add_(1, targets[s:e, None], g[:, None])
            # back through .float(), the scale and the linear, in the compute dtype (as autograd does on full logits)
            gz = gz.to(hidden.dtype)
            if scale is not None:
                gz = gz * scale
            if need_h:
                grad_h[s:e] = gz @ weight
            if need_w:
                if gz.dtype == torch.float32:
                    grad_w.addmm_(gz.t(), h)
                else:
                    grad_w += (gz.t() @ h).float()
            if need_b:
                grad_b += gz.float().sum(0)
            del gz
        grad_w = None if grad_w is None else grad_w.to(weight.dtype)
        grad_b = None if grad_b is None else grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None


def chunked_token_logprobs(hidden: torch.Tensor, head: OutputHead, targets: torch.Tensor, *, chunk_tokens: int,
                           with_entropy: bool = False):
    """log softmax(head.logits(hidden))[targets] `[...]` float32 for hidden `[..., d]` and targets `[...]`,
    `chunk_tokens` rows of logits at a time (module doc). With `with_entropy`, also the entropy of each row's
    distribution (no gradient)."""
    if int(chunk_tokens) < 1:
        raise ConfigError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    if hidden.dim() < 1 or targets.shape != hidden.shape[:-1]:
        raise DataError(f"chunked log-probs need hidden [..., d] and targets [...]; got {tuple(hidden.shape)} and "
                        f"{tuple(targets.shape)}")
    shape = targets.shape
    hidden, targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    device = hidden.device.type
    # The dtype autocast would run the head's linear in (it casts input, weight and bias), else the weight's.
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else head.weight.dtype
    bias = None if head.bias is None else head.bias.to(dtype)
    with torch.autocast(device, enabled=False):
        logp, entropy = _ChunkedLogprobs.apply(hidden.to(dtype), head.weight.to(dtype), bias, targets.long(),
                                               head.scale, int(chunk_tokens), with_entropy)
    return (logp.view(shape), entropy.view(shape)) if with_entropy else logp.view(shape)
