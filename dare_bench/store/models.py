"""SQLAlchemy 2 ORM of the results store: runs, per-step metrics, evaluations, per-sample records, reported scores.

The schema is owned by the alembic migrations in `dare_bench/store/migrations/versions/`; these classes must
describe the schema at `HEAD` (a test compares them with the migrated database). JSON payloads are stored as
text so any SQLAlchemy backend works.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

# Every revision this code knows, oldest first. A database stamped with anything else is from a newer dare-bench.
REVISIONS = ("0001", "0002", "0003")
HEAD = REVISIONS[-1]

RUN_STATUSES = ("running", "finished", "failed")


class Base(DeclarativeBase):
    pass


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    uid: Mapped[str] = mapped_column(String(64), unique=True, nullable=False)
    reproduction: Mapped[str] = mapped_column(String(128), index=True)
    algorithm: Mapped[str] = mapped_column(String(32))
    backbone: Mapped[str] = mapped_column(String(32))
    task: Mapped[str] = mapped_column(String(32))
    scale: Mapped[str] = mapped_column(String(16), index=True)
    config_json: Mapped[str] = mapped_column(Text)
    config_hash: Mapped[str] = mapped_column(String(64), index=True)
    modified: Mapped[bool] = mapped_column(Boolean, default=False)
    overrides_json: Mapped[str] = mapped_column(Text, default="[]")
    seed: Mapped[int] = mapped_column(Integer)
    code_version: Mapped[str] = mapped_column(String(128))
    packages_json: Mapped[str] = mapped_column(Text, default="{}")
    hardware_json: Mapped[str] = mapped_column(Text, default="{}")
    status: Mapped[str] = mapped_column(String(16), index=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    host: Mapped[str | None] = mapped_column(String(255), nullable=True)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    duration_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    # 0002: where the row came from: "local" (written by this process) or "ingest" (from a result file).
    origin: Mapped[str] = mapped_column(String(16), default="local", server_default="local")
    # 0003: the tiny base the run started from (None: a real checkpoint, or a run recorded before 0003); runs on
    # different bases are different groups on the leaderboard and in `dare-bench check`.
    base_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    base_json: Mapped[str] = mapped_column(Text, default="{}", server_default="{}")
    # 0003: the training compute the run counted (trainers/compute.py; {} for kind none), and for a compute-matched
    # SFT control the uid of the RL run it controls (`reproduce --control`)
    compute_json: Mapped[str] = mapped_column(Text, default="{}", server_default="{}")
    control_of: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)

    metrics: Mapped[list[StepMetric]] = relationship(back_populates="run", cascade="all, delete-orphan")
    evaluations: Mapped[list[Evaluation]] = relationship(back_populates="run", cascade="all, delete-orphan")


class StepMetric(Base):
    __tablename__ = "step_metrics"
    __table_args__ = (UniqueConstraint("run_id", "step", name="uq_step_metrics_run_step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    reward_mean: Mapped[float | None] = mapped_column(Float, nullable=True)
    reward_std: Mapped[float | None] = mapped_column(Float, nullable=True)
    loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    kl: Mapped[float | None] = mapped_column(Float, nullable=True)
    entropy: Mapped[float | None] = mapped_column(Float, nullable=True)
    tokens_per_forward: Mapped[float | None] = mapped_column(Float, nullable=True)
    peak_memory_mb: Mapped[float | None] = mapped_column(Float, nullable=True)
    stage_seconds_json: Mapped[str] = mapped_column(Text, default="{}")
    extra_json: Mapped[str] = mapped_column(Text, default="{}")
    logged_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

    run: Mapped[Run] = relationship(back_populates="metrics")


class Evaluation(Base):
    __tablename__ = "evaluations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    task: Mapped[str] = mapped_column(String(32))
    split: Mapped[str] = mapped_column(String(64))
    data_fingerprint: Mapped[str] = mapped_column(String(128))
    sampler_preset: Mapped[str | None] = mapped_column(String(128), nullable=True)
    sampler_json: Mapped[str] = mapped_column(Text, default="{}")
    metrics_json: Mapped[str] = mapped_column(Text)
    primary_metric: Mapped[str] = mapped_column(String(64))
    primary_value: Mapped[float] = mapped_column(Float)
    n_items: Mapped[int] = mapped_column(Integer)
    checkpoint: Mapped[str | None] = mapped_column(String(512), nullable=True)
    step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # 0002: stable id given by the writer, so re-ingesting a result file adds nothing.
    uid: Mapped[str | None] = mapped_column(String(64), unique=True, nullable=True)

    run: Mapped[Run] = relationship(back_populates="evaluations")
    samples: Mapped[list[Sample]] = relationship(back_populates="evaluation", cascade="all, delete-orphan")


class Sample(Base):
    __tablename__ = "samples"
    __table_args__ = (UniqueConstraint("evaluation_id", "idx", name="uq_samples_eval_idx"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    evaluation_id: Mapped[int] = mapped_column(ForeignKey("evaluations.id", ondelete="CASCADE"), index=True)
    idx: Mapped[int] = mapped_column(Integer)
    item_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    prompt: Mapped[str | None] = mapped_column(Text, nullable=True)
    completion: Mapped[str] = mapped_column(Text)
    reference: Mapped[str | None] = mapped_column(Text, nullable=True)
    score: Mapped[float] = mapped_column(Float)
    correct: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    extra_json: Mapped[str] = mapped_column(Text, default="{}")

    evaluation: Mapped[Evaluation] = relationship(back_populates="samples")


class ReportedScoreRow(Base):
    """0002: published numbers, synced from the registry (the YAMLs are the source of truth)."""

    __tablename__ = "reported_scores"
    __table_args__ = (
        UniqueConstraint("reproduction", "table_id", "metric", "settings_json", name="uq_reported_scores"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    reproduction: Mapped[str] = mapped_column(String(128), index=True)
    algorithm: Mapped[str] = mapped_column(String(32))
    backbone: Mapped[str] = mapped_column(String(32))
    task: Mapped[str] = mapped_column(String(32))
    table_id: Mapped[str] = mapped_column(String(128))
    metric: Mapped[str] = mapped_column(String(64))
    value: Mapped[float] = mapped_column(Float)
    source_kind: Mapped[str] = mapped_column(String(16))
    source_ref: Mapped[str] = mapped_column(String(255))
    source_table: Mapped[str | None] = mapped_column(String(255), nullable=True)
    source_file: Mapped[str | None] = mapped_column(String(512), nullable=True)
    source_commit: Mapped[str | None] = mapped_column(String(64), nullable=True)
    settings_json: Mapped[str] = mapped_column(Text, default="{}")
    note: Mapped[str | None] = mapped_column(Text, nullable=True)
