"""Secure aggregation: members' public keys and answers, routed encrypted shares, the unmasking deadline.

Revision ID: 0003
Revises: 0002
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('secagg_members',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('round_id', sa.Integer(), nullable=False),
    sa.Column('device_id', sa.String(length=32), nullable=False),
    sa.Column('index', sa.Integer(), nullable=False),
    sa.Column('c_public', sa.LargeBinary(length=32), nullable=False),
    sa.Column('s_public', sa.LargeBinary(length=32), nullable=False),
    sa.Column('shared_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('unmask_answer', sa.JSON(), nullable=True),
    sa.ForeignKeyConstraint(['device_id'], ['devices.id'], name=op.f('fk_secagg_members_device_id_devices'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['round_id'], ['rounds.id'], name=op.f('fk_secagg_members_round_id_rounds')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_secagg_members')),
    sa.UniqueConstraint('round_id', 'device_id', name=op.f('uq_secagg_members_round_id_device_id')),
    sa.UniqueConstraint('round_id', 'index', name=op.f('uq_secagg_members_round_id_index'))
    )
    with op.batch_alter_table('secagg_members', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_secagg_members_round_id'), ['round_id'], unique=False)

    op.create_table('secagg_shares',
    sa.Column('round_id', sa.Integer(), nullable=False),
    sa.Column('recipient', sa.Integer(), nullable=False),
    sa.Column('sender', sa.Integer(), nullable=False),
    sa.Column('ciphertext', sa.LargeBinary(), nullable=False),
    sa.ForeignKeyConstraint(['round_id'], ['rounds.id'], name=op.f('fk_secagg_shares_round_id_rounds')),
    sa.PrimaryKeyConstraint('round_id', 'recipient', 'sender', name=op.f('pk_secagg_shares'))
    )
    with op.batch_alter_table('rounds', schema=None) as batch_op:
        batch_op.add_column(sa.Column('unmask_deadline_at', sa.DateTime(timezone=True), nullable=True))



def downgrade() -> None:
    with op.batch_alter_table('rounds', schema=None) as batch_op:
        batch_op.drop_column('unmask_deadline_at')

    op.drop_table('secagg_shares')
    with op.batch_alter_table('secagg_members', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_secagg_members_round_id'))

    op.drop_table('secagg_members')
