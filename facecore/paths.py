"""Where the face data and the caches live."""
from __future__ import annotations

import os
from pathlib import Path

from facecore.errors import DataRootMissing

DATA_ENV = "FEDFACE_DATA"
CACHE_ENV = "FEDFACE_CACHE"
PACKAGES_ENV = "FEDFACE_PACKAGES"


def data_root(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Resolve the read-only data root: an explicit path, else FEDFACE_DATA, else ../shared/data.

    The fallback is looked up relative to the working directory and to the project
    checkout, because `make run` and CI both run from a checkout that sits beside
    shared/.
    """
    candidates: list[Path] = []
    if explicit is not None:
        candidates.append(Path(explicit))
    elif os.environ.get(DATA_ENV):
        candidates.append(Path(os.environ[DATA_ENV]))
    else:
        candidates.append(Path.cwd().parent / "shared" / "data")
        candidates.append(Path(__file__).resolve().parents[2] / "shared" / "data")
    for path in candidates:
        if path.is_dir():
            return path.resolve()
    raise DataRootMissing([str(p) for p in candidates])


def cache_root() -> Path:
    """Writable cache for derived data (aligned faces, features); never inside the data root."""
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "fedface")
    root.mkdir(parents=True, exist_ok=True)
    return root


def packages_root() -> Path:
    """FEDFACE_PACKAGES, else `packages/` in the cache root: published weights and the detectors built from
    them outlive a private face cache set for a test."""
    explicit = os.environ.get(PACKAGES_ENV)
    return Path(explicit) if explicit else cache_root() / "packages"
