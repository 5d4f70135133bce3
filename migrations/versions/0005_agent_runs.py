"""agent runs: the process id (to re-attach after a restart), the run number, the output tail, the error

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-21 23:58:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("agents") as batch:
        batch.add_column(sa.Column("run", sa.Integer(), server_default=sa.text("1"), nullable=False))
        batch.add_column(sa.Column("pid", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("output_tail", sa.Text(), server_default=sa.text("''"), nullable=False))
        batch.add_column(sa.Column("error", sa.Text(), nullable=True))
    op.create_index("ix_agents_status", "agents", ["status"])


def downgrade() -> None:
    op.drop_index("ix_agents_status", table_name="agents")
    with op.batch_alter_table("agents") as batch:
        batch.drop_column("error")
        batch.drop_column("output_tail")
        batch.drop_column("pid")
        batch.drop_column("run")
