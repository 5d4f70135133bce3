"""agents: the sandbox each agent ran in

`sandbox` says how the agent's process was confined (issue 39): `bwrap; network …` (its network: none, open, or
the allow-list), or `off: <why>` (the `[sandbox] mode`, or what the host lacks). Shown by `session status`, the
console and MCP with each agent; the same words are in its `agent.status` event on the audit log. Agents of
earlier releases keep NULL (they ran before there was a sandbox).

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-28 20:50:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN (as 0012, 0018): a batch copy of `agents` would fail foreign keys on SQLite.
    op.add_column("agents", sa.Column("sandbox", sa.String(1000), nullable=True))


def downgrade() -> None:
    op.execute("ALTER TABLE agents DROP COLUMN sandbox")
