"""`fedface admin model list|calibrate|center`: the model versions a round server publishes, the
verification threshold each one tells devices to use, and the feature centre rounds centre on.

A round's version inherits its parent's threshold, because the server holds no faces to calibrate
on. Federated training moves every score, so an inherited threshold stops meaning its FAR
(simulator/REPORT.md, section 6). `calibrate` puts that right from the operator's machine: it
downloads the version, sets the threshold at `--far` over every impostor pair of LFW people folds
1-5 (never the test folds 6-10), and publishes it. Devices read it with the current model (every
online verify and round), and the next round inherits it.

`center` publishes a version's feature centre (facecore.eval.feature_center), computed the same way
on the operator's machine from public photos: `fedface admin round open` takes the current version's
centre for its fleet-camera settings, and a round's version inherits it.
"""
from __future__ import annotations

import argparse
import hashlib
import tempfile
from pathlib import Path
from typing import Any

from fedface.commands.admin_client import call, connection_arguments, table, time_text, usage
from server_api.errors import AdminClientError


def add_arguments(objects: Any) -> None:
    parser = objects.add_parser(
        "model", help="model versions, their verification thresholds and feature centres; set either on public faces",
        description="model versions, their verification thresholds and feature centres; set either on public faces",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    list_ = actions.add_parser("list", help="versions, newest (current) first: round, threshold, what it was calibrated on")
    calibrate = actions.add_parser(
        "calibrate", help="set a version's threshold at a FAR on LFW folds 1-5 and publish it",
        description="Download the version, calibrate its verification threshold at --far over every impostor pair of "
        "LFW people folds --folds (6-10 are the test set and refused), and publish it: devices read it with the current "
        "model (every online verify and round), and the next round's version inherits it. Needs the LFW data (--data, else $FEDFACE_DATA).",
    )
    calibrate.add_argument("--far", type=float, default=1e-3, help="false-accept rate to calibrate for (default: 0.001)")
    calibrate.add_argument("--force", action="store_true",
                           help="publish a threshold below the model's FAR 10%% point, which the server otherwise refuses")
    calibrate.add_argument("--folds", default="1-5", help="LFW people folds to calibrate on (default: 1-5; 6-10 are refused)")
    calibrate.add_argument("--data", metavar="DIR", help="data root holding lfw/ (default: $FEDFACE_DATA, else ../shared/data)")
    calibrate.add_argument(
        "--unseen-only", choices=("auto", "yes", "no"), default="auto",
        help="leave out the public split's people the model trained on (auto: yes for every backbone but the dlib ResNet)",
    )
    center = actions.add_parser(
        "center", help="publish a version's feature centre: the mean feature of 1,000 public photos",
        description="Download the version, compute the unit mean of its features of 1,000 public photos of --source (the split's "
        "public people, never a device's or an evaluation person's), and publish it: `fedface admin round open` centres the "
        "devices' loss on the current version's centre, and a round's version inherits it. Needs the data (--data, else $FEDFACE_DATA).",
    )
    center.add_argument("--source", choices=("celeba", "lfw"), default="celeba",
                        help="whose public photos (default: celeba; the LFW photos' centre does not adapt the default model, "
                        "simulator/REPORT.md section 8)")
    center.add_argument("--data", metavar="DIR", help="data root (default: $FEDFACE_DATA, else ../shared/data)")
    list_.add_argument("--limit", type=int, default=20, metavar="N", help="versions to show")
    for sub in (calibrate, center):
        sub.add_argument("version", nargs="?", metavar="VERSION",
                         help="a version hash or its first characters, as `model list` shows (default: the current one)")
    for sub in (list_, calibrate, center):
        connection_arguments(sub)


def _resolve(versions: list[dict[str, Any]], wanted: str | None) -> dict[str, Any]:
    if not versions:
        raise AdminClientError("the server has no model version yet")
    if wanted is None:
        return versions[0]
    matches = [v for v in versions if v["version"].startswith(wanted.lower())]
    if len(matches) != 1:
        found = "no version" if not matches else f"{len(matches)} versions"
        raise AdminClientError(f"{found} among the server's newest {len(versions)} start with {wanted!r}: see `fedface admin model list`")
    return matches[0]


def _threshold(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _version_table(versions: list[dict[str, Any]]) -> str:
    if not versions:
        return "no model versions"
    return table(
        ("VERSION", "ROUND", "CREATED", "THRESHOLD", "FAR", "CALIBRATED FOR", "CENTRE"),
        [
            (
                v["version"][:12], v["round_id"] if v["round_id"] is not None else "bootstrap", time_text(v["created_at"]),
                _threshold(v["verify_threshold"]), v["verify_far"] if v["verify_far"] is not None else "-",
                "this version" if v["calibrated_for"] == v["version"] else f"{v['calibrated_for'][:12]} (inherited)",
                "yes" if v.get("feature_center") else "-",
            )
            for v in versions
        ],
    )


def _calibrate(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """Download, calibrate locally on public faces, publish; the answer is the version as now published."""
    from facecore.data.lfw import parse_folds
    from facecore.eval.calibration import calibrate_threshold, public_people, trained_on_public
    from facecore.eval.lfw import refuse_test_folds
    from facecore.paths import data_root

    if not 0.0 < args.far < 1.0:
        raise AdminClientError(f"--far must lie strictly between 0 and 1, got {args.far}")
    folds = parse_folds(args.folds)
    refuse_test_folds(folds, "a verification threshold")
    root = data_root(args.data)
    version, model = _download(args)
    unseen_only = trained_on_public(model) if args.unseen_only == "auto" else args.unseen_only == "yes"
    seen = public_people(root) if unseen_only else []
    verification = calibrate_threshold(model, root / "lfw", folds, args.far, exclude=seen)
    body = {"threshold": verification.threshold, "far": verification.far, "calibration": verification.calibration}
    published = call(args, "PUT", f"/v1/admin/models/{version['version']}/verification", body | ({"force": True} if args.force else {}))
    was = _threshold(version["verify_threshold"])
    return published, (
        f"version {published['version'][:12]}: threshold {was} -> {_threshold(published['verify_threshold'])} at FAR "
        f"{published['verify_far']:g} ({verification.calibration}); devices use it from their next online verify or round"
    )


def _center(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """Download, compute the centre locally on public photos, publish; the answer is the version as now published."""
    from facecore.align.geometry import geometry_of
    from facecore.data.split import SplitConfig, build_split
    from facecore.eval.feature_center import center_source, public_feature_center
    from facecore.paths import data_root

    root = data_root(args.data)
    version, model = _download(args)
    center = public_feature_center(build_split(root, SplitConfig(seed=0)), root, model, geometry_of(model), source=args.source)
    source = center_source(args.source)
    published = call(args, "PUT", f"/v1/admin/models/{version['version']}/feature-center", {"vector": center.tolist(), "source": source})
    return published, f"version {published['version'][:12]}: feature centre from {source}; `fedface admin round open` uses it from the next round"


def _download(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """The version `args.version` names (default: the current one) and its backbone, checked against its hash."""
    from facecore.models.checkpoint import load_backbone

    version = _resolve(call(args, "GET", "/v1/admin/models?limit=500"), args.version)
    blob = call(args, "GET", f"/v1/admin/models/{version['version']}/backbone", raw=True)
    if hashlib.sha256(blob).hexdigest() != version["version"]:
        raise AdminClientError(f"the backbone downloaded for {version['version'][:12]} does not match its hash")
    with tempfile.TemporaryDirectory(prefix="fedface-model-") as scratch:
        path = Path(scratch) / "backbone.pt"
        path.write_bytes(blob)
        return version, load_backbone(path)


def run(args: argparse.Namespace) -> tuple[Any, str]:
    if args.action == "calibrate":
        return _calibrate(args)
    if args.action == "center":
        return _center(args)
    if args.limit < 1:
        raise usage(f"--limit must be at least 1, got {args.limit}")
    versions = call(args, "GET", f"/v1/admin/models?limit={args.limit}")
    return versions, _version_table(versions)
