"""Results store: runs, step metrics, evaluations with per-sample records, reported scores (SQLAlchemy 2).

    from dare_bench.store import Store, EvaluationRecord, SampleRecord, write_result_file
    store = Store()            # or Store("sqlite:///path.db"), Store("postgresql://..."); env DARE_BENCH_DB

See `api.py` for the write rules (transactions, finish/fail) and `records.py` for result files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from dare_bench.store.api import Store
from dare_bench.store.engine import resolve_url
from dare_bench.store.records import (
    EvaluationRecord,
    MetricRecord,
    ResultFile,
    RunRecord,
    SampleRecord,
    read_result_file,
)

__all__ = [
    "Store", "EvaluationRecord", "SampleRecord", "MetricRecord", "RunRecord", "ResultFile", "resolve_url",
    "read_result_file", "write_result_file", "run_record",
]


def run_record(config: Any, *, seed: int, status: str = "finished", uid: str | None = None, **fields: Any) -> RunRecord:
    """A RunRecord for `config` (a RunConfig or its to_dict()), with this machine's code/package/hardware info."""
    from dare_bench.store import environment

    cfg = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    data = dict(
        reproduction=cfg["reproduction"], algorithm=cfg["algorithm"], backbone=cfg["backbone"], task=cfg["task"],
        scale=cfg["scale"], config=cfg, config_hash=cfg["content_hash"], modified=bool(cfg.get("modified")),
        overrides=list(cfg.get("overrides", [])), seed=seed, code_version=environment.code_version(),
        packages=environment.package_versions(), hardware=environment.hardware(), status=status,
    )
    if uid:
        data["uid"] = uid
    data.update(fields)
    return RunRecord(**data)


def write_result_file(
    path: str | Path,
    *,
    run: RunRecord | None = None,
    config: Any = None,
    seed: int | None = None,
    evaluations: Iterable[EvaluationRecord | dict] = (),
    metrics: Iterable[tuple[int, dict] | MetricRecord] = (),
) -> Path:
    """Atomically write a result file for `dare-bench ingest`; give `run`, or `config` + `seed`."""
    from dare_bench.fileio import atomic_write_text

    if run is None:
        if config is None or seed is None:
            raise ValueError("write_result_file needs run=RunRecord(...) or config= and seed=")
        run = run_record(config, seed=seed)
    result = ResultFile(
        run=run,
        evaluations=[e if isinstance(e, EvaluationRecord) else EvaluationRecord.model_validate(e) for e in evaluations],
        metrics=[m if isinstance(m, MetricRecord) else MetricRecord(step=m[0], values=m[1]) for m in metrics],
    )
    path = Path(path)
    atomic_write_text(path, result.model_dump_json(indent=1) + "\n")
    return path
