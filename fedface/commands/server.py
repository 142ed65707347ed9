"""`fedface server`: the cross-device FedFace round server (FastAPI on uvicorn)."""
from __future__ import annotations

import argparse
import ipaddress
import os
import sys

from server_api.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--db", help="database URL (default: FEDFACE_DATABASE_URL, else SQLite in --data-dir); postgresql://... uses psycopg 3")
    parser.add_argument("--data-dir", help="database, blobs and dev secrets (default: FEDFACE_DATA_DIR or ./fedface-data)")
    parser.add_argument("--dev", action="store_true", help="generate local secrets in --data-dir (admin_token, template.key)")
    parser.add_argument("--model", help="initial global model: PATH, 'default' or 'random' (default: FEDFACE_MODEL or 'default')")
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes (all state is in the database)")
    parser.add_argument("--ssl-certfile")
    parser.add_argument("--ssl-keyfile")
    parser.add_argument("--log-level", default=None, help="DEBUG, INFO (default), WARNING...")


def _export_settings(args: argparse.Namespace) -> None:
    """Flags become FEDFACE_* variables, which every uvicorn worker process inherits."""
    values = {"FEDFACE_DATABASE_URL": args.db, "FEDFACE_DATA_DIR": args.data_dir, "FEDFACE_MODEL": args.model, "FEDFACE_LOG_LEVEL": args.log_level}
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


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from server_api.core.config import ADMIN_TOKEN_FILE, Settings, resolve_secrets
    from server_api.core.logging import configure_logging, logging_config
    from server_api.services.context import ServerContext

    if bool(args.ssl_certfile) != bool(args.ssl_keyfile):
        raise ConfigError("--ssl-certfile and --ssl-keyfile go together")
    if args.workers < 1:
        raise ConfigError("--workers must be at least 1")
    _export_settings(args)
    settings = Settings()
    configure_logging(settings.log_level)
    secrets = resolve_secrets(settings)
    # Migrate and create the first model here, so errors print as one line before uvicorn starts.
    context = ServerContext.create(settings, secrets)
    try:
        context.startup()
    finally:
        context.close()
    scheme = "https" if args.ssl_certfile else "http"
    backend = "sqlite" if settings.is_sqlite() else "postgresql"
    print(f"fedface server: {scheme}://{args.host}:{args.port} ({backend}, data in {settings.data_dir}, docs at /docs)", file=sys.stderr)
    if settings.dev:
        print(f"fedface server: dev mode, admin token in {settings.data_dir / ADMIN_TOKEN_FILE}", file=sys.stderr)
        if not _is_loopback(args.host):
            print("fedface server: warning: dev secrets on a non-loopback address", file=sys.stderr)
    uvicorn.run(
        "server_api.main:create_app_from_env", factory=True, host=args.host, port=args.port, workers=args.workers,
        ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile, log_config=logging_config(settings.log_level),
        timeout_graceful_shutdown=10,
    )
    return 0
