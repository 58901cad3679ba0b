"""Synthetic store runs for `dare-bench check`: real reproduction configs (so hashes match), fake numbers.

A synthetic run mimics a micro RL run: 16 evaluated items per evaluation (base and final), a 3-step reward / loss
curve. Its numbers are drawn from seeded noise around fixed means, so different seeds differ like real seeds do.
"""

from __future__ import annotations

import random

NAME = "d1-llada-sudoku"
N_ITEMS = 16
STEPS = 3


def config(name: str = NAME, scale: str = "micro", overrides=()):
    from dare_bench.registry import get

    return get(name).resolve(scale, list(overrides), with_data=True)  # as the pipeline resolves it


def _evaluation(checkpoint: str, rng: random.Random, level: float, fingerprint: str = "sha256:items"):
    from dare_bench.store.records import EvaluationRecord

    scores = [min(1.0, max(0.0, rng.gauss(level, 0.15))) for _ in range(N_ITEMS)]
    correct = [s > 0.8 for s in scores]
    samples = [{"idx": i, "item_id": str(i), "completion": "<answer>0</answer>", "score": s, "correct": c,
                "extra": {"reward": s}} for i, (s, c) in enumerate(zip(scores, correct))]
    metrics = {"n": float(N_ITEMS), "accuracy": sum(correct) / N_ITEMS, "pass@1": sum(correct) / N_ITEMS,
               "score": sum(scores) / N_ITEMS, "mean_reward": sum(scores) / N_ITEMS}
    return EvaluationRecord(task="sudoku", split="test", data_fingerprint=fingerprint, sampler_preset="tiny",
                            metrics=metrics, primary_metric="accuracy", checkpoint=checkpoint, samples=samples)


def add_run(db: str, seed: int, *, cfg=None, level: float = 0.4, reward_shift: float = 0.0,
            fingerprint: str = "sha256:items", base_sha: str = "b" * 64) -> int:
    """One finished synthetic run in the store at `db`; returns its id."""
    from dare_bench.store import Store

    cfg = cfg or config()
    rng = random.Random(seed)
    store = Store(db)
    run_id = store.start_run(cfg, seed=seed)
    for step in range(STEPS):
        store.log_metrics(run_id, step, {"reward_mean": rng.gauss(0.3, 0.03) + reward_shift,
                                         "reward_std": 0.2, "loss": rng.gauss(0.01, 0.002)})
    base_rng = random.Random(1234)  # the base evaluation is the same for every seed, as in the pipeline
    store.finish_run(run_id, [_evaluation("base", base_rng, 0.35, fingerprint),
                              _evaluation("final", rng, level, fingerprint)],
                     base={"weights_sha256": base_sha, "selection": {"rule": "fixed", "step": 40}})
    store.close()
    return run_id


def write_baseline(db: str, directory, seeds=(0, 1, 2), *, cfg=None) -> dict:
    """Record a baseline from synthetic runs of `seeds` (what `--record` does, without training)."""
    from dare_bench.check import baseline as bl
    from dare_bench.store import Store

    cfg = cfg or config()
    ids = [add_run(db, s, cfg=cfg) for s in seeds]
    store = Store(db)
    doc = bl.document(cfg, [bl.strip(bl.observe(store, i)) for i in ids], store.get_run(ids[-1]))
    bl.write(bl.baseline_path(directory, cfg.reproduction, cfg.scale), doc)
    store.close()
    return doc
