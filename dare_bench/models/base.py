"""What every backbone exposes, and the family registry.

A backbone is a `DiffusionLM` (a torch Module) whose `forward` returns float logits `[B, L, V]` in the official
model's convention, plus `traits` that tell samplers, likelihood estimators and trainers everything family-specific
(mask id, logit shift, attention kind, block size, eos / pad ids) so that no caller branches on a family name.
`forward(..., return_hidden=True)` returns the final-normed hidden states and the `OutputHead` instead of logits
(`models/lm_head.py`: chunked log-probs without `[tokens, vocab]` logits); the default forward is unchanged.

The family registry (`FamilySpec`, `register_family`, `detect_family`) lives in `families.py`, the bottom of the
package.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from dare_bench.models.io import save_pretrained as save_checkpoint_dir
from dare_bench.models.layers import check_backend
from dare_bench.models.lm_head import HiddenStates, OutputHead

AttentionKind = Literal["bidirectional", "block_causal"]


@dataclass(frozen=True)
class ModelTraits:
    """Family facts a caller needs, read from the model's config (never from constants)."""

    family: str
    mask_token_id: int
    eos_token_id: int
    pad_token_id: int
    # 0: logits row i predicts token i (LLaDA, SDAR, LLaDA2). 1: row i predicts token i+1 (Dream, AR convention);
    # callers use `shift_logits` to get "row i predicts token i".
    logit_shift: int
    attention: AttentionKind
    block_size: int | None = None  # block diffusion only
    # Extra ids that end a generation (e.g. <|eot_id|>, <|im_end|>), besides eos.
    stop_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None

    @property
    def is_block_diffusion(self) -> bool:
        return self.attention == "block_causal"


def shift_logits(logits: torch.Tensor, logit_shift: int) -> torch.Tensor:
    """Return logits where row i predicts token i.

    With `logit_shift == 1` (Dream) this is the official sampler's `cat([logits[:, :1], logits[:, :-1]], 1)`:
    position i takes row i-1 and position 0 reuses row 0.
    """
    if logit_shift == 0:
        return logits
    if logit_shift == 1:
        return torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
    raise ValueError(f"unsupported logit_shift {logit_shift}")


