"""agents: the process group, the leader's start time and the signal a stop ended it with

A stop from any taskgate process on the agent's node (not only the one supervising it) ends the agent's process
group; the leader's start time (/proc/<pid>/stat field 22) tells its own process from one that reused the pid
(infrastructure/process_groups.py). `ended_by` says whether SIGTERM or SIGKILL ended it. Agents of earlier
releases keep NULL: only a leader that is still there is signalled for them.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28 17:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN (as 0012): a batch copy of `agents` would fail foreign keys on SQLite.
    op.add_column("agents", sa.Column("pgid", sa.Integer(), nullable=True))
    op.add_column("agents", sa.Column("process_start", sa.BigInteger(), nullable=True))
    op.add_column("agents", sa.Column("ended_by", sa.String(16), nullable=True))


def downgrade() -> None:
    for column in ("ended_by", "process_start", "pgid"):
        op.execute(f"ALTER TABLE agents DROP COLUMN {column}")
