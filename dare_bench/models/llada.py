"""LLaDA (GSAI-ML/LLaDA-8B-Base / -Instruct, LLaDA-1.5): a bidirectional Llama-style masked diffusion backbone.

Matches the official `modeling_llada.py` (ML-GSAI/LLaDA @ 59750478, the attention-mask-aware version) for the
configurations LLaDA ships (block_type "llama", activation "silu", RMS norm, RoPE): same state-dict keys
(`model.transformer.wte.weight`, `model.transformer.blocks.{i}.q_proj.weight`, ...), same config.json field names,
same numerics (RMSNorm in float32 then weight; RoPE on float32 q/k), logits not shifted. Spec:
shared/docs/models.md section 1.

    from dare_bench.models import load_pretrained
    model = load_pretrained("tiny-llada")                                     # CPU preset, random init
    model = load_pretrained("/ckpt/LLaDA-8B-Instruct", dtype="bfloat16", device="cuda")
    logits = model(input_ids, attention_mask)                                  # [B, L, V]

Parity test: `.venv/bin/python -m pytest tests/models/test_llada_dream_parity.py -q`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from dare_bench.errors import CheckpointError, ConfigError, DareBenchError
from dare_bench.models.base import DiffusionLM, KVCache, ModelTraits
from dare_bench.models.families import FamilySpec, register_family
from dare_bench.models.layers import (
    RMSNorm,
    apply_rotary,
    attention,
    combine_masks,
    explicit_mask,
    key_padding_mask,
    rotary_cos_sin,
)
from dare_bench.models.lm_head import HiddenStates, OutputHead, linear_head
from dare_bench.models.presets import register_preset

# What `LLaDAConfig` fills in for a field missing from config.json: the OLMo-style `ModelConfig` dataclass
# defaults of configuration_llada.py (blob 3556bdac). Several are NOT what LLaDA uses (weight_tying True,
# activation swiglu, block_type sequential, rope False, dropouts 0.1), so a config that omits them describes a
# different model; we read it the way the official code does and reject the parts LLaDA's forward cannot run.
LLADA_CONFIG_DEFAULTS: dict[str, Any] = {
    "d_model": 768,
    "n_heads": 12,
    "n_kv_heads": None,
    "n_layers": 12,
    "mlp_ratio": 4,
    "mlp_hidden_size": None,
    "activation_type": "swiglu",
    "block_type": "sequential",
    "block_group_size": 1,
    "alibi": False,
    "alibi_bias_max": 8.0,
    "rope": False,
    "rope_full_precision": True,
    "flash_attention": False,
    "attention_dropout": 0.1,
    "multi_query_attention": None,
    "attention_layer_norm": False,
    "residual_dropout": 0.1,
    "embedding_dropout": 0.1,
    "input_emb_norm": False,
    "layer_norm_type": "default",
    "layer_norm_with_affine": True,
    "rms_norm_eps": 1e-05,
    "attention_layer_norm_with_affine": True,
    "max_sequence_length": 1024,
    "rope_theta": 10000.0,
    "include_qkv_bias": False,
    "include_bias": False,
    "bias_for_layer_norm": None,
    "scale_logits": False,
    "vocab_size": 50257,
    "embedding_size": 50304,
    "weight_tying": True,
    "eos_token_id": 50256,
    "pad_token_id": 50256,
    "mask_token_id": 50256,
    "init_device": None,
    "init_fn": "normal",
    "init_std": 0.02,
    "init_cutoff_factor": None,
    "precision": None,
    "use_cache": False,
}

# Ids of the real LLaDA tokenizer (models.md 1.4); <|eot_id|> ends an Instruct turn.
_REAL_MASK_ID, _REAL_EOS_ID, _REAL_EOT_ID = 126336, 126081, 126348


def llada_settings(config: dict[str, Any]) -> dict[str, Any]:
    """config.json with the official defaults filled in, validated against what LLaDA's forward supports."""
    c = {**LLADA_CONFIG_DEFAULTS, **{k: v for k, v in config.items()}}
    problems = []
    if c["block_type"] != "llama":
        problems.append(f"block_type={c['block_type']!r} (only 'llama' is a LLaDA block)")
    if c["activation_type"] != "silu":
        problems.append(f"activation_type={c['activation_type']!r} (LLaDA uses 'silu')")
    if c["layer_norm_type"] != "rms":
        problems.append(f"layer_norm_type={c['layer_norm_type']!r} (LLaDA uses 'rms')")
    if not c["rope"] or c["alibi"]:
        problems.append(f"rope={c['rope']!r}, alibi={c['alibi']!r} (the official forward asserts rope and not alibi)")
    if c["attention_layer_norm"]:
        problems.append("attention_layer_norm=true (QK layer norm is not implemented)")
    if c["input_emb_norm"]:
        problems.append("input_emb_norm=true (not used by LLaDA, not implemented)")
    if c["use_cache"]:
        problems.append("use_cache=true (the official forward rejects every call with it)")
    if problems:
        raise CheckpointError("LLaDA config not supported: " + "; ".join(problems)
                              + " (missing fields take the LLaDAConfig defaults)")
    n_kv = c["n_kv_heads"]
    mqa = c["multi_query_attention"]
    if n_kv is None:
        n_kv = 1 if mqa is True else c["n_heads"]
    elif mqa is not None and n_kv != (1 if mqa else c["n_heads"]):
        raise CheckpointError("LLaDA config: multi_query_attention and n_kv_heads disagree")
    if c["d_model"] % c["n_heads"] or c["n_heads"] % n_kv:
        raise CheckpointError(f"LLaDA config: d_model {c['d_model']} / n_heads {c['n_heads']} / "
                              f"n_kv_heads {n_kv} do not divide")
    c["effective_n_kv_heads"] = n_kv
    c["hidden"] = c["mlp_hidden_size"] or c["mlp_ratio"] * c["d_model"]
    c["emb_rows"] = c["embedding_size"] or c["vocab_size"]
    ln_bias = c["bias_for_layer_norm"]
    c["ln_bias"] = c["include_bias"] if ln_bias is None else ln_bias
    return c


