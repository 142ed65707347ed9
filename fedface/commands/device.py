"""`fedface device ACTION`: the device SDK's command line.

`--server` defaults to FEDFACE_SERVER, else http://127.0.0.1:8000 (as `fedface admin`); `--state`
defaults to a per-user data folder. Only `register` creates state, and only once the server accepted
the device: every other action refuses a folder that is not a registered device, before it reads a
photo or trains. Every failure is one line (a FaceCoreError) that says what to do about it; a train
stopped by Ctrl-C (or SIGTERM, SIGHUP) first says whether its update is saved to be resent.

Only `train` and `personalize` import torch (device_sdk.device's docstring); register, enroll, verify,
status, unenroll and reset run on numpy and onnxruntime, and FastAPI is never imported
(tests/device/test_device_torch_free.py). `verify` decides as the SDK's `FaceDevice.verify` does: both
open their verifier in device_sdk.verify. A command starts cold each time, so its imports are most of
what it costs: `fedface bench device` measures each against its goal.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from device_sdk.errors import StateError

if TYPE_CHECKING:
    from device_sdk.device import FaceDevice
    from device_sdk.enrolment import EnrollResult
    from device_sdk.state import DeviceState

DEFAULT_SERVER = "http://127.0.0.1:8000"
ACTIONS = {
    "register": "create this device's key pair and register it with the server (the only action that creates state)",
    "enroll": "enroll the owner from photos (files or folders)",
    "add-photos": "add photos this device's camera took of the owner to what it trains on; the template stays",
    "train": "take part in the current round: train locally and upload (resends an update saved earlier)",
    "verify": "compare photos (files or folders) with the enrolled owner, without torch",
    "personalize": "opt-in: train a fused personal verifier on the owner's faces (stays on this device)",
    "unenroll": "delete the owner's enrollment here and on the server",
    "status": "show this device's registration, enrollment, pending upload and the server's current model",
    "reset": "delete this device's local state, after unenrolling on the server when it can",
}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """ArgumentDefaultsHelpFormatter that leaves out defaults that say nothing (None, False)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def default_state_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir("fedface", appauthor=False)) / "device"


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text}")
    return value


def _count(text: str, least: int = 1) -> int:
    value = int(text)
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {text}")
    return value


def _members(text: str) -> int:
    return _count(text, least=2)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    # A parent that already shows defaults (the `fedface` parser) passes its formatter down; a plain one gets ours.
    shown: dict[str, Any] = {"formatter_class": HelpFormatter} if parser.formatter_class is argparse.HelpFormatter else {}
    for name, help_text in ACTIONS.items():
        sub = actions.add_parser(name, help=help_text, description=help_text, **shown)
        sub.add_argument("--server", metavar="URL", default=os.environ.get("FEDFACE_SERVER", DEFAULT_SERVER),
                         help="round server URL (FEDFACE_SERVER sets the default)")
        sub.add_argument("--state", metavar="DIR", type=Path, default=default_state_dir(),
                         help="this device's state folder")
        sub.add_argument("--cacert", metavar="FILE", help="CA bundle for an https server with a private certificate")
        _ACTION_ARGUMENTS.get(name, lambda _: None)(sub)


def _register_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--enrollment-token", metavar="TOKEN", default=os.environ.get("FEDFACE_ENROLLMENT_TOKEN"),
                     help="one-time token from the operator (`fedface admin token issue`), which a production "
                     "server requires; FEDFACE_ENROLLMENT_TOKEN sets the default")


def _enroll_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--photos", metavar="PATH", nargs="+", required=True, help="the owner's photos: files or folders")
    sub.add_argument("--min-photos", metavar="N", type=_count, default=3, help="fewest photos with a face to enroll")


def _add_photos_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--photos", metavar="PATH", nargs="+", required=True, help="the owner's photos from this device's camera: files or folders")


