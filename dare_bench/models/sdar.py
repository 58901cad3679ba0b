"""SDAR (JetLM SDAR-*-Chat): a Qwen3 decoder run as a block diffusion LM, and its Qwen3-MoE variant (SDAR-30B-A3B).

Matches the official `modeling_sdar.py` (JetAstra/SDAR @ c2041a8, byte-identical to the HF mirror): pre-norm
decoder, per-head RMSNorm on q and k (QK-norm) before rotate-half RoPE over the full head_dim, GQA, no biases,
untied lm_head, no logit shift (row i predicts token i). RMSNorm follows flash-attn's `rms_norm_fn` used upstream:
normalise in fp32, multiply by the weight in fp32, cast once.

Attention pattern without a 4-D mask: the inference block-causal mask over absolute positions (block size from
config `block_size`, default 4), with new queries offset by the KV cache length, so cached committed blocks are fully
visible (`dare_bench.models.block.resolve_attention`). Training layouts pass their mask explicitly (see block.py).

Calling convention: the official one works as is, `model(input_ids, attention_mask=mask4, position_ids=pos)` with
the 4-D `[B or 1, 1, L, Lk]` mask upstream requires (it has no default pattern), read as upstream reads it, with
`.bool()`: a bool mask (True = may attend) or an integer 0/1 one. A float mask is refused: upstream would read an
additive 0 = attend mask inverted. The native keyword `attn_mask=` takes bool or additive float; giving it and a 4-D
`attention_mask` is an error. A 2-D `attention_mask` ([B, keys], 1 = real token; not an upstream form) hides padding
keys on top of the block-causal pattern.

The MoE variant (`model_type "sdar_moe"`, `SDARMoeForCausalLM`) uses the Qwen3-MoE sparse block, the layout its
weight map names (`mlp.gate.weight`, `mlp.experts.{e}.{gate,up,down}_proj.weight`, no shared expert). Its official
modeling file is not vendored anywhere we could read, so the routing is Qwen3-MoE's (softmax in fp32, top-k,
renormalised when `norm_topk_prob`, weights cast to the hidden dtype, experts summed in expert order); there is
no parity fixture for it.

    from dare_bench.models import load_pretrained
    m = load_pretrained("tiny-sdar")                                  # CPU preset, random init
    m = load_pretrained("/ckpt/SDAR-4B-Chat", dtype="bfloat16", device="cuda")
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from dare_bench.models.base import DiffusionLM, KVCache, ModelTraits
from dare_bench.models.block import resolve_attention, skip_init_on_meta
from dare_bench.models.families import FamilySpec, register_family
from dare_bench.models.layers import SwiGLU, apply_rotary, attention, rotary_cos_sin
from dare_bench.models.lm_head import HiddenStates, OutputHead, linear_head
from dare_bench.models.moe import RoutedExperts, cpu_chunks
from dare_bench.models.presets import register_preset

DEFAULT_BLOCK_SIZE = 4
# 4-D `attention_mask` forms the official (eval) attention takes: it reads the mask with `.bool()`
OFFICIAL_MASK_FORMS = ("bool", "int01")
DEFAULT_MASK_TOKEN_ID = 151669  # <MASK> of the Qwen3 tokenizer extended by SDAR


class SDARRMSNorm(nn.Module):
    """flash-attn `rms_norm_fn` semantics: `(x_fp32 * rsqrt(mean(x²)+eps) * w_fp32).to(x.dtype)`."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
            return (h * self.weight.float()).to(x.dtype)


