"""`fedface device verify PHOTO...|DIR [--personal] [--threshold T] [--json]`: photos against the owner.

One process scores every photo without torch, deciding as the SDK's `FaceDevice.verify` does
(device_sdk.verify: the model, the model last seen when the server is unreachable, and the threshold).
Output: one line per photo, in the order given (a folder's photos sorted by name), then the threshold,
its false-accept rate and the model's version; with --json, one JSON object per photo per line carrying
the same fields. Exit status 0 when every photo got a score (a match or not), 1 when one could not be
scored (not an image, no face): its line says which. Paths that hold no photo at all (an empty folder, a
folder of other files) are one error line and exit 1, before the server is asked: a verify that scored
nothing never reads as a pass. The caller adds --server, --state and --cacert.
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from device_sdk.scoring import PhotoVerifier


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("photos", nargs="+", metavar="PHOTO",
                        help="photos, or folders of photos, to compare with the owner")
    parser.add_argument("--personal", action="store_true",
                        help="score with the personal verifier (at its own calibrated threshold)")
    parser.add_argument("--threshold", type=float, metavar="COSINE",
                        help="accept at or above this cosine (default: the personal verifier's calibrated one with "
                             "--personal, else the server's, calibrated for the global model)")
    parser.add_argument("--json", action="store_true", help="one JSON object per photo per line")


@contextmanager
def _no_collections() -> Iterator[None]:
    """No cyclic garbage collection inside the block, and what it made joins the oldest generation at its end.
    Loading the modules and sessions makes ~65,000 objects that live as long as the process and drops almost
    none in cycles (~1,300), yet the allocations trigger some ninety collections, ~20 ms of a one-photo verify
    that find next to nothing; left young, the objects would only cost the first collection after the block
    as much. In the oldest generation they are looked at by full collections alone, as if they had survived
    the young ones (gc.freeze then gc.unfreeze: the documented way to move every object there at no cost).
    Collection is back before photos are scored, however many."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        if was_enabled:
            gc.enable()


def run(args: argparse.Namespace) -> int:
    from fedface.cli import UsageError

    if args.threshold is not None and not -1.0 <= args.threshold <= 1.0:
        raise UsageError(f"--threshold is a cosine in [-1, 1], got {args.threshold}")
    with _no_collections():
        photos, verifier = _open(args)
    if verifier.offline:
        print(f"server unreachable: using model {verifier.model_version[:12]}, the one last seen", file=sys.stderr)
    threshold = verifier.threshold
    far = "unknown" if threshold.far is None else f"{threshold.far:g}"
    results = verifier.verify(photos)
    for result in results:
        if args.json:
            row = {**result.to_json(), "threshold": threshold.value, "threshold_source": threshold.source,
                   "far": threshold.far, "personal": args.personal, "model_version": verifier.model_version}
            print(json.dumps(row), flush=True)
        elif result.score is None:
            print(f"{result.photo}: {result.problem}", flush=True)
        else:
            print(f"{result.photo}: {'match' if result.match else 'no match'}, score {result.score:.3f}", flush=True)
    if not args.json:
        source = {"server": "the server's", "personal": "the personal verifier's", "given": "given"}[threshold.source]
        print(f"threshold {threshold.value:.3f} ({source}, FAR {far}); model {verifier.model_version[:12]}"
              + ("; personal verifier" if args.personal else ""))
        if threshold.detail:
            print(f"calibration: {threshold.detail}")
    return 0 if all(r.score is not None for r in results) else 1


def _open(args: argparse.Namespace) -> tuple[list[Path], PhotoVerifier]:
    """The photos named, and the owner's verifier: registered and enrolled first, then the server's model."""
    from device_sdk.link import ServerLink
    from device_sdk.state import DeviceState
    from device_sdk.transport import Transport
    from device_sdk.verify import owner_verifier
    from facecore.data.folders import list_photos
    from fedface.commands.device import tls_verify

    photos = list_photos(args.photos)
    state = DeviceState(args.state)
    state.require_registered()  # a mistyped --state is the more useful thing to hear first
    if not photos:
        from device_sdk.errors import DeviceError
        from facecore.data.records import IMAGE_SUFFIXES

        raise DeviceError(f"no photos to verify in {', '.join(map(str, args.photos))}: a folder's photos "
                          f"are its {', '.join(sorted(IMAGE_SUFFIXES))} files")
    # One quick retry: a verify should answer, not wait out a long backoff; offline it uses the cached model.
    transport = Transport(args.server, timeout=10.0, retries=1, verify=tls_verify(args.server, args.cacert))
    return photos, owner_verifier(ServerLink(state, transport), personal=args.personal, threshold=args.threshold)
