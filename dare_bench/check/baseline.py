"""Baseline files (`dare_bench/reproductions/baselines/<name>.<scale>.json`) and what a run looks like to the check.

A baseline holds, for each recorded seed, an *observation* of one finished run (`observe`): the final and base
evaluations (metrics, data fingerprint, per-item correct / score / reward) and the step curves (reward mean / std,
loss); plus the config hash, code version, package versions and hardware it was recorded with. `record` produces
one by running the reproduction with several seeds; it is only ever called by `dare-bench check --record`.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from dare_bench.errors import DataError
from dare_bench.fileio import atomic_write_json

FORMAT = "dare-bench-baseline"
VERSION = 1
# Step curves kept from the store: columns, then `extra` keys (grad_norm: an RL loss whose value is 0 by
# construction, e.g. GRPO at mu = 1, still shows a changed gradient here).
CURVES = ("reward_mean", "reward_std", "loss", "grad_norm")
ITEM_FIELDS = {"accuracy": "correct", "score": "score", "mean_reward": "reward"}


def baselines_directory(given: str | os.PathLike | None = None) -> Path:
    if given:
        return Path(given).expanduser()
    env = os.environ.get("DARE_BENCH_BASELINES")
    if env:
        return Path(env).expanduser()
    from dare_bench.registry import default_directory

    return default_directory() / "baselines"


def baseline_path(directory: Path, name: str, scale: str) -> Path:
    return directory / f"{name}.{scale}.json"


def available(directory: Path, scale: str) -> list[str]:
    """Reproductions with a baseline at `scale`, sorted."""
    suffix = f".{scale}.json"
    if not directory.is_dir():
        return []
    return sorted(p.name[: -len(suffix)] for p in directory.glob(f"*{suffix}") if not p.name.startswith("."))


def load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise DataError(f"{path}: cannot read the baseline ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise DataError(f"{path}: not a dare-bench baseline (format must be {FORMAT!r})")
    if data.get("version") != VERSION:
        raise DataError(f"{path}: baseline version {data.get('version')!r}; this dare-bench reads version {VERSION}")
    for key in ("reproduction", "scale", "config_hash", "runs"):
        if key not in data:
            raise DataError(f"{path}: baseline lacks {key!r}")
    if not isinstance(data["runs"], list) or not data["runs"]:
        raise DataError(f"{path}: baseline has no recorded runs")
    for i, run in enumerate(data["runs"]):
        if not isinstance(run, dict) or "final" not in run or "metrics" not in run["final"]:
            raise DataError(f"{path}: runs[{i}] lacks final.metrics")
    return data


# ---------------------------------------------------------------------------------------------- observations

def _evaluation(store, ev: dict[str, Any]) -> dict[str, Any]:
    samples = store.samples(ev["id"])
    return {
        "metrics": dict(ev["metrics"]),
        "primary_metric": ev["primary_metric"],
        "n_items": ev["n_items"],
        "data_fingerprint": ev["data_fingerprint"],
        "items": {
            "item_id": [s["item_id"] for s in samples],
            "correct": [None if s["correct"] is None else int(bool(s["correct"])) for s in samples],
            "score": [s["score"] for s in samples],
            "reward": [s["extra"].get("reward") for s in samples],
        },
    }


def observe(store, run_id: int) -> dict[str, Any]:
    """What the check compares of one finished run: evaluations with per-item values, and the step curves."""
    run = store.get_run(run_id)
    evals = {}
    for ev in store.evaluations(run_id):
        if ev.get("checkpoint") in ("base", "final"):
            evals[ev["checkpoint"]] = _evaluation(store, ev)  # the last of each label wins
    curves: dict[str, list[float]] = {}
    rows = store.metrics(run_id)
    for name in CURVES:
        values = [r[name] if name in r else (r.get("extra") or {}).get(name) for r in rows]
        if values and all(v is not None for v in values):
            curves[name] = [float(v) for v in values]
    train = (run.get("config") or {}).get("profile", {}).get("train", {})
    rollouts = (train.get("batch_prompts") or 0) * (train.get("group_size") or 0)
    return {
        "run_id": run_id, "seed": run["seed"], "config_hash": run["config_hash"], "status": run["status"],
        "code_version": run["code_version"], "duration_s": run["duration_s"],
        "rollouts_per_step": rollouts or None, "base_sha256": run.get("base_sha256"),
        "final": evals.get("final"), "base": evals.get("base"), "curves": curves,
    }


# ---------------------------------------------------------------------------------------------- recording

def record(name: str, scale: str, seeds: list[int], *, db: str | None, log: Callable[[str], Any],
           overrides: list[str] | None = None) -> dict[str, Any]:
    """Run `name` once per seed (always afresh) and return the baseline document (not yet written)."""
    from dare_bench.pipeline import reproduce, resolve
    from dare_bench.store import Store

    _, cfg = resolve(name, scale, list(overrides or []))
    store = Store(db)
    runs = []
    last_run = None
    for seed in seeds:
        log(f"record: {name} [{scale}] seed {seed}")
        result = reproduce(name, scale, seed=seed, db=store.url, force=True, progress=False, log=log,
                           overrides=list(overrides or []))
        last_run = result.run_id
        obs = observe(store, result.run_id)
        obs["wall_seconds"] = round(result.wall_seconds, 2)
        runs.append(strip(obs))
    return document(cfg, runs, store.get_run(last_run))


def document(cfg, observations: list[dict[str, Any]], run: dict[str, Any]) -> dict[str, Any]:
    """The baseline document of `observations` (one per seed) of config `cfg`; `run` is a store run dict whose
    code version, packages and hardware are recorded."""
    from dare_bench.store import environment

    return {
        "format": FORMAT,
        "version": VERSION,
        "reproduction": cfg.reproduction,
        "scale": cfg.scale,
        "overrides": list(cfg.overrides),
        "config_hash": cfg.content_hash,
        "primary_metric": cfg.profile.eval.metric,
        "recorded_at": datetime.now(timezone.utc).replace(microsecond=0).isoformat(),
        "code_version": run["code_version"],
        "packages": run["packages"] or environment.package_versions(),
        "hardware": run["hardware"] or environment.hardware(),
        "seeds": [o["seed"] for o in observations],
        "runs": observations,
    }


def strip(obs: dict[str, Any]) -> dict[str, Any]:
    """An observation as a baseline keeps it (no store-local ids)."""
    return {k: v for k, v in obs.items() if k not in ("status", "run_id", "duration_s")}


def write(path: Path, doc: dict[str, Any]) -> None:
    atomic_write_json(path, doc, indent=1)