class SDARAttention(nn.Module):
    def __init__(self, cfg: dict[str, Any], layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        hidden = cfg["hidden_size"]
        self.n_heads = cfg["num_attention_heads"]
        self.n_kv = cfg.get("num_key_value_heads") or self.n_heads
        self.head_dim = cfg.get("head_dim") or hidden // self.n_heads
        bias = bool(cfg.get("attention_bias", False))
        self.q_proj = nn.Linear(hidden, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, hidden, bias=bias)
        eps = cfg.get("rms_norm_eps", 1e-6)
        self.q_norm = SDARRMSNorm(self.head_dim, eps)
        self.k_norm = SDARRMSNorm(self.head_dim, eps)

    def forward(self, x, cos, sin, mask, kv_cache: KVCache | None, update_cache: bool, replace_position, backend):
        b, L, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, L, self.n_heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, L, self.n_kv, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, L, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, k, cos, sin)
        if kv_cache is not None:
            # The cache keeps post-k_norm, post-RoPE keys, as the official DynamicCache does.
            k, v = kv_cache.attend(self.layer_idx, k, v, update_cache, replace_position)
        if isinstance(mask, torch.Tensor) and mask.dtype != torch.bool:  # not a flex BlockMask
            mask = mask.to(q.dtype)
        out = attention(q, k, v, mask, backend=backend, scale=self.head_dim ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, L, self.n_heads * self.head_dim))


class Qwen3MoeBlock(nn.Module):
    """Qwen3-MoE sparse block: softmax router (fp32), top-k, optional renormalisation, no shared expert."""

    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        hidden = cfg["hidden_size"]
        self.num_experts = cfg["num_experts"]
        self.top_k = cfg["num_experts_per_tok"]
        self.norm_topk_prob = bool(cfg.get("norm_topk_prob", False))
        self.gate = nn.Linear(hidden, self.num_experts, bias=False)
        # a ModuleList of SwiGLU experts (official key names) that can also run them grouped (models/moe.py)
        self.experts = RoutedExperts(self.num_experts, hidden, cfg["moe_intermediate_size"])

    def forward(self, x: torch.Tensor):
        b, L, h = x.shape
        flat = x.reshape(-1, h)
        router_logits = self.gate(flat)
        probs = F.softmax(router_logits, dim=1, dtype=torch.float)
        weights, idx = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(flat.dtype)
        # experts in index order, accumulated with index_add_ as transformers' Qwen3-MoE; one host sync for counts
        flat_idx = idx.reshape(-1)
        order = flat_idx.argsort(stable=True)
        counts = torch.bincount(flat_idx, minlength=self.num_experts)
        tok_all, w_all = order // self.top_k, weights.reshape(-1)[order]
        grouped = self.experts.grouped_weights()
        if grouped is not None:
            # model.moe = grouped: every expert in two grouped matmuls over the expert-sorted rows
            chunks = cpu_chunks(flat.device, tok_all.shape[0], h, counts)
            if chunks is not None:
                # thousands of rows on CPU: chunks of experts, each gathered, computed and added (per expert, in
                # index order, as the loop does) while its rows are still in cache
                out = torch.zeros_like(flat)
                for e0, e1, r0, r1 in chunks:
                    tok = tok_all[r0:r1]
                    y = self.experts.grouped(flat[tok], counts[e0:e1], grouped, experts=(e0, e1))
                    y = (y * w_all[r0:r1, None]).to(flat.dtype)
                    start = 0
                    for n in counts[e0:e1].tolist():
                        if n:
                            out.index_add_(0, tok[start:start + n], y[start:start + n])
                            start += n
                return out.view(b, L, h), (router_logits.view(b, L, -1), idx.view(b, L, -1))
            y = (self.experts.grouped(flat[tok_all], counts, grouped) * w_all[:, None]).to(flat.dtype)
            if self.top_k <= 2:  # 0 + a + b rounds alike in any order: one index_add_ is the loop's sum
                out = torch.zeros_like(flat).index_add_(0, tok_all, y)
            else:  # each token's k outputs added in expert-index order, one rounding per add, as the loop does
                rank = idx.argsort(dim=1).argsort(dim=1).reshape(-1)  # slot -> its expert's rank in the token
                buf = torch.empty_like(y)
                buf[tok_all * self.top_k + rank[order]] = y
                buf = buf.view(-1, self.top_k, h)
                out = buf[:, 0]
                for r in range(1, self.top_k):
                    out = out + buf[:, r]
            return out.view(b, L, h), (router_logits.view(b, L, -1), idx.view(b, L, -1))
        out = torch.zeros_like(flat)
        start = 0
        every = self.experts.every_expert_gets_a_gradient()
        for e, n in enumerate(counts.tolist()):
            if n or every:
                tok = tok_all[start:start + n]
                y = self.experts[e](flat[tok]) * w_all[start:start + n, None]
                out.index_add_(0, tok, y.to(flat.dtype))
                start += n
        return out.view(b, L, h), (router_logits.view(b, L, -1), idx.view(b, L, -1))


