"""leases and session affinity: a session records the node holding its worktree (`sessions.node_id`), a node its
MCP address and when a surviving node found it down (`nodes.url`, `nodes.down_at`), and `leases` names the work
one node at a time does for all (the sweeper's turn) (docs/nodes.md)

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-25 14:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN (as 0010-0012): a batch copy of `sessions` would fail foreign keys on SQLite. Sessions of
    # earlier releases keep NULL: held by no node, any node may change them (one machine, as before).
    op.add_column("sessions", sa.Column("node_id", sa.String(200), nullable=True))
    op.add_column("nodes", sa.Column("url", sa.Text(), nullable=True))
    op.add_column("nodes", sa.Column("down_at", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "leases",
        sa.Column("name", sa.String(100), primary_key=True),
        sa.Column("holder", sa.String(300), nullable=False),
        sa.Column("node_id", sa.String(200), nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("leases")
    op.execute("ALTER TABLE nodes DROP COLUMN down_at")
    op.execute("ALTER TABLE nodes DROP COLUMN url")
    op.execute("ALTER TABLE sessions DROP COLUMN node_id")
