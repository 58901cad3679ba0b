"""The weight-matmul FLOP model of one token's forward, shared by the benchmarks' roofline fractions
(bench/roofline.py) and the trainers' compute meter (trainers/compute.py, compute-matched SFT controls).

    from dare_bench.models.flops import matmul_flops_per_token
    flops = matmul_flops_per_token(model) * tokens           # a forward over `tokens` tokens; x3 with its backward

It counts 2 x every 2-D weight a token goes through (attention and MLP projections, the LM head; routed MoE experts
at the share a token uses, num_experts_per_tok / experts), the input embedding (a lookup) left out unless tied to
the LM head. Attention scores (4 x layers x d x context per token) and element-wise work are left out.
"""

from __future__ import annotations

import contextlib
import contextvars

# Rows the model call being made stands for, when a sampler computes identical rows once (diffusion/sampling/
# core.py `shared_rows_forward`): the compute meter counts the rows the algorithm asked for, so an RL run's FLOPs,
# and the compute-matched SFT control's budget, do not depend on how many rows happened to be shared.
_REPRESENTED_ROWS: contextvars.ContextVar[int | None] = contextvars.ContextVar("represented_rows", default=None)


@contextlib.contextmanager
def representing_rows(rows: int):
    """Within this block the model's forward stands for `rows` rows (its own batch is smaller)."""
    token = _REPRESENTED_ROWS.set(rows)
    try:
        yield
    finally:
        _REPRESENTED_ROWS.reset(token)


def counted_tokens(ids) -> int:
    """Tokens a forward over `ids` `[B, L]` counts: B x L, or the represented rows x L inside `representing_rows`."""
    rows = _REPRESENTED_ROWS.get()
    if rows is None or ids.dim() < 2 or ids.shape[0] == 0:
        return int(ids.numel())
    return int(ids.numel()) // int(ids.shape[0]) * rows


def matmul_flops_per_token(model) -> float:
    """Weight-matmul FLOPs of one token's forward (module doc)."""
    import torch

    from dare_bench.models.moe import moe_blocks

    config = model.config
    tied = bool(config.get("tie_word_embeddings") or config.get("weight_tying"))
    embedding_ids = set() if tied else {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    expert_share = {}
    for block in moe_blocks(model):
        share = float(config.get("num_experts_per_tok") or len(block)) / len(block)
        expert_share.update({id(p): share for p in block.parameters()})
    return 2.0 * sum(p.numel() * expert_share.get(id(p), 1.0) for p in model.parameters()
                     if p.dim() == 2 and id(p) not in embedding_ids)


__all__ = ["counted_tokens", "matmul_flops_per_token", "representing_rows"]
