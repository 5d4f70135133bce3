"""pull_requests and forge_deliveries: the forge loop (issue 40, docs/forge.md)

`pull_requests` holds one row per session pushed to a forge: what taskgate pushed (`pushed`, the lease of its next
push), the pull request (`number`, `url`), the forge's last look (`observation`, stored by compare-and-swap on
`pushed`), its sub-state of awaiting_merge (`status`), what happened last, and whether a webhook asked for a look.
`forge_deliveries` records each webhook delivery by its id, so a replay is refused by the key and counted.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-28 23:50:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pull_requests",
        sa.Column("session_id", sa.String(36), sa.ForeignKey("sessions.id"), primary_key=True),
        sa.Column("project_id", sa.Integer, sa.ForeignKey("projects.id"), nullable=False),
        sa.Column("branch", sa.String(500), nullable=False),
        sa.Column("base", sa.String(500), nullable=False),
        sa.Column("number", sa.Integer, nullable=True),
        sa.Column("url", sa.Text, nullable=True),
        sa.Column("pushed", sa.String(64), nullable=True),
        sa.Column("pushed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("observation", sa.JSON, nullable=True),
        sa.Column("observed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("note", sa.Text, nullable=False, server_default=sa.text("''")),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("poke", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_pull_requests_branch", "pull_requests", ["branch"])
    op.create_table(
        "forge_deliveries",
        sa.Column("id", sa.String(100), primary_key=True),
        sa.Column("event", sa.String(100), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("forge_deliveries")
    op.drop_index("ix_pull_requests_branch", table_name="pull_requests")
    op.drop_table("pull_requests")