def _train_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--wait", metavar="SECONDS", type=_seconds, nargs="?", const=None, default=0.0,
                     help="seconds to wait for an open round and a slot; --wait alone waits until the round ends "
                     "and names the model it made")
    sub.add_argument("--min-secure-members", metavar="N", type=_members, default=2,
                     help="take part in a secure-aggregation round only with at least N members (each puppet member "
                     "a server would enrol beside this device costs it one)")


def _verify_arguments(sub: argparse.ArgumentParser) -> None:
    from fedface.commands import device_verify  # torch-free, and light to import

    device_verify.add_arguments(sub)


def _personalize_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--fusion", metavar="KIND", choices=("none", "conv", "multi", "single"), default="single",
                     help="fusion module: none, conv, multi or single")
    sub.add_argument("--epochs", metavar="N", type=_count, default=20, help="training epochs over the owner's faces")


def _status_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--json", action="store_true", help="print the status as JSON")
    sub.add_argument("--timeout", metavar="SECONDS", type=_seconds, default=5.0,
                     help="how long to wait for the server's answer before showing the model last seen "
                     "(0: do not ask it)")


def _reset_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--yes", action="store_true", help="confirm: delete the key, identity, template and faces")


_ACTION_ARGUMENTS = {
    "register": _register_arguments, "enroll": _enroll_arguments, "add-photos": _add_photos_arguments, "train": _train_arguments, "verify": _verify_arguments,
    "personalize": _personalize_arguments, "status": _status_arguments, "reset": _reset_arguments,
}


def tls_verify(server: str, cacert: str | None) -> bool | str:
    """What the transport checks a server's certificate against: `cacert`, else the system's CA bundle, for an
    https server; nothing for a plain-http one, which has no certificate (loading the bundle costs ~20 ms)."""
    return (cacert or True) if server.startswith("https:") else False


def _skip_httpx_cli() -> None:
    """httpx imports its own command-line client whenever click, rich and pygments are installed (other tools
    install them): ~60 ms of a cold command, a sixth of a one-photo verify, for code this process never runs.
    A None entry in sys.modules makes that import fail, and httpx takes its documented fallback (its `main`
    then asks for `httpx[cli]`). It touches only this command's process, and nothing once httpx is loaded."""
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]  # None: "do not import", as the import system reads it


# The actions that import torch; every other one runs on numpy and onnxruntime alone.
TORCH_ACTIONS = ("train", "personalize")


# The actions that end without the interpreter's teardown (fedface.cli.console): they start no thread, pool or
# server and leave no file open (the state's files are written whole and closed, the aligned-face cache is not
# used), so freeing every module is all the teardown would do, ~50 ms of a one-photo verify.
QUICK_EXIT_ACTIONS = ("register", "verify", "status", "unenroll")


def skips_teardown(args: argparse.Namespace) -> bool:
    """Whether this process may end without the interpreter's teardown once `run(args)` has returned."""
    return args.action in QUICK_EXIT_ACTIONS


def _one_blas_thread(action: str) -> None:
    """numpy's OpenBLAS starts a thread per core when numpy is imported, and they spin: CPU time in every
    cold register, enroll or verify, and wall time when the other core is busy. The
    torch-free actions never run a BLAS call big enough to share out (onnxruntime has its own threads).
    OpenBLAS reads this when it loads, so it is set before numpy is imported; a value the user set wins,
    and torch's actions keep theirs."""
    if action not in TORCH_ACTIONS:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def run(args: argparse.Namespace) -> int:
    _skip_httpx_cli()
    _one_blas_thread(args.action)
    try:
        return _run(args)
    except OSError as error:  # an unreadable or unwritable state folder, a photo that vanished
        where = error.filename or args.state
        raise StateError(f"{where}: {error.strerror or error}: check the path and its permissions") from None


