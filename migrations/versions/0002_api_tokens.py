"""api tokens

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21 21:18:11.069730
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table('api_tokens',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('operator_id', sa.String(length=100), nullable=True),
    sa.Column('session_id', sa.String(length=36), nullable=True),
    sa.Column('label', sa.String(length=200), server_default=sa.text("('')"), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['operator_id'], ['operators.id'], name=op.f('fk_api_tokens_operator_id_operators')),
    sa.ForeignKeyConstraint(['session_id'], ['sessions.id'], name=op.f('fk_api_tokens_session_id_sessions')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_tokens')),
    sa.UniqueConstraint('token_hash', name=op.f('uq_api_tokens_token_hash'))
    )



def downgrade() -> None:

    op.drop_table('api_tokens')

