"""Resumable training checkpoints, written atomically (a killed run leaves the previous checkpoint intact).

Layout of `<checkpoint_dir>/step-000012/` (one directory per saved step, renamed into place in one go):

    model/              the policy in Hugging Face format (`model.save_pretrained`): config.json + safetensors;
                        for LoRA the PEFT adapters only (adapter_config.json + adapter_model.safetensors)
    optimizer.pt        optimizer state_dict
    scheduler.pt        LR scheduler state_dict
    rng.pt              RNG states: torch CPU, every CUDA device, python `random`, numpy, and the loop's own
                        generators (per rank in distributed runs)
    trainer_state.json  step, optimizer steps, data position, metrics history, run identity; written last

Only directories whose `trainer_state.json` says `"complete": true` count (`latest_checkpoint`). `--resume`
reloads all of the above into the freshly built objects, so a resumed run ends with the same metrics and weights as
an uninterrupted one under the same seed (`tests/trainers/test_checkpoint_resume.py` kills a run to check this).
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dare_bench.errors import CheckpointError
from dare_bench.fileio import atomic_directory

STATE_FILE = "trainer_state.json"
ALGORITHM_FILE = "algorithm.pt"  # Algorithm.state_dict(), only when non-empty
_STEP_DIR = re.compile(r"^step-(\d+)$")


def checkpoint_path(root: str | Path, step: int) -> Path:
    return Path(root) / f"step-{step:06d}"


def is_peft(model) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under `root`, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for d in root.iterdir():
        m = _STEP_DIR.match(d.name)
        if not m or not d.is_dir():
            continue
        try:
            state = json.loads((d / STATE_FILE).read_text())
        except (OSError, ValueError):
            continue
        if state.get("complete") is True:
            out.append((int(m.group(1)), d))
    return sorted(out)


def latest_checkpoint(root: str | Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1][1] if found else None


# --- RNG ----------------------------------------------------------------------------------------------------------
def capture_rng(generators: dict[str, torch.Generator]) -> dict[str, Any]:
    """Every RNG a training step can touch: global torch (CPU + CUDA; dropout uses it), python, numpy, and ours."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "generators": {k: g.get_state() for k, g in generators.items()},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any], generators: dict[str, torch.Generator]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    missing = sorted(set(generators) - set(state["generators"]))
    if missing:
        raise CheckpointError(f"checkpoint lacks the state of generator(s) {missing}")
    for k, g in generators.items():
        g.set_state(state["generators"][k])


# --- model weights ------------------------------------------------------------------------------------------------
def save_model(model, directory: Path, tokenizer=None, state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """HF-format weights: the full model, or only the LoRA adapters of a PEFT model. `state_dict`: the weights to
    write instead of the model's own (an FSDP2 model's gathered full state dict)."""
    if is_peft(model):
        model.save_pretrained(str(directory), state_dict=state_dict)
        return
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        model.save_pretrained(directory, tokenizer=tokenizer, state_dict=state_dict)
    else:
        model.save_pretrained(directory, state_dict=state_dict)


def load_model_weights(model, directory: Path) -> None:
    """Copy saved weights into `model` in place (parameters keep their identity: the optimizer still points at them)."""
    if is_peft(model):
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        f = directory / "adapter_model.safetensors"
        if not f.exists():
            raise CheckpointError(f"{directory}: no adapter_model.safetensors (was this a LoRA run?)")
        result = set_peft_model_state_dict(model, load_file(str(f)))
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise CheckpointError(f"{f}: unexpected adapter weight(s) {unexpected[:3]}")
        return
    from dare_bench.models.io import read_state_dict

    state = read_state_dict(directory)
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{directory}: weights do not match the model (missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]})")
    with torch.no_grad():
        for name, t in expected.items():
            if t.shape != state[name].shape:
                raise CheckpointError(f"{directory}: {name} has shape {tuple(state[name].shape)}, "
                                      f"the model {tuple(t.shape)}")
            t.copy_(state[name])


# --- save / load --------------------------------------------------------------------------------------------------
def save_checkpoint(root: str | Path, step: int, *, model, optimizer, scheduler, trainer_state: dict[str, Any],
                    rng: dict[str, Any] | list[dict[str, Any]], tokenizer=None, keep_last: int | None = None,
                    model_state: dict[str, torch.Tensor] | None = None,
                    optimizer_state: dict[str, Any] | None = None,
                    algorithm_state: dict[str, Any] | None = None) -> Path:
    """Write `root/step-<step>/` atomically; `trainer_state` must be JSON-serialisable. Returns the directory.

    An FSDP2-sharded run passes the gathered full `model_state` / `optimizer_state` (`trainers.distributed`
    full_state_dict / full_optimizer_state_dict, collected on every rank, written by rank 0)."""
    path = checkpoint_path(root, step)
    with atomic_directory(path) as tmp:
        save_model(model, tmp / "model", tokenizer, state_dict=model_state)
        torch.save(optimizer.state_dict() if optimizer_state is None else optimizer_state, tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        torch.save(rng, tmp / "rng.pt")
        if algorithm_state:  # a plug-in's own state (Algorithm.state_dict: e.g. TraceRL's value model)
            torch.save(algorithm_state, tmp / ALGORITHM_FILE)
        state = dict(trainer_state, step=step, complete=True)
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1, allow_nan=True) + "\n")
    if keep_last is not None:
        for _, old in list_checkpoints(root)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return path


def load_algorithm_state(path: str | Path) -> dict[str, Any]:
    """The plug-in state a checkpoint holds (`{}` when it has none)."""
    f = Path(path) / ALGORITHM_FILE
    if not f.exists():
        return {}
    try:
        return torch.load(f, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot restore the algorithm state ({exc})") from None


def load_checkpoint(path: str | Path, *, model, optimizer, scheduler) -> tuple[dict[str, Any], Any]:
    """Restore model / optimizer / scheduler in place; returns (trainer_state, rng) for the caller to apply."""
    path = Path(path)
    try:
        state = json.loads((path / STATE_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable {STATE_FILE} ({exc})") from None
    if state.get("complete") is not True:
        raise CheckpointError(f"{path}: incomplete checkpoint")
    from dare_bench.trainers.distributed import is_sharded, load_full_state

    sharded = is_sharded(model)
    if sharded:  # every rank reads the full state and keeps its shards
        if is_peft(model):
            raise CheckpointError(f"{path}: resuming a LoRA run under FSDP2 is not supported; resume it with the same "
                                  "adapters in one process, or train LoRA without --nproc")
        from dare_bench.models.io import read_state_dict

        load_full_state(model, optimizer, read_state_dict(path / "model"),
                        torch.load(path / "optimizer.pt", map_location="cpu", weights_only=False))
    else:
        load_model_weights(model, path / "model")
    try:
        if not sharded:
            optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location="cpu", weights_only=False))
        scheduler.load_state_dict(torch.load(path / "scheduler.pt", map_location="cpu", weights_only=False))
        rng = torch.load(path / "rng.pt", map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{path}: cannot restore optimizer / scheduler / RNG state ({exc})") from None
    return state, rng


__all__ = ["ALGORITHM_FILE", "STATE_FILE", "capture_rng", "checkpoint_path", "is_peft", "latest_checkpoint",
           "list_checkpoints", "load_algorithm_state",
           "load_checkpoint", "load_model_weights", "restore_rng", "save_checkpoint", "save_model"]
