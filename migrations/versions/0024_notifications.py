"""notifications: the notifier's cursor over the events log and its queue per channel (issue 42)

`notification_cursor` holds one row: the id of the last event the notifier read. `notifications` holds one row
per (channel, event) notice: pending until its batch is sent, then sent (or failed after the last attempt), with
its attempts, next try and last error for `taskgate notify status`. A channel is a hash of its Apprise URL, so
no secret of the URL is stored.

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-29 07:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "notification_cursor",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("event_id", BigId, nullable=False),
    )
    op.create_table(
        "notifications",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("event_id", BigId, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("notice", sa.JSON, nullable=False),
        sa.Column("queued_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("channel", "event_id", name="uq_notifications_channel_event"),
    )
    op.create_index("ix_notifications_channel_status", "notifications", ["channel", "status", "event_id"])


def downgrade() -> None:
    op.drop_index("ix_notifications_channel_status", table_name="notifications")
    op.drop_table("notifications")
    op.drop_table("notification_cursor")
