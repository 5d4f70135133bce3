"""session snapshots (context and review checkpoints) and the tracker a task came from

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21 22:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "session_snapshots",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(length=36), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["session_id"], ["sessions.id"], name=op.f("fk_session_snapshots_session_id_sessions")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_session_snapshots")),
    )
    op.create_index("ix_session_snapshots_session_id", "session_snapshots", ["session_id", "id"])
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("source", sa.String(length=16), server_default=sa.text("'builtin'"), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("source")
    op.drop_index("ix_session_snapshots_session_id", table_name="session_snapshots")
    op.drop_table("session_snapshots")
