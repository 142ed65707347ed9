"""What a round's aggregation reads: its updates streamed one at a time from the blob store (plain or
masked), the enrolled identities' embeddings, and the lineage server momentum needs. Plain values
only (``UpdateRef``, ``EnrolledRef``): the rows they were copied from are not touched after their
session ends.
"""
from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, BinaryIO, NamedTuple

import numpy as np
from sqlalchemy.orm import Session

from facecore.federation.config import RoundConfig
from facecore.federation.protocol import BACKBONE_PREFIX, MASKED_KEY, SCALE_PREFIX
from facecore.federation.quantize import received_deltas
from facecore.federation.strategies import ClientUpdate, Strategy, spreadout_of
from facecore.federation.strategies.secure_fedavg import MASKED
from facecore.tensorfile import read_header, read_tensor
from server_api.crud import rounds as round_crud
from server_api.crud import updates as update_crud
from server_api.crud import versions as version_crud
from server_api.storage.blobs import BlobStore

if TYPE_CHECKING:  # the context imports torch; an aggregation worker needs neither
    from server_api.services.context import ServerContext


class UpdateRef(NamedTuple):
    device_id: str
    blob_sha256: str
    n_samples: int
    metrics: dict[str, float]
    embedding_ciphertext: bytes | None


class EnrolledRef(NamedTuple):
    device_id: str
    ciphertext: bytes
    updated_at: datetime


def parent_hash(session: Session, producing_round_id: int | None) -> str | None:
    """The base model of the round that produced a version: server momentum's lineage (None for an imported model)."""
    if producing_round_id is None:
        return None
    producing = round_crud.get_round(session, producing_round_id)
    parent = None if producing is None else version_crud.get(session, producing.base_version_id)
    return None if parent is None else parent.version_hash


def round_update_refs(session: Session, round_id: int) -> list[UpdateRef]:
    """The round's updates in update order (the order its shards cut), as plain values."""
    return [
        UpdateRef(u.device_id, u.blob_sha256, u.n_samples, dict(u.metrics), u.embedding_ciphertext)
        for u in update_crud.round_updates(session, round_id)
    ]


def stream_updates(store: BlobStore, updates: Sequence[UpdateRef], shapes: dict[str, tuple[int, ...]]) -> Iterator[ClientUpdate]:
    """One update in memory at a time, read back from the blob store: the trained entries (`shapes`: theirs,
    wire.trained_entries) only, whether a file left the frozen prefix out or sent it, quantised ones dequantised."""
    for update in updates:
        with store.open(update.blob_sha256) as handle:
            header = read_header(handle, _length(handle))
            # only these entries (and their scales) are read, in the model's order whatever the file's
            wanted = [k for name in shapes for k in (BACKBONE_PREFIX + name, SCALE_PREFIX + name) if k in header.tensors]
            weights = received_deltas({k: read_tensor(handle, header, k) for k in wanted}, shapes)
        yield ClientUpdate(weights=weights, n_samples=update.n_samples, metrics=update.metrics, client_id=update.device_id)


def stream_masked(store: BlobStore, updates: Sequence[UpdateRef], index_of: dict[str, int]) -> Iterator[ClientUpdate]:
    for update in updates:
        with store.open(update.blob_sha256) as handle:
            header = read_header(handle, _length(handle))
            masked = read_tensor(handle, header, MASKED_KEY)
        yield ClientUpdate(weights={MASKED: masked}, n_samples=update.n_samples, metrics=update.metrics, client_id=str(index_of[update.device_id]))


def _length(handle: BinaryIO) -> int:
    """An open blob's size, from the handle (no second look-up in the store), left at its start."""
    size = handle.seek(0, io.SEEK_END)
    handle.seek(0)
    return size


def new_embeddings(
    ctx: ServerContext, strategy: Strategy, config: RoundConfig, updates: list[UpdateRef], enrolled: list[EnrolledRef], dim: int
) -> dict[str, tuple[bytes, datetime]]:
    """W = every enrolled identity's embedding (this round's upload if it sent one), through the strategy."""
    if not enrolled:
        return {}
    uploaded = {u.device_id: u.embedding_ciphertext for u in updates if u.embedding_ciphertext is not None}
    rows = []
    for enrollment in enrolled:
        device_id = enrollment.device_id
        if device_id in uploaded:
            raw = ctx.cipher.decrypt(uploaded[device_id], device_id, "update")
        else:
            raw = ctx.cipher.decrypt(enrollment.ciphertext, device_id, "enrollment")
        rows.append(np.frombuffer(raw, dtype="<f4").astype(np.float32))
    W = np.stack(rows)
    assert W.shape[1] == dim
    W_new = strategy.aggregate_embeddings(W, spreadout_of(config.spreadout))
    return {
        e.device_id: (ctx.cipher.encrypt(W_new[i].astype("<f4").tobytes(), e.device_id, "enrollment"), e.updated_at)
        for i, e in enumerate(enrolled)
    }
