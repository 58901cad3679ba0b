"""Per-rank training memory, estimated from the model's shapes (a meta-device model is enough) and the run's layout.

What one rank holds while training with AdamW (the trainers' optimizer), term by term, in bytes:
- `master_weights`: fp32 parameters (trainers/precision.py keeps fp32 masters), sharded 1/world_size under FSDP2
  full-shard, whole when replicated; with LoRA the frozen base stays in the compute dtype and only adapters are fp32;
- `compute_weights`: the bf16 copies the forward computes with. FSDP2 MixedPrecisionPolicy(param_dtype=bf16)
  all-gathers one decoder layer at a time (plus one prefetched) and the root unit (embeddings, final norm, LM head)
  for the whole step, with their unsharded bf16 gradients before the reduce-scatter. Replicated under autocast, the
  bf16 casts of every Linear weight are saved for backward (autocast's weight cache); nothing in float32;
- `gradients`: fp32 (reduce_dtype float32), sharded like the masters; `optimizer`: AdamW's two fp32 states;
- `reference_model`: the frozen copy for a KL term (trainers.loop.frozen_copy: a deepcopy, same dtype as the
  policy, sharded like it); none with LoRA (the reference is the policy with adapters off);
- `activations`: what the decoder layers keep for backward (counted from this codebase's layers, LLaDA's block:
  both RMSNorms keep 2 tensors of [rows, seq, d] (the normalised input and its weighted copy, 8 bytes / element
  either way: fp32 internally under bf16), the attention keeps v, rotated q and k, its output and the reshaped copy
  attn_out reads, the residual stream keeps 2, SwiGLU keeps 4 of [rows, seq, ffn]); with gradient checkpointing
  every layer keeps only its input and one layer is recomputed at a time;
- `logits`: [rows, seq, vocab] of the loss: the logits, their fp32 log-softmax (cross-entropy) and, in backward,
  the log-softmax gradient and the logits gradient (3 fp32 copies at the peak; + a bf16 copy in bf16 compute);
- `optimizer_step`: AdamW's temporaries: the foreach implementation (the CUDA default) one fp32 copy of the local
  states, the single-tensor one (CPU default) two copies of the largest parameter.

`per_rank_total` = weights + gradients + optimizer + reference + the larger of (activations + logits + compute
weights) and the optimizer step's temporaries: gradients stay resident through every micro-batch of an accumulation,
so the count is the steady state of a run with >= 2 micro-batches (with one, the peak is lower by up to the gradients
of the layers not yet reached in backward).

Checked against a measured peak on CPU (tests/trainers/test_memory_plan.py; `dare-bench bench memory --plan`): a
shrunk LLaDA-8B-Instruct (real vocabulary, 2 layers, hidden 256) doing a masked-diffusion SFT step.

    from dare_bench.models import from_config
    from dare_bench.trainers.memory_plan import estimate_training_memory
    est = estimate_training_memory(from_config("/ckpt/LLaDA-8B-Instruct"), world_size=8, strategy="fsdp2",
                                   rows=1, seq_len=1024, gradient_checkpointing=True)
    est["per_rank_total"] / 2**30
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dare_bench.errors import ConfigError

STRATEGIES = ("fsdp2", "replicated")
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Shapes:
    """The sizes that set activation memory, read from a backbone's config."""

    hidden: int
    q_dim: int
    kv_dim: int
    ffn: int  # per-token MLP width (MoE: top-k routed + shared experts)
    layers: int
    vocab: int
    block_diffusion: bool


