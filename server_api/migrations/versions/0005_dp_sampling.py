"""DP-FedAvg's Poisson selection: each DP round's sample rate, enrolled count and sampling key.

Revision ID: 0005
Revises: 0004
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('rounds', schema=None) as batch_op:
        batch_op.add_column(sa.Column('sample_rate', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('population', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('sampling_key', sa.LargeBinary(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('rounds', schema=None) as batch_op:
        batch_op.drop_column('sampling_key')
        batch_op.drop_column('population')
        batch_op.drop_column('sample_rate')
