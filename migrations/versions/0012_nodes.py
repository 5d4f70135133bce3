"""nodes: each service process's node id is recorded with the agents it launches (`agents.node_id`), and every
node heartbeats into `nodes` (docs/nodes.md), so that recovery touches only its own agents and `taskgate nodes`
lists who is alive

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25 13:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN (as 0010, 0011): a batch copy of `agents` would fail foreign keys on SQLite. Agents of
    # earlier releases keep NULL: recorded by no node, they are taken as the recovering node's own (one machine).
    op.add_column("agents", sa.Column("node_id", sa.String(200), nullable=True))
    op.create_table(
        "nodes",
        sa.Column("id", sa.String(200), primary_key=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("data_dir", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(50), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("nodes")
    op.execute("ALTER TABLE agents DROP COLUMN node_id")
