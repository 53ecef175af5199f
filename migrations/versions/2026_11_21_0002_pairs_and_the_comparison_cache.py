"""pairs and the comparison cache

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21 09:42:28.862722
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('comparison_results',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('cache_key', sa.String(length=80), nullable=False),
    sa.Column('digests_a', sa.JSON(), nullable=False),
    sa.Column('digests_b', sa.JSON(), nullable=False),
    sa.Column('alignment_key', sa.Text(), nullable=False),
    sa.Column('rtol', sa.Double(), nullable=False),
    sa.Column('atol', sa.Double(), nullable=False),
    sa.Column('stats', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_comparison_results')),
    sa.UniqueConstraint('cache_key', name=op.f('uq_comparison_results_cache_key'))
    )
    op.create_table('pair_overrides',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('session_id', sa.Integer(), nullable=False),
    sa.Column('run_b_id', sa.Integer(), nullable=False),
    sa.Column('action', sa.String(length=10), nullable=False),
    sa.Column('a_name', sa.Text(), nullable=False),
    sa.Column('b_name', sa.Text(), nullable=False),
    sa.Column('steps', sa.JSON(), nullable=True),
    sa.ForeignKeyConstraint(['run_b_id'], ['runs.id'], name=op.f('fk_pair_overrides_run_b_id_runs'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['session_id'], ['sessions.id'], name=op.f('fk_pair_overrides_session_id_sessions'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_pair_overrides'))
    )
    with op.batch_alter_table('pair_overrides', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_pair_overrides_session_id'), ['session_id'], unique=False)

    op.create_table('pairs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('session_id', sa.Integer(), nullable=False),
    sa.Column('run_a_id', sa.Integer(), nullable=False),
    sa.Column('run_b_id', sa.Integer(), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('layer', sa.Integer(), nullable=True),
    sa.Column('stage', sa.String(length=200), nullable=True),
    sa.Column('strategy', sa.String(length=20), nullable=False),
    sa.Column('a_name', sa.Text(), nullable=False),
    sa.Column('b_name', sa.Text(), nullable=False),
    sa.Column('a_tensor_ids', sa.JSON(), nullable=False),
    sa.Column('b_tensor_ids', sa.JSON(), nullable=False),
    sa.Column('alignment', sa.JSON(), nullable=True),
    sa.Column('alignment_overridden', sa.Boolean(), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('result_id', sa.Integer(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['result_id'], ['comparison_results.id'], name=op.f('fk_pairs_result_id_comparison_results'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['run_a_id'], ['runs.id'], name=op.f('fk_pairs_run_a_id_runs'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['run_b_id'], ['runs.id'], name=op.f('fk_pairs_run_b_id_runs'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['session_id'], ['sessions.id'], name=op.f('fk_pairs_session_id_sessions'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_pairs'))
    )
    with op.batch_alter_table('pairs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_pairs_run_b_id'), ['run_b_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_pairs_session_id'), ['session_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_pairs_status'), ['status'], unique=False)

    op.create_table('unmatched',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('session_id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('other_run_id', sa.Integer(), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('tensor_ids', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['other_run_id'], ['runs.id'], name=op.f('fk_unmatched_other_run_id_runs'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_unmatched_run_id_runs'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['session_id'], ['sessions.id'], name=op.f('fk_unmatched_session_id_sessions'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_unmatched'))
    )
    with op.batch_alter_table('unmatched', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_unmatched_session_id'), ['session_id'], unique=False)

    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('rtol', sa.Double(), nullable=True))
        batch_op.add_column(sa.Column('atol', sa.Double(), nullable=True))



def downgrade() -> None:
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.drop_column('atol')
        batch_op.drop_column('rtol')

    with op.batch_alter_table('unmatched', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_unmatched_session_id'))

    op.drop_table('unmatched')
    with op.batch_alter_table('pairs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_pairs_status'))
        batch_op.drop_index(batch_op.f('ix_pairs_session_id'))
        batch_op.drop_index(batch_op.f('ix_pairs_run_b_id'))

    op.drop_table('pairs')
    with op.batch_alter_table('pair_overrides', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_pair_overrides_session_id'))

    op.drop_table('pair_overrides')
    op.drop_table('comparison_results')
