"""`fedface server`: the cross-device FedFace round server (FastAPI on uvicorn).

Everything that can fail (flags, the port, the TLS files, the database, the data folder, secrets, migrations, the first
model) is checked before the banner and before uvicorn starts, so a failure is one line and no half-started
server; an operator's own database URL is checked before anything is written or torch is loaded.
In production every line the server writes once logging is configured is a JSON log record, the banner
included (`_announce`); `--dev` writes readable text.
Stop signals are uvicorn's (`OWN_SIGNALS`: SIGTERM is a graceful shutdown); started by the launcher,
the server ends with its whole process group once the launching process is gone.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import os
import socket
import sys
from pathlib import Path

from server_api.errors import ConfigError

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
OWN_SIGNALS = True  # fedface.cli leaves SIGTERM and SIGHUP alone: uvicorn handles them


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on; 0.0.0.0 for every interface")
    parser.add_argument("--port", type=int, default=8000, help="TCP port to listen on")
    parser.add_argument(
        "--db",
        metavar="URL",
        help="database URL, sqlite:///PATH or postgresql://... (psycopg 3) "
        "(default: $FEDFACE_DATABASE_URL, else SQLite in --data-dir)",
    )
    parser.add_argument(
        "--data-dir",
        metavar="DIR",
        help="database, model blobs and --dev secrets (default: $FEDFACE_DATA_DIR, else ./fedface-data)",
    )
    parser.add_argument(
        "--dev",
        action="store_true",
        help="local use: generate the admin token and template key in --data-dir, log readable text instead of JSON",
    )
    parser.add_argument(
        "--model",
        metavar="MODEL",
        help="initial global model: default, mobile, random or a backbone file PATH "
        "(default: $FEDFACE_MODEL, else default)",
    )
    parser.add_argument(
        "--workers", type=int, default=1, metavar="N", help="uvicorn worker processes (all state is in the database)"
    )
    parser.add_argument(
        "--blob-store",
        choices=("local", "database"),
        help="where model weights and uploads live: local (--data-dir, this host) or database (shared by server "
        "processes on several hosts; docs/scaling.md) (default: $FEDFACE_BLOB_STORE, else local)",
    )
    parser.add_argument(
        "--ssl-certfile", metavar="FILE", help="TLS certificate (PEM); needs --ssl-keyfile (default: plain HTTP)"
    )
    parser.add_argument("--ssl-keyfile", metavar="FILE", help="TLS private key (PEM); needs --ssl-certfile")
    parser.add_argument(
        "--forwarded-allow-ips",
        metavar="IPS",
        help="comma-separated addresses or networks of the reverse proxies whose X-Forwarded-For names the client "
        "(default: $FEDFACE_FORWARDED_ALLOW_IPS, else none: the client is the connecting address)",
    )
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        metavar="LEVEL",
        help=f"one of {', '.join(LOG_LEVELS)} (default: $FEDFACE_LOG_LEVEL, else INFO)",
    )


def _export_settings(args: argparse.Namespace) -> None:
    """Flags become FEDFACE_* variables, which every uvicorn worker process inherits."""
    values = {
        "FEDFACE_DATABASE_URL": args.db,
        "FEDFACE_DATA_DIR": args.data_dir,
        "FEDFACE_MODEL": args.model,
        "FEDFACE_LOG_LEVEL": args.log_level,
        "FEDFACE_FORWARDED_ALLOW_IPS": args.forwarded_allow_ips,
        "FEDFACE_BLOB_STORE": args.blob_store,
    }
    for name, value in values.items():
        if value is not None:
            os.environ[name] = value
    if args.dev:
        os.environ["FEDFACE_DEV"] = "true"


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def check_port_free(host: str, port: int) -> None:
    """Bind the address as uvicorn will (SO_REUSEADDR), then let it go: a busy port is one line now,
    not a traceback after the banner, the migrations and the model load."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as error:
        raise ConfigError(f"cannot listen on {host}:{port}: {error.strerror}") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            hint = " (another server running? choose another --port)" if error.errno == errno.EADDRINUSE else ""
            raise ConfigError(f"cannot listen on {host}:{port}: {error.strerror}{hint}") from None