def _is_moe_layer(cfg: dict[str, Any], i: int) -> bool:
    if not cfg.get("num_experts"):
        return False
    if i in (cfg.get("mlp_only_layers") or []):
        return False
    return (i + 1) % int(cfg.get("decoder_sparse_step", 1)) == 0


class SDARDecoderLayer(nn.Module):
    def __init__(self, cfg: dict[str, Any], layer_idx: int):
        super().__init__()
        hidden, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.self_attn = SDARAttention(cfg, layer_idx)
        self.is_moe = _is_moe_layer(cfg, layer_idx)
        self.mlp = Qwen3MoeBlock(cfg) if self.is_moe else SwiGLU(hidden, cfg["intermediate_size"])
        self.input_layernorm = SDARRMSNorm(hidden, eps)
        self.post_attention_layernorm = SDARRMSNorm(hidden, eps)

    def forward(self, h, cos, sin, mask, kv_cache, update_cache, replace_position, backend):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, mask, kv_cache, update_cache, replace_position,
                               backend)
        out = self.mlp(self.post_attention_layernorm(h))
        router = None
        if isinstance(out, tuple):
            out, router = out
        return h + out, router


class SDARInner(nn.Module):
    """The `model.` prefix of the official state dict."""

    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        # padding_idx as upstream: it only freezes that row's gradient (forward is unaffected).
        pad = cfg.get("pad_token_id")
        pad = pad if pad is not None and 0 <= pad < cfg["vocab_size"] else None
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"], padding_idx=pad)
        self.layers = nn.ModuleList(SDARDecoderLayer(cfg, i) for i in range(cfg["num_hidden_layers"]))
        self.norm = SDARRMSNorm(cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6))


class SDARForCausalLM(DiffusionLM):
    family = "sdar"

    def __init__(self, config: dict[str, Any]):
        super().__init__(config)
        cfg = self.config
        if cfg.get("rope_scaling"):
            raise NotImplementedError(f"SDAR with rope_scaling {cfg['rope_scaling']!r} is not implemented "
                                      "(every released SDAR config has rope_scaling null)")
        with skip_init_on_meta():
            self.model = SDARInner(cfg)
            # tied: no lm_head weight at all, as the official save_pretrained writes tied checkpoints
            tied = bool(cfg.get("tie_word_embeddings", False))
            self.lm_head = None if tied else nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        self.head_dim = self.model.layers[0].self_attn.head_dim if len(self.model.layers) else 0

    @property
    def num_layers(self) -> int:
        return len(self.model.layers)

    @property
    def traits(self) -> ModelTraits:
        cfg = self.config
        gen = getattr(self, "generation_config", None) or {}
        gen_eos = gen.get("eos_token_id")
        gen_eos = [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])
        eos = cfg.get("eos_token_id")
        if isinstance(eos, list):
            gen_eos = gen_eos or eos
            eos = eos[0]
        if eos is None:
            eos = gen_eos[0] if gen_eos else cfg.get("bos_token_id", 0)
        pad = cfg.get("pad_token_id")
        if pad is None:
            pad = gen.get("pad_token_id", eos)
        return ModelTraits(
            family=self.family,
            mask_token_id=int(cfg.get("mask_token_id", DEFAULT_MASK_TOKEN_ID)),
            eos_token_id=int(eos),
            pad_token_id=int(pad),
            logit_shift=0,
            attention="block_causal",
            block_size=int(cfg.get("block_size", DEFAULT_BLOCK_SIZE)),
            stop_token_ids=tuple(int(t) for t in gen_eos),
            bos_token_id=cfg.get("bos_token_id"),
        )

    @torch.no_grad()
    def init_weights(self, std: float | None = None) -> None:
        super().init_weights(self.config.get("initializer_range", 0.02) if std is None else std)
        emb = self.model.embed_tokens
        if emb.padding_idx is not None:
            emb.weight[emb.padding_idx].zero_()  # as the official _init_weights

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
        output_router_info: bool = False,
        return_hidden: bool = False,
    ):
        """Logits `[B, L, V]` (fp32). See `DiffusionLM.forward`; `output_router_info` (MoE variant) also returns
        `{layer: (router_logits [B, L, E], topk_idx [B, L, k])}`."""
        position_ids, mask = resolve_attention(
            input_ids, block_size=self.traits.block_size, attention_mask=attention_mask, position_ids=position_ids,
            attn_mask=attn_mask, kv_cache=kv_cache, replace_position=replace_position, family="SDAR",
            official_mask_forms=OFFICIAL_MASK_FORMS, backend=self.attn_backend)
        h = self.model.embed_tokens(input_ids)
        cos, sin = rotary_cos_sin(position_ids, self.head_dim, float(self.config.get("rope_theta", 10000.0)), h.dtype)
        routers = {}
        use_ckpt = self.gradient_checkpointing and self.training and kv_cache is None and torch.is_grad_enabled()
        for i, layer in enumerate(self.model.layers):
            args = (h, cos, sin, mask, kv_cache, update_cache, replace_position, self.attn_backend)
            h, router = checkpoint(layer, *args, use_reentrant=False) if use_ckpt else layer(*args)
            if router is not None:
                routers[i] = router
        if return_hidden:
            out = HiddenStates(self.model.norm(h), self.output_head())
            return (out, routers) if output_router_info else out
        head = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(self.model.norm(h), head).float()
        return (logits, routers) if output_router_info else logits

    def output_head(self) -> OutputHead:
        if self.lm_head is None:  # tied: the embedding matrix
            return OutputHead(self.model.embed_tokens.weight, float_logits=True)
        return linear_head(self.lm_head, float_logits=True)


