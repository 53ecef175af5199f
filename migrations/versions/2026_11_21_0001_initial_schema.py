"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-21 09:10:22.391543
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('sessions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('notes', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_sessions')),
    sa.UniqueConstraint('name', name=op.f('uq_sessions_name'))
    )
    op.create_table('runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('session_id', sa.Integer(), nullable=False),
    sa.Column('label', sa.String(length=200), nullable=False),
    sa.Column('role', sa.String(length=20), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('ingest_pid', sa.Integer(), nullable=True),
    sa.Column('ingest_host', sa.String(length=255), nullable=True),
    sa.Column('created_session', sa.Boolean(), nullable=False),
    sa.Column('sources', sa.JSON(), nullable=False),
    sa.Column('tensor_count', sa.Integer(), nullable=False),
    sa.Column('total_bytes', sa.BigInteger(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['session_id'], ['sessions.id'], name=op.f('fk_runs_session_id_sessions'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_runs')),
    sa.UniqueConstraint('session_id', 'label', name='uq_runs_session_label')
    )
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_runs_session_id'), ['session_id'], unique=False)

    op.create_table('problems',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('file', sa.Text(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_problems_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_problems'))
    )
    with op.batch_alter_table('problems', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_problems_run_id'), ['run_id'], unique=False)

    op.create_table('tensors',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('source_file', sa.Text(), nullable=False),
    sa.Column('key_path', sa.JSON(), nullable=False),
    sa.Column('layer', sa.Integer(), nullable=True),
    sa.Column('stage', sa.String(length=200), nullable=True),
    sa.Column('shape', sa.JSON(), nullable=False),
    sa.Column('dtype', sa.String(length=40), nullable=False),
    sa.Column('store_key', sa.String(length=200), nullable=False),
    sa.Column('nbytes', sa.BigInteger(), nullable=False),
    sa.Column('digest', sa.String(length=80), nullable=False),
    sa.Column('numel', sa.BigInteger(), nullable=False),
    sa.Column('min', sa.Double(), nullable=True),
    sa.Column('max', sa.Double(), nullable=True),
    sa.Column('mean', sa.Double(), nullable=True),
    sa.Column('std', sa.Double(), nullable=True),
    sa.Column('nan_count', sa.BigInteger(), nullable=False),
    sa.Column('inf_count', sa.BigInteger(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_tensors_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_tensors')),
    sa.UniqueConstraint('run_id', 'name', name='uq_tensors_run_name')
    )
    with op.batch_alter_table('tensors', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_tensors_digest'), ['digest'], unique=False)
        batch_op.create_index(batch_op.f('ix_tensors_run_id'), ['run_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('tensors', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_tensors_run_id'))
        batch_op.drop_index(batch_op.f('ix_tensors_digest'))

    op.drop_table('tensors')
    with op.batch_alter_table('problems', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_problems_run_id'))

    op.drop_table('problems')
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_runs_session_id'))

    op.drop_table('runs')
    op.drop_table('sessions')
