"""Shrunk real checkpoints: a Hugging Face checkpoint directory with a real model's field set, key names, special-token
ids, chat template and (where the source has them) tokenizer files, at a size a CPU runs in seconds; weights random.

The paper path is tested on these, as torchtune, verl and TRL test their recipes on tiny random checkpoints of the
real architecture: every config field the real checkpoint has is kept (only sizes change), the vocabulary is kept
whole (so the real tokenizer and special ids stay valid), and the weights carry the official state-dict names.

    dare-bench checkpoint shrink LLaDA-8B-Instruct OUT --layers 2 --hidden 256       # a shipped config.json
    dare-bench checkpoint shrink path/to/Dream-v0-Instruct-7B OUT                    # a metadata dir: + tokenizer
    python -c "from dare_bench.models.shrink import shrink_checkpoint; shrink_checkpoint('SDAR-4B-Chat', 'out')"

Sizes: `hidden` with the real head_dim (so heads = hidden / head_dim), kv heads in the real ratio (at least 1),
MLP widths scaled with hidden, MoE backbones with `experts` routed experts (default 2 x the real top-k, keeping
top-k and the routing groups' semantics).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import torch

from dare_bench.errors import CheckpointError
from dare_bench.fileio import atomic_directory

# Files of a checkpoint dir that describe weights: never copied from the source, since the shrunk weights replace them.
WEIGHT_FILES = ("config.json", "model.safetensors.index.json")


def _round_to(value: float, multiple: int) -> int:
    return max(multiple, int(round(value / multiple)) * multiple)


# Config field names of each family's sizes (the official configs name them differently).
SIZE_FIELDS = {
    "llada": dict(hidden="d_model", layers="n_layers", heads="n_heads", kv_heads="n_kv_heads", ffn="mlp_hidden_size"),
    "dream": dict(hidden="hidden_size", layers="num_hidden_layers", heads="num_attention_heads",
                  kv_heads="num_key_value_heads", ffn="intermediate_size"),
    "sdar": dict(hidden="hidden_size", layers="num_hidden_layers", heads="num_attention_heads",
                 kv_heads="num_key_value_heads", ffn="intermediate_size"),
    "llada2": dict(hidden="hidden_size", layers="num_hidden_layers", heads="num_attention_heads",
                   kv_heads="num_key_value_heads", ffn="intermediate_size"),
}


def shrunk_config(config: dict[str, Any], family: str, *, layers: int = 2, hidden: int = 256,
                  experts: int | None = None) -> dict[str, Any]:
    """The real config with sizes replaced; every other field (ids, rope, norms, MoE routing) is kept."""
    if family not in SIZE_FIELDS:
        raise CheckpointError(f"cannot shrink a {family!r} checkpoint (families: {', '.join(SIZE_FIELDS)})")
    if layers < 1 or hidden < 8:
        raise CheckpointError(f"--layers must be >= 1 and --hidden >= 8 (got {layers}, {hidden})")
    f = SIZE_FIELDS[family]
    out = dict(config)
    real_hidden, real_heads = config[f["hidden"]], config[f["heads"]]
    head_dim = config.get("head_dim") or real_hidden // real_heads
    if hidden % head_dim:
        raise CheckpointError(f"--hidden {hidden} is not a multiple of the real head_dim {head_dim}")
    heads = hidden // head_dim
    real_kv = config.get(f["kv_heads"]) or real_heads
    kv_heads = max(1, heads * real_kv // real_heads)
    while heads % kv_heads:
        kv_heads -= 1
    scale = hidden / real_hidden
    out.update({f["hidden"]: hidden, f["layers"]: layers, f["heads"]: heads, f["kv_heads"]: kv_heads})
    if config.get(f["ffn"]):
        out[f["ffn"]] = _round_to(config[f["ffn"]] * scale, 64)
    if family == "llada" and "mlp_ratio" in config and not config.get("mlp_hidden_size"):
        out["mlp_hidden_size"] = hidden * config["mlp_ratio"]
    if "max_window_layers" in config:  # Qwen-style "first N layers without sliding window": all of them
        out["max_window_layers"] = layers
    if config.get("num_experts"):
        top_k = config["num_experts_per_tok"]
        n_experts = experts or 2 * top_k
        if n_experts < top_k:
            raise CheckpointError(f"--experts {n_experts} is below the real top-k {top_k}")
        out["num_experts"] = n_experts
        if config.get("moe_intermediate_size"):
            out["moe_intermediate_size"] = _round_to(config["moe_intermediate_size"] * scale, 32)
        groups = config.get("n_group")
        if groups:
            if n_experts % groups:
                raise CheckpointError(f"--experts {n_experts} must be a multiple of the {groups} routing groups")
            if config.get("topk_group", groups) * (n_experts // groups) < top_k:
                raise CheckpointError(f"--experts {n_experts}: {config['topk_group']} groups of "
                                      f"{n_experts // groups} cannot hold the top-{top_k} experts")
        if "first_k_dense_replace" in config:
            out["first_k_dense_replace"] = min(config["first_k_dense_replace"], layers - 1 if layers > 1 else 0)
    if "rotary_dim" in config and config.get("partial_rotary_factor"):
        out["rotary_dim"] = int(head_dim * config["partial_rotary_factor"])
    return out


def _source(source: str | Path) -> tuple[dict[str, Any], Path | None]:
    """config.json of a checkpoint / metadata dir, or of a shipped real config by name; and the dir (or None)."""
    p = Path(source).expanduser()
    if p.is_dir():
        cfg = p / "config.json"
        if not cfg.exists():
            raise CheckpointError(f"{p}: no config.json")
        try:
            return json.loads(cfg.read_text()), p
        except ValueError as exc:
            raise CheckpointError(f"{cfg}: not valid JSON ({exc})") from None
    from dare_bench.models.real_configs import real_config

    return real_config(str(source))[1], None


def shrink_checkpoint(source: str | Path, out: str | Path, *, layers: int = 2, hidden: int = 256,
                      experts: int | None = None, seed: int = 0, dtype: str = "bfloat16") -> dict[str, Any]:
    """Write the shrunk checkpoint to `out` (atomically; an existing `out` is refused). Returns a summary."""
    from dare_bench.models.families import detect_family
    from dare_bench.models.io import build_model, resolve_dtype, save_pretrained

    out = Path(out).expanduser()
    if out.exists():
        raise CheckpointError(f"{out} exists; choose a new directory")
    config, source_dir = _source(source)
    family = detect_family(config, str(source)).name
    small = shrunk_config(config, family, layers=layers, hidden=hidden, experts=experts)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_model(small, device="cpu", dtype=torch.float32, source=str(source))
        model.init_weights()
    model = model.to(resolve_dtype(dtype))
    copied = []
    with atomic_directory(out) as tmp:
        save_pretrained(model, tmp / "model")
        for f in (tmp / "model").iterdir():
            f.rename(tmp / f.name)
        (tmp / "model").rmdir()
        if source_dir is not None:  # tokenizer, chat template, generation config: unchanged
            for f in sorted(source_dir.iterdir()):
                if f.is_file() and f.name not in WEIGHT_FILES and not f.name.endswith(".safetensors"):
                    shutil.copy2(f, tmp / f.name)
                    copied.append(f.name)
    n = model.num_parameters()
    return {"family": family, "directory": str(out), "parameters": n, "layers": layers, "hidden": hidden,
            "experts": small.get("num_experts"), "copied": copied,
            "tokenizer": any(c in copied for c in ("tokenizer.json", "vocab.json")),
            "embedding_share": round(_embedding_params(small, family) / n, 3) if n else math.nan}


def _embedding_params(config: dict[str, Any], family: str) -> int:
    hidden = config[SIZE_FIELDS[family]["hidden"]]
    vocab = config.get("embedding_size") or config["vocab_size"]
    tied = config.get("tie_word_embeddings") or config.get("weight_tying")
    return vocab * hidden * (1 if tied else 2)