def model_shapes(model) -> Shapes:
    c = model.config
    traits = model.traits
    if model.family == "llada":
        d, heads = c["d_model"], c["n_heads"]
        kv = c.get("n_kv_heads") or heads
        hd = d // heads
        ffn = c.get("mlp_hidden_size") or c.get("mlp_ratio", 4) * d
        return Shapes(d, heads * hd, kv * hd, ffn, c["n_layers"], c.get("embedding_size") or c["vocab_size"], False)
    d, heads = c["hidden_size"], c["num_attention_heads"]
    hd = c.get("head_dim") or d // heads
    kv = c.get("num_key_value_heads") or heads
    ffn = c["intermediate_size"]
    if c.get("num_experts"):  # the MoE layers route each token to top-k experts (+ shared ones)
        moe = c.get("moe_intermediate_size") or ffn
        ffn = max(ffn, moe * (c["num_experts_per_tok"] + (c.get("num_shared_experts") or 0)))
    return Shapes(d, heads * hd, kv * hd, ffn, c["num_hidden_layers"], c["vocab_size"], traits.is_block_diffusion)


def _param_groups(model) -> tuple[int, int, int, int]:
    """(all parameters, the largest decoder layer's, the root unit's (outside the layers), the Linear weights')."""
    import torch

    layers = _decoder_layers(model)
    per_layer = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    total = sum(p.numel() for p in model.parameters())
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    tied = not any(isinstance(m, torch.nn.Linear) and m.weight.shape[0] >= model_shapes(model).vocab
                   for m in model.modules())
    if tied:  # the LM head is F.linear over the embedding: cast under autocast like a Linear
        linear += model_shapes(model).vocab * model_shapes(model).hidden
    return total, max(per_layer, default=0), total - sum(per_layer), linear


def _decoder_layers(model):
    import torch

    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    return max(lists, key=lambda m: sum(p.numel() for p in m.parameters())) if lists else []


def activation_bytes(shapes: Shapes, rows: int, seq_len: int, *, gradient_checkpointing: bool,
                     compute_dtype: str = "bfloat16") -> dict[str, int]:
    """Bytes of activations kept for backward (decoder layers) and of the loss's logits, at their peak."""
    e = _BYTES[compute_dtype]
    tokens = rows * seq_len * (2 if shapes.block_diffusion else 1)  # BD3 training forwards [noisy; clean]
    d, q, kv, f = shapes.hidden, shapes.q_dim, shapes.kv_dim, shapes.ffn
    norms = 2 * 2 * d * 8  # two RMSNorms x two kept [tokens, d] tensors x 8 bytes (see the module docstring)
    attention = (2 * q + kv + kv + q) * e  # v, rotated q and k, output, reshaped output (attn_out's input)
    residual = 2 * d * e  # layer input and the mid-layer residual
    mlp = 4 * f * e  # gate / up outputs, silu(gate), their product
    per_layer = tokens * (norms + attention + residual + mlp)
    if gradient_checkpointing:  # every layer keeps its input; one layer's graph is rebuilt at a time in backward
        layers = shapes.layers * tokens * d * e + per_layer
    else:
        layers = shapes.layers * per_layer
    logits_elems = rows * seq_len * (2 if shapes.block_diffusion else 1) * shapes.vocab
    # final norm (2 kept tensors) + 3 fp32 [tokens, vocab] (log-softmax, its gradient, the logits' gradient);
    # in bf16 compute the bf16 logits too
    logits = tokens * d * 8 + logits_elems * (3 * 4 + (e if e < 4 else 0))
    return {"activations": layers, "logits": logits}


