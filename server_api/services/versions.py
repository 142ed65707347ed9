"""Model versions as devices download them: read-only lookups.

A download streams for as long as the client takes, so its lookup is a transaction of its own,
ended before the first byte goes out (on SQLite an open transaction holds the write lock).
"""
from __future__ import annotations

from sqlalchemy.orm import Session

from server_api.core.db import transaction
from server_api.crud import versions as version_crud
from server_api.errors import NotFound
from server_api.tables import ModelVersion


def for_download(session: Session, version_hash: str) -> ModelVersion:
    # Committed, not rolled back: the session keeps the row loaded (expire_on_commit=False).
    with transaction(session):
        found = version_crud.get_by_hash(session, version_hash)
    if found is None:
        raise NotFound(f"model version {version_hash} does not exist")
    return found