class LLaDABlock(nn.Module):
    """LLaDALlamaBlock: x + attn_out(Attn(attn_norm(x))), then x + ff_out(silu(ff_proj(h)) * up_proj(h))."""

    def __init__(self, c: dict[str, Any]):
        super().__init__()
        d, hd = c["d_model"], c["d_model"] // c["n_heads"]
        kv_dim = c["effective_n_kv_heads"] * hd
        bias, qkv_bias = c["include_bias"], c["include_bias"] or c["include_qkv_bias"]
        self.n_heads, self.n_kv_heads, self.head_dim = c["n_heads"], c["effective_n_kv_heads"], hd
        self.rope_full_precision = c["rope_full_precision"]
        self.attention_dropout = c["attention_dropout"]
        self.attn_norm = RMSNorm(d, c["rms_norm_eps"], c["layer_norm_with_affine"], c["ln_bias"])
        self.ff_norm = RMSNorm(d, c["rms_norm_eps"], c["layer_norm_with_affine"], c["ln_bias"])
        self.q_proj = nn.Linear(d, d, bias=qkv_bias)
        self.k_proj = nn.Linear(d, kv_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(d, kv_dim, bias=qkv_bias)
        self.attn_out = nn.Linear(d, d, bias=bias)
        self.ff_proj = nn.Linear(d, c["hidden"], bias=bias)
        self.up_proj = nn.Linear(d, c["hidden"], bias=bias)
        self.ff_out = nn.Linear(c["hidden"], d, bias=bias)
        self.dropout = nn.Dropout(c["residual_dropout"])

    def forward(self, x, cos, sin, mask, layer_idx, kv_cache, update_cache, replace_position, backend):
        b, l, _ = x.shape
        h = self.attn_norm(x)
        q = self.q_proj(h).view(b, l, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, l, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, l, self.n_kv_heads, self.head_dim).transpose(1, 2)
        dtype = q.dtype
        if self.rope_full_precision:
            q, k = apply_rotary(q.float(), k.float(), cos, sin)
        else:
            q, k = apply_rotary(q, k, cos.to(dtype), sin.to(dtype))
        q, k = q.to(dtype), k.to(dtype)
        if kv_cache is not None:
            k, v = kv_cache.attend(layer_idx, k, v, update_cache, replace_position)
        att = attention(q, k, v, mask, backend=backend,
                        dropout_p=self.attention_dropout if self.training else 0.0)
        att = att.transpose(1, 2).reshape(b, l, self.n_heads * self.head_dim)
        x = x + self.dropout(self.attn_out(att))
        h = self.ff_norm(x)
        return x + self.dropout(self.ff_out(F.silu(self.ff_proj(h)) * self.up_proj(h)))


class LLaDAModelLM(DiffusionLM):
    """LLaDA with the official module tree `model.transformer.{wte, blocks, ln_f, ff_out}`."""

    family = "llada"

    def __init__(self, config: dict[str, Any]):
        super().__init__(config)
        c = llada_settings(config)
        self._c = c
        transformer = nn.ModuleDict({
            "wte": nn.Embedding(c["emb_rows"], c["d_model"]),
            "blocks": nn.ModuleList(LLaDABlock(c) for _ in range(c["n_layers"])),
            "ln_f": RMSNorm(c["d_model"], c["rms_norm_eps"], c["layer_norm_with_affine"], c["ln_bias"]),
        })
        if not c["weight_tying"]:
            transformer["ff_out"] = nn.Linear(c["d_model"], c["emb_rows"], bias=c["include_bias"])
        self.model = nn.Module()
        self.model.transformer = transformer
        self.emb_drop = nn.Dropout(c["embedding_dropout"])

    @property
    def num_layers(self) -> int:
        return self._c["n_layers"]

    @property
    def traits(self) -> ModelTraits:
        c = self._c
        stop: tuple[int, ...] = ()
        # <|eot_id|> is only known for the real tokenizer layout; tiny configs end on eos alone
        if (c["mask_token_id"] == _REAL_MASK_ID and c["eos_token_id"] == _REAL_EOS_ID
                and c["emb_rows"] > _REAL_EOT_ID):
            stop = (_REAL_EOT_ID,)
        gen = getattr(self, "generation_config", None) or {}
        bos = self.config.get("bos_token_id", gen.get("bos_token_id"))
        return ModelTraits(family="llada", mask_token_id=int(c["mask_token_id"]), eos_token_id=int(c["eos_token_id"]),
                           pad_token_id=int(c["pad_token_id"]), logit_shift=0, attention="bidirectional",
                           stop_token_ids=stop, bos_token_id=None if bos is None else int(bos))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        *,
        attention_bias: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        update_cache: bool = False,
        replace_position: tuple[int, int] | None = None,
        return_hidden: bool = False,
    ) -> torch.Tensor | HiddenStates:
        """Logits `[B, L, V]`, not shifted (row i scores token i); `return_hidden`: see `DiffusionLM.forward`.

        The official calling convention: `attention_mask` is the `[B, Lk]` 0/1 padding mask (or its `[B, 1, 1, Lk]`
        view, which upstream flattens the same way); it hides pad keys from every query, and only if it contains a 0
        (pad queries still attend to real keys). Lk is the full key length (cache + new). A 4-D pattern goes in
        `attention_bias` `[B or 1, 1, L, Lk]`, as upstream: bool / int8 (0 = blocked) or additive float (added as
        is). `attn_mask` is the native keyword (bool or additive float); give at most one of it and attention_bias.
        position_ids (not an upstream argument: upstream positions are always 0..L-1) default to 0..L-1; with a
        cache, to the positions the new tokens take (after the cached ones, or `replace_position`).
        """
        tr = self.model.transformer
        b, l = input_ids.shape
        past = len(kv_cache) if kv_cache is not None else 0
        if position_ids is None:
            start = replace_position[0] if replace_position is not None else past
            position_ids = torch.arange(start, start + l, device=input_ids.device).expand(b, l)
        elif position_ids.dim() != 2 or position_ids.shape[-1] != l or position_ids.shape[0] not in (1, b):
            raise DareBenchError(f"LLaDA: position_ids must be [B or 1, {l}] like input_ids, got "
                                 f"{tuple(position_ids.shape)}")
        k_len = l if kv_cache is None else (past if replace_position is not None else past + l)
        pad = None
        if attention_mask is not None:
            if not isinstance(attention_mask, torch.Tensor):
                raise DareBenchError(f"LLaDA: attention_mask must be a [B, {k_len}] 0/1 tensor, got "
                                     f"{type(attention_mask).__name__}")
            if attention_mask.dim() == 4 and attention_mask.shape[1:3] == (1, 1):
                attention_mask = attention_mask[:, 0, 0]
            if attention_mask.dim() != 2 or tuple(attention_mask.shape) not in ((b, k_len), (1, k_len)):
                hint = (" (a 4-D attention pattern goes in attention_bias, as in the official forward)"
                        if attention_mask.dim() == 4 else "")
                raise DareBenchError(f"LLaDA: attention_mask must be the [B, {k_len}] padding mask (1 = real token, "
                                     f"keys incl. cache), got {tuple(attention_mask.shape)}{hint}")
            if not bool(attention_mask.bool().all()):
                pad = key_padding_mask(attention_mask)
        if attention_bias is not None:
            if attn_mask is not None:
                raise DareBenchError("LLaDA: got attention_bias and attn_mask; pass the 4-D mask once")
            attn_mask = explicit_mask(attention_bias, arg="attention_bias", family="LLaDA",
                                      forms=("bool", "int01", "additive"), q_len=l, k_len=k_len, batch=b)
        elif attn_mask is not None:
            attn_mask = explicit_mask(attn_mask, arg="attn_mask", family="LLaDA", forms=("bool", "additive"),
                                      q_len=l, k_len=k_len, batch=b)
        mask = combine_masks(attn_mask, pad)

        x = self.emb_drop(tr["wte"](input_ids))
        # cos/sin stay float32: with rope_full_precision the blocks rotate float32 q/k
        cos, sin = rotary_cos_sin(position_ids, self._c["d_model"] // self._c["n_heads"], self._c["rope_theta"],
                                  torch.float32)
        ckpt = self.gradient_checkpointing and self.training and kv_cache is None and torch.is_grad_enabled()
        for i, block in enumerate(tr["blocks"]):
            args = (x, cos, sin, mask, i, kv_cache, update_cache, replace_position, self.attn_backend)
            x = checkpoint(block, *args, use_reentrant=False) if ckpt else block(*args)
        x = tr["ln_f"](x)
        if return_hidden:
            return HiddenStates(x, self.output_head())
        logits = tr["ff_out"](x) if "ff_out" in tr else F.linear(x, tr["wte"].weight)
        if self._c["scale_logits"]:
            logits = logits * (1 / math.sqrt(self._c["d_model"]))
        return logits


    def output_head(self) -> OutputHead:
        tr = self.model.transformer
        scale = 1 / math.sqrt(self._c["d_model"]) if self._c["scale_logits"] else None
        if "ff_out" in tr:
            return linear_head(tr["ff_out"], scale=scale)
        return OutputHead(tr["wte"].weight, None, scale)  # weight tying: the embedding matrix, no bias