def _run(args: argparse.Namespace) -> int:
    if args.action == "status":
        return _status(args)
    if args.action == "verify":
        from fedface.commands import device_verify

        return int(device_verify.run(args) or 0)
    if args.action == "reset":
        return _reset(args)
    from device_sdk.device import FaceDevice

    device = FaceDevice(args.server, args.state, min_photos=getattr(args, "min_photos", 3),
                        verify_tls=tls_verify(args.server, args.cacert),
                        min_secure_members=getattr(args, "min_secure_members", 2))
    if args.action == "register":
        _register(device, args)
    elif args.action == "enroll":
        result = device.enroll(args.photos, progress=_say)
        print(f"enrolled {result.faces} faces with model {result.model_version[:12]}")
        _print_skipped(result)
    elif args.action == "add-photos":
        result = device.add_photos(args.photos, progress=_say)
        print(f"added {result.faces} faces from this device's camera; the next round trains on them (the template stays)")
        _print_skipped(result)
    elif args.action == "train":
        _train(device, args.wait)
    elif args.action == "personalize":
        from device_sdk.personal import PersonalConfig
        from device_sdk.training import LocalTrainingConfig

        print(f"training the {args.fusion} personal verifier ...", flush=True)
        training = LocalTrainingConfig(epochs=args.epochs, trainable_blocks=2)
        done = device.personalize(PersonalConfig(args.fusion, training))
        print(f"personal verifier ({done.fusion}) on {done.faces} faces: loss {done.loss_before:.4f} -> "
              f"{done.loss_after:.4f} in {done.seconds:.1f} s")
        if done.threshold is None:
            print("no public faces to calibrate its threshold on: pass --threshold to verify --personal")
        else:
            print(f"its own threshold: {done.threshold:.3f} (FAR {done.far:g} on public impostor faces); "
                  "verify --personal uses it")
    else:
        device.unenroll()
        print("unenrolled: the template is deleted here and on the server")
    return 0


def _say(step: str) -> None:
    print(f"{step} ...", flush=True)


def _register(device: FaceDevice, args: argparse.Namespace) -> None:
    from device_sdk.errors import RegistrationRefused

    known = device.device_id
    try:
        device_id = device.register(args.enrollment_token)
    except RegistrationRefused as refused:
        raise refused.saying("--enrollment-token TOKEN (or the FEDFACE_ENROLLMENT_TOKEN variable)") from None
    print(f"already registered as {device_id} ({args.state}): nothing changed" if known == device_id
          else f"registered as {device_id} ({args.state})")


def _print_skipped(result: EnrollResult) -> None:
    if result.skipped:
        shown = ", ".join(f"{name} ({why})" for name, why in zip(result.skipped, result.reasons, strict=True))
        print(f"skipped {len(result.skipped)} photo(s): {shown}")


def _train(device: FaceDevice, wait: float | None) -> None:
    try:
        summary = device.train_round(wait=wait, progress=_say)
    except KeyboardInterrupt:  # Ctrl-C, or facecore.lifetime.Stopped for SIGTERM and SIGHUP: cli.main ends the run
        print(_unsent_update(device), file=sys.stderr, flush=True)
        raise
    for notice in summary.notices:
        print(notice)
    if summary.resent:
        print(f"round {summary.round_id}: sent the update saved by an earlier train (loss {summary.loss_before:.4f} -> "
              f"{summary.loss_after:.4f}, {summary.bytes_up:,} B up)")
    else:
        print(f"round {summary.round_id}: loss {summary.loss_before:.4f} -> {summary.loss_after:.4f} in "
              f"{summary.seconds:.1f} s, {summary.steps} steps, {summary.bytes_up:,} B up, {summary.bytes_down:,} B down")
    if wait is None:  # --wait alone: until the round ends
        _say(f"waiting for round {summary.round_id} to end")
        try:
            end = device.wait_for_round_end(summary)
        except KeyboardInterrupt:
            print(f"the server had accepted this device's update for round {summary.round_id}: nothing is left to "
                  "resend", file=sys.stderr, flush=True)
            raise
        from device_sdk.rounds import ROUND_END_GRACE_S  # loaded already, with FaceDevice

        if end.ended:
            made = "" if end.made_by_round == end.round_id else f" (made by round {end.made_by_round})"
            print(f"round {end.round_id} ended: the server's model is now {end.model_version[:12]}{made}")
        else:
            still = " still" if end.model_version == summary.base_version else ""
            print(f"round {end.round_id}: no new model by {end.gave_up_at:%H:%M:%S} UTC (its deadline plus "
                  f"{ROUND_END_GRACE_S:.0f} s): it most likely failed; the server's model is{still} "
                  f"{end.model_version[:12]} (`fedface device status` shows the current one)")


