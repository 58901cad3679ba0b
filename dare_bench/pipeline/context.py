"""What one `reproduce` run hands from stage to stage: `RunContext` (the run's fixed inputs: config, store, seed,
device ...) and `Base` (the starting model with its tokenizer, task and training data).

    from dare_bench.pipeline.context import RunContext
    ctx = RunContext(cfg, store, run_id, result, seed=0, resume=False, device="cpu", progress=False, log=print)
    ctx.run_dir   # DARE_BENCH_HOME/runs/<reproduction>-<scale>-<hash>-seed<seed>: checkpoints/, final/
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from dare_bench.fileio import dare_bench_home

Log = Callable[[str], Any]


@dataclass
class RunContext:
    """The fixed inputs of one reproduction run, shared by every stage of `dare_bench.pipeline._run`."""

    cfg: Any  # the resolved RunConfig
    store: Any  # dare_bench.store.Store on rank 0; None on the other ranks of a torchrun job (only rank 0 writes)
    run_id: int
    result: Any  # the ReproduceResult the stages fill in
    seed: int
    resume: bool
    device: str
    progress: bool
    log: Log
    paper_dir: Path | None = None  # paper scale: the real checkpoint (the base); None: tiny / micro SFT base
    rank: int = 0  # this process's rank under torchrun (0 in one process)

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes (store rows, metrics, checkpoints, the final model)."""
        return self.rank == 0

    @property
    def run_dir(self) -> Path:
        return run_directory(self.cfg, self.seed)


def run_directory(cfg, seed: int) -> Path:
    """Where a run of `cfg` at `seed` keeps its checkpoints and final model: the same directory for every attempt,
    which is how `--resume` (and `dare-bench sweep`) find an interrupted run's last checkpoint."""
    return dare_bench_home() / "runs" / f"{cfg.reproduction}-{cfg.scale}-{cfg.content_hash[:12]}-seed{seed}"


@dataclass
class Base:
    """The post-training start and what it was built with."""

    model: Any
    tokenizer: Any
    task: Any
    train_data: Any  # the task's training items (a Dataset-like with `.fingerprint`)
    directory: Path  # the cached base (tiny / micro) or the paper-scale base's cache dir (its evaluation)
    template: Any  # "plain" (tiny replicas) or the chat tokenizer (paper scale)
    # tiny / micro: {"weights_sha256", "selection"} (base_cache.base_identity), kept in the run record's base_json
    identity: dict[str, Any] | None = None


__all__ = ["Base", "Log", "RunContext", "run_directory"]
