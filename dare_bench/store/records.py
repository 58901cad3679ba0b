"""Plain records exchanged with the store: evaluation results (with per-sample rows) and result files.

Evaluation jobs that run apart from the database (fan-out over a cluster) write one JSON result file each with
`write_result_file`; `dare-bench ingest PATH` loads them later in one transaction, so no job ever writes the
database over a network filesystem. Files are written atomically and carry stable ids (run uid, evaluation uid),
so re-ingesting a file adds nothing.

    from dare_bench.store import EvaluationRecord, SampleRecord, write_result_file
    ev = EvaluationRecord(task="sudoku", split="test", data_fingerprint="sha256:...", sampler_preset="tiny-sudoku",
                          sampler={...}, metrics={"accuracy": 0.23}, primary_metric="accuracy",
                          samples=[SampleRecord(idx=0, completion="...", score=1.0, correct=True)])
    write_result_file("results/job-17.json", config=run_config, seed=0, evaluations=[ev])
"""

from __future__ import annotations

import gzip
import json
import math
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dare_bench.errors import DataError

RESULT_FORMAT = "dare-bench-result"
#: what a result file may be named: plain JSON (a job's own output) or gzip-compressed JSON (bundles: per-item
#: samples make a tiny run's file ~0.5 MB, ~9x smaller compressed, and the shipped bundle is in the wheel)
RESULT_SUFFIXES = (".json", ".json.gz")
RESULT_VERSION = 1


def new_uid() -> str:
    return uuid.uuid4().hex


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SampleRecord(_Record):
    idx: int = Field(..., ge=0)
    item_id: str | None = None
    prompt: str | None = None
    completion: str
    reference: str | None = None
    score: float
    correct: bool | None = None
    extra: dict[str, Any] = Field(default_factory=dict)


class EvaluationRecord(_Record):
    uid: str = Field(default_factory=new_uid)
    task: str
    split: str
    data_fingerprint: str = Field(..., min_length=1, description="hash of the exact items evaluated")
    sampler_preset: str | None = None
    sampler: dict[str, Any] = Field(default_factory=dict, description="resolved decoding settings")
    metrics: dict[str, float]
    primary_metric: str
    n_items: int | None = Field(None, ge=0, description="defaults to len(samples)")
    checkpoint: str | None = None
    step: int | None = None
    samples: list[SampleRecord] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> "EvaluationRecord":
        if self.primary_metric not in self.metrics:
            raise ValueError(f"primary_metric {self.primary_metric!r} is not in metrics {sorted(self.metrics)}")
        if not all(math.isfinite(v) for v in self.metrics.values()):
            raise ValueError("metrics must be finite numbers")
        idx = [s.idx for s in self.samples]
        if len(set(idx)) != len(idx):
            raise ValueError("sample idx values repeat")
        if self.n_items is None:
            self.n_items = len(self.samples)
        return self


class MetricRecord(_Record):
    step: int = Field(..., ge=0)
    values: dict[str, Any]


class RunRecord(_Record):
    uid: str = Field(default_factory=new_uid)
    reproduction: str
    algorithm: str
    backbone: str
    task: str
    scale: str
    config: dict[str, Any]
    config_hash: str = Field(..., min_length=64, max_length=64)
    modified: bool = False
    overrides: list[str] = Field(default_factory=list)
    seed: int
    code_version: str
    packages: dict[str, str] = Field(default_factory=dict)
    hardware: dict[str, Any] = Field(default_factory=dict)
    base: dict[str, Any] = Field(default_factory=dict, description="the tiny base's identity (empty: none recorded)")
    compute: dict[str, Any] = Field(default_factory=dict, description="training compute counted (trainers/compute.py)")
    control_of: str | None = Field(None, description="uid of the RL run a compute-matched SFT control controls")
    status: Literal["running", "finished", "failed"] = "finished"
    error: str | None = None
    host: str | None = None
    pid: int | None = None
    started_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None

    @field_validator("started_at", "finished_at")
    @classmethod
    def _aware(cls, v: datetime | None) -> datetime | None:
        return v.replace(tzinfo=timezone.utc) if v is not None and v.tzinfo is None else v


class ResultFile(_Record):
    format: Literal["dare-bench-result"] = RESULT_FORMAT
    version: Literal[1] = RESULT_VERSION
    run: RunRecord
    metrics: list[MetricRecord] = Field(default_factory=list)
    evaluations: list[EvaluationRecord] = Field(default_factory=list)


def read_result_file(path: str | Path) -> ResultFile:
    """Parse and validate one result file; any defect raises DataError naming the file."""
    path = Path(path)
    try:
        data = path.read_bytes()
        raw = json.loads((gzip.decompress(data) if path.name.endswith(".gz") else data).decode("utf-8"))
    except (OSError, EOFError, UnicodeDecodeError) as exc:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{path}: cannot read result file: {exc}") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}") from None
    if not isinstance(raw, dict) or raw.get("format") != RESULT_FORMAT:
        raise DataError(f"{path}: not a dare-bench result file (missing \"format\": \"{RESULT_FORMAT}\")")
    if raw.get("version") != RESULT_VERSION:
        raise DataError(f"{path}: result file version {raw.get('version')!r} is not supported (expected 1)")
    try:
        return ResultFile.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise DataError(f"{path}: invalid result file at {loc}: {err['msg']}{more}") from None


#: a bundle's subdirectory of shared tiny / micro SFT bases (`export --bundle --bases`): weights and their JSON
#: records, never read as result files
BASES_DIR = "bases"


def result_files(directory: str | Path) -> list[Path]:
    """Every result file (`RESULT_SUFFIXES`) under `directory`, recursively, in path order; hidden files skipped
    (an interrupted atomic write leaves a hidden temporary), and so is a bundle's `bases/` subdirectory."""
    root = Path(directory)
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")
                  and p.name.endswith(RESULT_SUFFIXES) and BASES_DIR not in p.relative_to(root).parts[:-1])


def check_integrity(result: ResultFile, path: str | Path) -> None:
    """Refuse a result whose run record was edited or is incomplete, before anything is written (`ingest`):
    - its `config_hash` must be the content hash of its stored config, recomputed here (an edited learning rate, seed
      list or score-relevant setting changes it), and the config must still validate under this dare-bench;
    - it must carry the package and machine record (`packages.torch`, `hardware`) that says where it ran.
    A DataError names the file and the run."""
    from dare_bench.config import RunConfig

    run = result.run
    where = f"{path}: run {run.uid} ({run.reproduction}, seed {run.seed})"
    try:
        recomputed = RunConfig.from_dict(run.config).content_hash
    except Exception as exc:  # a DareBenchError or pydantic's ValidationError: either way not checkable here
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{where}: its config does not validate under this dare-bench, so its hash cannot be "
                        f"checked ({first}); refused") from None
    stated = {run.config_hash, run.config.get("content_hash", run.config_hash)}
    if stated != {recomputed}:
        raise DataError(f"{where}: config_hash {run.config_hash[:12]} is not the hash of its config "
                        f"({recomputed[:12]}): the record was edited after it was written; refused")
    if not run.packages.get("torch") or not run.hardware:
        raise DataError(f"{where}: no package / machine record (packages.torch and hardware are required: where "
                        "and with what it ran); refused")