def check_tls_files(certfile: str, keyfile: str) -> None:
    """Load the certificate and key as uvicorn will: a missing file, a bad PEM or a key of another certificate is
    one line naming them now, not an error without a file name after the banner."""
    import ssl

    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(certfile, keyfile)
    except ssl.SSLError as error:  # OpenSSL's own words, with its code
        raise ConfigError(f"cannot use TLS certificate {certfile} with key {keyfile}: not a PEM certificate and its key ({error})") from None
    except OSError as error:
        raise ConfigError(f"cannot use TLS certificate {certfile} with key {keyfile}: {error.strerror}") from None


def _announce(message: str, human: bool, **fields: object) -> None:
    """A start-up line: plain text for a terminal (--dev); in production a log record like every other
    line the server writes, so a log shipper that parses JSON lines never meets a bare one."""
    if human:
        print(f"fedface server: {message}", file=sys.stderr)
        return
    from server_api.core.logging import get_logger

    get_logger("startup").info(message, extra={"fields": fields})


def _make_data_dir(path: Path) -> None:
    """The data folder, made private now: one that cannot be made (a parent that is a file, a read-only
    file system) is one line, not a traceback from the secrets or the database that go in it."""
    from server_api.storage.blobs import make_private_dir

    try:
        make_private_dir(path)
    except OSError as error:
        raise ConfigError(f"cannot use data folder {path}: {error.strerror}") from None


def run(args: argparse.Namespace) -> int:
    from facecore.lifetime import exit_with_parent
    from fedface.cli import UsageError

    exit_with_parent("fedface server")  # first: a launcher that dies during our start-up must not leave us running
    if bool(args.ssl_certfile) != bool(args.ssl_keyfile):
        raise UsageError("--ssl-certfile and --ssl-keyfile go together")
    if args.workers < 1:
        raise UsageError(f"--workers must be at least 1, got {args.workers}")
    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be 1-65535, got {args.port}")
    check_port_free(args.host, args.port)
    if args.ssl_certfile:
        check_tls_files(args.ssl_certfile, args.ssl_keyfile)

    import uvicorn

    from server_api.core.config import ADMIN_TOKEN_FILE, Settings, redact_url, resolve_secrets
    from server_api.core.db import check_database, check_database_url
    from server_api.core.logging import configure_logging, logging_config

    _export_settings(args)
    settings = Settings()
    trusted_proxies = settings.trusted_proxies()  # a malformed list is one line, before anything starts
    database_url = settings.resolved_database_url()  # so is a database URL with an unknown scheme
    settings.check_aggregation()  # and aggregation settings that cannot work together
    shown_url = redact_url(settings.database_url_as_given())
    if settings.database_url is not None:  # the operator's database: reachable before anything is written or loaded
        check_database_url(database_url, shown_url)
    configure_logging(settings.log_level, human=settings.dev)
    secrets = resolve_secrets(settings)
    _make_data_dir(settings.data_dir)

    from server_api.services.context import ServerContext

    # Migrate and create the first model here, so errors print as one line before uvicorn starts.
    context = ServerContext.create(settings, secrets)
    try:
        if settings.database_url is None:  # the default SQLite file, in the data folder just made
            check_database(context.engine, shown_url)
        context.startup()
    finally:
        context.close()
    scheme = "https" if args.ssl_certfile else "http"
    backend = "sqlite" if settings.is_sqlite() else "postgresql"
    url = f"{scheme}://{args.host}:{args.port}"
    _announce(
        f"{url} ({backend}, data in {settings.data_dir}, API docs at /docs, operator page at /ui)", settings.dev,
        url=url, database=backend, data_dir=str(settings.data_dir),
    )
    if settings.dev:
        _announce(f"dev mode, admin token in {settings.data_dir / ADMIN_TOKEN_FILE}", human=True)
        if not _is_loopback(args.host):
            _announce("warning: dev secrets on a non-loopback address", human=True)
    if trusted_proxies:
        _announce(
            f"client addresses from X-Forwarded-For of {', '.join(trusted_proxies)}", settings.dev,
            forwarded_allow_ips=trusted_proxies,
        )
    uvicorn.run(
        "server_api.main:create_app_from_env",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
        # Forwarded headers only from the listed proxies: uvicorn's own default trusts them from 127.0.0.1, so any
        # local client could pick the address its rate limits are kept under.
        proxy_headers=bool(trusted_proxies),
        forwarded_allow_ips=trusted_proxies,
        log_config=logging_config(settings.log_level, human=settings.dev),
        timeout_graceful_shutdown=10,
    )
    return 0
