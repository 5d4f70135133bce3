"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-21 20:29:28.208345
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table('events',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('session_id', sa.String(length=36), nullable=True),
    sa.Column('kind', sa.String(length=64), nullable=False),
    sa.Column('payload', sa.JSON(), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_events'))
    )
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_events_at'), ['at'], unique=False)
        batch_op.create_index(batch_op.f('ix_events_session_id'), ['session_id'], unique=False)

    op.create_table('operators',
    sa.Column('id', sa.String(length=100), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('email', sa.String(length=320), nullable=True),
    sa.Column('roles', sa.JSON(), nullable=False),
    sa.Column('permissions', sa.JSON(), nullable=False),
    sa.Column('max_active_sessions', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_operators'))
    )
    op.create_table('projects',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('key', sa.String(length=8), nullable=False),
    sa.Column('root_path', sa.Text(), nullable=False),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('task_seq', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('archived_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_projects')),
    sa.UniqueConstraint('key', name=op.f('uq_projects_key')),
    sa.UniqueConstraint('name', name=op.f('uq_projects_name')),
    sa.UniqueConstraint('root_path', name=op.f('uq_projects_root_path'))
    )
    op.create_table('plans',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('project_id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_plans_project_id_projects')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_plans'))
    )
    with op.batch_alter_table('plans', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_plans_project_id'), ['project_id'], unique=False)

    op.create_table('tasks',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('project_id', sa.Integer(), nullable=False),
    sa.Column('plan_id', sa.Integer(), nullable=True),
    sa.Column('title', sa.Text(), nullable=False),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('priority', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['plan_id'], ['plans.id'], name=op.f('fk_tasks_plan_id_plans')),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_tasks_project_id_projects')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_tasks'))
    )
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_tasks_plan_id'), ['plan_id'], unique=False)
        batch_op.create_index('ix_tasks_project_status', ['project_id', 'status'], unique=False)

    op.create_table('sessions',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('task_id', sa.String(length=64), nullable=False),
    sa.Column('project_id', sa.Integer(), nullable=False),
    sa.Column('plan_id', sa.Integer(), nullable=True),
    sa.Column('operator_id', sa.String(length=100), nullable=True),
    sa.Column('state', sa.String(length=20), nullable=False),
    sa.Column('prior_state', sa.String(length=20), nullable=True),
    sa.Column('state_data', sa.JSON(), nullable=False),
    sa.Column('workflow_stack', sa.JSON(), nullable=False),
    sa.Column('branch_name', sa.Text(), nullable=True),
    sa.Column('worktree_path', sa.Text(), nullable=True),
    sa.Column('compensation_plan', sa.String(length=32), nullable=True),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('completed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('deadline', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['operator_id'], ['operators.id'], name=op.f('fk_sessions_operator_id_operators')),
    sa.ForeignKeyConstraint(['plan_id'], ['plans.id'], name=op.f('fk_sessions_plan_id_plans')),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_sessions_project_id_projects')),
    sa.ForeignKeyConstraint(['task_id'], ['tasks.id'], name=op.f('fk_sessions_task_id_tasks')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_sessions'))
    )
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.create_index('ix_sessions_plan_state', ['plan_id', 'state'], unique=False)
        batch_op.create_index(batch_op.f('ix_sessions_project_id'), ['project_id'], unique=False)
        batch_op.create_index('ix_sessions_task_id', ['task_id'], unique=False)
        batch_op.create_index('uq_sessions_active_task', ['task_id'], unique=True, sqlite_where=sa.text("state NOT IN ('completed', 'cancelled')"), postgresql_where=sa.text("state NOT IN ('completed', 'cancelled')"))

    op.create_table('task_dependencies',
    sa.Column('task_id', sa.String(length=64), nullable=False),
    sa.Column('depends_on_id', sa.String(length=64), nullable=False),
    sa.Column('type', sa.String(length=32), nullable=False),
    sa.ForeignKeyConstraint(['depends_on_id'], ['tasks.id'], name=op.f('fk_task_dependencies_depends_on_id_tasks')),
    sa.ForeignKeyConstraint(['task_id'], ['tasks.id'], name=op.f('fk_task_dependencies_task_id_tasks')),
    sa.PrimaryKeyConstraint('task_id', 'depends_on_id', name=op.f('pk_task_dependencies'))
    )
    with op.batch_alter_table('task_dependencies', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_task_dependencies_depends_on_id'), ['depends_on_id'], unique=False)

    op.create_table('agents',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('session_id', sa.String(length=36), nullable=False),
    sa.Column('agent_type', sa.String(length=100), nullable=False),
    sa.Column('command', sa.JSON(), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('exit_code', sa.Integer(), nullable=True),
    sa.Column('output_path', sa.Text(), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('completed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['session_id'], ['sessions.id'], name=op.f('fk_agents_session_id_sessions')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_agents'))
    )
    with op.batch_alter_table('agents', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_agents_session_id'), ['session_id'], unique=False)

    op.create_table('decisions',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('session_id', sa.String(length=36), nullable=False),
    sa.Column('operator_id', sa.String(length=100), nullable=False),
    sa.Column('decision', sa.String(length=20), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('instructions', sa.Text(), nullable=True),
    sa.Column('override_policies', sa.JSON(), nullable=False),
    sa.Column('compensation', sa.String(length=32), nullable=True),
    sa.Column('session_version', sa.Integer(), nullable=False),
    sa.Column('policy_results', sa.JSON(), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['operator_id'], ['operators.id'], name=op.f('fk_decisions_operator_id_operators')),
    sa.ForeignKeyConstraint(['session_id'], ['sessions.id'], name=op.f('fk_decisions_session_id_sessions')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_decisions'))
    )
    with op.batch_alter_table('decisions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_decisions_session_id'), ['session_id'], unique=False)

    op.create_table('transition_log',
    sa.Column('seq', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('session_id', sa.String(length=36), nullable=False),
    sa.Column('trigger', sa.String(length=32), nullable=False),
    sa.Column('from_state', sa.String(length=20), nullable=True),
    sa.Column('to_state', sa.String(length=20), nullable=False),
    sa.Column('outcome', sa.String(length=10), nullable=False),
    sa.Column('actor', sa.String(length=200), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('guard_results', sa.JSON(), nullable=False),
    sa.Column('session_version', sa.Integer(), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['session_id'], ['sessions.id'], name=op.f('fk_transition_log_session_id_sessions')),
    sa.PrimaryKeyConstraint('seq', name=op.f('pk_transition_log'))
    )
    with op.batch_alter_table('transition_log', schema=None) as batch_op:
        batch_op.create_index('ix_transition_log_actor_at', ['actor', 'at'], unique=False)
        batch_op.create_index('ix_transition_log_at', ['at'], unique=False)
        batch_op.create_index('ix_transition_log_session_at', ['session_id', 'at'], unique=False)
        batch_op.create_index('ix_transition_log_session_seq', ['session_id', 'seq'], unique=False)
        batch_op.create_index('ix_transition_log_to_state_at', ['to_state', 'at'], unique=False)




def downgrade() -> None:

    with op.batch_alter_table('transition_log', schema=None) as batch_op:
        batch_op.drop_index('ix_transition_log_to_state_at')
        batch_op.drop_index('ix_transition_log_session_seq')
        batch_op.drop_index('ix_transition_log_session_at')
        batch_op.drop_index('ix_transition_log_at')
        batch_op.drop_index('ix_transition_log_actor_at')

    op.drop_table('transition_log')
    with op.batch_alter_table('decisions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_decisions_session_id'))

    op.drop_table('decisions')
    with op.batch_alter_table('agents', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_agents_session_id'))

    op.drop_table('agents')
    with op.batch_alter_table('task_dependencies', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_task_dependencies_depends_on_id'))

    op.drop_table('task_dependencies')
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.drop_index('uq_sessions_active_task', sqlite_where=sa.text("state NOT IN ('completed', 'cancelled')"), postgresql_where=sa.text("state NOT IN ('completed', 'cancelled')"))
        batch_op.drop_index('ix_sessions_task_id')
        batch_op.drop_index(batch_op.f('ix_sessions_project_id'))
        batch_op.drop_index('ix_sessions_plan_state')

    op.drop_table('sessions')
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.drop_index('ix_tasks_project_status')
        batch_op.drop_index(batch_op.f('ix_tasks_plan_id'))

    op.drop_table('tasks')
    with op.batch_alter_table('plans', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_plans_project_id'))

    op.drop_table('plans')
    op.drop_table('projects')
    op.drop_table('operators')
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_events_session_id'))
        batch_op.drop_index(batch_op.f('ix_events_at'))

    op.drop_table('events')

