"""`fedface admin round open|status|close`: operate a running round server.

The admin token comes from FEDFACE_ADMIN_TOKEN or, for a `--dev` server, from
`<data-dir>/admin_token`; there is deliberately no flag, so it stays out of shell history.
"""
from __future__ import annotations

import argparse
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from server_api.errors import AdminClientError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    objects = parser.add_subparsers(dest="object", metavar="OBJECT", required=True)
    round_parser = objects.add_parser("round", help="open rounds and watch them")
    actions = round_parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    open_ = actions.add_parser("open", help="open a round on the current model")
    status = actions.add_parser("status", help="show the current (or latest) round")
    close = actions.add_parser("close", help="end the open round now: aggregate if its minimum is met, else fail it")
    for sub in (open_, status, close):
        sub.add_argument("--server", default=os.environ.get("FEDFACE_SERVER", "http://127.0.0.1:8000"), help="server URL (default: FEDFACE_SERVER or http://127.0.0.1:8000)")
        sub.add_argument("--data-dir", default="./fedface-data", help="where a --dev server wrote admin_token")
        sub.add_argument("--cacert", help="CA bundle for an https server with a private certificate")
        sub.add_argument("--json", action="store_true", help="print the round as JSON")
    open_.add_argument("--min", type=int, default=2, help="fewest updates that still make a round (default 2)")
    open_.add_argument("--target", type=int, default=10, help="participants to select; aggregation starts when all uploaded (default 10)")
    open_.add_argument("--deadline", type=float, default=600, help="seconds until uploads close (default 600)")
    open_.add_argument("--selection-window", type=float, default=5, help="seconds of check-ins before fair selection (default 5)")
    open_.add_argument("--local-epochs", type=int, default=1)
    open_.add_argument("--lr", type=float, default=0.01, help="local learning rate")
    open_.add_argument("--aggregation", choices=("fedavg", "median", "trimmed_mean", "norm_bounded", "dp_fedavg"), default="fedavg",
                       help="backbone aggregation: fedavg (default), a robust one against malicious devices, or dp_fedavg (user-level DP)")
    open_.add_argument("--trim-beta", type=float, default=0.2, help="trimmed_mean: fraction dropped at each end (default 0.2)")
    open_.add_argument("--max-update-norm", type=float, default=1.0, help="norm_bounded, dp_fedavg: L2 bound on each delta (default 1.0)")
    open_.add_argument("--dp-noise", type=float, default=1.0, help="dp_fedavg: noise multiplier z, noise std = z * bound / participants (default 1.0)")
    open_.add_argument("--dp-delta", type=float, default=1e-5, help="dp_fedavg: delta of the reported epsilon (default 1e-5)")
    open_.add_argument("--secure-aggregation", action="store_true",
                       help="mask each backbone update (Bonawitz et al.): the server sees only their sum; fedavg only")
    open_.add_argument("--secagg-key-phase", type=float, default=30, help="secure aggregation: seconds for each key step (default 30)")
    open_.add_argument("--secagg-unmask-phase", type=float, default=60, help="secure aggregation: seconds to wait for unmasking answers (default 60)")
    status.add_argument("--round", type=int, help="a round id instead of the current one")
    close.add_argument("--round", type=int, help="a round id instead of the current one")


def _token(data_dir: str) -> str:
    token = os.environ.get("FEDFACE_ADMIN_TOKEN", "").strip()
    if token:
        return token
    path = Path(data_dir) / "admin_token"
    if path.is_file():
        return path.read_text().strip()
    raise AdminClientError(f"no admin token: set FEDFACE_ADMIN_TOKEN (or pass the dev server's --data-dir; {path} does not exist)")


def _call(args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    import httpx

    url = args.server.rstrip("/") + path
    try:
        response = httpx.request(
            method, url, json=body, headers={"Authorization": f"Bearer {_token(args.data_dir)}"},
            verify=args.cacert or True, timeout=30,
        )
    except httpx.HTTPError as error:
        raise AdminClientError(f"cannot reach {args.server}: {error}") from None
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail")
        except ValueError:
            detail = response.text[:200]
        raise AdminClientError(f"server answered {response.status_code}: {json.dumps(detail) if not isinstance(detail, str) else detail}")
    return response.json()


def _describe(r: dict[str, Any]) -> str:
    deadline = datetime.fromisoformat(r["deadline_at"])
    left = (deadline - datetime.now(UTC)).total_seconds()
    lines = [
        f"round {r['id']}: {r['status']} ({r['strategy']})",
        f"  participants: {r['n_checked_in']} checked in, {r['n_selected']} selected, {r['n_uploaded']} uploaded "
        f"(target {r['target_participants']}, min {r['min_participants']})",
        f"  deadline: {r['deadline_at']}" + (f" (in {left:.0f} s)" if r["status"] == "open" and left > 0 else ""),
        f"  model: {r['base_version'][:12]}" + (f" -> {r['result_version'][:12]}" if r["result_version"] else ""),
    ]
    if r.get("failure_reason"):
        lines.append(f"  failed: {r['failure_reason']}")
    if r.get("summary"):
        lines.append(f"  summary: {json.dumps(r['summary'])}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.action == "open":
        config = {
            "min_participants": args.min, "target_participants": args.target, "deadline_s": args.deadline,
            "selection_window_s": args.selection_window, "local": {"epochs": args.local_epochs, "lr": args.lr},
            "aggregation": {"method": args.aggregation, "trim_beta": args.trim_beta, "max_update_norm": args.max_update_norm,
                            "dp_noise_multiplier": args.dp_noise, "dp_delta": args.dp_delta},
            "secure_aggregation": {"enabled": args.secure_aggregation, "key_phase_s": args.secagg_key_phase,
                                   "unmask_phase_s": args.secagg_unmask_phase},
        }
        result = _call(args, "POST", "/v1/admin/rounds", config)
    elif args.action == "close":
        round_id = args.round or _call(args, "GET", "/v1/admin/rounds/current")["id"]
        result = _call(args, "POST", f"/v1/admin/rounds/{round_id}/close", None)
    else:
        result = _call(args, "GET", f"/v1/admin/rounds/{args.round}" if args.round else "/v1/admin/rounds/current")
    print(json.dumps(result, indent=1) if args.json else _describe(result))
    return 0
