"""config.json of the real checkpoints (shipped with the package, weights not included), for dry runs and
memory planning without a download: `real_config("GSAI-ML/LLaDA-8B-Instruct") -> (source, config_dict)`."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from dare_bench.errors import CheckpointError

DIRECTORY = Path(__file__).with_name("checkpoint_configs")


def known_checkpoints() -> list[str]:
    return sorted(p.stem for p in DIRECTORY.glob("*.json"))


def real_config(checkpoint_id: str) -> tuple[str, dict]:
    """Match on the repo name (the part after the organisation), e.g. `SDAR-1.7B-Chat` ~ `SDAR-1dot7B-Chat`."""
    name = checkpoint_id.split("/")[-1]
    candidates = {p.stem: p for p in DIRECTORY.glob("*.json")}
    normalised = {k.replace("dot", ".").lower(): k for k in candidates}
    key = candidates.get(name) and name or normalised.get(name.replace("dot", ".").lower())
    if key is None:
        hint = difflib.get_close_matches(name, list(candidates), n=1)
        raise CheckpointError(f"no shipped config for checkpoint {checkpoint_id!r}; pass --checkpoint DIR"
                              + (f" (closest shipped: {hint[0]})" if hint else ""))
    path = candidates[key]
    return str(path), json.loads(path.read_text())
