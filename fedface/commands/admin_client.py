"""The HTTP side of `fedface admin`: the admin token, one call to a round server's admin API, and
how its refusals read on a terminal.

Every refusal becomes one AdminClientError line (exit 1) or, for a request the schema rejects, a
UsageError naming the flag that set the field (exit 2): an operator never sees a traceback or a
raw JSON error list.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from server_api.errors import AdminClientError


@functools.cache
def request_flags() -> dict[str, str]:
    """request field (dotted path) -> the flag that sets it: round open's from the round-flag table (read from
    RoundConfig, so imported here, when an error needs it, not when a command starts)."""
    from fedface.commands.round_flags import ROUND_FLAGS

    return {path: flag.flag for path, flag in ROUND_FLAGS.items()} | {
        "limit": "--limit", "offset": "--offset", "device_id": "DEVICE_ID", "round_id": "--round",
    }


def connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        default=os.environ.get("FEDFACE_SERVER", "http://127.0.0.1:8000"),
        metavar="URL",
        help="round server URL (default: $FEDFACE_SERVER, else http://127.0.0.1:8000)",
    )
    parser.add_argument(
        "--data-dir",
        default="./fedface-data",
        metavar="DIR",
        help="a --dev server's data folder, whose admin_token is used when FEDFACE_ADMIN_TOKEN is not set",
    )
    parser.add_argument(
        "--cacert",
        metavar="FILE",
        help="CA bundle for an https server with a private certificate (default: the system's)",
    )
    parser.add_argument("--json", action="store_true", help="print the server's JSON answer instead of text")


def usage(message: str) -> Exception:
    from fedface.cli import UsageError

    return UsageError(message)


def with_flag_names(text: str) -> str:
    """A server or schema message with each request field named by its flag instead (only names with
    an underscore: plain words such as "method" or "limit" also occur in ordinary prose)."""
    # A dotted name first ("secure_aggregation.max_update_norm"); then a bare one, which two sections may
    # share: the first section's (aggregation's max_update_norm).
    names = {dotted: flag for dotted, flag in request_flags().items() if "." in dotted}
    for dotted, flag in request_flags().items():
        if "_" in dotted.rsplit(".", 1)[-1]:
            names.setdefault(dotted.rsplit(".", 1)[-1], flag)
    for name in sorted(names, key=len, reverse=True):
        text = re.sub(rf"(?<![.\w]){re.escape(name)}\b", names[name], text)
    return text.removeprefix("Value error, ")


def flag_errors(errors: list[dict[str, Any]], sent: dict[str, Any] | None = None) -> str:
    """One line for a list of schema errors ({loc, msg[, input]}), each naming the flag."""
    lines = []
    for error in errors:
        loc = [str(part) for part in error.get("loc", ()) if part not in ("body", "query", "path")]
        message = with_flag_names(str(error.get("msg", "invalid"))).replace("Input should be", "should be")
        if not loc:
            lines.append(message)
            continue
        flag = request_flags().get(".".join(loc), "--" + loc[-1].replace("_", "-"))
        value = error.get("input", _dig(sent, loc))
        lines.append(f"{flag}{'' if value is None or isinstance(value, dict) else f' {value}'}: {message}")
    return "; ".join(lines)


def _dig(tree: dict[str, Any] | None, path: list[str]) -> Any:
    for part in path:
        if not isinstance(tree, dict):
            return None
        tree = tree.get(part)
    return tree


def token(data_dir: str) -> str:
    token = os.environ.get("FEDFACE_ADMIN_TOKEN", "").strip()
    if token:
        return token
    path = Path(data_dir) / "admin_token"
    if path.is_file():
        return path.read_text().strip()
    raise AdminClientError(
        f"no admin token: set FEDFACE_ADMIN_TOKEN (or pass the dev server's --data-dir; {path} does not exist)"
    )


def call(args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None = None, raw: bool = False) -> Any:
    """The server's JSON answer (its bytes with `raw`); a refusal or a failure is one AdminClientError."""
    import httpx

    url = args.server.rstrip("/") + path
    if args.cacert and not Path(args.cacert).is_file():
        raise AdminClientError(f"--cacert {args.cacert} does not exist")
    try:
        response = httpx.request(
            method,
            url,
            json=body,
            headers={"Authorization": f"Bearer {token(args.data_dir)}"},
            verify=args.cacert or True,
            timeout=120 if raw else 30,
        )
    except httpx.InvalidURL as error:  # not an HTTPError: raised while the request is built
        raise AdminClientError(f"--server {args.server} is not a usable URL: {error}") from None
    except httpx.HTTPError as error:
        raise AdminClientError(f"cannot reach {args.server}: {error}") from None
    except OSError as error:  # ssl.SSLError among them: httpx reads --cacert before it connects
        if not args.cacert:
            raise
        raise AdminClientError(f"--cacert {args.cacert} holds no usable CA certificate ({error})") from None
    if response.status_code < 400:
        return response.content if raw else response.json()
    try:
        detail = response.json().get("detail")
    except ValueError:
        detail = response.text[:200]
    if response.status_code == 422 and isinstance(detail, list):
        raise usage(flag_errors(detail, body))
    if response.status_code == 401:
        detail = f"{detail} (FEDFACE_ADMIN_TOKEN, or the --data-dir of a --dev server)"
    text = detail if isinstance(detail, str) else json.dumps(detail)
    raise AdminClientError(f"server answered {response.status_code}: {with_flag_names(text)}")


def time_text(stamp: str | None) -> str:
    return datetime.fromisoformat(stamp).strftime("%Y-%m-%d %H:%M:%S") if stamp else "-"


def table(header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    cells = [header, *[tuple(map(str, row)) for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells)
