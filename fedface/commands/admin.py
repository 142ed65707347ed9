"""`fedface admin round open|list|status|close`, `fedface admin device list|remove|prune`, `fedface admin
token issue` and `fedface admin model list|calibrate` (fedface/commands/admin_model.py): operate a
running round server over its admin API.

The admin token comes from FEDFACE_ADMIN_TOKEN or, for a `--dev` server, from
`<data-dir>/admin_token`; there is deliberately no flag, so it stays out of shell history.
Round open's settings are RoundConfig's, as flags from the one table the simulator's come from too
(fedface/commands/round_flags.py); `--settings` picks the preset a flag not given leaves in place. They
are checked here against the server's own request schema, so a bad value is reported by the flag that
set it (exit 2) before anything is sent.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from datetime import UTC, datetime
from typing import Any

from facecore.federation.status import ACTIVE_ROUND_STATUSES, RoundStatus
from fedface.commands import admin_model
from fedface.commands.admin_client import call, connection_arguments, flag_errors, table, time_text, usage
from server_api.errors import AdminClientError

# The round-flag table (fedface.commands.round_flags) is read from RoundConfig, which loads pydantic: it is
# imported inside the functions that build or read round open's flags, so other admin commands start without it.


def _preset_flags(secure: bool, besides: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the fleet-camera preset sets, by setting, other than the defaults (or than `besides`)."""
    from facecore.federation.fleet_camera import fleet_camera_settings
    from fedface.commands.round_flags import ROUND_FLAGS

    preset = fleet_camera_settings([1.0], secure)  # any unit vector: the centre is not a flag
    flat = {f"{section}.{name}": value for section, values in preset.items() for name, value in values.items()}
    return {path: value for path, value in flat.items()
            if path in ROUND_FLAGS and value != (ROUND_FLAGS[path].default if besides is None else besides.get(path))}


def _open_arguments(parser: argparse.ArgumentParser) -> None:
    from fedface.commands.round_flags import ROUND_FLAGS, Alias, add_round_flags, flag_text

    # Old spellings of round open's flags, hidden from help, kept for one release.
    aliases = (Alias("--lr", "local.lr"), Alias("--keep-templates", "local.train_embedding", const=False))
    plain = _preset_flags(False)
    secure = _preset_flags(True, {path: plain.get(path, flag.default) for path, flag in ROUND_FLAGS.items()})
    parser.add_argument(
        "--settings", choices=("fleet-camera", "paper"), default="fleet-camera",
        help="fleet-camera (default): the devices' loss centred on the current model's feature centre (`fedface admin model center`) "
        f"and {' '.join(flag_text(*item) for item in plain.items())} (with --secure-aggregation: "
        f"{' '.join(flag_text(*item) for item in secure.items())}): devices keep their templates and take one small step towards them; "
        "paper: the defaults below, the FedFace paper's rounds (trained templates, spreadout), which leave a strong model unchanged. "
        "A flag given overrides either (default: fleet-camera)",
    )
    add_round_flags(parser, list(ROUND_FLAGS), aliases)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    objects = parser.add_subparsers(dest="object", metavar="OBJECT", required=True)
    round_parser = objects.add_parser(
        "round",
        help="open rounds, list them, watch one, end one early",
        description="open rounds, list them, watch one, end one early",
    )
    actions = round_parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    open_ = actions.add_parser(
        "open", help="open a round on the current model", description="open a round on the current model"
    )
    list_ = actions.add_parser("list", help="recent rounds, newest first: state, participants, duration")
    status = actions.add_parser("status", help="show the current round (open or aggregating), else the latest one")
    close = actions.add_parser("close", help="end the open round now: aggregate if its minimum is met, else fail it")
    device_parser = objects.add_parser(
        "device",
        help="list registered devices; remove one, with its stored template",
        description="list registered devices; remove one, with its stored template",
    )
    device_actions = device_parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    device_list = device_actions.add_parser(
        "list", help="devices in registration order: status, template held, last selection"
    )
    remove = device_actions.add_parser(
        "remove",
        help="delete a device's stored template and revoke its key",
        description="Delete the device's template (and any uploaded copy) and revoke its key: its requests fail "
        "from now on. The same phone may register again, as a new device, and enroll again.",
    )
    remove.add_argument("device_id", metavar="DEVICE_ID", help="the id `fedface admin device list` shows")
    prune = device_actions.add_parser(
        "prune", help="delete devices that registered but never enrolled a template",
        description="Delete devices registered longer ago than --older-than that never enrolled: they hold no "
        "template and would otherwise pile up (and count as nothing in any round).",
    )
    prune.add_argument("--older-than", type=int, metavar="SECONDS",
                       help="registration age (default: the server's FEDFACE_PRUNE_UNENROLLED_AFTER_S)")
    token_parser = objects.add_parser(
        "token", help="issue one-time enrollment tokens (a production server requires one per new device)",
        description="issue one-time enrollment tokens (a production server requires one per new device)",
    )
    token_actions = token_parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    issue = token_actions.add_parser(
        "issue", help="print new one-time tokens, one per line; each registers one device before it expires",
    )
    issue.add_argument("--count", type=int, default=1, metavar="N", help="tokens to issue (at most 1000)")
    issue.add_argument("--ttl", type=int, metavar="SECONDS",
                       help="lifetime of the tokens (default: the server's FEDFACE_ENROLLMENT_TOKEN_TTL_S)")
    for sub in (open_, list_, status, close, device_list, remove, prune, issue):
        connection_arguments(sub)
    admin_model.add_arguments(objects)
    _open_arguments(open_)
    list_.add_argument("--limit", type=int, default=20, metavar="N", help="rounds to show")
    device_list.add_argument("--limit", type=int, default=100, metavar="N", help="devices to show")
    device_list.add_argument("--offset", type=int, default=0, metavar="N", help="devices to skip first")
    status.add_argument("--round", type=int, metavar="ID", help="this round instead (default: the current one)")
    close.add_argument("--round", type=int, metavar="ID", help="this round instead (default: the current one)")
    close.add_argument(
        "--wait",
        type=float,
        default=30,
        metavar="SECONDS",
        help="wait this long for the server to end the round, then show its new state (0: show it at once)",
    )


