"""Model versions keep an int8 copy of the backbone for devices whose round downloads int8 (`local.download_bits`).

Revision ID: 0008
Revises: 0007
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("model_versions", sa.Column("int8_blob", sa.String(length=64), nullable=True))


def downgrade() -> None:
    op.drop_column("model_versions", "int8_blob")