def estimate_training_memory(model, *, world_size: int = 1, strategy: str = "fsdp2", lora_parameters: int | None = None,
                             reference: bool = False, rows: int = 1, seq_len: int = 1024,
                             gradient_checkpointing: bool = True, compute_dtype: str = "bfloat16",
                             device: str = "cuda") -> dict[str, int]:
    """Per-rank bytes of each term and `per_rank_total` (see the module docstring). `lora_parameters`: trainable
    adapter parameters (None = full fine-tuning); `compute_dtype` float32 = no mixed precision."""
    if strategy not in STRATEGIES:
        raise ConfigError(f"unknown strategy {strategy!r}; use one of {STRATEGIES}")
    if compute_dtype not in _BYTES:
        raise ConfigError(f"unknown compute dtype {compute_dtype!r}; use one of {sorted(_BYTES)}")
    if world_size < 1 or rows < 1 or seq_len < 1:
        raise ConfigError("world_size, rows and seq_len must be >= 1")
    total, layer_params, root_params, linear_params = _param_groups(model)
    shard = world_size if strategy == "fsdp2" else 1
    e = _BYTES[compute_dtype]
    trainable = total if lora_parameters is None else lora_parameters
    if lora_parameters is None:
        master = 4 * total // shard
    else:  # frozen base in the compute dtype, adapters in fp32
        master = (e * total + 4 * lora_parameters) // shard
    mixed = e < 4
    if strategy == "fsdp2" and mixed:
        # unsharded bf16 root for the whole step + 2 layers in flight, each with its unsharded bf16 gradients
        unsharded = root_params + 2 * layer_params
        compute = (2 if lora_parameters is None else 1) * e * unsharded
    elif mixed:
        compute = e * linear_params  # autocast's casts, saved for backward
    else:
        compute = 0
    grads = 4 * trainable // shard
    optimizer = 8 * trainable // shard
    ref = 0 if (not reference or lora_parameters is not None) else master
    act = activation_bytes(model_shapes(model), rows, seq_len, gradient_checkpointing=gradient_checkpointing,
                           compute_dtype=compute_dtype)
    if device == "cuda":
        step = 4 * trainable // shard  # foreach AdamW: one fp32 temporary per local state
    else:
        largest = max((p.numel() for p in model.parameters() if p.requires_grad or lora_parameters is None), default=0)
        step = 2 * 4 * (largest // shard)  # single-tensor AdamW: sqrt and division of the largest parameter
    transient = max(act["activations"] + act["logits"] + compute, step)
    out = {"master_weights": master, "compute_weights": compute, "gradients": grads, "optimizer": optimizer,
           "reference_model": ref, "activations": act["activations"], "logits": act["logits"],
           "optimizer_step": step}
    out["per_rank_total"] = master + grads + optimizer + ref + transient
    return out


def lora_parameters(model, r: int, target_modules) -> int:
    """Adapter parameters LoRA of rank `r` adds on the Linear layers named by `target_modules` (all if empty)."""
    import torch

    picked = [m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)
              and (not target_modules or any(name.endswith(t) for t in target_modules))]
    return sum(r * (m.in_features + m.out_features) for m in picked)


def paper_memory_gib(cfg, model) -> dict[str, Any]:
    """The plan's `memory_gib`: per-rank terms and `per_rank_total` for a paper run of `cfg` on `model` (meta),
    FSDP2 full-shard over `train.gpus` ranks, bf16 compute, 1 row per micro-batch of max prompt + completion tokens,
    gradient checkpointing on; `weights_bf16` is the whole model in bf16 (the checkpoint), not a per-rank term."""
    train = cfg.profile.train
    lora_params = None
    if train.lora is not None:
        lora_params = lora_parameters(model, train.lora.r, train.lora.target_modules)
    gen = max([cfg.profile.eval.sampler.gen_length] + ([train.rollout.gen_length] if train.rollout else []))
    seq = (train.max_prompt_length or 256) + gen
    est = estimate_training_memory(model, world_size=train.gpus or 1, strategy="fsdp2", lora_parameters=lora_params,
                                   reference=bool(train.beta_kl), rows=1, seq_len=seq, gradient_checkpointing=True)
    gib = {k: round(v / 2**30, 2) for k, v in est.items()}
    gib["weights_bf16"] = round(2 * model.num_parameters() / 2**30, 2)
    gib["assumptions"] = {"world_size": train.gpus or 1, "strategy": "fsdp2 full-shard, bf16 params, fp32 reduce",
                          "rows_per_micro_batch": 1, "seq_len": seq, "gradient_checkpointing": True}
    return gib


__all__ = ["STRATEGIES", "Shapes", "activation_bytes", "estimate_training_memory", "lora_parameters", "model_shapes",
           "paper_memory_gib"]