def _feature_center(args: argparse.Namespace) -> list[float]:
    """The current version's published feature centre, which fleet-camera settings need."""
    current = call(args, "GET", "/v1/admin/models?limit=1")
    center = current[0].get("feature_center") if current else None
    if center is None:
        raise AdminClientError("the current model version publishes no feature centre, which --settings fleet-camera centres the "
                               "devices' loss on: publish one with `fedface admin model center`, or open with --settings paper")
    return [float(x) for x in center]


def _round_config(args: argparse.Namespace, feature_center: list[float] | None) -> dict[str, Any]:
    from fedface.commands.round_flags import given_settings, nested

    """The POST body of `round open`: the settings preset (fleet-camera with `feature_center`, else the
    schema's defaults, the paper's), then every flag given; checked with the server's own schema."""
    from pydantic import ValidationError

    from facecore.federation.fleet_camera import fleet_camera_settings
    from server_api.schemas import RoundCreate

    preset = {} if feature_center is None else fleet_camera_settings(feature_center, args.secure_aggregation)
    config = nested(given_settings(args), preset)
    try:
        RoundCreate.model_validate(config)
    except ValidationError as error:
        raise usage(flag_errors([dict(e) for e in error.errors()], config)) from None
    return config


def _duration(r: dict[str, Any]) -> str:
    end = datetime.fromisoformat(r["closed_at"]) if r.get("closed_at") else datetime.now(UTC)
    seconds = (end - datetime.fromisoformat(r["created_at"])).total_seconds()
    return f"{seconds:.0f} s" if seconds < 600 else f"{seconds / 60:.0f} min"


def _aggregation(r: dict[str, Any]) -> str:
    return (r["config"].get("aggregation") or {}).get("method", "fedavg")


def _describe(r: dict[str, Any]) -> str:
    deadline = datetime.fromisoformat(r["deadline_at"])
    left = (deadline - datetime.now(UTC)).total_seconds()
    lines = [
        f"round {r['id']}: {r['status']} ({r['strategy']}, {_aggregation(r)})",
        f"  participants: {r['n_checked_in']} checked in, {r['n_selected']} selected, {r['n_uploaded']} uploaded "
        f"(target {r['target_participants']}, min {r['min_participants']})",
        f"  opened: {time_text(r['created_at'])}, deadline: {time_text(r['deadline_at'])}"
        + (f" (in {left:.0f} s)" if r["status"] == RoundStatus.OPEN and left > 0 else ""),
        f"  duration: {_duration(r)}" + (" so far" if r["status"] in ACTIVE_ROUND_STATUSES else ""),
        f"  model: {r['base_version'][:12]}" + (f" -> {r['result_version'][:12]}" if r["result_version"] else ""),
    ]
    if r.get("failure_reason"):
        lines.append(f"  failed: {r['failure_reason']}")
    if r.get("summary"):
        lines.append(f"  summary: {json.dumps(r['summary'])}")
    return "\n".join(lines)


