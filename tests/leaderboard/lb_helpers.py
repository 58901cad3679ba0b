"""Build leaderboard test databases with the store's own API (and, for scale, its own schema)."""

from __future__ import annotations

import hashlib
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from dare_bench.store import EvaluationRecord, SampleRecord, Store

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "leaderboard" / "app.py"


def config(algorithm: str, backbone: str, task: str, scale: str, *, modified: bool = False,
           mc_samples: int | None = None, overrides: list[str] | None = None, num_t: int | None = None) -> dict:
    """A run config as the pipeline stores it; `mc_samples` sets `profile.train.mc_samples` and `num_t`
    `profile.train.algorithm.num_t`; `overrides` (which mark the run modified) replace the default `train.lr=1` of a
    modified run."""
    name = f"{algorithm}-{backbone}-{task}"
    overrides = overrides if overrides is not None else (["train.lr=1"] if modified else [])
    train = {"lr": 1e-5} if mc_samples is None else {"lr": 1e-5, "mc_samples": mc_samples}
    if num_t is not None:
        train["algorithm"] = {"num_t": num_t}
    key = f"{name}/{scale}/{bool(overrides)}/{overrides}"
    content_hash = hashlib.sha256(key.encode()).hexdigest()
    return {"reproduction": name, "algorithm": algorithm, "backbone": backbone, "task": task, "scale": scale,
            "content_hash": content_hash, "modified": bool(overrides),
            "overrides": overrides, "profile": {"train": train}}


def evaluation(task: str, value: float, checkpoint: str, *, n_samples: int = 0, step: int = 0) -> EvaluationRecord:
    samples = [SampleRecord(idx=i, prompt=f"puzzle {i}", completion=f"answer {i}", reference=f"ref {i}",
                            score=float(i % 2 == 0), correct=i % 2 == 0) for i in range(n_samples)]
    return EvaluationRecord(task=task, split="test", data_fingerprint=f"fp-{task}", sampler_preset=f"tiny-{task}",
                            sampler={"steps": 24, "gen_length": 24}, metrics={"accuracy": value, "n": 8.0},
                            primary_metric="accuracy", checkpoint=checkpoint, step=step, samples=samples)


def add_run(store: Store, algorithm: str, final: float, *, backbone: str = "llada", task: str = "sudoku",
            scale: str = "micro", seed: int = 0, steps: int = 4, modified: bool = False, n_samples: int = 4,
            base: float = 0.1, base_sha: str | None = None, mc_samples: int | None = None,
            overrides: list[str] | None = None, num_t: int | None = None, hardware: dict | None = None,
            trained_on: dict | None = None) -> int:
    cfg = config(algorithm, backbone, task, scale, modified=modified, mc_samples=mc_samples, overrides=overrides,
                 num_t=num_t)
    run_id = store.start_run(cfg, seed=seed,
                             code_version="test-version", packages={"torch": "2.13.0"},
                             hardware=hardware or {"cpu": "test"})
    for step in range(1, steps + 1 if algorithm != "baseline" else 1):
        store.log_metrics(run_id, step, {
            "reward_mean": final * step / steps, "loss": 1.0 / step, "kl": 0.01 * step, "tokens_per_forward": 1.0,
            "stage_seconds": {"rollout": 2.0, "update": 1.0},
        })
    identity = {"weights_sha256": base_sha, "selection": {"rule": "target", "step": 100}} if base_sha else None
    if identity and trained_on:
        identity["trained_on"] = trained_on  # the CPU that trained the base, as base_cache records it
    store.finish_run(run_id, [evaluation(task, base, "base"),
                              evaluation(task, final, "final", n_samples=n_samples, step=steps)], base=identity)
    return run_id


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the leaderboard server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"the leaderboard server did not answer on port {port} within {timeout:.0f} s")
