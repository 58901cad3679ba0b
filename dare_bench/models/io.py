"""Load and save Hugging Face checkpoint directories with the official config fields and weight names.

Loading is strict: every weight of the model must be in the checkpoint with the right shape and nothing else may
be there; a missing weight is an error, never a silent random init. Single-file (`model.safetensors`) and sharded
(`model.safetensors.index.json`) checkpoints both load. Saving writes config.json, safetensors (sharded above
`max_shard_bytes`), companion files the official loader needs (e.g. Dream's generation_config.json) and an
optional tokenizer, atomically (a temporary directory renamed into place).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dare_bench.errors import CheckpointError
from dare_bench.fileio import atomic_directory
from dare_bench.models.families import FAMILIES, detect_family
from dare_bench.models.layers import check_backend
from dare_bench.models.moe import check_moe, set_moe
from dare_bench.models.presets import PRESETS, preset_config

if TYPE_CHECKING:  # for annotations only: base.py (DiffusionLM.save_pretrained) imports this module
    from dare_bench.models.base import DiffusionLM

DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
    "float64": torch.float64, "fp64": torch.float64,
}


def resolve_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[str(dtype).replace("torch.", "")]
    except KeyError:
        raise CheckpointError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPES)}") from None


def read_config(path: str | os.PathLike) -> tuple[dict[str, Any], Path]:
    """Read config.json from a checkpoint dir (or a config.json path)."""
    p = Path(path)
    cfg_path = p / "config.json" if p.is_dir() else p
    if not cfg_path.exists():
        raise CheckpointError(f"{cfg_path}: no config.json (expected a Hugging Face checkpoint directory)")
    try:
        return json.loads(cfg_path.read_text()), cfg_path
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{cfg_path}: not valid JSON ({exc})") from None


def build_model(config: dict[str, Any], *, device="cpu", dtype=torch.float32, source="config.json") -> DiffusionLM:
    spec = detect_family(config, source)
    with torch.device(device):
        model = spec.model_cls(config)
    return model.to(dtype=dtype) if str(device) != "meta" else model


def from_config(path_or_dir, device="meta") -> DiffusionLM:
    """An uninitialised model built from config.json alone (meta device by default): names, shapes, sizes."""
    if isinstance(path_or_dir, dict):
        return build_model(path_or_dir, device=device)
    config, cfg_path = read_config(path_or_dir)
    return build_model(config, device=device, source=str(cfg_path))


def _checkpoint_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    single = directory / "model.safetensors"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{index}: not a valid safetensors index ({exc!r})") from None
        files = sorted({directory / f for f in weight_map.values()})
        missing = [str(f) for f in files if not f.exists()]
        if missing:
            raise CheckpointError(f"{index}: shard file(s) missing: {missing}")
        return files
    if single.exists():
        return [single]
    raise CheckpointError(f"{directory}: no weights (model.safetensors or model.safetensors.index.json)")


def read_state_dict(directory: str | os.PathLike) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for f in _checkpoint_files(Path(directory)):
        try:
            part = load_file(str(f))
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"{f}: corrupt or unreadable safetensors file ({exc})") from None
        dup = set(part) & set(state)
        if dup:
            raise CheckpointError(f"{f}: weight(s) {sorted(dup)[:3]} appear in more than one shard")
        state.update(part)
    return state


def load_state_dict_strict(model: DiffusionLM, state: dict[str, torch.Tensor], source: str, dtype: torch.dtype) -> None:
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing:
        raise CheckpointError(f"{source}: missing weight(s) {missing[:5]}{' ...' if len(missing) > 5 else ''} "
                              f"({len(missing)} in all)")
    if unexpected:
        raise CheckpointError(f"{source}: unexpected weight(s) {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''} "
                              f"({len(unexpected)} in all); is this checkpoint of another family or size?")
    for name, ref in expected.items():
        if tuple(state[name].shape) != tuple(ref.shape):
            raise CheckpointError(f"{source}: weight {name} has shape {tuple(state[name].shape)}, "
                                  f"config.json implies {tuple(ref.shape)}")
    converted = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in state.items()}
    model.load_state_dict(converted, strict=True, assign=True)


def set_attention(model, name: str):
    """Select the attention backend (`sdpa` | `flash_attn` | `flex`, see `layers.BACKENDS`) of every backbone inside
    `model` (a DiffusionLM, or a wrapper around one: PEFT, FSDP2, DDP), checked first (`layers.check_backend`: a
    missing extra is one line naming it). Returns `model`. Raises if `model` holds no backbone, so a selection is
    never silently dropped."""
    check_backend(name)
    # DiffusionLM by its method (base.py imports this module, so no import of it here)
    backbones = [m for m in model.modules() if callable(getattr(m, "set_attention_backend", None))]
    if not backbones:
        raise CheckpointError(f"set_attention: {type(model).__name__} holds no dare-bench backbone")
    for m in backbones:
        m.set_attention_backend(name)
    return model


def load_pretrained(path_or_preset, *, dtype="float32", device="cpu", seed: int | None = 0,
                    attention: str = "sdpa", moe: str = "loop") -> DiffusionLM:
    """Load a checkpoint directory, or build a preset (`tiny-llada`, ...) with a seeded random init; `attention` is
    the attention backend (checked before any weight is read); `moe` how MoE blocks run their experts
    (`models.moe.set_moe`: loop | grouped; dense backbones ignore it)."""
    check_backend(attention)
    check_moe(moe)
    dtype = resolve_dtype(dtype)
    p = Path(str(path_or_preset)).expanduser()
    if not p.exists():
        if str(path_or_preset) in PRESETS or not any(s in str(path_or_preset) for s in "/\\."):
            config = preset_config(str(path_or_preset))
            with torch.random.fork_rng(devices=[]):
                if seed is not None:
                    torch.manual_seed(seed)
                model = build_model(config, device="cpu", dtype=torch.float32, source=str(path_or_preset))
                model.init_weights()
            return set_moe(set_attention(model.to(device=device, dtype=dtype).eval(), attention), moe)
        raise CheckpointError(f"{p}: no such checkpoint directory or model preset")
    if not p.is_dir():
        raise CheckpointError(f"{p}: expected a checkpoint directory")
    config, cfg_path = read_config(p)
    model = build_model(config, device="meta", source=str(cfg_path))
    state = read_state_dict(p)
    load_state_dict_strict(model, state, str(p), dtype)
    model.post_load()
    gen_cfg = p / "generation_config.json"
    if gen_cfg.exists():
        model.generation_config = json.loads(gen_cfg.read_text())
    model.name_or_path = str(p)
    return set_moe(set_attention(model.to(device=device).eval(), attention), moe)


def _is_weight_file(name: str) -> bool:
    """Weights and what describes them (a kept adapter_config.json would make the dir load as a LoRA adapter)."""
    return name.endswith((".safetensors", ".bin")) or name in (
        "model.safetensors.index.json", "pytorch_model.bin.index.json", "adapter_config.json")


def _keep_companions(directory: Path, tmp: Path) -> None:
    """Like Hugging Face's save_pretrained, saving into an existing checkpoint dir keeps the files it does not
    write (tokenizer, chat template, README): they are carried into the new dir before the swap. Old weight files
    are not, so no stale shard outlives the save."""
    if not directory.is_dir():
        return
    for f in directory.iterdir():
        if f.is_file() and not _is_weight_file(f.name):
            shutil.copy2(f, tmp / f.name)


def save_pretrained(model: DiffusionLM, directory, *, tokenizer=None, extra_files: dict[str, str] | None = None,
                    max_shard_bytes: int = 4 * 1024**3, state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """`state_dict`: the weights to write instead of `model.state_dict()` (an FSDP2-sharded model's gathered full
    state dict, `trainers.distributed.full_state_dict`)."""
    from safetensors.torch import save_file

    source = model.state_dict() if state_dict is None else state_dict
    state = {k: v.detach().contiguous().cpu() for k, v in source.items()}
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in state.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    with atomic_directory(directory) as tmp:
        _keep_companions(Path(directory), tmp)
        (tmp / "config.json").write_text(json.dumps(model.config, indent=2) + "\n")
        if len(shards) == 1:
            save_file(shards[0], str(tmp / "model.safetensors"), metadata={"format": "pt"})
        else:
            weight_map = {}
            for i, shard in enumerate(shards, 1):
                fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                save_file(shard, str(tmp / fname), metadata={"format": "pt"})
                weight_map.update({k: fname for k in shard})
            index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
                     "weight_map": weight_map}
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        gen = getattr(model, "generation_config", None)
        spec = FAMILIES.get(model.family)
        companions = dict(spec.companion_files) if spec else {}
        if gen is not None:
            (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
            companions.pop("generation_config.json", None)
        for fname, build in companions.items():
            (tmp / fname).write_text(json.dumps(build(model.config), indent=2) + "\n")
        for fname, text in (extra_files or {}).items():
            (tmp / fname).write_text(text)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))


def load_tokenizer(path_or_dir):
    """A tokenizer from a checkpoint / tokenizer directory, offline."""
    from transformers import PreTrainedTokenizerFast

    p = Path(path_or_dir)
    if (p / "tokenizer.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(str(p), local_files_only=True)
    if (p / "vocab.json").exists() and (p / "merges.txt").exists():
        from transformers import Qwen2TokenizerFast

        return Qwen2TokenizerFast.from_pretrained(str(p), local_files_only=True)
    raise CheckpointError(f"{p}: no tokenizer files (tokenizer.json, or vocab.json + merges.txt)")
