"""initial schema

Revision ID: 0001
Revises: (none)
Tables: devices, enrollments, rounds, participations, updates, model_versions,
audit_events, nonces, idempotency.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('audit_events',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('actor', sa.String(length=64), nullable=False),
    sa.Column('action', sa.String(length=64), nullable=False),
    sa.Column('round_id', sa.Integer(), nullable=True),
    sa.Column('device_id', sa.String(length=32), nullable=True),
    sa.Column('details', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_audit_events'))
    )
    op.create_table('devices',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('public_key', sa.LargeBinary(length=32), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_selected_round', sa.Integer(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_devices')),
    sa.UniqueConstraint('public_key', name=op.f('uq_devices_public_key'))
    )
    op.create_table('model_versions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('version_hash', sa.String(length=64), nullable=False),
    sa.Column('backbone', sa.String(length=64), nullable=False),
    sa.Column('embedding_dim', sa.Integer(), nullable=False),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('fp16_blob', sa.String(length=64), nullable=False),
    sa.Column('onnx_blob', sa.String(length=64), nullable=True),
    sa.Column('round_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_model_versions')),
    sa.UniqueConstraint('version_hash', name=op.f('uq_model_versions_version_hash'))
    )
    op.create_table('nonces',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('subject', sa.String(length=64), nullable=False),
    sa.Column('nonce', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_nonces')),
    sa.UniqueConstraint('subject', 'nonce', name=op.f('uq_nonces_subject_nonce'))
    )
    with op.batch_alter_table('nonces', schema=None) as batch_op:
        batch_op.create_index('ix_nonces_created_at', ['created_at'], unique=False)

    op.create_table('enrollments',
    sa.Column('device_id', sa.String(length=32), nullable=False),
    sa.Column('ciphertext', sa.LargeBinary(), nullable=False),
    sa.Column('round_id', sa.Integer(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['device_id'], ['devices.id'], name=op.f('fk_enrollments_device_id_devices'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('device_id', name=op.f('pk_enrollments'))
    )
    op.create_table('idempotency',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('device_id', sa.String(length=32), nullable=False),
    sa.Column('key', sa.String(length=128), nullable=False),
    sa.Column('request_sha256', sa.String(length=64), nullable=False),
    sa.Column('status_code', sa.Integer(), nullable=False),
    sa.Column('response', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['device_id'], ['devices.id'], name=op.f('fk_idempotency_device_id_devices'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_idempotency')),
    sa.UniqueConstraint('device_id', 'key', name=op.f('uq_idempotency_device_id_key'))
    )
    op.create_table('rounds',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('active_slot', sa.Integer(), nullable=True),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('strategy', sa.String(length=32), nullable=False),
    sa.Column('target_participants', sa.Integer(), nullable=False),
    sa.Column('min_participants', sa.Integer(), nullable=False),
    sa.Column('base_version_id', sa.Integer(), nullable=False),
    sa.Column('result_version_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('selection_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('selection_done', sa.Boolean(), nullable=False),
    sa.Column('deadline_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('closed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('failure_reason', sa.String(length=500), nullable=True),
    sa.Column('lease_until', sa.DateTime(timezone=True), nullable=True),
    sa.Column('summary', sa.JSON(), nullable=True),
    sa.ForeignKeyConstraint(['base_version_id'], ['model_versions.id'], name=op.f('fk_rounds_base_version_id_model_versions')),
    sa.ForeignKeyConstraint(['result_version_id'], ['model_versions.id'], name=op.f('fk_rounds_result_version_id_model_versions')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_rounds')),
    sa.UniqueConstraint('active_slot', name=op.f('uq_rounds_active_slot'))
    )
    op.create_table('participations',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('round_id', sa.Integer(), nullable=False),
    sa.Column('device_id', sa.String(length=32), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('checked_in_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['device_id'], ['devices.id'], name=op.f('fk_participations_device_id_devices'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['round_id'], ['rounds.id'], name=op.f('fk_participations_round_id_rounds')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_participations')),
    sa.UniqueConstraint('round_id', 'device_id', name=op.f('uq_participations_round_id_device_id'))
    )
    with op.batch_alter_table('participations', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_participations_round_id'), ['round_id'], unique=False)

    op.create_table('updates',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('round_id', sa.Integer(), nullable=False),
    sa.Column('device_id', sa.String(length=32), nullable=False),
    sa.Column('blob_sha256', sa.String(length=64), nullable=False),
    sa.Column('size_bytes', sa.Integer(), nullable=False),
    sa.Column('n_samples', sa.Integer(), nullable=False),
    sa.Column('metrics', sa.JSON(), nullable=False),
    sa.Column('embedding_ciphertext', sa.LargeBinary(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['device_id'], ['devices.id'], name=op.f('fk_updates_device_id_devices'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['round_id'], ['rounds.id'], name=op.f('fk_updates_round_id_rounds')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_updates')),
    sa.UniqueConstraint('round_id', 'device_id', name=op.f('uq_updates_round_id_device_id'))
    )
    with op.batch_alter_table('updates', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_updates_round_id'), ['round_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('updates', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_updates_round_id'))

    op.drop_table('updates')
    with op.batch_alter_table('participations', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_participations_round_id'))

    op.drop_table('participations')
    op.drop_table('rounds')
    op.drop_table('idempotency')
    op.drop_table('enrollments')
    with op.batch_alter_table('nonces', schema=None) as batch_op:
        batch_op.drop_index('ix_nonces_created_at')

    op.drop_table('nonces')
    op.drop_table('model_versions')
    op.drop_table('devices')
    op.drop_table('audit_events')
