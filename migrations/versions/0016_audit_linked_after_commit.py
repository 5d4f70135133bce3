"""audit records are linked after their commit, by the linker: `audit_marks` says how far each table is linked

Until now each audited record was linked in the transaction that wrote it. From here a writer only inserts its
record; the linker (application/audit/linking.py) links the records of every table above its mark, in batches,
before any checkpoint, verify, export or prune, and every `[audit] link_interval_s` in `taskgate serve`
(docs/decisions.md, "Audit records linked after their commit"). Every record in the database at this revision was
linked by the transaction that wrote it, so each table's mark starts at its largest primary key.

Downgrading drops the marks: records written since and not yet linked would then show as "no link" to the older
verify; run `taskgate audit checkpoint` (which links them first) before downgrading.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27 16:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_KEYS = {"transition_log": "seq", "decisions": "id", "events": "id"}


def upgrade() -> None:
    op.create_table(
        "audit_marks",
        sa.Column("record_table", sa.String(20), primary_key=True),
        sa.Column("linked_upto", sa.BigInteger, nullable=False),
        sqlite_with_rowid=False,
    )
    for table, key in _KEYS.items():
        op.execute(
            f"INSERT INTO audit_marks (record_table, linked_upto) "  # noqa: S608 - names from the constant above
            f"SELECT '{table}', coalesce(max({key}), 0) FROM {table}"
        )


def downgrade() -> None:
    op.drop_table("audit_marks")
