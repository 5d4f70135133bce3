"""board index: the project's sessions by state and time in it (issue 43)

The console's board counts a project's sessions per state (GROUP BY state) and reads one page of each column, the
most recently moved first. `ix_sessions_project_state_updated` (project_id, state, updated_at) covers the counts
and reads each column's page in order from its states' entries alone, instead of every session of the project.

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-29 10:30:00
"""

from __future__ import annotations

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_sessions_project_state_updated", "sessions", ["project_id", "state", "updated_at"])


def downgrade() -> None:
    op.drop_index("ix_sessions_project_state_updated", table_name="sessions")
