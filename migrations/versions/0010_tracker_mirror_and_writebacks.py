"""tasks keep what their external tracker says of them, and status write-backs go through a durable outbox

- `tasks.external_id`: the issue's id in its tracker (a Beads id). A task's own id is that id, or, when another
  project already uses it, the id qualified with the project key (`KEY.bd-a1b2`): ids are per project for
  imports. Backfilled from `id` for the tasks already imported from Beads.
- `tasks.tracker_status`: the issue's status in its tracker, in the tracker's own words (`hooked`, `pinned`, …).
- `tasks.hold`: why the tracker keeps the issue out of its ready set (its status, type, ephemeral, pinned,
  deferred); null when nothing does. `ready` never lists a held task.
- `tracker_writebacks`: one row per status write owed to the tracker, written in the transition's commit,
  retried with backoff until done; failed and dismissed rows stay for the operator and the audit.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24 21:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    # Plain ADD/DROP COLUMN, not a batch copy: SQLite would have to recreate `tasks`, which sessions and
    # dependencies reference, and the copy fails the foreign keys on a database that holds sessions.
    op.add_column("tasks", sa.Column("external_id", sa.String(64), nullable=True))
    op.add_column("tasks", sa.Column("tracker_status", sa.String(32), nullable=True))
    op.add_column("tasks", sa.Column("hold", sa.String(200), nullable=True))
    op.create_index("uq_tasks_project_source_external", "tasks", ["project_id", "source", "external_id"], unique=True)
    op.execute("UPDATE tasks SET external_id = id WHERE source = 'beads'")
    op.create_table(
        "tracker_writebacks",
        sa.Column("id", _BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("project_id", sa.Integer, sa.ForeignKey("projects.id", name="fk_tracker_writebacks_project_id_projects"), nullable=False),
        sa.Column("task_id", sa.String(64), sa.ForeignKey("tasks.id", name="fk_tracker_writebacks_task_id_tasks"), nullable=False),
        sa.Column("session_id", sa.String(36), nullable=True),
        sa.Column("tracker", sa.String(16), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("reason", sa.Text, nullable=False, server_default=sa.text("''")),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("resolved_by", sa.String(100), nullable=True),
    )
    op.create_index("ix_tracker_writebacks_state_next", "tracker_writebacks", ["state", "next_attempt_at"])
    op.create_index("ix_tracker_writebacks_task", "tracker_writebacks", ["task_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_tracker_writebacks_task", "tracker_writebacks")
    op.drop_index("ix_tracker_writebacks_state_next", "tracker_writebacks")
    op.drop_table("tracker_writebacks")
    op.drop_index("uq_tasks_project_source_external", "tasks")
    for column in ("hold", "tracker_status", "external_id"):
        op.execute(f"ALTER TABLE tasks DROP COLUMN {column}")  # SQLite ≥ 3.35 and PostgreSQL, no table copy
