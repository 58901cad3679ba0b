"""Initial schema: runs, per-step metrics, evaluations and per-sample records.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("uid", sa.String(64), nullable=False, unique=True),
        sa.Column("reproduction", sa.String(128), nullable=False),
        sa.Column("algorithm", sa.String(32), nullable=False),
        sa.Column("backbone", sa.String(32), nullable=False),
        sa.Column("task", sa.String(32), nullable=False),
        sa.Column("scale", sa.String(16), nullable=False),
        sa.Column("config_json", sa.Text, nullable=False),
        sa.Column("config_hash", sa.String(64), nullable=False),
        sa.Column("modified", sa.Boolean, nullable=False),
        sa.Column("overrides_json", sa.Text, nullable=False),
        sa.Column("seed", sa.Integer, nullable=False),
        sa.Column("code_version", sa.String(128), nullable=False),
        sa.Column("packages_json", sa.Text, nullable=False),
        sa.Column("hardware_json", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("host", sa.String(255), nullable=True),
        sa.Column("pid", sa.Integer, nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("duration_s", sa.Float, nullable=True),
    )
    op.create_index("ix_runs_reproduction", "runs", ["reproduction"])
    op.create_index("ix_runs_scale", "runs", ["scale"])
    op.create_index("ix_runs_config_hash", "runs", ["config_hash"])
    op.create_index("ix_runs_status", "runs", ["status"])

    op.create_table(
        "step_metrics",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("reward_mean", sa.Float, nullable=True),
        sa.Column("reward_std", sa.Float, nullable=True),
        sa.Column("loss", sa.Float, nullable=True),
        sa.Column("kl", sa.Float, nullable=True),
        sa.Column("entropy", sa.Float, nullable=True),
        sa.Column("tokens_per_forward", sa.Float, nullable=True),
        sa.Column("peak_memory_mb", sa.Float, nullable=True),
        sa.Column("stage_seconds_json", sa.Text, nullable=False),
        sa.Column("extra_json", sa.Text, nullable=False),
        sa.Column("logged_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("run_id", "step", name="uq_step_metrics_run_step"),
    )
    op.create_index("ix_step_metrics_run_id", "step_metrics", ["run_id"])

    op.create_table(
        "evaluations",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("task", sa.String(32), nullable=False),
        sa.Column("split", sa.String(64), nullable=False),
        sa.Column("data_fingerprint", sa.String(128), nullable=False),
        sa.Column("sampler_preset", sa.String(128), nullable=True),
        sa.Column("sampler_json", sa.Text, nullable=False),
        sa.Column("metrics_json", sa.Text, nullable=False),
        sa.Column("primary_metric", sa.String(64), nullable=False),
        sa.Column("primary_value", sa.Float, nullable=False),
        sa.Column("n_items", sa.Integer, nullable=False),
        sa.Column("checkpoint", sa.String(512), nullable=True),
        sa.Column("step", sa.Integer, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_evaluations_run_id", "evaluations", ["run_id"])

    op.create_table(
        "samples",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("evaluation_id", sa.Integer, sa.ForeignKey("evaluations.id", ondelete="CASCADE"), nullable=False),
        sa.Column("idx", sa.Integer, nullable=False),
        sa.Column("item_id", sa.String(128), nullable=True),
        sa.Column("prompt", sa.Text, nullable=True),
        sa.Column("completion", sa.Text, nullable=False),
        sa.Column("reference", sa.Text, nullable=True),
        sa.Column("score", sa.Float, nullable=False),
        sa.Column("correct", sa.Boolean, nullable=True),
        sa.Column("extra_json", sa.Text, nullable=False),
        sa.UniqueConstraint("evaluation_id", "idx", name="uq_samples_eval_idx"),
    )
    op.create_index("ix_samples_evaluation_id", "samples", ["evaluation_id"])


def downgrade() -> None:
    for table in ("samples", "evaluations", "step_metrics", "runs"):
        op.drop_table(table)
