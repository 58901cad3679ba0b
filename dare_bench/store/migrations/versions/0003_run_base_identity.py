"""The tiny base a run started from: its weight hash (indexed: the leaderboard groups by it) and how its SFT step
was chosen (issue #16: machine-stable bases; `pipeline.base_cache.base_identity`); the training compute a run
counted (trainers/compute.py) and, for a compute-matched SFT control, the uid of the RL run it controls.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("base_sha256", sa.String(64), nullable=True))
        batch.add_column(sa.Column("base_json", sa.Text, nullable=False, server_default="{}"))
        batch.create_index("ix_runs_base_sha256", ["base_sha256"])
        batch.add_column(sa.Column("compute_json", sa.Text, nullable=False, server_default="{}"))
        batch.add_column(sa.Column("control_of", sa.String(64), nullable=True))
        batch.create_index("ix_runs_control_of", ["control_of"])


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_index("ix_runs_control_of")
        batch.drop_column("control_of")
        batch.drop_column("compute_json")
        batch.drop_index("ix_runs_base_sha256")
        batch.drop_column("base_json")
        batch.drop_column("base_sha256")
