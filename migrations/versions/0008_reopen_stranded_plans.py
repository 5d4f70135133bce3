"""reopen plans that closed while they still hold unfinished tasks (added to a closed plan before adding one
reopened it): those tasks were listed ready but could not start, and `ready` now hides them

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23 22:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "UPDATE plans SET status = 'open' WHERE status = 'closed' AND EXISTS "
        "(SELECT 1 FROM tasks WHERE tasks.plan_id = plans.id AND tasks.status != 'completed')"
    )


def downgrade() -> None:
    pass  # a plan reopened here closes again with its last task, as any plan does
