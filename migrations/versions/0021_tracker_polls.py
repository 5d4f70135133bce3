"""tracker_polls: the last poll of each project's external tracker and what dispatch made of it (issue 41)

One row per project read from GitHub Issues, Linear or Beads: when it was polled, what the poll cost (requests, of
them 304s, seconds), its error, and a JSON report (ready, held with why, claimed, each dispatch decision), written by
the process holding the sweeper's lease and read by `taskgate tracker status` and the console.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-29 03:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tracker_polls",
        sa.Column("project_id", sa.Integer, sa.ForeignKey("projects.id"), primary_key=True),
        sa.Column("provider", sa.String(32), nullable=False),
        sa.Column("describe", sa.Text, nullable=False),
        sa.Column("polled_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("calls", sa.Integer, nullable=False),
        sa.Column("not_modified", sa.Integer, nullable=False),
        sa.Column("seconds", sa.Float, nullable=False),
        sa.Column("report", sa.JSON, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("tracker_polls")
