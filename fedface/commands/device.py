"""`fedface device register|enroll|train|verify|personalize|unenroll --server URL --state DIR`."""
from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, help_text in (
        ("register", "create this device's key pair and register it"),
        ("enroll", "enroll the owner from photos (a folder or files)"),
        ("train", "take part in the current round: train locally and upload"),
        ("verify", "compare a photo with the enrolled owner"),
        ("personalize", "opt-in: train a fused personal verifier on the owner's faces (stays on this device)"),
        ("unenroll", "delete the owner's enrollment here and on the server"),
    ):
        sub = actions.add_parser(name, help=help_text)
        sub.add_argument("--server", required=True, help="round server URL, e.g. http://127.0.0.1:8000")
        sub.add_argument("--state", required=True, help="this device's state folder")
        sub.add_argument("--cacert", help="CA bundle for a TLS server with a private certificate")
        if name == "enroll":
            sub.add_argument("--photos", nargs="+", required=True)
            sub.add_argument("--min-photos", type=int, default=3)
        if name == "train":
            sub.add_argument("--wait", type=float, default=0.0, help="seconds to wait for an open round and a slot")
        if name == "verify":
            sub.add_argument("photo")
            sub.add_argument("--personal", action="store_true", help="use the verifier trained by personalize")
            sub.add_argument("--threshold", type=float, help="cosine threshold (default: the server's, calibrated for the global model)")
            sub.add_argument("--json", action="store_true")
        if name == "personalize":
            sub.add_argument("--fusion", choices=("none", "conv", "multi", "single"), default="single")
            sub.add_argument("--epochs", type=int, default=20)


def run(args: argparse.Namespace) -> int:
    from device_sdk.device import FaceDevice

    device = FaceDevice(args.server, args.state, min_photos=getattr(args, "min_photos", 3), verify_tls=args.cacert or True)
    if args.action == "register":
        print(f"registered as {device.register()}")
    elif args.action == "enroll":
        print("detecting and aligning faces ...", flush=True)
        result = device.enroll(args.photos)
        print(f"enrolled {result.faces} faces with model {result.model_version[:12]}")
        if result.skipped:
            print(f"no face found in {len(result.skipped)} photo(s): {', '.join(result.skipped)}")
    elif args.action == "train":
        print(f"checking in (waiting up to {args.wait:.0f} s) ...", flush=True)
        summary = device.train_round(wait=args.wait)
        print(
            f"round {summary.round_id}: loss {summary.loss_before:.4f} -> {summary.loss_after:.4f} in {summary.seconds:.1f} s, "
            f"{summary.steps} steps, {summary.bytes_up:,} B up, {summary.bytes_down:,} B down"
        )
    elif args.action == "personalize":
        from device_sdk.personal import PersonalConfig
        from device_sdk.training import LocalTrainingConfig

        print(f"training the {args.fusion} personal verifier ...", flush=True)
        done = device.personalize(PersonalConfig(args.fusion, LocalTrainingConfig(epochs=args.epochs, trainable_blocks=2)))
        print(f"personal verifier ({done.fusion}) on {done.faces} faces: loss {done.loss_before:.4f} -> {done.loss_after:.4f} in {done.seconds:.1f} s")
    elif args.action == "verify":
        result = device.verify(args.photo, personal=args.personal, threshold=args.threshold)
        if args.json:
            print(json.dumps({"score": result.score, "match": result.match, "threshold": result.threshold, "personal": result.personal}))
        else:
            print(f"{'match' if result.match else 'no match'}: score {result.score:.3f} (threshold {result.threshold:.3f})")
    else:
        device.unenroll()
        print("unenrolled: the template is deleted here and on the server")
    return 0
