"""Memory-mapped cache of aligned faces, keyed by source-file content, aligner version and geometry.

One folder holds one crop geometry. Layout: `faces.u8` (rows of size*size*3 uint8, append-only) and `index.sqlite`
(content hash -> row, status, detection score, landmarks). Rows are appended and flushed before
the index commits them, so a crash leaves at worst an orphan row, never an index entry that
points at half-written pixels.
"""
from __future__ import annotations

import fcntl
import json
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from facecore.align.template import FACE_SIZE

STATUS_OK = "ok"  # a face was detected and aligned
STATUS_FALLBACK = "fallback"  # no face found; pixels come from the dataset-typical landmarks
STATUS_NOFACE = "noface"  # no face found and no fallback possible: no pixels
STATUS_UNREADABLE = "unreadable"  # not a decodable image


@dataclass(frozen=True)
class CacheEntry:
    row: int  # -1 when there are no pixels
    status: str
    score: float
    landmarks: tuple[tuple[float, float], ...] | None
    detail: str = ""


class AlignedFaceCache:
    def __init__(self, folder: str | Path, size: int = FACE_SIZE) -> None:
        self.folder = Path(folder)
        self.row_shape = (size, size, 3)
        self.row_bytes = size * size * 3
        self.folder.mkdir(parents=True, exist_ok=True)
        self._faces_path = self.folder / "faces.u8"
        self._faces_path.touch(exist_ok=True)
        self._db = sqlite3.connect(self.folder / "index.sqlite", timeout=60)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS faces (key TEXT PRIMARY KEY, row INTEGER, status TEXT, score REAL, landmarks TEXT, detail TEXT)"
        )
        self._db.commit()
        self._faces: np.memmap | None = None

    def close(self) -> None:
        self._db.close()

    def lookup(self, keys: list[str]) -> dict[str, CacheEntry]:
        found: dict[str, CacheEntry] = {}
        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for key, row, status, score, landmarks, detail in self._db.execute(
                f"SELECT key, row, status, score, landmarks, detail FROM faces WHERE key IN ({marks})", chunk
            ):
                points = tuple(map(tuple, json.loads(landmarks))) if landmarks else None
                found[key] = CacheEntry(row, status, score, points, detail)
        return found

    def add(self, items: list[tuple[str, np.ndarray | None, CacheEntry]]) -> dict[str, CacheEntry]:
        """Append faces (None for entries without pixels) and commit their index rows."""
        stored: dict[str, CacheEntry] = {}
        with self._exclusive():
            with open(self._faces_path, "r+b") as handle:
                handle.seek(0, os.SEEK_END)
                # A crash mid-append can leave a partial row; cut it so rows stay aligned.
                next_row = handle.tell() // self.row_bytes
                handle.truncate(next_row * self.row_bytes)
                handle.seek(next_row * self.row_bytes)
                for key, face, entry in items:
                    row = -1
                    if face is not None:
                        if face.shape != self.row_shape or face.dtype != np.uint8:
                            raise ValueError(f"aligned face must be uint8 {self.row_shape}, got {face.dtype} {face.shape}")
                        handle.write(np.ascontiguousarray(face).tobytes())
                        row, next_row = next_row, next_row + 1
                    stored[key] = CacheEntry(row, entry.status, entry.score, entry.landmarks, entry.detail)
                handle.flush()
                os.fsync(handle.fileno())
            self._db.executemany(
                "INSERT OR REPLACE INTO faces VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (key, e.row, e.status, e.score, json.dumps(e.landmarks) if e.landmarks else None, e.detail)
                    for key, e in stored.items()
                ],
            )
            self._db.commit()
        self._faces = None
        return stored

    def faces(self, rows: np.ndarray | list[int]) -> np.ndarray:
        """Gather rows into an (N,size,size,3) uint8 array."""
        memmap = self._memmap()
        return np.asarray(memmap[np.asarray(rows, dtype=np.int64)])

    def _memmap(self) -> np.memmap:
        n_rows = self._faces_path.stat().st_size // self.row_bytes
        if self._faces is None or len(self._faces) != n_rows:
            self._faces = np.memmap(self._faces_path, dtype=np.uint8, mode="r", shape=(max(n_rows, 1), *self.row_shape)) if n_rows else None
        if self._faces is None:
            raise LookupError("the aligned-face cache is empty")
        return self._faces

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        with open(self.folder / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
