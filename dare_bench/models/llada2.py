"""LLaDA2.x (inclusionAI LLaDA2.0-mini / -flash, LLaDA2.1-mini): block diffusion on the Ling / Bailing-V2 MoE body.

Matches the HF `modeling_llada2_moe.py` (as vendored by ZHZisZZ/dllm @ cbbda7a): fused `query_key_value`
(rows = q heads, k heads, v heads), per-head QK RMSNorm before RoPE, partial rotate-half RoPE over the first
`int(head_dim * partial_rotary_factor)` dims, GQA, `dense` output projection (bias = `use_bias`), the first
`first_k_dense_replace` layers dense, the rest MoE with the exact official routing:

    logits = x_fp32 @ gate_fp32.T;  s = sigmoid(logits);  r = s + expert_bias       (bias for selection only)
    group score = sum of the top-2 r in each of n_group groups; keep topk_group groups; top-k experts by r
    weights = s[top-k] / (sum + 1e-20) (if k > 1) * routed_scaling_factor;  y = Σ w·Expert(x) (fp32 sum) + Shared(x)

`expert_bias` is a persistent buffer (in the checkpoint; zeros at init). Logits are upcast to fp32; no logit shift.
RMSNorm casts to the input dtype before the weight multiply (official `LLaDA2MoeRMSNorm`).

Attention pattern. Upstream `attention_mask=None` means fully bidirectional, but the model is only ever used with
the block-causal mask (generation, block size 32) or the BD3 training mask (dFactory). So here, as for SDAR,
no mask means the inference block-causal mask over absolute positions (block size from config `block_size`,
default 32; new queries offset by the KV cache length). The official no-mask behaviour is asked for explicitly with
an all-True mask (`dare_bench.models.block.full_attention_mask`).

Calling convention: the official one works as is, `model(input_ids, attention_mask=mask4, position_ids=pos)` with
the 4-D `[B or 1, 1, L, Lk]` mask upstream passes to SDPA unchanged: additive float (0 = attend, -inf / finfo.min =
blocked; the official generate builds it in bf16, any float dtype is cast to the activations') or bool (True =
may attend). It replaces the default pattern, so any block size (or the BD3 training mask) can be given that way.
The native keyword `attn_mask=` takes the same forms; giving both is an error, as is a 3-D, integer or mis-shaped
mask.

A 2-D `attention_mask` ([B, keys], 1 = real token) hides padding keys on top of the block-causal pattern. (Upstream,
a 2-D mask containing a 0 is turned into a causal + padding mask by `_prepare_4d_causal_attention_mask_for_sdpa`,
which no diffusion caller wants; that path is deliberately not reproduced.)

Special ids: upstream they are `generate()` arguments (mask 156895, eos 156892), not config fields; `traits` reads
config `mask_token_id` / `eos_token_id` / `pad_token_id` when present (presets and `adapt_vocab` set them) and falls
back to those defaults.

    from dare_bench.models import load_pretrained
    m = load_pretrained("tiny-llada2")                                  # CPU preset, random init
    m = load_pretrained("/ckpt/LLaDA2.0-mini", dtype="bfloat16", device="cuda")
    logits, routers = m(ids, output_router_info=True)                  # routers[layer] = (gate logits, top-k ids)
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from dare_bench.errors import CheckpointError
from dare_bench.models.base import DiffusionLM, KVCache, ModelTraits
from dare_bench.models.block import resolve_attention, skip_init_on_meta
from dare_bench.models.families import FamilySpec, register_family
from dare_bench.models.layers import RMSNorm, SwiGLU, apply_rotary, attention, rotary_cos_sin
from dare_bench.models.lm_head import HiddenStates, OutputHead, linear_head
from dare_bench.models.moe import RoutedExperts
from dare_bench.models.presets import PRESETS, register_preset

DEFAULT_BLOCK_SIZE = 32
# 4-D `attention_mask` forms the official forward takes (passed to SDPA unchanged): bool, or additive 0 / -inf float
OFFICIAL_MASK_FORMS = ("bool", "additive")
DEFAULT_MASK_TOKEN_ID = 156895
DEFAULT_EOS_TOKEN_ID = 156892


def _cfg(cfg: dict[str, Any], key: str, default):
    """Config value with the official `LLaDA2MoeConfig.__init__` default (which differ from the checkpoints')."""
    v = cfg.get(key)
    return default if v is None else v


def _num_experts(cfg: dict[str, Any]) -> int | None:
    # class default 16 when the field is absent; an explicit null means a dense model
    return cfg["num_experts"] if "num_experts" in cfg else 16


class LLaDA2Attention(nn.Module):
    def __init__(self, cfg: dict[str, Any], layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        hidden = cfg["hidden_size"]
        self.n_heads = cfg["num_attention_heads"]
        self.n_kv = int(_cfg(cfg, "num_key_value_heads", 0))
        if self.n_kv <= 0:
            raise CheckpointError("LLaDA2 config: num_key_value_heads must be set (the class default 0 is unusable)")
        self.head_dim = _cfg(cfg, "head_dim", hidden // self.n_heads)
        self.rot_dim = int(self.head_dim * float(_cfg(cfg, "partial_rotary_factor", 0.5)))
        self.attention_dropout = float(_cfg(cfg, "attention_dropout", 0.1))
        self.query_key_value = nn.Linear(hidden, (self.n_heads + 2 * self.n_kv) * self.head_dim,
                                         bias=bool(_cfg(cfg, "use_qkv_bias", False)))
        self.use_qk_norm = bool(_cfg(cfg, "use_qk_norm", True))
        if self.use_qk_norm:
            eps = float(_cfg(cfg, "rms_norm_eps", 1e-5))
            self.query_layernorm = RMSNorm(self.head_dim, eps)
            self.key_layernorm = RMSNorm(self.head_dim, eps)
        self.dense = nn.Linear(self.n_heads * self.head_dim, hidden, bias=bool(_cfg(cfg, "use_bias", True)))

    def forward(self, x, cos, sin, mask, kv_cache: KVCache | None, update_cache: bool, replace_position, backend):
        b, L, _ = x.shape
        qkv = self.query_key_value(x).view(b, L, self.n_heads + 2 * self.n_kv, self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in qkv.split([self.n_heads, self.n_kv, self.n_kv], dim=-2))
        if self.use_qk_norm:
            q, k = self.query_layernorm(q), self.key_layernorm(k)
        q, k = apply_rotary(q, k, cos, sin)
        if kv_cache is not None:
            k, v = kv_cache.attend(self.layer_idx, k, v, update_cache, replace_position)
        if isinstance(mask, torch.Tensor) and mask.dtype != torch.bool:  # not a flex BlockMask
            mask = mask.to(q.dtype)
        dropout = self.attention_dropout if self.training else 0.0
        out = attention(q, k, v, mask, backend=backend, scale=self.head_dim ** -0.5, dropout_p=dropout)
        return self.dense(out.transpose(1, 2).reshape(b, L, self.n_heads * self.head_dim))


class LLaDA2Gate(nn.Module):
    """Router: fp32 sigmoid scores, expert_bias for selection only, group-limited top-k."""

    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        self.num_experts = _num_experts(cfg)
        self.top_k = int(_cfg(cfg, "num_experts_per_tok", 2))
        self.n_group = int(_cfg(cfg, "n_group", 8))
        self.topk_group = int(_cfg(cfg, "topk_group", 4))
        self.routed_scaling_factor = float(_cfg(cfg, "routed_scaling_factor", 2.5))
        if self.num_experts % self.n_group:
            raise CheckpointError(f"LLaDA2 config: num_experts {self.num_experts} not divisible by n_group "
                                  f"{self.n_group}")
        # zeros until loaded or init_weights(): never uninitialised memory (NaN routing)
        self.weight = nn.Parameter(torch.zeros(self.num_experts, cfg["hidden_size"]))
        # persistent: the released checkpoints carry the trained (aux-loss-free balancing) bias
        self.register_buffer("expert_bias", torch.zeros(self.num_experts))

    def forward(self, x: torch.Tensor):
        logits = nn.functional.linear(x.float(), self.weight.float())  # [T, E]
        scores = torch.sigmoid(logits)
        routing = scores + self.expert_bias
        T = routing.shape[0]
        group_scores = routing.view(T, self.n_group, -1).topk(2, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1).bool()
        expert_mask = group_mask[:, :, None].expand(T, self.n_group, self.num_experts // self.n_group).reshape(T, -1)
        idx = torch.topk(routing.masked_fill(~expert_mask, float("-inf")), k=self.top_k, dim=-1)[1]
        w = torch.gather(scores, 1, idx)
        if self.top_k > 1:
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        return idx, w * self.routed_scaling_factor, logits


class LLaDA2SparseMoe(nn.Module):
    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        hidden = cfg["hidden_size"]
        inter = cfg["moe_intermediate_size"]
        self.top_k = int(_cfg(cfg, "num_experts_per_tok", 2))
        # a ModuleList of SwiGLU experts (official key names) that can also run them grouped (models/moe.py)
        self.experts = RoutedExperts(_num_experts(cfg), hidden, inter)
        self.gate = LLaDA2Gate(cfg)
        # upstream builds the shared MLP whenever the field is not None (even 0: a zero-width MLP with weights)
        n_shared = cfg.get("num_shared_experts", 0)
        self.shared_experts = SwiGLU(hidden, inter * n_shared) if n_shared is not None else None

    def forward(self, x: torch.Tensor):
        b, L, h = x.shape
        flat = x.reshape(-1, h)
        idx, w, logits = self.gate(flat)
        # dispatch as the official moe_infer: (token, slot) pairs sorted by expert (the loop reads the counts on the
        # host once; the grouped path keeps them on the device)
        flat_idx = idx.reshape(-1)
        order = flat_idx.argsort()
        counts = torch.bincount(flat_idx, minlength=len(self.experts))
        tokens = flat[order // self.top_k]
        grouped = self.experts.grouped_weights()
        if grouped is not None:  # model.moe = grouped: two grouped matmuls over the sorted rows
            out = self.experts.grouped(tokens, counts, grouped)
        else:  # the official per-expert loop
            outs, start = [], 0
            every = self.experts.every_expert_gets_a_gradient()
            for e, n in enumerate(counts.tolist()):
                if n or every:
                    outs.append(self.experts[e](tokens[start:start + n]))
                    start += n
            out = torch.cat(outs)
        # official moe_infer: new_x = empty_like(outs) (the experts' output dtype: bf16 under autocast), the
        # outputs times the fp32 weights, summed over k, cast back to that dtype
        buf = torch.empty_like(out)
        buf[order] = out
        y = (buf.view(*idx.shape, h).float() * w[..., None]).sum(dim=1).to(buf.dtype).view(b, L, h)
        if self.shared_experts is not None:
            y = y + self.shared_experts(x)
        return y, (logits.view(b, L, -1), idx.view(b, L, -1))


class LLaDA2DecoderLayer(nn.Module):
    def __init__(self, cfg: dict[str, Any], layer_idx: int):
        super().__init__()
        hidden, eps = cfg["hidden_size"], float(_cfg(cfg, "rms_norm_eps", 1e-5))
        self.attention = LLaDA2Attention(cfg, layer_idx)
        self.is_moe = _num_experts(cfg) is not None and layer_idx >= int(_cfg(cfg, "first_k_dense_replace", 0))
        self.mlp = LLaDA2SparseMoe(cfg) if self.is_moe else SwiGLU(hidden, cfg["intermediate_size"])
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)

    def forward(self, h, cos, sin, mask, kv_cache, update_cache, replace_position, backend):
        h = h + self.attention(self.input_layernorm(h), cos, sin, mask, kv_cache, update_cache, replace_position,
                               backend)
        out = self.mlp(self.post_attention_layernorm(h))
        router = None
        if isinstance(out, tuple):
            out, router = out
        return h + out, router


class LLaDA2Inner(nn.Module):
    """The `model.` prefix of the official state dict."""

    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        pad = cfg.get("pad_token_id")
        # padding_idx as upstream (it only freezes that row's gradient); skipped when a tiny vocab lacks the id
        pad = pad if pad is not None and 0 <= pad < cfg["vocab_size"] else None
        self.word_embeddings = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"], padding_idx=pad)
        self.layers = nn.ModuleList(LLaDA2DecoderLayer(cfg, i) for i in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(cfg["hidden_size"], float(_cfg(cfg, "rms_norm_eps", 1e-5)))


class LLaDA2MoeModelLM(DiffusionLM):
    family = "llada2"

    def __init__(self, config: dict[str, Any]):
        super().__init__(config)
        cfg = self.config
        if cfg.get("rope_scaling"):
            raise NotImplementedError(f"LLaDA2 with rope_scaling {cfg['rope_scaling']!r} is not implemented "
                                      "(the released configs have rope_scaling null)")
        with skip_init_on_meta():
            self.model = LLaDA2Inner(cfg)
            # tied: no lm_head weight at all, as the official save_pretrained writes tied checkpoints
            tied = bool(cfg.get("tie_word_embeddings", False))
            self.lm_head = None if tied else nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        attn = self.model.layers[0].attention if len(self.model.layers) else None
        self.rot_dim = attn.rot_dim if attn is not None else 0

    @property
    def num_layers(self) -> int:
        return len(self.model.layers)

    @property
    def traits(self) -> ModelTraits:
        cfg = self.config
        eos = cfg.get("eos_token_id", DEFAULT_EOS_TOKEN_ID)
        stops = ()
        if isinstance(eos, list):
            eos, stops = eos[0], tuple(eos)
        pad = cfg.get("pad_token_id", eos)
        return ModelTraits(
            family=self.family,
            mask_token_id=int(cfg.get("mask_token_id", DEFAULT_MASK_TOKEN_ID)),
            eos_token_id=int(eos),
            pad_token_id=int(pad),
            logit_shift=0,
            attention="block_causal",
            block_size=int(cfg.get("block_size", DEFAULT_BLOCK_SIZE)),
            stop_token_ids=stops,
            bos_token_id=cfg.get("bos_token_id"),
        )

    @torch.no_grad()
    def init_weights(self, std: float | None = None) -> None:
        super().init_weights(self.config.get("initializer_range", 0.02) if std is None else std)
        for m in self.modules():
            if isinstance(m, LLaDA2Gate):
                nn.init.normal_(m.weight, mean=0.0, std=self.config.get("initializer_range", 0.02))
                m.expert_bias.zero_()
        emb = self.model.word_embeddings
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
        """Logits `[B, L, V]` fp32 (see `DiffusionLM.forward`). With `output_router_info` also returns
        `{layer: (gate logits [B, L, E] fp32, top-k expert ids [B, L, k])}` for every MoE layer."""
        position_ids, mask = resolve_attention(
            input_ids, block_size=self.traits.block_size, attention_mask=attention_mask, position_ids=position_ids,
            attn_mask=attn_mask, kv_cache=kv_cache, replace_position=replace_position, family="LLaDA2",
            official_mask_forms=OFFICIAL_MASK_FORMS, backend=self.attn_backend)
        h = self.model.word_embeddings(input_ids)
        cos, sin = rotary_cos_sin(position_ids, self.rot_dim, float(_cfg(self.config, "rope_theta", 10000.0)),
                                  h.dtype)
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
        head = self.model.word_embeddings.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(self.model.norm(h), head).float()
        return (logits, routers) if output_router_info else logits

    def output_head(self) -> OutputHead:
        if self.lm_head is None:  # tied: the embedding matrix
            return OutputHead(self.model.word_embeddings.weight, float_logits=True)
        return linear_head(self.lm_head, float_logits=True)


def adapt_vocab(config: dict, *, vocab_size: int, mask_token_id: int, eos_token_id: int, pad_token_id: int,
                bos_token_id: int | None = None) -> dict:
    cfg = copy.deepcopy(config)
    cfg.update(vocab_size=int(vocab_size), mask_token_id=int(mask_token_id), eos_token_id=int(eos_token_id),
               pad_token_id=int(pad_token_id))
    if bos_token_id is not None:
        cfg["bos_token_id"] = int(bos_token_id)
    else:
        cfg.pop("bos_token_id", None)
    return cfg


register_family(FamilySpec(
    name="llada2",
    model_cls=LLaDA2MoeModelLM,
    model_types=("llada2_moe",),
    architectures=("LLaDA2MoeModelLM",),
    required_fields=("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads"),
    adapt_vocab=adapt_vocab,
))

# Field set of the real LLaDA2.0-mini config.json with tiny sizes (~2 M parameters with a 4k vocabulary);
# mask / eos ids are extra fields (upstream they are generate() arguments), read by `traits`.
register_preset("tiny-llada2", {
    "architectures": ["LLaDA2MoeModelLM"],
    "attention_dropout": 0.0,
    "auto_map": {
        "AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
        "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
        "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM",
    },
    "block_size": 32,
    "dtype": "float32",
    "embedding_dropout": 0.0,
    "eos_token_id": 4094,
    "first_k_dense_replace": 1,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 128,
    "initializer_range": 0.02,
    "intermediate_size": 384,
    "mask_token_id": 4095,
    "max_position_embeddings": 4096,
    "max_window_layers": 28,
    "model_type": "llada2_moe",
    "moe_intermediate_size": 64,
    "moe_router_enable_expert_bias": True,
    "n_group": 2,
    "norm_head": False,
    "norm_softmax": False,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "num_shared_experts": 1,
    "output_dropout": 0.0,
    "output_router_logits": False,
    "pad_token_id": 4094,
    "partial_rotary_factor": 0.5,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 600000,
    "rotary_dim": 16,
    "routed_scaling_factor": 2.5,
    "router_dtype": "fp32",
    "score_function": "sigmoid",
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "use_bias": False,
    "use_cache": False,
    "use_qk_norm": True,
    "use_qkv_bias": False,
    "use_rmsnorm": True,
    "use_sliding_window": False,
    "using_split_qkv_in_self_attention": False,
    "vocab_size": 4096,
})

# The autoregressive starting point of LLaDA2.0's WSD conversion at tiny scale: the same replica at block size 1,
# where the block-causal pattern is causal attention (an AR model; no other model code). Its base SFT is the
# next-token loss (trainers.sft.next_token_objective), its decoder one token per forward (eval block_length 1).
register_preset("tiny-llada2-ar", {**PRESETS["tiny-llada2"], "block_size": 1})