def adapt_vocab(config: dict[str, Any], *, vocab_size: int, mask_token_id: int, eos_token_id: int,
                pad_token_id: int, bos_token_id: int | None = None) -> dict[str, Any]:
    """A copy of `config` sized for a tokenizer of `vocab_size` with its special ids (LLaDA keeps bos out of
    config.json: it lives in generation_config.json)."""
    _check_ids("LLaDA", vocab_size, mask_token_id=mask_token_id, eos_token_id=eos_token_id,
               pad_token_id=pad_token_id, bos_token_id=bos_token_id)
    out = dict(config)
    out.update(vocab_size=int(vocab_size), embedding_size=int(vocab_size), mask_token_id=int(mask_token_id),
               eos_token_id=int(eos_token_id), pad_token_id=int(pad_token_id))
    return out


def _check_ids(family: str, vocab_size: int, **ids: int | None) -> None:
    bad = {k: v for k, v in ids.items() if v is not None and not 0 <= int(v) < int(vocab_size)}
    if bad:
        raise ConfigError(f"{family}: special id(s) {bad} outside the vocabulary of size {vocab_size}")
    if ids["mask_token_id"] in (ids["pad_token_id"], ids["eos_token_id"]):
        raise ConfigError(f"{family}: mask_token_id {ids['mask_token_id']} must differ from pad/eos "
                          "(the samplers tell masked positions from padding by id)")


