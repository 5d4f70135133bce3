"""decisions are unique per verification and operator; webhook deliveries; test runs of require_tests

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21 23:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("decisions") as batch:
        batch.add_column(
            sa.Column("outcome", sa.String(length=20), server_default=sa.text("'applied'"), nullable=False)
        )
        batch.add_column(sa.Column("to_state", sa.String(length=20), nullable=True))
    # One decision per operator per verification (the session at one version): the idempotency backstop.
    op.create_index(
        "uq_decisions_verification_operator", "decisions", ["session_id", "session_version", "operator_id"], unique=True
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("event_id", BigId, nullable=False),
        sa.Column("subscriber", sa.String(length=100), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["event_id"], ["events.id"], name=op.f("fk_webhook_deliveries_event_id_events")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_deliveries")),
        sa.UniqueConstraint("event_id", "subscriber", name="uq_webhook_deliveries_event_subscriber"),
    )
    op.create_index("ix_webhook_deliveries_status_next", "webhook_deliveries", ["status", "next_attempt_at"])
    op.create_table(
        "test_runs",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(length=36), nullable=False),
        sa.Column("session_version", sa.Integer(), nullable=False),
        sa.Column("command", sa.JSON(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("timed_out", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("duration_ms", sa.Integer(), nullable=False),
        sa.Column("output_tail", sa.Text(), nullable=False),
        sa.Column("head_commit", sa.String(length=64), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["session_id"], ["sessions.id"], name=op.f("fk_test_runs_session_id_sessions")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_test_runs")),
    )
    op.create_index("ix_test_runs_session_id", "test_runs", ["session_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_test_runs_session_id", table_name="test_runs")
    op.drop_table("test_runs")
    op.drop_index("ix_webhook_deliveries_status_next", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_index("uq_decisions_verification_operator", table_name="decisions")
    with op.batch_alter_table("decisions") as batch:
        batch.drop_column("to_state")
        batch.drop_column("outcome")
