"""Replicas share a round's sum: its shards, each claimed under a lease, their partial sums named by digest.

Revision ID: 0009
Revises: 0008
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "aggregation_shards",
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("shard", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("shard_updates", sa.Integer(), nullable=False),
        sa.Column("holder", sa.String(length=36), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("partial_sha256", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(["round_id"], ["rounds.id"], name=op.f("fk_aggregation_shards_round_id_rounds")),
        sa.PrimaryKeyConstraint("round_id", "shard", name=op.f("pk_aggregation_shards")),
    )


def downgrade() -> None:
    op.drop_table("aggregation_shards")
