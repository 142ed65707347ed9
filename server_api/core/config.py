"""Server settings: one pydantic-settings class read from `FEDFACE_*` variables.

`fedface server` turns its flags into these variables before starting uvicorn, so
every worker process (``--workers N``) builds the same Settings from its environment.
Secrets are resolved separately by :func:`resolve_secrets`: in ``--dev`` they are
generated once into the data directory, otherwise they must come from the
environment and must not be weak.
"""
from __future__ import annotations

import base64
import ipaddress
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy import make_url
from sqlalchemy.exc import ArgumentError

from facecore.federation.strategies.tiers import SHARD_SIZE
from server_api.errors import ConfigError

ADMIN_TOKEN_FILE = "admin_token"
TEMPLATE_KEY_FILE = "template.key"
MIN_ADMIN_TOKEN_CHARS = 32
_PASSWORD_IN_URL = re.compile(r"(://[^:/@]*:)[^@/]*@")  # scheme://user:PASSWORD@host
_WEAK_TOKENS = {"admin", "changeme", "change-me", "password", "secret", "token", "dev", "test", "fedface", "default"}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FEDFACE_", extra="ignore")

    data_dir: Path = Path("fedface-data")
    database_url: str | None = Field(default=None, description="SQLAlchemy URL; default sqlite:///<data_dir>/fedface.db")
    dev: bool = False
    model: str = Field(default="default", description="initial global model: PATH, 'default' or 'random'")
    random_backbone: str = "mobilefacenet"

    admin_token: SecretStr | None = None
    template_key: SecretStr | None = Field(default=None, description="base64 of 32 random bytes (AES-256-GCM)")
    template_key_file: Path | None = None

    max_request_bytes: int = Field(default=1 << 20, ge=1024)
    max_upload_bytes: int = Field(default=64 << 20, ge=1024)
    max_delta_norm: float = Field(default=1000.0, gt=0, description="L2 bound over a whole backbone delta")
    signature_window_s: int = Field(default=300, ge=1, le=3600)
    scheduler_interval_s: float = Field(default=1.0, gt=0)
    aggregation_lease_s: float = Field(default=60.0, gt=0, description="after this a stuck aggregation is retaken")
    export_onnx: bool = True
    # Where model weights and uploads live: "local" is <data_dir>/blobs on this host; "database" is the
    # database's blobs table, which server processes on several hosts share (server_api/storage/database_blobs.py).
    blob_store: Literal["local", "database"] = "local"
    # Individual backbone deltas are deleted once their round has ended (completed or failed):
    # the aggregate is all the server needs, and a single delta can leak about its owner's photos.
    keep_update_blobs: bool = False
    torch_threads: int = Field(default=1, ge=1)
    # Aggregation in tiers (server_api/services/aggregation_tiers.py): a round's updates are summed in shards of
    # this many, by this many worker processes (0 or 1: by the aggregating process). The number of processes does not
    # change a bit of the result; the shard size sets the order of float64 additions.
    aggregation_shard_updates: int = Field(default=SHARD_SIZE, ge=1, le=100_000, description="updates summed together in one shard")
    aggregation_processes: int = Field(default=0, ge=0, le=64, description="worker processes that sum a round's shards (0 or 1: the aggregating process)")
    # Replicas on one database share a round's shards (server_api/services/aggregation_shards.py): each claims them
    # under a lease and stores its partial sums as blobs, which every replica reads, so it needs the database store.
    aggregation_shared_shards: bool = Field(default=False, description="every replica sums the shards of the round being aggregated")
    validation_processes: int = Field(
        default=1, ge=0, le=64, description="worker processes that parse and check uploads (0: in the request's thread)",
    )
    # Abuse limits (server_api/core/limits.py): shared by every process on PostgreSQL, per process on SQLite;
    # 0 turns a rate limit off.
    device_rate_per_s: float = Field(default=5.0, ge=0, description="signed requests per second per device")
    device_burst: int = Field(default=60, ge=1, description="requests a device may send at once, before its rate applies")
    address_rate_per_s: float = Field(
        default=1.0, ge=0, description="registrations and failed device authentications per second per client address",
    )
    address_burst: int = Field(
        default=100, ge=1, description="registrations and failed authentications an address may make at once",
    )
    # Reverse proxies whose X-Forwarded-For (and -Proto) uvicorn believes: comma-separated addresses or networks.
    # Empty (the default): no one's, so a client cannot pick the address its rate limits are kept under.
    forwarded_allow_ips: str = Field(
        default="", description="proxies trusted to name the client in X-Forwarded-For, e.g. '10.0.0.5,10.1.0.0/16'",
    )
    max_concurrent_uploads: int = Field(default=32, ge=1, description="upload bodies received and checked at once")
    upload_body_timeout_s: float = Field(default=120.0, gt=0, description="an upload body must arrive within this")
    # Registration needs an admin-issued one-time token: None means required, except with --dev.
    require_enrollment_token: bool | None = None
    enrollment_token_ttl_s: int = Field(default=7 * 86400, ge=60, description="default lifetime of an enrollment token")
    prune_unenrolled_after_s: int = Field(
        default=86400, ge=0, description="default age after which a registered device that never enrolled is pruned",
    )
    log_level: str = "INFO"
    # Chaos knob for the crash tests: pause between writing a new version's blobs and
    # committing it, so a test can kill -9 the process mid-aggregation. Keep 0 in production.
    aggregation_pause_s: float = Field(default=0.0, ge=0)
    # The same, after each shard this process sums for a round whose shards are shared.
    aggregation_shard_pause_s: float = Field(default=0.0, ge=0)

    def database_url_as_given(self) -> str:
        """The URL as the operator wrote it (or the default SQLite file); secret, name it with :func:`redact_url`."""
        return self.database_url or f"sqlite:///{(self.data_dir / 'fedface.db').resolve()}"

    def resolved_database_url(self) -> str:
        """The SQLAlchemy URL to connect with. A scheme we do not ship a driver for, or a URL SQLAlchemy cannot
        read (a port that is not a number), is a ConfigError naming the URL without its password."""
        url = self.database_url_as_given()
        # psycopg 3 is the only PostgreSQL driver we ship; accept the usual spellings.
        for prefix in ("postgres://", "postgresql://"):
            if url.startswith(prefix):
                url = "postgresql+psycopg://" + url[len(prefix):]
        if not (url.startswith("sqlite") or url.startswith("postgresql+psycopg://")):
            scheme = url.split("://", 1)[0] if "://" in url else None
            what = f"unsupported scheme {scheme!r}" if scheme else "not a URL"
            raise ConfigError(
                f"database URL {redact_url(self.database_url_as_given())}: {what}; use sqlite:///PATH or postgresql://USER@HOST/DB"
            )
        try:
            make_url(url)
        except (ArgumentError, ValueError) as error:
            reason = "its port is not a number" if _port_is_not_a_number(url) else str(error)
            raise ConfigError(f"database URL {redact_url(self.database_url_as_given())} is malformed: {reason}") from None
        return url

    def is_sqlite(self) -> bool:
        return self.resolved_database_url().startswith("sqlite")

    def check_aggregation(self) -> None:
        """Refuse settings for aggregation in tiers that cannot work together (ConfigError, one line)."""
        if self.aggregation_shared_shards and self.blob_store != "database":
            raise ConfigError(
                "FEDFACE_AGGREGATION_SHARED_SHARDS needs FEDFACE_BLOB_STORE=database: the replicas read each other's partial sums there"
            )
        if self.aggregation_shared_shards and self.aggregation_processes > 1:
            raise ConfigError(
                "FEDFACE_AGGREGATION_SHARED_SHARDS and FEDFACE_AGGREGATION_PROCESSES > 1 both say who sums a round's shards; choose one"
            )

    def enrollment_token_required(self) -> bool:
        return not self.dev if self.require_enrollment_token is None else self.require_enrollment_token

    def trusted_proxies(self) -> list[str]:
        """`forwarded_allow_ips` as uvicorn's list; [] trusts no one. Refused (ConfigError) unless every entry
        is an IP address or network: uvicorn would take a typo for a host name and silently trust nothing, and
        '*' would let every client choose its own address."""
        return parse_trusted_proxies(self.forwarded_allow_ips)


