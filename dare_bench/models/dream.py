"""Dream (Dream-org/Dream-v0-Instruct-7B / -Base-7B; DiffuCoder, Dream-Coder): Qwen2 without the causal mask.

Matches the official `modeling_dream.py` (HF snapshot, transformers 4.46.2): state-dict keys
`model.embed_tokens.weight`, `model.layers.{i}.self_attn.{q,k,v}_proj.{weight,bias}`, `...o_proj.weight`,
`model.layers.{i}.mlp.{gate,up,down}_proj.weight`, `model.norm.weight`, `lm_head.weight`; config.json field names
of `DreamConfig`; GQA; RoPE with `rope_theta`. Logits keep the autoregressive convention (row i scores token i+1,
`traits.logit_shift == 1`; `dare_bench.models.shift_logits` applies the sampler's shift). Spec:
shared/docs/models.md section 2.

    from dare_bench.models import load_pretrained, shift_logits
    model = load_pretrained("tiny-dream")                                       # CPU preset, random init
    model = load_pretrained("/ckpt/Dream-v0-Instruct-7B", dtype="bfloat16", device="cuda")
    logits = shift_logits(model(input_ids, attention_mask, position_ids), model.traits.logit_shift)

Parity test: `.venv/bin/python -m pytest tests/models/test_llada_dream_parity.py -q`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from dare_bench.errors import CheckpointError, DareBenchError
from dare_bench.models.base import DiffusionLM, KVCache, ModelTraits
from dare_bench.models.families import FamilySpec, register_family
from dare_bench.models.layers import (
    RMSNorm,
    SwiGLU,
    apply_rotary,
    attention,
    combine_masks,
    explicit_mask,
    query_key_padding_mask,
    rotary_cos_sin,
)
from dare_bench.models.llada import _check_ids
from dare_bench.models.lm_head import HiddenStates, OutputHead, linear_head
from dare_bench.models.presets import register_preset

# `DreamConfig.__init__` defaults (configuration_dream.py of the HF snapshot), used for absent fields.
# bos/eos are not DreamConfig arguments: PretrainedConfig leaves them None when absent.
DREAM_CONFIG_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 4096,
    "intermediate_size": 22016,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "use_cache": False,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "use_sliding_window": False,
    "sliding_window": 4096,
    "max_window_layers": 28,
    "attention_dropout": 0.0,
    "mask_token_id": 151666,
    "pad_token_id": 151643,
    "bos_token_id": None,
    "eos_token_id": None,
}

# Ids of the real Dream tokenizer (models.md 2.4): <|im_end|> ends an Instruct turn.
_REAL_MASK_ID, _REAL_EOS_ID, _REAL_IM_END_ID = 151666, 151643, 151645


def dream_settings(config: dict[str, Any]) -> dict[str, Any]:
    c = {**DREAM_CONFIG_DEFAULTS, **config}
    if c["num_key_value_heads"] is None:  # DreamConfig's backward-compatibility rule
        c["num_key_value_heads"] = c["num_attention_heads"]
    problems = []
    if c["hidden_act"] != "silu":
        problems.append(f"hidden_act={c['hidden_act']!r} (Dream uses 'silu')")
    if c["rope_scaling"] is not None:
        problems.append(f"rope_scaling={c['rope_scaling']!r} (only the default RoPE is implemented)")
    if c["hidden_size"] % c["num_attention_heads"] or c["num_attention_heads"] % c["num_key_value_heads"]:
        problems.append(f"hidden_size {c['hidden_size']} / heads {c['num_attention_heads']} / kv heads "
                        f"{c['num_key_value_heads']} do not divide")
    if c["pad_token_id"] is not None and not 0 <= c["pad_token_id"] < c["vocab_size"]:
        problems.append(f"pad_token_id {c['pad_token_id']} outside the vocabulary (it is the embedding padding_idx)")
    if problems:
        raise CheckpointError("Dream config not supported: " + "; ".join(problems))
    # use_sliding_window is ignored like the official SDPA attention does (Dream is bidirectional)
    c["head_dim"] = c["hidden_size"] // c["num_attention_heads"]
    return c


class DreamAttention(nn.Module):
    def __init__(self, c: dict[str, Any]):
        super().__init__()
        d, hd = c["hidden_size"], c["head_dim"]
        self.n_heads, self.n_kv_heads, self.head_dim = c["num_attention_heads"], c["num_key_value_heads"], hd
        self.attention_dropout = c["attention_dropout"]
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=True)
        self.k_proj = nn.Linear(d, self.n_kv_heads * hd, bias=True)
        self.v_proj = nn.Linear(d, self.n_kv_heads * hd, bias=True)
        self.o_proj = nn.Linear(self.n_heads * hd, d, bias=False)

    def forward(self, x, cos, sin, mask, layer_idx, kv_cache, update_cache, replace_position, backend):
        b, l, _ = x.shape
        q = self.q_proj(x).view(b, l, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, l, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, l, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, k, cos, sin)  # in the activation dtype, as Qwen2 does
        if kv_cache is not None:
            k, v = kv_cache.attend(layer_idx, k, v, update_cache, replace_position)
        out = attention(q, k, v, mask, backend=backend, dropout_p=self.attention_dropout if self.training else 0.0)
        return self.o_proj(out.transpose(1, 2).reshape(b, l, self.n_heads * self.head_dim))


class DreamDecoderLayer(nn.Module):
    def __init__(self, c: dict[str, Any]):
        super().__init__()
        self.self_attn = DreamAttention(c)
        self.mlp = SwiGLU(c["hidden_size"], c["intermediate_size"])
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, x, cos, sin, mask, layer_idx, kv_cache, update_cache, replace_position, backend):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, layer_idx, kv_cache, update_cache,
                               replace_position, backend)
        return x + self.mlp(self.post_attention_layernorm(x))


class DreamModel(DiffusionLM):
    """Dream with the official module tree `model.{embed_tokens, layers, norm}` and `lm_head`."""

    family = "dream"

    def __init__(self, config: dict[str, Any]):
        super().__init__(config)
        c = dream_settings(config)
        self._c = c
        self.model = nn.Module()
        # padding_idx as in the official model: the pad row gets no gradient
        self.model.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"], padding_idx=c["pad_token_id"])
        self.model.layers = nn.ModuleList(DreamDecoderLayer(c) for _ in range(c["num_hidden_layers"]))
        self.model.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        if not c["tie_word_embeddings"]:
            self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)

    @property
    def num_layers(self) -> int:
        return self._c["num_hidden_layers"]

    @property
    def traits(self) -> ModelTraits:
        c = self._c
        # eos falls back to pad (the real checkpoint has eos == pad) when config.json does not name one
        eos = c["eos_token_id"] if c["eos_token_id"] is not None else c["pad_token_id"]
        if isinstance(eos, (list, tuple)):
            eos, extra = eos[0], tuple(int(e) for e in eos[1:])
        else:
            extra = ()
        stop = extra
        if c["mask_token_id"] == _REAL_MASK_ID and eos == _REAL_EOS_ID and c["vocab_size"] > _REAL_IM_END_ID:
            stop = stop + (_REAL_IM_END_ID,)
        return ModelTraits(family="dream", mask_token_id=int(c["mask_token_id"]), eos_token_id=int(eos),
                           pad_token_id=int(c["pad_token_id"]), logit_shift=1, attention="bidirectional",
                           stop_token_ids=stop,
                           bos_token_id=None if c["bos_token_id"] is None else int(c["bos_token_id"]))

    @torch.no_grad()
    def init_weights(self, std: float | None = None) -> None:
        super().init_weights(self._c["initializer_range"] if std is None else std)
        pad = self.model.embed_tokens.padding_idx
        if pad is not None:
            self.model.embed_tokens.weight[pad].zero_()

    def forward(
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
        """Raw logits `[B, L, V]`: row i scores token i+1 (shift with `shift_logits(..., 1)`); `return_hidden`: see
        `DiffusionLM.forward` (the hidden rows keep the same unshifted convention).

        The official calling convention works as is: `attention_mask` None or "full" (no mask), or the 4-D mask the
        official sampler builds, `[B or 1, 1, L, Lk]`, bool (True = may attend; the sampler's
        `m[:, None, None, :] & m[:, None, :, None]`) or additive float (added to the scores, as SDPA does).
        Beyond that (not an upstream form), a 2-D `[B, Lk]` 0/1 padding mask (0 = pad; Lk = cached + new keys) is
        turned into the sampler's 4-D mask (pad keys hidden, pad queries see nothing and output 0). `attn_mask` is the
        native keyword (bool or additive float), ANDed with a 2-D padding mask; it cannot be combined with a 4-D
        attention_mask. position_ids default to 0..L-1 (with a cache: the positions after the cached ones, or
        `replace_position`); the sampler's cumsum positions for padded batches are the caller's job.
        """
        b, l = input_ids.shape
        past = len(kv_cache) if kv_cache is not None else 0
        # absolute positions of the new tokens: after the cached ones, or the replaced window
        q_start = 0 if kv_cache is None else (replace_position[0] if replace_position is not None else past)
        k_len = l if kv_cache is None else (past if replace_position is not None else past + l)
        if position_ids is None:
            position_ids = torch.arange(q_start, q_start + l, device=input_ids.device).expand(b, l)
        elif position_ids.dim() != 2 or position_ids.shape[-1] != l or position_ids.shape[0] not in (1, b):
            raise DareBenchError(f"Dream: position_ids must be [B or 1, {l}] like input_ids, got "
                                 f"{tuple(position_ids.shape)}")
        if attn_mask is not None:
            attn_mask = explicit_mask(attn_mask, arg="attn_mask", family="Dream", forms=("bool", "additive"),
                                      q_len=l, k_len=k_len, batch=b)
        if isinstance(attention_mask, str):
            if attention_mask != "full":
                raise DareBenchError(f"Dream: attention_mask may be the string 'full' (no mask), got "
                                     f"{attention_mask!r}")
            attention_mask = None
        pad = None
        if attention_mask is not None:
            if not isinstance(attention_mask, torch.Tensor):
                raise DareBenchError(f"Dream: attention_mask must be a tensor or 'full', got "
                                     f"{type(attention_mask).__name__}")
            if attention_mask.dim() == 4:
                if attn_mask is not None:
                    raise DareBenchError("Dream: got a 4-D attention_mask and attn_mask; pass the 4-D mask once")
                attn_mask = explicit_mask(attention_mask, arg="attention_mask", family="Dream",
                                          forms=("bool", "additive"), q_len=l, k_len=k_len, batch=b)
            elif attention_mask.dim() != 2 or tuple(attention_mask.shape) not in ((b, k_len), (1, k_len)):
                raise DareBenchError(f"Dream: attention_mask must be 'full', a 4-D [B or 1, 1, {l}, {k_len}] mask "
                                     f"or a [B, {k_len}] padding mask, got {tuple(attention_mask.shape)}")
            elif not bool(attention_mask.bool().all()):
                if kv_cache is None:
                    pad = query_key_padding_mask(attention_mask)
                else:
                    m = attention_mask.bool()
                    pad = m[:, None, None, :] & m[:, q_start:q_start + l][:, None, :, None]
        mask = combine_masks(attn_mask, pad)

        x = self.model.embed_tokens(input_ids)
        cos, sin = rotary_cos_sin(position_ids, self._c["head_dim"], self._c["rope_theta"], x.dtype)
        ckpt = self.gradient_checkpointing and self.training and kv_cache is None and torch.is_grad_enabled()
        for i, layer in enumerate(self.model.layers):
            args = (x, cos, sin, mask, i, kv_cache, update_cache, replace_position, self.attn_backend)
            x = checkpoint(layer, *args, use_reentrant=False) if ckpt else layer(*args)
        x = self.model.norm(x)
        if return_hidden:
            return HiddenStates(x, self.output_head())
        if self._c["tie_word_embeddings"]:
            return torch.nn.functional.linear(x, self.model.embed_tokens.weight)
        return self.lm_head(x)

    def output_head(self) -> OutputHead:
        if self._c["tie_word_embeddings"]:
            return OutputHead(self.model.embed_tokens.weight)
        return linear_head(self.lm_head)


def adapt_vocab(config: dict[str, Any], *, vocab_size: int, mask_token_id: int, eos_token_id: int,
                pad_token_id: int, bos_token_id: int | None = None) -> dict[str, Any]:
    """A copy of `config` sized for a tokenizer of `vocab_size` with its special ids (bos defaults to eos, as in
    the real checkpoint)."""
    _check_ids("Dream", vocab_size, mask_token_id=mask_token_id, eos_token_id=eos_token_id,
               pad_token_id=pad_token_id, bos_token_id=bos_token_id)
    out = dict(config)
    out.update(vocab_size=int(vocab_size), mask_token_id=int(mask_token_id), eos_token_id=int(eos_token_id),
               pad_token_id=int(pad_token_id), bos_token_id=int(eos_token_id if bos_token_id is None else bos_token_id))
    return out


def generation_config(config: dict[str, Any]) -> dict[str, Any]:
    """generation_config.json as the real checkpoint ships it (DreamGenerationConfig defaults, the model's ids).

    The official `DreamModel.from_pretrained` refuses a directory without this file."""
    eos = config.get("eos_token_id", config.get("pad_token_id", DREAM_CONFIG_DEFAULTS["pad_token_id"]))
    return {
        "_from_model_config": True,
        "alg": "origin",
        "alg_temp": None,
        "bos_token_id": config.get("bos_token_id", eos),
        "eos_token_id": eos,
        "eps": 0.001,
        "mask_token_id": None,
        "output_history": False,
        "pad_token_id": config.get("pad_token_id", DREAM_CONFIG_DEFAULTS["pad_token_id"]),
        "steps": 512,
        "temperature": 0.0,
        "top_k": None,
        "top_p": None,
        "transformers_version": "4.46.2",
    }


register_family(FamilySpec(
    name="dream",
    model_cls=DreamModel,
    model_types=("Dream",),
    architectures=("DreamModel",),
    companion_files={"generation_config.json": generation_config},
    adapt_vocab=adapt_vocab,
))

# Official field set (the real config.json's), tiny sizes; ~1.1 M parameters, CPU-friendly.
TINY_DREAM: dict[str, Any] = {
    "architectures": ["DreamModel"],
    "attention_dropout": 0.0,
    "auto_map": {
        "AutoConfig": "configuration_dream.DreamConfig",
        "AutoModel": "modeling_dream.DreamModel",
    },
    "bos_token_id": 510,
    "eos_token_id": 510,
    "hidden_act": "silu",
    "hidden_size": 128,
    "initializer_range": 0.02,
    "intermediate_size": 512,
    "mask_token_id": 511,
    "max_position_embeddings": 131072,
    "max_window_layers": 4,
    "model_type": "Dream",
    "num_attention_heads": 4,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "pad_token_id": 510,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "transformers_version": "4.46.2",
    "use_cache": True,
    "use_mrope": False,
    "use_sliding_window": False,
    "vocab_size": 512,
}
register_preset("tiny-dream", TINY_DREAM)