register_family(FamilySpec(
    name="llada",
    model_cls=LLaDAModelLM,
    model_types=("llada",),
    architectures=("LLaDAModelLM",),
    adapt_vocab=adapt_vocab,
))

# Official field set (the real config.json's), tiny sizes; ~1.2 M parameters, CPU-friendly.
TINY_LLADA: dict[str, Any] = {
    "activation_type": "silu",
    "alibi": False,
    "alibi_bias_max": 8.0,
    "architectures": ["LLaDAModelLM"],
    "attention_dropout": 0.0,
    "attention_layer_norm": False,
    "attention_layer_norm_with_affine": True,
    "auto_map": {
        "AutoConfig": "configuration_llada.LLaDAConfig",
        "AutoModel": "modeling_llada.LLaDAModelLM",
        "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
    },
    "bias_for_layer_norm": False,
    "block_group_size": 1,
    "block_type": "llama",
    "d_model": 128,
    "embedding_dropout": 0.0,
    "embedding_size": 512,
    "eos_token_id": 510,
    "flash_attention": False,
    "include_bias": False,
    "include_qkv_bias": False,
    "init_cutoff_factor": None,
    "init_device": "meta",
    "init_fn": "mitchell",
    "init_std": 0.02,
    "input_emb_norm": False,
    "layer_norm_type": "rms",
    "layer_norm_with_affine": True,
    "mask_token_id": 511,
    "max_sequence_length": 4096,
    "mlp_hidden_size": 512,
    "mlp_ratio": 4,
    "model_type": "llada",
    "multi_query_attention": None,
    "n_heads": 4,
    "n_kv_heads": 4,
    "n_layers": 4,
    "pad_token_id": 510,
    "precision": "amp_bf16",
    "residual_dropout": 0.0,
    "rms_norm_eps": 1e-05,
    "rope": True,
    "rope_full_precision": True,
    "rope_theta": 500000.0,
    "scale_logits": False,
    "transformers_version": "4.46.2",
    "use_cache": False,
    "vocab_size": 512,
    "weight_tying": False,
}
register_preset("tiny-llada", TINY_LLADA)
