"""The server's settings and secrets. (The aggregation strategies' unit tests live next to them, in
facecore/federation/strategies; the tensor wire format's in facecore/tensorfile_test.py.)"""
from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest

from server_api.core.config import Settings, resolve_secrets
from server_api.errors import ConfigError


def test_production_secrets_are_required_and_checked(tmp_path: Path) -> None:
    key = base64.b64encode(bytes(range(32))).decode()
    strong = "Zt4kQw9-Lp2mXc7vB1nR5sT8yU3oP6aD"
    with pytest.raises(ConfigError, match="FEDFACE_ADMIN_TOKEN is not set"):
        resolve_secrets(Settings(data_dir=tmp_path, template_key=key))
    with pytest.raises(ConfigError, match="weak"):
        resolve_secrets(Settings(data_dir=tmp_path, admin_token="changeme", template_key=key))
    with pytest.raises(ConfigError, match="at least 32"):
        resolve_secrets(Settings(data_dir=tmp_path, admin_token="Zt4kQw9#Lp2", template_key=key))
    with pytest.raises(ConfigError, match="no template key"):
        resolve_secrets(Settings(data_dir=tmp_path, admin_token=strong))
    with pytest.raises(ConfigError, match="weak key"):
        resolve_secrets(Settings(data_dir=tmp_path, admin_token=strong, template_key=base64.b64encode(b"\0" * 32).decode()))
    with pytest.raises(ConfigError, match="32 bytes"):
        resolve_secrets(Settings(data_dir=tmp_path, admin_token=strong, template_key=base64.b64encode(b"short").decode()))
    (tmp_path / "key").write_text(key)
    secrets = resolve_secrets(Settings(data_dir=tmp_path, admin_token=strong, template_key_file=tmp_path / "key"))
    assert secrets.template_key == bytes(range(32)) and "Zt4k" not in repr(secrets)


def test_dev_mode_generates_private_secrets_once(tmp_path: Path) -> None:
    # Execute
    first = resolve_secrets(Settings(data_dir=tmp_path / "d", dev=True))
    second = resolve_secrets(Settings(data_dir=tmp_path / "d", dev=True))
    # Assert
    assert first == second and len(first.admin_token) >= 32 and len(first.template_key) == 32
    for name in ("admin_token", "template.key"):
        assert stat.S_IMODE((tmp_path / "d" / name).stat().st_mode) == 0o600


def test_database_urls_are_normalised(tmp_path: Path) -> None:
    assert Settings(database_url="postgresql://u:p@h/db").resolved_database_url() == "postgresql+psycopg://u:p@h/db"
    assert Settings(database_url="postgres://u@h/db").resolved_database_url() == "postgresql+psycopg://u@h/db"
    assert Settings(data_dir=tmp_path).resolved_database_url() == f"sqlite:///{tmp_path.resolve()}/fedface.db"
    with pytest.raises(ConfigError, match="unsupported"):
        Settings(database_url="mysql://x").resolved_database_url()


def test_shared_shards_need_the_database_store_and_no_worker_pool(tmp_path: Path) -> None:
    # Prepare
    shared = {"data_dir": tmp_path, "aggregation_shared_shards": True}
    # Execute / Assert: partial sums on one host's disk are out of the other replicas' reach; two ways to sum are refused
    with pytest.raises(ConfigError, match="needs FEDFACE_BLOB_STORE=database"):
        Settings(**shared).check_aggregation()
    with pytest.raises(ConfigError, match="choose one"):
        Settings(**shared, blob_store="database", aggregation_processes=2).check_aggregation()
    Settings(**shared, blob_store="database").check_aggregation()
    Settings(data_dir=tmp_path, aggregation_processes=2).check_aggregation()
