"""Fixtures shared by every test folder."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from facecore.errors import DataRootMissing
from facecore.paths import data_root


@pytest.fixture(scope="session")
def real_data() -> Path:
    """The real data root. In CI it must exist; elsewhere tests that need it are skipped."""
    try:
        return data_root()
    except DataRootMissing as error:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(error))


@pytest.fixture()
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private aligned-face cache, so tests never depend on (or pollute) the user's cache.
    The published weights that `make test` fetched stay where they are."""
    from facecore.models.published import PACKAGES_ENV, packages_root

    monkeypatch.setenv(PACKAGES_ENV, str(packages_root()))
    monkeypatch.setenv("FEDFACE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"