def _unsent_update(device: FaceDevice) -> str:
    """What a train stopped midway leaves: an update saved to be resent (device_sdk.state's pending upload,
    sealed before the upload starts), one the server already accepted, or nothing."""
    try:
        pending = device.state.pending_meta()
    except (StateError, OSError) as error:  # an unreadable leftover must not hide that the run was stopped
        return f"could not read {device.state.dir}'s saved update ({error})"
    if pending is not None:
        return (f"the update for round {pending['round_id']} is saved in {device.state.dir} and will be resent by "
                "the next train (unless the round's deadline passes first)")
    if device.accepted_round is not None:
        return f"the server had accepted this device's update for round {device.accepted_round}: nothing is left to resend"
    return "no update was saved: nothing will be resent, and the next train checks in and trains afresh"


def _status(args: argparse.Namespace) -> int:
    from device_sdk.state import DeviceState

    state = DeviceState(args.state)
    status = state.summary()
    current, problem = _server_model(state, args)
    # `server_model`: the server's current model when it answered, else the one last seen (`server_model_current`).
    status |= {"server": args.server, "server_model": current or status["server_model"],
               "server_model_current": current is not None, "server_error": problem}
    if args.json:
        print(json.dumps(status))
        return 0
    pending = status["pending_upload_round"]
    rows = {
        "state": f"{status['state']} (key: {status['key']})",
        "device": f"{status['device_id']} (registered)",
        "enrolled": f"yes, with model {status['enrolled_model'][:12]}" if status["enrolled"] else "no: run enroll",
        "pending": f"an update for round {pending}, resent by the next train" if pending is not None else "none",
        "model": _model_row(status),
        "personal": "a personal verifier" if status["personal_verifier"] else "none",
    }
    for label, value in rows.items():
        print(f"{label:<9} {value}")
    return 0


def _server_model(state: DeviceState, args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(the server's current model version, None), or (None, why the server did not say): one signed GET, no
    retry, `--timeout` seconds at most (0: not asked). Nothing is written: the model a later offline verify
    falls back to stays the one whose ONNX file a verify or enroll cached."""
    from device_sdk.errors import DeviceError, ServerUnavailable
    from device_sdk.link import ServerLink
    from device_sdk.model_cache import current_model
    from device_sdk.transport import Transport

    if args.timeout == 0:
        return None, "the server was not asked (--timeout 0)"
    transport = Transport(args.server, timeout=args.timeout, retries=0, verify=tls_verify(args.server, args.cacert))
    try:
        return current_model(ServerLink(state, transport), remember=False)["version"], None
    except ServerUnavailable:
        return None, f"the server at {args.server} cannot be reached now"
    except DeviceError as error:  # a refusal (removed device, no model yet) or a malformed answer
        return None, f"the server at {args.server} did not say ({error})"
    finally:
        transport.close()


def _model_row(status: dict[str, Any]) -> str:
    model = status["server_model"]
    if status["server_model_current"]:
        return f"{model[:12]} (the server's current model)"
    return f"{model[:12]} (the last one seen: {status['server_error']})" if model else f"not seen yet ({status['server_error']})"


def _reset(args: argparse.Namespace) -> int:
    from fedface.cli import UsageError

    if not args.yes:
        raise UsageError(f"reset deletes this device's key, identity, template and faces in {args.state}: "
                         "pass --yes to confirm")
    from device_sdk.device import FaceDevice

    done = FaceDevice(args.server, args.state, retries=1, timeout=10, verify_tls=tls_verify(args.server, args.cacert)).reset()
    print(f"server: {done.server}")
    print(f"deleted the local state in {args.state} ({', '.join(done.removed)})")
    return 0
