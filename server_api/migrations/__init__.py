"""Alembic migration environment (a package so that wheels install it)."""
