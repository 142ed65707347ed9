"""Alembic revisions; alembic skips this file."""
