"""Reported scores table; ingest bookkeeping (evaluation uid for idempotent re-ingest, run origin).

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reported_scores",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("reproduction", sa.String(128), nullable=False),
        sa.Column("algorithm", sa.String(32), nullable=False),
        sa.Column("backbone", sa.String(32), nullable=False),
        sa.Column("task", sa.String(32), nullable=False),
        sa.Column("table_id", sa.String(128), nullable=False),
        sa.Column("metric", sa.String(64), nullable=False),
        sa.Column("value", sa.Float, nullable=False),
        sa.Column("source_kind", sa.String(16), nullable=False),
        sa.Column("source_ref", sa.String(255), nullable=False),
        sa.Column("source_table", sa.String(255), nullable=True),
        sa.Column("source_file", sa.String(512), nullable=True),
        sa.Column("source_commit", sa.String(64), nullable=True),
        sa.Column("settings_json", sa.Text, nullable=False),
        sa.Column("note", sa.Text, nullable=True),
        sa.UniqueConstraint("reproduction", "table_id", "metric", "settings_json", name="uq_reported_scores"),
    )
    op.create_index("ix_reported_scores_reproduction", "reported_scores", ["reproduction"])
    with op.batch_alter_table("evaluations") as batch:
        batch.add_column(sa.Column("uid", sa.String(64), nullable=True))
        batch.create_unique_constraint("uq_evaluations_uid", ["uid"])
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("origin", sa.String(16), nullable=False, server_default="local"))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("origin")
    with op.batch_alter_table("evaluations") as batch:
        batch.drop_constraint("uq_evaluations_uid", type_="unique")
        batch.drop_column("uid")
    op.drop_table("reported_scores")
