"""Model versions publish the feature centre fleet-camera rounds centre the devices' loss on.

Revision ID: 0006
Revises: 0005
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("model_versions", sa.Column("feature_center", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("model_versions", "feature_center")