def _roundtable(rounds: list[dict[str, Any]]) -> str:
    if not rounds:
        return "no rounds yet: open one with `fedface admin round open`"
    return table(
        ("ROUND", "STATE", "UPLOADED/SELECTED/CHECKED-IN", "TARGET/MIN", "OPENED", "DURATION", "RESULT"),
        [
            (
                r["id"],
                r["status"],
                f"{r['n_uploaded']}/{r['n_selected']}/{r['n_checked_in']}",
                f"{r['target_participants']}/{r['min_participants']}",
                time_text(r["created_at"]),
                _duration(r),
                (r["result_version"] or "")[:12] or (r.get("failure_reason") or "-"),
            )
            for r in rounds
        ],
    )


def _devicetable(devices: list[dict[str, Any]]) -> str:
    if not devices:
        return "no devices"
    return table(
        ("DEVICE", "STATUS", "TEMPLATE", "REGISTERED", "LAST SELECTED"),
        [
            (
                d["device_id"],
                d["status"],
                "yes" if d["enrolled"] else "no",
                time_text(d["created_at"]),
                d["last_selected_round"] if d["last_selected_round"] is not None else "-",
            )
            for d in devices
        ],
    )


def _close(args: argparse.Namespace) -> dict[str, Any]:
    """Close, then wait for the scheduler to end the round, so what is printed is its new state."""
    round_id = args.round or call(args, "GET", "/v1/admin/rounds/current")["id"]
    result = call(args, "POST", f"/v1/admin/rounds/{round_id}/close", None)
    deadline = time.monotonic() + max(0.0, args.wait)
    while result["status"] == RoundStatus.OPEN and time.monotonic() < deadline:
        time.sleep(0.2)
        result = call(args, "GET", f"/v1/admin/rounds/{round_id}")
    return result


def _run_round(args: argparse.Namespace) -> tuple[Any, str]:
    if args.action == "open":
        config = _round_config(args, None)  # every flag checked before any request
        if args.settings == "fleet-camera":
            config = _round_config(args, _feature_center(args))
        result = call(args, "POST", "/v1/admin/rounds", config)
        return result, _describe(result)
    if args.action == "list":
        if args.limit < 1:
            raise usage(f"--limit must be at least 1, got {args.limit}")
        rounds = call(args, "GET", f"/v1/admin/rounds?limit={args.limit}")
        return rounds, _roundtable(rounds)
    if args.action == "close":
        result = _close(args)
        return result, _describe(result)
    result = call(args, "GET", f"/v1/admin/rounds/{args.round}" if args.round else "/v1/admin/rounds/current")
    return result, _describe(result)


def _run_device(args: argparse.Namespace) -> tuple[Any, str]:
    if args.action == "list":
        if args.limit < 1 or args.offset < 0:
            raise usage(f"--limit must be at least 1 and --offset at least 0, got {args.limit} and {args.offset}")
        devices = call(args, "GET", f"/v1/admin/devices?limit={args.limit}&offset={args.offset}")
        return devices, _devicetable(devices)
    if args.action == "prune":
        if args.older_than is not None and args.older_than < 0:
            raise usage(f"--older-than must be at least 0, got {args.older_than}")
        query = "" if args.older_than is None else f"?older_than_s={args.older_than}"
        result = call(args, "POST", f"/v1/admin/devices/prune{query}")
        return result, f"{result['pruned']} never-enrolled device(s) registered before {time_text(result['registered_before'])} deleted"
    if not re.fullmatch(r"[0-9a-f]{1,64}", args.device_id):
        raise usage(
            f"DEVICE_ID {args.device_id!r} is not a device id (lower-case hex, as `fedface admin device list` shows)"
        )
    result = call(args, "DELETE", f"/v1/admin/devices/{args.device_id}")
    held = "its template deleted" if result["template_deleted"] else "it held no template"
    return result, f"device {result['device_id']} removed ({held}; its key no longer authenticates)"


def _runtoken(args: argparse.Namespace) -> tuple[Any, str]:
    # One line per flag, naming only the value that is wrong: the other may be unset (None).
    problems = []
    if args.count < 1:
        problems.append(f"--count must be at least 1, got {args.count}")
    elif args.count > 1000:
        problems.append(f"--count must be at most 1000, got {args.count}")
    if args.ttl is not None and args.ttl < 60:
        problems.append(f"--ttl must be at least 60 seconds, got {args.ttl}")
    if problems:
        raise usage("; ".join(problems))
    result = call(args, "POST", "/v1/admin/enrollment-tokens", {"count": args.count, "ttl_s": args.ttl})
    return result, "\n".join(result["tokens"]) + f"\n(expire {time_text(result['expires_at'])}; each registers one device)"


def run(args: argparse.Namespace) -> int:
    runner = {"device": _run_device, "token": _runtoken, "model": admin_model.run}.get(args.object, _run_round)
    result, text = runner(args)
    print(json.dumps(result, indent=1) if args.json else text)
    return 0
