"""`fedface sim cross-device ...`: simulations on real identities.

Invariant: cross-device's round settings are the live round's flags, from the table `fedface admin round
open` takes its own from (fedface/commands/round_flags.py, SIM_SETTINGS); only what a live round has no
setting for (the population, seeds, the camera, the evaluation, how devices are run) is declared here.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from fedface.cli import add_lazy_command
from fedface.commands.evaluation_options import add_eval_photos, evaluation_choice, subset_line
from fedface.commands.round_flags import Alias, add_round_flags, nested, on_off, settings

if TYPE_CHECKING:
    from simulator.cross_device.config import CrossDeviceConfig

# facecore.capture.CAPTURES's names, written out: importing it at parse time brings numpy and PIL
# (fedface/cli_test.py checks the two agree).
CAPTURE_NAMES = ("lowlight-ir", "far")
CENTER_SOURCE_NAMES = ("lfw", "celeba", "model")  # simulator.cross_device.config.CENTER_SOURCES, written out for the same reason
CAPTURE_HELP = ("simulate the fleet's camera: every device photo and the evaluation's LFW photos as it takes them, "
                "LFW also scored clean (lowlight-ir: grey near-infrared at night, one side light; far: a small, blurred, "
                "noisy, JPEG face). See `fedface sim capture-examples`")


# The round settings the simulator honours, as the live round's flags (fedface/commands/round_flags.py);
# the rest of RoundConfig is the round server's (deadlines, quorum, robust and secure aggregation's details).
SIM_SETTINGS = (
    "local.epochs", "local.steps", "local.lr", "local.margin", "local.batch_size", "local.trainable_blocks", "local.train_embedding",
    "local.upload_bits", "local.download_bits",
    "spreadout.nu", "spreadout.steps", "spreadout.lr", "spreadout.momentum", "spreadout.center",
    "aggregation.weighting", "aggregation.max_update_norm", "aggregation.dp_delta", "aggregation.server_momentum",
    "secure_aggregation.enabled",
)
# Old spellings, hidden from help, kept for one release.
SIM_ALIASES = (Alias("--dp-clip", "aggregation.max_update_norm"),)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    modes = parser.add_subparsers(dest="mode", metavar="MODE", required=True)
    cd = modes.add_parser("cross-device", help="FedFace with one identity per device")
    cd.add_argument("--devices", type=int, default=1000, metavar="N", help="simulated devices, one identity each")
    cd.add_argument("--rounds", type=int, default=20, metavar="N", help="rounds to run")
    cd.add_argument("--per-round", type=int, default=100, metavar="N", help="devices selected per round")
    cd.add_argument("--method", choices=("pretrained", "fedavg", "fedface", "central"), default="fedface",
                    help="fedface (FedAvg + spreadout), plain fedavg, the pretrained model alone, or central training")
    cd.add_argument("--init", choices=("mean", "random"), default="mean",
                    help="class embedding start: mean owner feature, or random")
    cd.add_argument("--spreadout", type=on_off, default="on", metavar="{on,off}",
                    help="run the spreadout regularizer on the server")
    cd.add_argument("--seed", type=int, default=0, help="seed of device choice, selection and training")
    cd.add_argument("--model", default="default", help="starting backbone: default, PATH or random")
    add_round_flags(cd, SIM_SETTINGS, SIM_ALIASES)
    cd.add_argument("--public-negatives", type=int, default=0, metavar="K",
                    help="the server sends K public identities' templates each round and devices train against them (0: the paper's positive-only loss)")
    cd.add_argument("--public-rehearsal", type=on_off, default="off", metavar="{on,off}",
                    help="with --public-negatives: devices also get those people's faces and keep them near their own templates")
    cd.add_argument("--negative-scale", type=float, default=64.0, help="with --public-negatives: CosFace's scale s against them")
    cd.add_argument("--negative-margin", type=float, default=0.35, help="with --public-negatives: CosFace's margin m on the owner's cosine")
    cd.add_argument("--owner-holdout", type=float, default=None, metavar="FRACTION",
                    help="hold out this share of each device's photos from training and verify its owner on them (fedface eval owners)")
    cd.add_argument("--dp-epsilon", type=float, default=None,
                    help="DP-FedAvg on the backbone (a live round's dp_fedavg, each delta clipped to --max-update-norm): noise "
                         "calibrated so the whole run spends this epsilon at --dp-delta (inf: clipping only)")
    cd.add_argument("--template-noise-cos", type=float, default=None,
                    help="devices upload templates blurred to keep this cosine with the true one (default: clean)")
    cd.add_argument("--selection", choices=("least_recent", "uniform"), default="least_recent",
                    help="which devices a round takes: the round server's least-recently-selected rule, or uniform at random (runs before it)")
    cd.add_argument("--wire", choices=("fp16", "fp32"), default="fp16",
                    help="precision of the model devices receive and of the deltas they send (fp16: the SDK's default; fp32: runs before it)")
    cd.add_argument("--seeding", choices=("live", "per_device"), default="live",
                    help="each device's training seed: the SDK's for the round, or the per-device seeds of runs before it")
    cd.add_argument("--workers", type=int, default=1,
                    help="train devices in this many persistent processes (one per core is fastest; 1: in process)")
    cd.add_argument("--backend", choices=("process", "ray"), default="process",
                    help="where --workers run: local processes or Ray actors (pip install 'fedface[ray]')")
    cd.add_argument("--ray-address", default=None, metavar="ADDRESS",
                    help="--backend ray: the cluster to join (default: a local Ray, or RAY_ADDRESS); its nodes need fedface installed")
    cd.add_argument("--capture", choices=CAPTURE_NAMES, default=None, metavar="NAME",
                    help=CAPTURE_HELP + f" (choices: {', '.join(CAPTURE_NAMES)}; default: the photos as they are)")
    cd.add_argument("--enrolment", choices=("captured", "clean"), default="captured",
                    help="with --capture: each device's template starts from its photos as the fleet camera takes them, "
                         "or from the same photos clean (the owner enrolled with a phone's own camera)")
    cd.add_argument("--train-enrolment", type=on_off, default="off", metavar="{on,off}",
                    help="with --enrolment clean, on: each device also trains on its clean enrolment photos, as a device that "
                         "enrolled on them and added its camera's photos does; off: on the camera's photos only")
    cd.add_argument("--center-features", type=on_off, default="off", metavar="{on,off}",
                    help="on: the devices' positive loss runs on features centred on the direction the starting templates share")
    cd.add_argument("--center-source", choices=CENTER_SOURCE_NAMES, default="lfw",
                    help="with --center-features: whose public photos give the centre, or the centre the model publishes (model), "
                         "which a live round uses and no --split changes")
    cd.add_argument("--eval-every", type=int, default=5, metavar="N", help="rounds between LFW evaluations")
    cd.add_argument("--folds", default="6-10",
                    help="LFW folds to evaluate on (identity-disjoint from the devices): at least 2, all of 6-10 (test) or all of 1-5 (tuning)")
    add_eval_photos(cd)
    cd.add_argument("--target-accuracy", type=float, default=None, metavar="ACCURACY", help="LFW accuracy for rounds_to_target")
    # Its old spelling, hidden, for one release: round open's --target is the live round's devices per round.
    cd.add_argument("--target", dest="target_accuracy", type=float, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    cd.add_argument("--data", help="data root (default: $FEDFACE_DATA, else ../shared/data)")
    cd.add_argument("--split", help="split manifest (default: the seed-0 split)")
    cd.add_argument("--fresh", action="store_true", help="ignore a checkpoint in --out instead of resuming from it")
    cd.add_argument("--out", default="runs/sim", metavar="DIR", help="run folder: report, plots, resumable checkpoint")
    cd.add_argument("--http", type=int, default=None, metavar="N",
                    help="end-to-end instead: start the real server and drive N real SDK devices through --rounds rounds")
    cd.add_argument("--json", action="store_true", help="print the summary as one JSON line")

    # Imported only when named: FedFusion's defaults come from modules that load torch.
    add_lazy_command(
        modes, "fusion", "fedface.commands.fusion", "FedFusion: fuse global and local features on an image .npz"
    )
    add_lazy_command(modes, "fusion-faces", "fedface.commands.fusion_faces",
                     "the device's personalised fused verifier vs the global model, owner vs others")
    add_lazy_command(
        modes, "cross-silo", "fedface.commands.cross_silo", "PFM + FV over heterogeneous silos (Bai et al. 2021)"
    )

    examples = modes.add_parser("capture-examples", help="a grid of LFW faces, clean and through each fleet camera (--capture)")
    examples.add_argument("--out", required=True, metavar="PNG", help="where to write the grid (a .png file)")
    examples.add_argument("--photos", type=int, default=6, metavar="N", help="faces per row (people of LFW folds 1-5)")
    examples.add_argument("--seed", type=int, default=0, help="which people, and each camera's draws")
    examples.add_argument("--data", help="data root (default: $FEDFACE_DATA, else ../shared/data)")

    compare = modes.add_parser("compare", help="plot several finished runs together (accuracy, TAR, embedding spread)")
    compare.add_argument("runs", nargs="+", help="run folders holding report.json")
    compare.add_argument("--out", required=True, metavar="DIR", help="folder for the combined plots and table")
    compare.add_argument("--loss-target", type=float, default=None, help="also report rounds until the devices' round-start loss reaches this")


def run(args: argparse.Namespace) -> int:
    if args.mode == "cross-silo":
        from fedface.commands import cross_silo

        return cross_silo.run(args)
    if args.mode == "fusion":
        from fedface.commands.fusion import run as run_fusion

        return run_fusion(args)
    if args.mode == "fusion-faces":
        from fedface.commands.fusion_faces import run as run_fusion_faces

        return run_fusion_faces(args)
    if args.mode == "compare":
        return _compare(args)
    if args.mode == "capture-examples":
        return _capture_examples(args)
    return _cross_device(args)


def _capture_examples(args: argparse.Namespace) -> int:
    from facecore.models.dlib_resnet import DLIB_GEOMETRY
    from facecore.paths import data_root
    from simulator.cross_device.capture_examples import write_capture_examples

    path = write_capture_examples(data_root(args.data), Path(args.out), DLIB_GEOMETRY, args.photos, args.seed)
    print(f"wrote {path}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from simulator.cross_device.markdown import summary_table, write_markdown
    from simulator.cross_device.run import write_plots

    reports = []
    for folder in map(Path, args.runs):
        if not (folder / "report.json").is_file():
            from facecore.errors import FaceCoreError

            raise FaceCoreError(f"{folder} has no report.json: is the run finished?")
        reports.append(json.loads((folder / "report.json").read_text()))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plots = write_plots(reports, out)
    report = write_markdown(reports, out, plots, args.loss_target)
    print(summary_table(reports, args.loss_target))
    print("wrote " + ", ".join(str(p) for p in (*plots, report)))
    return 0


def _cross_device(args: argparse.Namespace) -> int:
    if args.secure_aggregation and not args.http:
        from facecore.errors import FaceCoreError

        raise FaceCoreError("--secure-aggregation runs the live protocol between real devices and the server: use it with --http N")
    if args.http:
        # --http runs the demo, whose figures are test figures: folds 6-10 only. In process, folds 1-5 tune.
        folds, eval_photos = evaluation_choice(args.folds, args.eval_photos, tuning=False)
        from facecore.paths import data_root
        from fedface.commands.demo import passive_openmp

        passive_openmp()
        from simulator.demo import run_demo

        report = run_demo(data_root(args.data), Path(args.out), devices=args.http, rounds=args.rounds, model=args.model, folds=folds,
                          secure=args.secure_aggregation, eval_photos=eval_photos, capture=args.capture)
        summary = {"method": "fedface-http" + ("-secagg" if args.secure_aggregation else ""), "devices": report["devices"], "rounds": report["rounds"],
                   "accuracy": report["after"]["accuracy"], "tar_at_far": report["after"]["tar_at_far"],
                   "initial_accuracy": report["before"]["accuracy"], "folds": report["folds"], "lfw_subset": report["subset"]}
        _print_summary(summary, args.json)
        return 0
    config = cross_device_config(args)  # checked before the run's heavy imports
    from facecore.data.split import SplitManifest
    from facecore.paths import data_root
    from simulator.cross_device.run import run_cross_device

    out = Path(args.out)
    manifest = SplitManifest.load(args.split) if args.split else None
    report = run_cross_device(config, data_root(args.data), out, manifest, resume=not args.fresh)
    summary = {k: report.get(k) for k in ("method", "devices", "rounds", "accuracy", "tar_at_far", "rounds_to_target", "seconds_per_round", "owners",
                                          "lfw_subset")}
    if report.get("capture"):  # the camera's figures, and the same photos' clean ones beside them
        summary |= {"capture": report["capture"], "clean": report.get("clean")}
    _print_summary(summary, args.json)
    return 0


def cross_device_config(args: argparse.Namespace) -> CrossDeviceConfig:
    """The in-process run that the flags describe, checked before any data is read (the round settings against
    a live round's bounds, then the simulator's configs); a refusal is one UsageError line."""
    from pydantic import ValidationError

    from device_sdk.training import LocalTrainingConfig
    from facecore.federation.config import RoundConfig
    from facecore.spreadout import SpreadoutConfig
    from fedface.cli import UsageError
    from fedface.commands.admin_client import flag_errors
    from simulator.cross_device.config import CrossDeviceConfig

    folds, eval_photos = evaluation_choice(args.folds, args.eval_photos, tuning=True)
    round_settings = settings(args, SIM_SETTINGS)
    # In process there is no secure aggregation to check (it is refused without --http): the rest as a live round's.
    try:
        RoundConfig.model_validate(nested({k: v for k, v in round_settings.items() if not k.startswith("secure_aggregation.")}))
    except ValidationError as error:
        raise UsageError(flag_errors([dict(e) for e in error.errors()])) from None
    part = {section: {path.partition(".")[2]: value for path, value in round_settings.items() if path.startswith(section + ".")}
            for section in ("local", "spreadout")}
    try:
        local = part["local"]
        config = CrossDeviceConfig(
            devices=args.devices, rounds=args.rounds, per_round=args.per_round, method=args.method, init=args.init,
            spreadout=args.spreadout, seed=args.seed, model=args.model, eval_every=args.eval_every,
            eval_folds=folds, eval_photos=eval_photos, target_accuracy=args.target_accuracy,
            local=LocalTrainingConfig(**{k: v for k, v in local.items() if k not in ("batch_size", "upload_bits", "download_bits")}, batch=local["batch_size"],
                                      negative_scale=args.negative_scale, negative_margin=args.negative_margin),
            server_spreadout=SpreadoutConfig(**part["spreadout"]),
            dp_epsilon=args.dp_epsilon, dp_clip=round_settings["aggregation.max_update_norm"], dp_delta=round_settings["aggregation.dp_delta"],
            weighting=round_settings["aggregation.weighting"], server_momentum=round_settings["aggregation.server_momentum"],
            template_noise_cos=args.template_noise_cos, workers=args.workers,
            selection=args.selection, wire=args.wire, seeding=args.seeding,
            backend=args.backend, ray_address=args.ray_address, owner_holdout=args.owner_holdout, public_negatives=args.public_negatives,
            public_rehearsal=args.public_rehearsal, capture=args.capture, enrolment=args.enrolment, train_enrolment=args.train_enrolment,
            center_features=args.center_features, center_source=args.center_source, upload_bits=local["upload_bits"],
            download_bits=local["download_bits"],
        )
    except ValueError as error:  # the configs' own checks: one line, not a traceback
        raise UsageError(str(error)) from None
    return config


def _print_summary(summary: dict[str, object], as_json: bool) -> None:
    """One JSON line, or a line per figure; `lfw_subset` only when the figures are on a subset, then in words."""
    subset = summary.pop("lfw_subset", None)
    if as_json:
        print(json.dumps(summary | ({"lfw_subset": subset} if subset else {})))
        return
    shown = summary | ({"evaluation": subset_line(subset)} if isinstance(subset, dict) else {})
    print("\n".join(f"{k:>18}: {v}" for k, v in shown.items()))
