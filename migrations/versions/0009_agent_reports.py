"""agents keep the account their CLI gave of its run (final message, turns, tokens, cost, its error): `report`,
parsed from the agent's log when it ends (null for plain-text agents and for agents that ended before)

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("agents") as batch:
        batch.add_column(sa.Column("report", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("agents") as batch:
        batch.drop_column("report")
