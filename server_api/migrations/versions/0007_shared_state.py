"""State several server processes share through the database: blobs (FEDFACE_BLOB_STORE=database),
rate buckets and upload slots (PostgreSQL); and each round's count of accepted updates.

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
    if op.get_bind().dialect.name == "postgresql":
        # Weights and deltas do not compress: store them out of line without spending CPU trying.
        op.execute("ALTER TABLE blobs ALTER COLUMN data SET STORAGE EXTERNAL")
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


    op.add_column("rounds", sa.Column("n_uploaded", sa.Integer(), server_default="0", nullable=False))
    op.execute(
        "UPDATE rounds SET n_uploaded = (SELECT count(*) FROM participations "
        "WHERE participations.round_id = rounds.id AND participations.status = 'uploaded')"
    )


def downgrade() -> None:
    with op.batch_alter_table("rounds", schema=None) as batch_op:
        batch_op.drop_column("n_uploaded")
    op.drop_table("upload_slots")
    op.drop_table("rate_buckets")
    op.drop_table("blobs")
