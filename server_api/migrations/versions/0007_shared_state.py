"""State several server processes share through the database: blobs (FEDFACE_BLOB_STORE=database),
rate buckets and upload slots (PostgreSQL).

Revision ID: 0007
Revises: 0006
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "blobs",
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("digest", name=op.f("pk_blobs")),
    )
    op.create_table(
        "rate_buckets",
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("taken", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("scope", "key", name=op.f("pk_rate_buckets")),
    )
    op.create_table(
        "upload_slots",
        sa.Column("slot", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("holder", sa.String(length=36), nullable=True),
        sa.Column("until", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("slot", name=op.f("pk_upload_slots")),
    )


def downgrade() -> None:
    op.drop_table("upload_slots")
    op.drop_table("rate_buckets")
    op.drop_table("blobs")
