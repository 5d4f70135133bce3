"""agents: the CLI's own conversation of each run, and the earlier one it continued (issue 42)

`conversation_id` is the id the agent's CLI gave its conversation (Claude Code's session id, Codex's thread id),
read from its log when it ends; `resumed_from` the earlier run's conversation this run continued (`--resume`,
`exec resume`) on request_changes, a CI round or a retry; `resume_failed` why continuing it failed (the conversation
was gone), after which the agent ran afresh. Shown with each agent by `session status`, the console and MCP. Agents
of earlier releases keep NULL.

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-29 07:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN (as 0012, 0018, 0019): a batch copy of `agents` would fail foreign keys on SQLite.
    op.add_column("agents", sa.Column("conversation_id", sa.String(200), nullable=True))
    op.add_column("agents", sa.Column("resumed_from", sa.String(200), nullable=True))
    op.add_column("agents", sa.Column("resume_failed", sa.Text, nullable=True))


def downgrade() -> None:
    for column in ("resume_failed", "resumed_from", "conversation_id"):
        op.execute(f"ALTER TABLE agents DROP COLUMN {column}")
