"""KV caches for diffusion sampling: the exact block cache (block diffusion) and Fast-dLLM prefix / dual caches.

Library module used by `dare_bench.diffusion.sampling`; no command line. Tests:
`.venv/bin/python -m pytest tests/diffusion/test_sampling_block.py tests/diffusion/test_sampling_mdlm.py -q`.

- `ExactBlockCache` (SDAR, LLaDA2): committed blocks are encoded once with the block-causal pattern and their keys /
  values kept; the current block then attends to (cache + itself). Because a committed block never changes and a
  block-causal query never sees later blocks, this gives the same logits as recomputing the whole prefix (up to
  float rounding), so the same tokens as the official recompute samplers. With `hidden` it returns the block's
  final hidden states and the head, so the sampler applies the LM head to the positions a step may write only.
- `FastDLLMCache` (LLaDA, Dream; Fast-dLLM, arXiv 2505.22618): at the start of every block the whole canvas is
  encoded once; `prefix` mode keeps the keys / values before the block and re-runs the block plus everything after
  it, `dual` mode keeps all of them and re-runs only the block, writing its fresh keys / values over the stale ones
  in place (`replace_position`). Bidirectional attention makes both approximate: the cached positions do not see
  the tokens committed since the refresh.

Every model call goes through the `forward` callable handed in by the sampler, so forward counts stay in one place.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch

from dare_bench.models.layers import block_causal_mask

Forward = Callable[..., torch.Tensor]


class ExactBlockCache:
    """Keys / values of committed blocks `[0, length)` of a block-causal model, grown block by block.

    A finished block is not encoded on its own: `commit` only marks it pending, and the next `block_logits` call
    runs `[pending block | current block]` in one forward under the block-causal mask, storing the pending block's
    keys / values (which see only the cache and themselves, exactly as a separate commit forward would) and
    returning the current block's logits. This saves one model call per block over the official SDAR loop.
    """

    def __init__(self, model, block_size: int, forward: Forward, hidden: bool = False, rows_known: bool = False):
        self.cache = model.new_kv_cache()
        self.block_size = block_size
        self.forward = forward
        # `forward` takes each row's `history` (a sampler's `SamplerRun.forward`): identical rows are computed once
        self.rows_known = rows_known
        # `block_logits` returns the block's HiddenStates (final-normed states + head) instead of its logits
        self.hidden = hidden
        self.pending: torch.Tensor | None = None

    @property
    def length(self) -> int:
        """Committed positions, pending block included."""
        return len(self.cache) + (0 if self.pending is None else self.pending.shape[1])

    def prefill(self, ids: torch.Tensor) -> None:
        """Encode whole prompt blocks `ids` (`[B, n*b]`, starting at position 0) into the cache."""
        n = ids.shape[1]
        if n == 0:
            return
        if n % self.block_size:
            raise ValueError(f"prefill length {n} is not a multiple of the block size {self.block_size}")
        pos = torch.arange(n, device=ids.device).expand(ids.shape[0], n)
        mask = block_causal_mask(n, n, self.block_size, device=ids.device)
        extra = {"history": ids} if self.rows_known else {}  # an empty cache: the ids are all a row holds
        self.forward(ids, position_ids=pos, attn_mask=mask, kv_cache=self.cache, update_cache=True, **extra)

    def block_logits(self, block_ids: torch.Tensor, history: torch.Tensor | None = None):
        """Logits of the current block (positions `[length, length + b)`) against the committed blocks (with
        `hidden`: its `HiddenStates`, states `[B, b, d]`). `history`: each row's canvas up to the block's end
        (committed blocks, pending block, this block), which lets identical rows be computed once
        (sampling/core.py `shared_rows_forward`)."""
        cached = len(self.cache)
        extra = {"return_hidden": True} if self.hidden else {}
        if history is not None and self.rows_known:
            extra["history"] = history
        if self.pending is None:
            # every cached key is an earlier block and the block is bidirectional inside: no mask needed
            pos = torch.arange(cached, cached + block_ids.shape[1], device=block_ids.device).expand_as(block_ids)
            return self.forward(block_ids, position_ids=pos, kv_cache=self.cache, update_cache=False, **extra)
        prev = self.pending
        ids = torch.cat([prev, block_ids], dim=1)
        n = ids.shape[1]
        pos = torch.arange(cached, cached + n, device=ids.device).expand(ids.shape[0], n)
        mask = block_causal_mask(n, cached + n, self.block_size, q_offset=cached, device=ids.device)
        out = self.forward(ids, position_ids=pos, attn_mask=mask, kv_cache=self.cache, update_cache=True, **extra)
        self.cache.crop(cached + prev.shape[1])
        self.pending = None
        if self.hidden:
            return replace(out, states=out.states[:, prev.shape[1]:])
        return out[:, prev.shape[1]:]

    def commit(self, block_ids: torch.Tensor) -> None:
        """Mark a finished block as committed; its keys / values are stored by the next `block_logits`."""
        if self.pending is not None:
            self.flush()
        self.pending = block_ids.clone()

    def flush(self) -> None:
        """Store a pending block now (one forward), e.g. before handing the cache to someone else."""
        if self.pending is None:
            return
        prev, self.pending = self.pending, None
        start = len(self.cache)
        pos = torch.arange(start, start + prev.shape[1], device=prev.device).expand_as(prev)
        self.forward(prev, position_ids=pos, kv_cache=self.cache, update_cache=True)


class FastDLLMCache:
    """Fast-dLLM approximate caches for bidirectional models (`mode` = "prefix" or "dual").

    `refresh` encodes the full canvas and returns its logits; `window_logits` re-runs `[start, end)` against the
    cached keys / values of the rest. Windows are given in canvas coordinates.
    """

    def __init__(self, model, mode: str, forward: Forward):
        if mode not in ("prefix", "dual"):
            raise ValueError(f"unknown Fast-dLLM cache mode {mode!r}")
        self.model = model
        self.mode = mode
        self.forward = forward
        self.cache = None
        self.start = 0

    def refresh(self, x: torch.Tensor, start: int, **model_kwargs) -> torch.Tensor:
        """Encode all of `x`, keep what `mode` needs for a block starting at `start`, return the full logits."""
        self.cache = self.model.new_kv_cache()
        logits = self.forward(x, kv_cache=self.cache, update_cache=True, **model_kwargs)
        if self.mode == "prefix":
            self.cache.crop(start)
        self.start = start
        return logits

    def window_logits(self, x: torch.Tensor, start: int, end: int, **model_kwargs) -> torch.Tensor:
        """Logits of canvas positions `[start, end)` (prefix mode: `end` must be the canvas end)."""
        if self.cache is None:
            raise RuntimeError("window_logits before refresh")
        if self.mode == "prefix":
            if start != len(self.cache) or end != x.shape[1]:
                raise ValueError("prefix cache windows run from the cached prefix to the end of the canvas")
            return self.forward(x[:, start:end], kv_cache=self.cache, update_cache=False, **model_kwargs)
        # dual: the block's fresh keys / values are written over the stale ones in place (Fast-dLLM's
        # replace_position); the next step overwrites them again and the next refresh re-encodes the canvas
        return self.forward(x[:, start:end], kv_cache=self.cache, update_cache=True,
                            replace_position=(start, end), **model_kwargs)
