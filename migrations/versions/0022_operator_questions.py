"""operator_questions: agents' questions and permission prompts to the operator (issue 42)

One row per `ask_operator` call or Claude Code permission prompt: what was asked (the question and its choices, or
the tool and its input), by which agent, until when, and how it ended (answered by whom, timed out, cancelled). A
question ends once, by a compare-and-swap on status = 'open'.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-29 07:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "operator_questions",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("session_id", sa.String(36), sa.ForeignKey("sessions.id"), nullable=False),
        sa.Column("agent_id", sa.String(64), nullable=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("choices", sa.JSON, nullable=False),
        sa.Column("tool_name", sa.String(200), nullable=True),
        sa.Column("tool_input", sa.Text, nullable=True),
        sa.Column("asked_by", sa.String(200), nullable=False),
        sa.Column("asked_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deadline", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("answer", sa.Text, nullable=True),
        sa.Column("message", sa.Text, nullable=True),
        sa.Column("answered_by", sa.String(200), nullable=True),
        sa.Column("answered_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_operator_questions_open", "operator_questions", ["status", "session_id"])
    op.create_index("ix_operator_questions_session", "operator_questions", ["session_id", "asked_at"])


def downgrade() -> None:
    op.drop_table("operator_questions")