def redact_url(url: str) -> str:
    """``url`` fit for a message or a log: its password, if any, replaced by ``***``."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):  # not even SQLAlchemy can read it: hide whatever stands where a password would
        return _PASSWORD_IN_URL.sub(r"\1***@", url)


def _port_is_not_a_number(url: str) -> bool:
    try:
        _ = urlsplit(url).port  # reading it is the check: it raises on "host:abc"
    except ValueError:
        return True
    return False


def parse_trusted_proxies(text: str) -> list[str]:
    """Comma-separated IP addresses and networks (CIDR), normalised; empty text is []."""
    entries = [item.strip() for item in text.split(",") if item.strip()]
    trusted = []
    for entry in entries:
        try:
            trusted.append(str(ipaddress.ip_network(entry, strict=False) if "/" in entry else ipaddress.ip_address(entry)))
        except ValueError:
            raise ConfigError(
                f"FEDFACE_FORWARDED_ALLOW_IPS: {entry!r} is not an IP address or network (CIDR); list the reverse "
                "proxies in front of the server, e.g. 10.0.0.5,10.1.0.0/16"
            ) from None
    return trusted


@dataclass(frozen=True)
class Secrets:
    admin_token: str
    template_key: bytes

    def __repr__(self) -> str:  # never print key material, even in a traceback
        return "Secrets(<redacted>)"


def resolve_secrets(settings: Settings) -> Secrets:
    """Admin token and template key, generated in dev mode, validated otherwise."""
    if settings.dev:
        return _dev_secrets(settings)
    token = settings.admin_token.get_secret_value() if settings.admin_token else ""
    if not token:
        raise ConfigError("FEDFACE_ADMIN_TOKEN is not set (or start with --dev for local secrets)")
    _check_token(token)
    if settings.template_key is not None:
        key = _decode_key(settings.template_key.get_secret_value(), "FEDFACE_TEMPLATE_KEY")
    elif settings.template_key_file is not None:
        key = _read_key_file(settings.template_key_file)
    else:
        raise ConfigError("no template key: set FEDFACE_TEMPLATE_KEY (base64, 32 bytes) or FEDFACE_TEMPLATE_KEY_FILE")
    return Secrets(admin_token=token, template_key=key)


def _check_token(token: str) -> None:
    if token.lower() in _WEAK_TOKENS or len(set(token)) < 8:
        raise ConfigError("FEDFACE_ADMIN_TOKEN is a default or weak value; generate one with `openssl rand -hex 32`")
    if len(token) < MIN_ADMIN_TOKEN_CHARS:
        raise ConfigError(f"FEDFACE_ADMIN_TOKEN must be at least {MIN_ADMIN_TOKEN_CHARS} characters")


def _decode_key(text: str, where: str) -> bytes:
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except ValueError:
        raise ConfigError(f"{where} is not valid base64") from None
    if len(key) != 32:
        raise ConfigError(f"{where} must decode to 32 bytes, got {len(key)}")
    if len(set(key)) < 8:
        raise ConfigError(f"{where} is a weak key (too few distinct bytes); generate one with `openssl rand -base64 32`")
    return key


def _read_key_file(path: Path) -> bytes:
    try:
        return _decode_key(path.read_text(), str(path))
    except OSError as error:
        raise ConfigError(f"cannot read template key file {path}: {error.strerror}") from None


def _write_private(path: Path, text: str) -> None:
    # O_EXCL: two workers racing to create the file must not both win.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def _dev_secrets(settings: Settings) -> Secrets:
    token_path = settings.data_dir / ADMIN_TOKEN_FILE
    key_path = settings.data_dir / TEMPLATE_KEY_FILE
    try:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        if not token_path.exists():
            _write_private(token_path, secrets.token_urlsafe(32) + "\n")
        if not key_path.exists():
            _write_private(key_path, base64.b64encode(secrets.token_bytes(32)).decode() + "\n")
        token = settings.admin_token.get_secret_value() if settings.admin_token else token_path.read_text().strip()
    except OSError as error:  # a parent that is a file, a read-only file system: one line, not a traceback
        raise ConfigError(f"cannot use data folder {settings.data_dir}: {error.strerror}") from None
    return Secrets(admin_token=token, template_key=_read_key_file(key_path))
