"""tasks carry labels: `tasks.labels`, a JSON list of task labels (domain/workflows/triggers.py `LABEL`), given by `task add
--label` or copied from Beads; a workflow's `label:<name>` trigger names one (docs/workflows.md#triggers)

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN (as 0010): a batch copy of `tasks` would fail the foreign keys of its sessions on SQLite.
    op.add_column("tasks", sa.Column("labels", sa.JSON(), nullable=False, server_default=sa.text("'[]'")))


def downgrade() -> None:
    op.execute("ALTER TABLE tasks DROP COLUMN labels")  # SQLite ≥ 3.35 and PostgreSQL, no table copy
