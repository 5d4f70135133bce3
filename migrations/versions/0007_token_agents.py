"""agent tokens name their agent, so revocation is durable: an agent's tokens are revoked with its end, in the
same transaction, and start-up revokes the tokens of agents that ended while no service ran

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23 22:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.add_column(sa.Column("agent_id", sa.String(length=36), nullable=True))
    op.create_index("ix_api_tokens_agent", "api_tokens", ["agent_id"])
    op.create_index("ix_api_tokens_session", "api_tokens", ["session_id"])
    # Tokens issued before this revision carried their agent only in the label ("agent <uuid>"): adopt it, so
    # start-up revokes those of ended agents too.
    op.execute(
        "UPDATE api_tokens SET agent_id = substr(label, 7) "
        "WHERE kind = 'agent' AND label LIKE 'agent %' AND length(label) = 42"
    )


def downgrade() -> None:
    op.drop_index("ix_api_tokens_session", table_name="api_tokens")
    op.drop_index("ix_api_tokens_agent", table_name="api_tokens")
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_column("agent_id")
