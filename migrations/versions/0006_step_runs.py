"""step runs: one row per attempt of a workflow step (status, output summary, agents, error, when)

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22 01:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "step_runs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(length=36), nullable=False),
        sa.Column("depth", sa.Integer(), nullable=False),
        sa.Column("frame", sa.Text(), nullable=False),
        sa.Column("step_id", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("output_summary", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("agent_ids", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["session_id"], ["sessions.id"], name=op.f("fk_step_runs_session_id_sessions")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_step_runs")),
    )
    op.create_index("ix_step_runs_session", "step_runs", ["session_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_step_runs_session", table_name="step_runs")
    op.drop_table("step_runs")
