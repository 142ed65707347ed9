"""`fedface sim cross-device ...`: simulations on real identities."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedface.cli import add_lazy_command
from fedface.commands.evaluation_options import add_eval_photos, evaluation_choice, subset_line

# facecore.capture.CAPTURES's names, written out: importing it at parse time brings numpy and PIL
# (fedface/cli_test.py checks the two agree).
CAPTURE_NAMES = ("lowlight-ir", "far")
CAPTURE_HELP = ("simulate the fleet's camera: every device photo and the evaluation's LFW photos as it takes them, "
                "LFW also scored clean (lowlight-ir: grey near-infrared at night, one side light; far: a small, blurred, "
                "noisy, JPEG face). See `fedface sim capture-examples`")


def _on_off(value: str) -> bool:
    # An {on,off} option's default is written as the word too: argparse passes a string default through
    # `type`, so the parsed value is still a bool while the help shows `(default: on)`.
    if value not in ("on", "off"):
        raise argparse.ArgumentTypeError("use on or off")
    return value == "on"


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
    cd.add_argument("--spreadout", type=_on_off, default="on", metavar="{on,off}",
                    help="run the spreadout regularizer on the server")
    cd.add_argument("--seed", type=int, default=0, help="seed of device choice, selection and training")
    cd.add_argument("--model", default="default", help="starting backbone: default, PATH or random")
    cd.add_argument("--local-epochs", type=int, default=1, metavar="N", help="epochs each selected device trains")
    cd.add_argument("--local-lr", type=float, default=0.01, metavar="RATE", help="the devices' learning rate")
    cd.add_argument("--local-steps", type=int, default=None, metavar="N", help="cap on each device's optimiser steps a round (default: whole epochs)")
    cd.add_argument("--weighting", choices=("samples", "devices"), default="samples",
                    help="FedAvg counts each device's update by its training photos (the paper's) or every device once")
    cd.add_argument("--server-momentum", type=float, default=0.0, metavar="BETA",
                    help="the server's heavy-ball momentum on each round's backbone step (0: plain FedAvg)")
    cd.add_argument("--margin", type=float, default=0.9, help="margin m of the positive-only FedFace loss")
    cd.add_argument("--trainable-blocks", type=int, default=None, help="frozen-prefix option: train only the last K blocks + head")
    cd.add_argument("--public-negatives", type=int, default=0, metavar="K",
                    help="the server sends K public identities' templates each round and devices train against them (0: the paper's positive-only loss)")
    cd.add_argument("--public-rehearsal", type=_on_off, default="off", metavar="{on,off}",
                    help="with --public-negatives: devices also get those people's faces and keep them near their own templates")
    cd.add_argument("--negative-scale", type=float, default=64.0, help="with --public-negatives: CosFace's scale s against them")
    cd.add_argument("--negative-margin", type=float, default=0.35, help="with --public-negatives: CosFace's margin m on the owner's cosine")
    cd.add_argument("--owner-holdout", type=float, default=None, metavar="FRACTION",
                    help="hold out this share of each device's photos from training and verify its owner on them (fedface eval owners)")
    # None: facecore.losses.SpreadoutConfig's (the paper's) value; not imported here, it loads torch.
    cd.add_argument("--spreadout-nu", type=float, default=None, help="spreadout: class embeddings are pushed below this cosine (paper: 0.3)")
    cd.add_argument("--spreadout-lr", type=float, default=None, help="spreadout: the server's SGD learning rate on the embeddings (paper: 0.01)")
    cd.add_argument("--spreadout-steps", type=int, default=None, help="spreadout: SGD steps per round (paper: 10)")
    cd.add_argument("--spreadout-center", type=_on_off, default=None, metavar="{on,off}",
                    help="spreadout: first take the direction all class embeddings share out of them (default: off, as the paper)")
    cd.add_argument("--dp-epsilon", type=float, default=None,
                    help="DP-FedAvg on the backbone: noise calibrated so the whole run spends this epsilon (inf: clipping only)")
    cd.add_argument("--dp-clip", type=float, default=1.0, help="DP-FedAvg: L2 bound on each device's delta")
    cd.add_argument("--dp-delta", type=float, default=1e-5, help="DP-FedAvg: delta of the epsilon")
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
    cd.add_argument("--train-embedding", type=_on_off, default="on", metavar="{on,off}",
                    help="off: devices keep their enrolled template and train only the backbone towards it")
    cd.add_argument("--center-features", type=_on_off, default="off", metavar="{on,off}",
                    help="on: the devices' positive loss runs on features centred on the direction the starting templates share")
    cd.add_argument("--center-source", choices=("lfw", "celeba"), default="lfw",
                    help="with --center-features: whose public photos give the centre")
    cd.add_argument("--eval-every", type=int, default=5, metavar="N", help="rounds between LFW evaluations")
    cd.add_argument("--folds", default="6-10",
                    help="LFW folds to evaluate on (identity-disjoint from the devices): at least 2, all of 6-10 (test) or all of 1-5 (tuning)")
    add_eval_photos(cd)
    cd.add_argument("--target", type=float, default=None, help="LFW accuracy for rounds_to_target")
    cd.add_argument("--data", help="data root (default: $FEDFACE_DATA, else ../shared/data)")
    cd.add_argument("--split", help="split manifest (default: the seed-0 split)")
    cd.add_argument("--fresh", action="store_true", help="ignore a checkpoint in --out instead of resuming from it")
    cd.add_argument("--out", default="runs/sim", metavar="DIR", help="run folder: report, plots, resumable checkpoint")
    cd.add_argument("--http", type=int, default=None, metavar="N",
                    help="end-to-end instead: start the real server and drive N real SDK devices through --rounds rounds")
    cd.add_argument("--secure-aggregation", action="store_true", help="with --http: rounds use secure aggregation of the backbone updates")
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
    # --http runs the demo, whose figures are test figures: folds 6-10 only. In process, folds 1-5 tune.
    folds, eval_photos = evaluation_choice(args.folds, args.eval_photos, tuning=not args.http)
    if args.http:
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
    from device_sdk.training import LocalTrainingConfig
    from facecore.data.split import SplitManifest
    from facecore.losses import SpreadoutConfig
    from facecore.paths import data_root
    from fedface.cli import UsageError
    from simulator.cross_device.config import CrossDeviceConfig
    from simulator.cross_device.run import run_cross_device

    try:
        local = LocalTrainingConfig(epochs=args.local_epochs, steps=args.local_steps, lr=args.local_lr, margin=args.margin,
                                    trainable_blocks=args.trainable_blocks, negative_scale=args.negative_scale, negative_margin=args.negative_margin,
                                    train_embedding=args.train_embedding)
        config = CrossDeviceConfig(
            devices=args.devices, rounds=args.rounds, per_round=args.per_round, method=args.method, init=args.init,
            spreadout=args.spreadout, seed=args.seed, model=args.model, eval_every=args.eval_every,
            eval_folds=folds, eval_photos=eval_photos, target_accuracy=args.target, local=local,
            dp_epsilon=args.dp_epsilon, dp_clip=args.dp_clip, dp_delta=args.dp_delta, template_noise_cos=args.template_noise_cos, workers=args.workers,
            selection=args.selection, wire=args.wire, seeding=args.seeding, weighting=args.weighting, server_momentum=args.server_momentum,
            backend=args.backend, ray_address=args.ray_address, owner_holdout=args.owner_holdout, public_negatives=args.public_negatives,
            public_rehearsal=args.public_rehearsal, capture=args.capture, enrolment=args.enrolment,
            center_features=args.center_features, center_source=args.center_source,
            server_spreadout=SpreadoutConfig(**{k: v for k, v in (("nu", args.spreadout_nu), ("steps", args.spreadout_steps),
                                                                   ("lr", args.spreadout_lr), ("center", args.spreadout_center)) if v is not None}),
        )
    except ValueError as error:  # the configs' own checks: one line, not a traceback
        raise UsageError(str(error)) from None
    out = Path(args.out)
    manifest = SplitManifest.load(args.split) if args.split else None
    report = run_cross_device(config, data_root(args.data), out, manifest, resume=not args.fresh)
    summary = {k: report.get(k) for k in ("method", "devices", "rounds", "accuracy", "tar_at_far", "rounds_to_target", "seconds_per_round", "owners",
                                          "lfw_subset")}
    if report.get("capture"):  # the camera's figures, and the same photos' clean ones beside them
        summary |= {"capture": report["capture"], "clean": report.get("clean")}
    _print_summary(summary, args.json)
    return 0


def _print_summary(summary: dict[str, object], as_json: bool) -> None:
    """One JSON line, or a line per figure; `lfw_subset` only when the figures are on a subset, then in words."""
    subset = summary.pop("lfw_subset", None)
    if as_json:
        print(json.dumps(summary | ({"lfw_subset": subset} if subset else {})))
        return
    shown = summary | ({"evaluation": subset_line(subset)} if isinstance(subset, dict) else {})
    print("\n".join(f"{k:>18}: {v}" for k, v in shown.items()))