def adapt_vocab(config: dict, *, vocab_size: int, mask_token_id: int, eos_token_id: int, pad_token_id: int,
                bos_token_id: int | None = None) -> dict:
    cfg = copy.deepcopy(config)
    cfg.update(vocab_size=int(vocab_size), mask_token_id=int(mask_token_id), eos_token_id=int(eos_token_id),
               pad_token_id=int(pad_token_id))
    cfg["bos_token_id"] = int(bos_token_id) if bos_token_id is not None else int(eos_token_id)
    return cfg


def _generation_config(cfg: dict) -> dict:
    """generation_config.json the official loader reads (eos / pad ids as SDAR-*-Chat ship them)."""
    eos = cfg.get("eos_token_id")
    return {"bos_token_id": cfg.get("bos_token_id"), "eos_token_id": eos,
            "pad_token_id": cfg.get("pad_token_id", eos)}


register_family(FamilySpec(
    name="sdar",
    model_cls=SDARForCausalLM,
    model_types=("sdar", "sdar_moe"),
    architectures=("SDARForCausalLM", "SDARMoeForCausalLM"),
    # SDARConfig's own defaults are not pinned by any source we could read, so the fields every released config
    # carries are required rather than guessed.
    required_fields=("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                     "head_dim", "intermediate_size", "rope_theta", "rms_norm_eps"),
    companion_files={"generation_config.json": _generation_config},
    adapt_vocab=adapt_vocab,
))

# Field set of the real SDAR-1.7B-Chat config.json with tiny sizes (~2 M parameters with a 4k vocabulary).
register_preset("tiny-sdar", {
    "architectures": ["SDARForCausalLM"],
    "auto_map": {
        "AutoConfig": "configuration_sdar.SDARConfig",
        "AutoModel": "modeling_sdar.SDARModel",
        "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM",
    },
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_implementation": "flex_attention",
    "bos_token_id": 4093,
    "debug": False,
    "eos_token_id": 4094,
    "block_size": 4,
    "mask_token_id": 4095,
    "ep_size": 1,
    "fuse_cross_entropy": True,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 128,
    "initializer_range": 0.02,
    "intermediate_size": 384,
    "max_position_embeddings": 4096,
    "max_window_layers": 4,
    "micro_forward": False,
    "model_type": "sdar",
    "num_attention_heads": 4,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "skip_checkpoint": False,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "use_cache": False,
    "use_deepep": False,
    "use_sliding_window": False,
    "vocab_size": 4096,
})