class KVCache:
    """Per-layer key/value tensors `[B, H_kv, L, D]` (post-RoPE, post QK-norm), appended block by block.

    Semantics of a forward with `kv_cache` (implemented by every family's attention):
    - `replace_position=None`: keys/values = concat(cache, new); if `update_cache`, the cache keeps the concat.
    - `replace_position=(start, end)`: keys/values = cache with positions [start, end) replaced by the new ones
      (Fast-dLLM dual cache); if `update_cache`, the replacement is written into the cache in place (as Fast-dLLM's
      `past_key[:, :, replace_indices] = k`: no copy of the whole cache per layer and step), else into a copy.
    `attn_mask` (bool `[B, 1, Lq, Lk]`, True = may attend) then covers all keys; None = attend to everything.
    """

    def __init__(self, num_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        # per layer, storage with room past the cached positions, of which keys / values are the leading views:
        # without grad an append writes the new positions there instead of concatenating a copy of the whole cache
        self._room: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_layers

    def __len__(self) -> int:  # number of cached positions
        k = self.keys[0]
        return 0 if k is None else int(k.shape[-2])

    def attend(
        self,
        layer: int,
        k: torch.Tensor,
        v: torch.Tensor,
        update: bool,
        replace_position: tuple[int, int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ck, cv = self.keys[layer], self.values[layer]
        if replace_position is not None:
            if ck is None:
                raise ValueError("replace_position needs a filled cache")
            start, end = replace_position
            if end - start != k.shape[-2]:
                raise ValueError(f"replace_position {replace_position} does not match {k.shape[-2]} new positions")
            if update:
                ck[..., start:end, :] = k
                cv[..., start:end, :] = v
                return ck, cv
            full_k = torch.cat([ck[..., :start, :], k, ck[..., end:, :]], dim=-2)
            full_v = torch.cat([cv[..., :start, :], v, cv[..., end:, :]], dim=-2)
        elif ck is None:
            full_k, full_v = k, v
        elif torch.is_grad_enabled():
            full_k, full_v = torch.cat([ck, k], dim=-2), torch.cat([cv, v], dim=-2)
        else:
            full_k, full_v = self._append(layer, ck, cv, k, v)
        if update:
            self.keys[layer], self.values[layer] = full_k, full_v
        return full_k, full_v

    def _append(self, layer: int, ck, cv, k, v) -> tuple[torch.Tensor, torch.Tensor]:
        """(cache + new) keys / values as views of the layer's storage: the new positions are written after the
        cached ones (scratch when `update` is off: the next append overwrites them), the storage doubled and the
        cache copied only when it is full or the cache is not its leading view (first append, after `reorder`)."""
        cached, n = ck.shape[-2], k.shape[-2]
        room = self._room[layer]
        if (room is None or room[0].shape[-2] < cached + n or room[0].shape[:-2] != ck.shape[:-2]
                or ck.data_ptr() != room[0].data_ptr() or cv.data_ptr() != room[1].data_ptr()
                or ck.stride() != room[0].stride() or room[0].dtype != k.dtype):
            capacity = max(2 * (cached + n), 64)
            room = (ck.new_empty((*ck.shape[:-2], capacity, ck.shape[-1])),
                    cv.new_empty((*cv.shape[:-2], capacity, cv.shape[-1])))
            room[0][..., :cached, :] = ck
            room[1][..., :cached, :] = cv
            self._room[layer] = room
        room[0][..., cached:cached + n, :] = k
        room[1][..., cached:cached + n, :] = v
        return room[0][..., :cached + n, :], room[1][..., :cached + n, :]

    def crop(self, length: int) -> None:
        """Keep the first `length` cached positions."""
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            if k is not None:
                self.keys[i], self.values[i] = k[..., :length, :], v[..., :length, :]

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows (e.g. after finished rows are dropped)."""
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            if k is not None:
                self.keys[i], self.values[i] = k.index_select(0, index), v.index_select(0, index)

    def rows(self, index: torch.Tensor) -> "KVCache":
        """A new cache holding copies of these batch rows (a forward over a subset of the rows)."""
        out = KVCache(len(self.keys))
        out.keys = [None if k is None else k.index_select(0, index) for k in self.keys]
        out.values = [None if v is None else v.index_select(0, index) for v in self.values]
        return out

    def hold(self, other: "KVCache") -> None:
        """Hold `other`'s keys / values from now on (this object is the one its owner keeps)."""
        self.keys, self.values = list(other.keys), list(other.values)
        self._room = [None] * len(self.keys)


class DiffusionLM(nn.Module):
    """Base class of every backbone.

    Subclasses set `family`, build their modules from `config` (the official config.json as a dict, whose field
    names are kept as they are), and implement `forward` and `traits`.
    """

    family: ClassVar[str] = ""

    def __init__(self, config: dict[str, Any]):
        super().__init__()
        self.config = copy.deepcopy(config)
        self.gradient_checkpointing = False
        self.attn_backend = "sdpa"

    # --- to implement -------------------------------------------------------------------------------------
    @property
    def traits(self) -> ModelTraits:  # pragma: no cover - abstract
        raise NotImplementedError

    def forward(  # pragma: no cover - abstract
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        *,
        attn_mask: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        update_cache: bool = False,
        replace_position: tuple[int, int] | None = None,
        return_hidden: bool = False,
    ) -> torch.Tensor | HiddenStates:
        """Return logits `[B, L, V]` (float) in the official convention.

        attention_mask: what the official forward takes, with its semantics: a `[B, Lk]` 0/1 padding mask, or
            where the official model takes one, the 4-D `[B or 1, 1, Lq, Lk]` mask in the official dtype forms
            (Dream: bool or additive, also the string "full"; SDAR: bool or integer 0/1; LLaDA2: additive or bool;
            LLaDA takes its 4-D pattern as the extra keyword `attention_bias`). Other forms raise `DareBenchError`.
        position_ids: `[B or 1, L]`; defaults to the family's official default.
        attn_mask: explicit `[B or 1, 1, Lq, Lk]` mask, bool (True = may attend) or additive float, overriding the
            family's default pattern (the native keyword, the same in every family); used for packing, block-causal
            training layouts and cached decoding. At most one of it and a 4-D attention_mask.
        kv_cache / update_cache / replace_position: see `KVCache`.
        return_hidden: return `HiddenStates(states [B, L, d], head)` instead: the final-normed hidden states in the
            logits' row convention (Dream's row i still scores token i+1) and `output_head()`, so that
            `head.logits(states)` is the logits this forward returns otherwise. Inside the forward, so wrappers
            (PEFT, FSDP2 hooks, the LoRA reference) pass it through like any keyword.
        """
        raise NotImplementedError

    def output_head(self) -> OutputHead:  # pragma: no cover - abstract
        """The LM head as an `OutputHead` (tied embeddings: the embedding matrix; LLaDA: its bias and logit scale)."""
        raise NotImplementedError

    # --- shared ---------------------------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        raise NotImplementedError

    def new_kv_cache(self) -> KVCache:
        return KVCache(self.num_layers)

    def set_attention_backend(self, backend: str) -> None:
        check_backend(backend)
        self.attn_backend = backend

    def gradient_checkpointing_enable(self, enabled: bool = True) -> None:
        self.gradient_checkpointing = enabled

    def gradient_checkpointing_disable(self) -> None:
        self.gradient_checkpointing = False

    @torch.no_grad()
    def init_weights(self, std: float = 0.02) -> None:
        """Random init for presets trained from scratch: normal(0, std) matrices, unit norms, zero biases."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif hasattr(module, "weight") and isinstance(module.weight, nn.Parameter) and module.weight.dim() == 1:
                nn.init.ones_(module.weight)

    def post_load(self) -> None:
        """Hook run after weights were assigned (e.g. to rebuild non-persistent buffers); default: nothing."""

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def save_pretrained(self, directory, *, tokenizer=None, extra_files: dict[str, str] | None = None,
                        state_dict: dict[str, torch.Tensor] | None = None) -> None:
        save_checkpoint_dir(self, directory, tokenizer=tokenizer, extra_files=extra_files, state_dict=state_dict)
