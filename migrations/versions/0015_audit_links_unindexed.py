"""audit links lose their (record_table, record_id) index: one b-tree less written per audited record

A transition writes two audited records; each link's entry in that index was a page of its own to write at every
commit (about a third of what chaining added to a transition on SQLite) and ~60 bytes per record. Its one reader
was the verify's search for records without a link, which now runs as one anti-join per table (docs/audit.md).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-25 13:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("uq_audit_links_record", table_name="audit_links")


def downgrade() -> None:
    op.create_index("uq_audit_links_record", "audit_links", ["record_table", "record_id"], unique=True)
