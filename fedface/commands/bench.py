"""`fedface bench <target>`: benchmarks (medians and ratios from one run), never timed unit tests.

Invariants:
- stdout holds the result alone: with --json exactly one JSON line (an object; `bench sim` of several device
  counts a list of them), else a readable report. Progress (step lines, bars) goes to stderr
  (fedface_bench.progress), so a run of minutes says what it is doing and a script reading stdout is unaffected.
- Every JSON object carries `goals_met` ({goal: {target, compare, measured, met}}) and `all_goals_met`
  (fedface_bench.goals), beside the keys it always had.
- Bad flags are usage errors (exit 2), a database or folder that cannot be used a runtime error (exit 1), each one line.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedface_bench.progress import Progress

DATA_HELP = "data root (default: $FEDFACE_DATA, else ../shared/data)"
JSON_HELP = "print one JSON object on stdout, with each goal's target, measured value and verdict (progress stays on stderr)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    targets = parser.add_subparsers(dest="target", metavar="TARGET", required=True)
    export = targets.add_parser("export", help="batch-1 single-thread latency: torch eager vs ONNX fp32 vs ONNX int8, per model, interleaved")
    export.add_argument("--model", action="append", metavar="MODEL",
                        help="a model to measure, repeatable: all engines of all models run interleaved in one run "
                             "(default: --model default --model mobile, the dlib ResNet next to its compact cut)")
    export.add_argument("--dir", action="append", metavar="DIR",
                        help="an existing export directory (holding model.onnx), one per --model in the same order "
                             "(default: export --int8 into temporary ones)")
    export.add_argument("--runs", type=int, default=600, metavar="N", help="timed runs per engine and model")
    export.add_argument("--rounds", type=int, default=20, metavar="N", help="interleaving rounds the runs are split into")
    export.add_argument("--data", metavar="DIR", help=DATA_HELP)
    export.add_argument("--json", action="store_true", help=JSON_HELP)
    server = targets.add_parser("server", help="N simulated devices through one round against a real `fedface server --dev` over HTTP")
    server.add_argument("--devices", type=int, default=1000, metavar="N", help="participants in the measured round (goals are judged at 1000)")
    server.add_argument("--concurrency", type=int, default=16, metavar="N", help="requests in flight at once")
    server.add_argument("--backbone", default="mobilefacenet", metavar="NAME", help="random backbone the server starts with")
    server.add_argument("--workers", type=int, default=1, metavar="N", help="server worker processes, as `fedface server --workers`")
    server.add_argument("--db", default=None, metavar="URL",
                        help="a PostgreSQL URL: each measured round runs in a fresh schema there, dropped afterwards (default: SQLite)")
    server.add_argument("--trainable-blocks", type=int, default=None, metavar="K",
                        help="the round trains the last K blocks and the head: each update carries those entries only")
    server.add_argument("--upload-bits", type=int, choices=(8, 4), default=None, metavar="BITS",
                        help="each update's deltas in 8 or 4 bits with a scale a row (a round's local.upload_bits); unset: fp16")
    server.add_argument("--aggregation-processes", type=int, default=0, metavar="N",
                        help="worker processes that sum the round's shards (FEDFACE_AGGREGATION_PROCESSES; 0: the aggregating process)")
    server.add_argument("--replicas", type=int, default=None, metavar="N",
                        help="with --db: the round on one server process (blobs on disk, then in the database), then on N "
                             "processes sharing the database and its blobs, devices spread over them; compares upload rates")
    server.add_argument("--secure", action="store_true",
                        help="a plain round and a secure-aggregation round of --devices side by side (no 10-device baseline)")
    server.add_argument("--drop", type=float, default=0.1, metavar="FRACTION",
                        help="--secure: fraction of devices dropping after sharing keys")
    server.add_argument("--json", action="store_true", help=JSON_HELP)
    device = targets.add_parser("device", help="enroll / one local round / verify on this CPU, and the cold `fedface device` "
                                "commands, against a local server")
    device.add_argument("--model", default="default", metavar="MODEL",
                        help="the model the local server starts with and the devices download: default, mobile or a backbone file")
    device.add_argument("--data", metavar="DIR", help=DATA_HELP)
    device.add_argument("--repeats", type=int, default=3, metavar="N",
                        help="SDK enrolls (each on a new device) and local rounds timed; medians reported, after one unmeasured warm-up each")
    device.add_argument("--verify-repeats", type=int, default=5, metavar="N",
                        help="cold `fedface device verify` runs per path")
    device.add_argument("--verify-only", action="store_true",
                        help="only the verify section: cold CLI, SDK, warm photos/s")
    device.add_argument("--commands-repeats", type=int, default=3, metavar="N",
                        help="fresh-process runs of `fedface device register`, `enroll` (10 new photos) and `verify` "
                             "(1 photo), each with a new device and person, after one unmeasured run")
    device.add_argument("--settings", choices=("fleet-camera", "paper"), default="fleet-camera",
                        help="the timed rounds' settings, as `fedface admin round open --settings`: fleet-camera trains (and sends) the "
                             "last blocks only, with the model's published feature centre; paper trains the whole backbone")
    device.add_argument("--upload-bits", type=int, choices=(8, 4), metavar="BITS",
                        help="the timed rounds send their updates in 8 or 4 bits (a round's local.upload_bits); unset: the --settings' own "
                             "(fleet-camera: 4, paper: fp16)")
    device.add_argument("--download-bits", type=int, choices=(8,), metavar="BITS",
                        help="8: the timed rounds' devices download the model as int8 weights (a round's local.download_bits); unset: fp16")
    device.add_argument("--commands-only", action="store_true",
                        help="only the cold commands section: register, enroll, verify, against their goals")
    device.add_argument("--json", action="store_true", help=JSON_HELP)
    sim = targets.add_parser("sim", help="one simulated FedFace round vs the compute floor (same images and steps as one stream)")
    sim.add_argument("--devices", default="10,100,1000", metavar="COUNTS",
                     help="comma-separated device counts, each run in a process of its own (its peak RSS is its own)")
    sim.add_argument("--trainable-blocks", type=int, default=2, metavar="K",
                     help="frozen-prefix option: train the last K blocks + head")
    sim.add_argument("--repeats", type=int, default=3, metavar="N", help="rounds timed per device count; the median is reported")
    sim.add_argument("--workers", type=int, default=None, metavar="N", help="our device processes (default: one per core)")
    sim.add_argument("--flower", action="store_true", help="also Flower's simulation engine (flwr + Ray) on the same round; needs `make flower-venv`")
    sim.add_argument("--ray", action="store_true", help="also our simulator on its Ray backend (as many actors as --workers); needs the ray extra")
    sim.add_argument("--model", default="mobilefacenet", metavar="MODEL",
                     help="starting backbone; MobileFaceNet because the 1,000-device timings are about the framework, "
                          "and it keeps them comparable with earlier runs and affordable on a CPU")
    sim.add_argument("--data", metavar="DIR", help=DATA_HELP)
    sim.add_argument("--json", action="store_true", help=JSON_HELP + "; a list of them for several device counts")
    detect = targets.add_parser("detect", help="photos/s for detection plus alignment per detector, side by side, "
                                "and LFW photos cut to their face box that each still finds")
    detect.add_argument("--photos", type=int, default=320, metavar="N", help="LFW photos decoded, detected and aligned per timed pass")
    detect.add_argument("--rounds", type=int, default=5, metavar="N", help="timed passes per detector and batch size, interleaved")
    detect.add_argument("--tight", type=int, default=1000, metavar="N",
                        help="LFW photos cut to MTCNN's face box for the tight-crop count (0: skip)")
    detect.add_argument("--data", metavar="DIR", help=DATA_HELP)
    detect.add_argument("--json", action="store_true", help=JSON_HELP)
    secagg = targets.add_parser("secagg", help="secure aggregation's bytes and seconds per round (Bonawitz et al.)")
    secagg.add_argument("--devices", default="100,1000", metavar="COUNTS", help="comma-separated device counts")
    secagg.add_argument("--dim", type=int, default=1_022_720, metavar="N",
                        help="parameters per update (default: mobilefacenet's 1,022,720 floats)")
    secagg.add_argument("--drop", type=float, default=0.1, metavar="FRACTION", help="fraction of devices dropping after sharing keys")
    secagg.add_argument("--full-protocol-max", type=int, default=100, metavar="N", help="run every device for real up to this many")
    secagg.add_argument("--json", action="store_true", help=JSON_HELP)


def run(args: argparse.Namespace) -> int:
    return {"export": _export, "server": _server, "device": _device, "sim": _sim, "secagg": _secagg,
            "detect": _detect}[args.target](args)


def _usage(message: str) -> Exception:
    from fedface.cli import UsageError

    return UsageError(message)


def _counts(flag: str, text: str) -> tuple[int, ...]:
    try:
        return tuple(int(c) for c in text.split(","))
    except ValueError:
        raise _usage(f"{flag} must be comma-separated integers, got {text!r}") from None


def _progress(args: argparse.Namespace) -> Progress:
    from fedface_bench.progress import Progress

    return Progress(args.target)


def _describe_goals(result: dict[str, Any]) -> str:
    from fedface_bench.goals import verdict

    return "\n".join(f"goal {name} {g['compare']} {g['target']:g}: measured "
                     f"{'-' if g['measured'] is None else format(g['measured'], '.4g')}, {verdict(g)}"
                     for name, g in result["goals_met"].items())


def _detect(args: argparse.Namespace) -> int:
    if args.photos < 16 or args.rounds < 1 or args.tight < 0:
        raise _usage("--photos must be at least 16, --rounds at least 1 and --tight at least 0")
    from facecore.paths import data_root
    from fedface_bench.detect import describe, run_detect_bench

    report = run_detect_bench(data_root(args.data), photos=args.photos, rounds=args.rounds, tight=args.tight, progress=_progress(args))
    print(json.dumps(report) if args.json else describe(report))
    return 0


def _secagg(args: argparse.Namespace) -> int:
    counts = _counts("--devices", args.devices)
    if min(counts) < 3 or args.dim < 1 or not 0 <= args.drop < 1 / 3:
        raise _usage("device counts must be >= 3, --dim >= 1, 0 <= --drop < 1/3 (the threshold is 2n/3 + 1)")
    from fedface_bench.secagg import describe, run_secagg_bench

    result = run_secagg_bench(counts, args.dim, args.drop, args.full_protocol_max, progress=_progress(args))
    print(json.dumps(result) if args.json else describe(result))
    return 0


def _sim(args: argparse.Namespace) -> int:
    counts = _counts("--devices", args.devices)
    if min(counts) < 2 or args.repeats < 1 or args.trainable_blocks < 0 or (args.workers is not None and args.workers < 1):
        raise _usage("device counts must be >= 2, --repeats >= 1, --trainable-blocks >= 0, --workers >= 1")
    from facecore.align.geometry import geometry_of
    from facecore.data.split import SplitConfig, build_split
    from facecore.errors import FaceCoreError
    from facecore.models.checkpoint import load_backbone
    from facecore.paths import data_root
    from fedface_bench.sim import bench_sim, bench_sim_each, describe
    from simulator.cross_device.population import load_population

    progress = _progress(args)
    if len(counts) > 1:  # each count in a process of its own, so that each peak RSS is its own
        try:
            results = bench_sim_each(counts, args._argv, progress)
        except RuntimeError as error:
            raise FaceCoreError(str(error)) from None
        print(json.dumps(results) if args.json else describe(results))
        return 0
    root = data_root(args.data)
    model = load_backbone(args.model)
    progress(f"loading {max(counts)} devices' faces (real identities of the seed-0 split, reused cyclically beyond them)")
    population = load_population(build_split(root, SplitConfig(seed=0)), root, requested=max(counts), geometry=geometry_of(model))
    try:
        results = bench_sim(population, model, counts, args.trainable_blocks, args.repeats, flower=args.flower, workers=args.workers,
                            ray=args.ray, progress=progress)
    except FileNotFoundError as error:
        raise FaceCoreError(str(error)) from None
    print(json.dumps(results if len(results) > 1 else results[0]) if args.json else describe(results))
    return 0


def _device(args: argparse.Namespace) -> int:
    """Real photos of one device identity (20 to enroll and train on, one more to verify), a folder
    of real LFW photos for the verify throughput, and LFW people of 11 or more photos for the cold
    commands (10 to enroll, one to verify)."""
    if args.verify_only and args.commands_only:
        raise _usage("--verify-only and --commands-only exclude each other")
    if min(args.repeats, args.verify_repeats, args.commands_repeats) < 1:
        raise _usage("--repeats, --verify-repeats and --commands-repeats must be at least 1")
    from export.detectors import export_detectors
    from facecore.data.split import SplitConfig, build_split
    from facecore.paths import data_root
    from fedface_bench.device import (
        COMMAND_PHOTOS,
        bench_commands,
        bench_device,
        bench_verify,
        command_goals,
        describe_commands,
        device_goals,
        verify_goals,
    )
    from fedface_bench.goals import Goal, with_goals
    from server_api.launcher import MANY_DEVICES_ON_LOOPBACK, LocalServer

    progress = _progress(args)
    root = data_root(args.data)
    progress("building the seed-0 split and choosing the photos")
    split = build_split(root, SplitConfig(seed=0))
    photos = next([root / p for p in paths] for identity, paths in sorted(split.sets["devices"].items()) if identity.startswith("celeba:") and len(paths) >= 21)
    lfw = sorted((root / "lfw" / "lfw-deepfunneled").glob("*/*.jpg"))
    by_person: dict[str, list[Path]] = {}
    for photo in lfw:
        by_person.setdefault(photo.parent.name, []).append(photo)
    # A new person for each run of the cold commands (and one for the unmeasured first run), in name order.
    people = [p for p in by_person.values() if len(p) >= COMMAND_PHOTOS + 1][: args.commands_repeats + 1]
    progress("checking the ONNX face detectors `fedface models fetch` made")
    export_detectors()  # what `fedface models fetch` made; the torch-free verify needs it
    progress(f"starting a local server with model {args.model}")
    with tempfile.TemporaryDirectory() as scratch, LocalServer(
        Path(scratch) / "server", model=args.model, env=MANY_DEVICES_ON_LOOPBACK, log=Path(scratch) / "server.log",
    ) as server:
        body: dict[str, Any] = {"target_participants": 1, "min_participants": 1, "deadline_s": 300, "selection_window_s": 0}
        if args.settings == "fleet-camera":
            from facecore.federation.fleet_camera import fleet_camera_settings

            center = server.admin("GET", "/v1/admin/models?limit=1")[0].get("feature_center")
            if center is None:
                raise _usage(f"model {args.model} publishes no feature centre, which --settings fleet-camera needs: use --settings paper")
            body |= fleet_camera_settings(center)
        for name in ("upload_bits", "download_bits"):
            if getattr(args, name) is not None:
                body["local"] = {**body.get("local", {}), name: getattr(args, name)}

        def open_round() -> None:
            import time

            import httpx

            for _ in range(240):  # the previous round may still be aggregating: one active round at a time
                try:
                    server.admin("POST", "/v1/admin/rounds", json=body)
                    return
                except httpx.HTTPStatusError as error:
                    if error.response.status_code != 409:
                        raise
                    time.sleep(0.5)
            raise RuntimeError("the previous round never finished")

        folder = Path(scratch) / "lfw_photos"
        folder.mkdir()
        for index in range(0, len(lfw), len(lfw) // 40)[:40]:  # 40 photos spread over all of LFW
            (folder / lfw[index].name).symlink_to(lfw[index])
        only = args.verify_only or args.commands_only
        goals: dict[str, Goal] = {}
        result = {} if only else bench_device(
            server.url, Path(scratch) / "device", photos[:20], photos[20], open_round, args.repeats, progress=progress)
        if result:
            result["settings"] = args.settings
            result |= {name: body.get("local", {}).get(name) for name in ("upload_bits", "download_bits")}
            goals |= device_goals(result)
        if not args.commands_only:
            result["verify"] = bench_verify(
                server.url, Path(scratch) / "verifier", photos[:20], photos[20], folder, args.verify_repeats, progress=progress)
            goals |= verify_goals(result["verify"])
        if not args.verify_only:
            commands_dir = Path(scratch) / "commands"
            commands_dir.mkdir()
            result["commands"] = bench_commands(server.url, commands_dir, people, args.commands_repeats, progress=progress)
            goals |= command_goals(result["commands"])
        progress("done; stopping the local server")
    with_goals(result, goals)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            if key not in ("verify", "commands", "goals_met", "all_goals_met"):
                print(f"{key:>28}: {value}")
        if "verify" in result:
            print(_describe_verify(result["verify"]))
        if "commands" in result:
            print(describe_commands(result["commands"]))
        print(_describe_goals(result))
    return 0


def _describe_verify(v: dict) -> str:  # type: ignore[type-arg]
    goals = v["goals"]
    return "\n".join([
        f"verify, medians of {v['repeats']} cold processes each, interleaved ({v['cpus']} CPUs, load average "
        f"{v['load_average'][0]:.1f} at the end): wall seconds (CPU seconds), peak RSS",
        f"  fedface device verify, 1 photo:   {v['cold_cli_verify_s']:.2f} s ({v['cold_cli_verify_cpu_s']:.2f}), "
        f"{v['cold_cli_verify_peak_rss_mb']:.0f} MB (goals {goals['cold_cli_verify_s']} s, "
        f"{goals['cold_cli_verify_peak_rss_mb']} MB)",
        f"  FaceDevice.verify (SDK), 1 photo: {v['cold_sdk_verify_s']:.2f} s ({v['cold_sdk_verify_cpu_s']:.2f}), "
        f"{v['cold_sdk_verify_peak_rss_mb']:.0f} MB ({v['cold_sdk_over_cli']:.1f}x the CLI's time)",
        f"  fedface device verify, {v['folder_photos']} LFW photos: {v['cli_folder_s']:.2f} s "
        f"({v['cli_folder_photos_per_s']:.1f} photos/s with start-up); warm, one verifier open: "
        f"{v['warm_photos_per_s']:.1f} photos/s (goal {goals['warm_photos_per_s']})",
    ])


def _export(args: argparse.Namespace) -> int:
    specs = list(dict.fromkeys(args.model or ["default", "mobile"]))
    if args.dir and len(args.dir) != len(specs):
        raise _usage(f"give one --dir per --model ({len(specs)} models, {len(args.dir)} folders)")
    if args.runs < 1 or not 1 <= args.rounds <= args.runs:
        raise _usage("--runs must be >= 1 and 1 <= --rounds <= --runs")
    from export.pipeline import export_model
    from facecore.errors import FaceCoreError
    from facecore.models.checkpoint import load_backbone
    from facecore.paths import data_root
    from fedface_bench.export import bench_exports
    from fedface_bench.goals import with_goals

    for folder in args.dir or ():  # checked before minutes of exports and timing: the fp32 model is what every ratio needs
        if not (Path(folder) / "model.onnx").is_file():
            raise FaceCoreError(f"--dir {folder}: no model.onnx there (make one with `fedface export --model MODEL --out {folder} --int8`)")
    progress = _progress(args)
    with tempfile.TemporaryDirectory() as scratch:
        folders = [Path(d) for d in args.dir] if args.dir else [Path(scratch) / f"model{i}" for i in range(len(specs))]
        if not args.dir:
            for number, (spec, folder) in enumerate(zip(specs, folders), 1):
                progress(f"{number} of {len(specs)}: exporting {spec} to ONNX fp32 and int8, with parity checks")
                export_model(spec, folder, data_root(args.data), int8=True)
        progress(f"loading the torch backbones ({', '.join(specs)})")
        exports = {spec: (load_backbone(spec), folder) for spec, folder in zip(specs, folders)}
        result = with_goals(bench_exports(exports, runs=args.runs, rounds=args.rounds, progress=progress), {})
    print(json.dumps(result) if args.json else _describe_export(result))
    return 0


def _describe_export(result: dict) -> str:  # type: ignore[type-arg]
    models = result["models"]
    lines = [f"batch {result['batch']}, {result['threads']} thread; p50 (p95) ms over {next(iter(models.values()))['torch_eager']['runs']} runs "
             f"per engine, all engines interleaved in {result['rounds']} rounds"]
    label_width = max(14, *(len(label) + 2 for label in models))
    backbone_width = max(15, *(len(r["backbone"]) + 2 for r in models.values()))
    lines.append(f"{'model':<{label_width}}{'backbone':<{backbone_width}}{'input':>6}{'params':>8}{'torch eager':>18}{'onnx fp32':>18}{'onnx int8':>18}"
                 f"{'fp32 vs torch':>14}{'int8/fp32':>10}{'fp32 MB':>9}{'int8 MB':>9}{'int8/fp32 size':>15}")
    for label, r in models.items():
        cells = [f"{r[e]['p50_ms']:7.2f} ({r[e]['p95_ms']:6.2f})" if e in r else "-" for e in ("torch_eager", "onnx_fp32", "onnx_int8")]
        bytes_ = r["bytes"]
        lines.append(
            f"{label:<{label_width}}{r['backbone']:<{backbone_width}}{r['input'][-1]:>6}{r['params'] / 1e6:>7.2f}M{cells[0]:>18}{cells[1]:>18}{cells[2]:>18}"
            f"{r['fp32_speedup_vs_torch']:>13.2f}x{r.get('int8_over_fp32_ms', float('nan')):>10.2f}"
            f"{bytes_['model.onnx'] / 1e6:>9.2f}{bytes_.get('model.int8.onnx', float('nan')) / 1e6:>9.2f}{r.get('int8_over_fp32_bytes', float('nan')):>15.2f}"
        )
    labels = list(models)
    for other in labels[1:]:
        a, b = models[labels[0]], models[other]
        ratios = ", ".join(f"{e} {a[e]['p50_ms'] / b[e]['p50_ms']:.2f}x" for e in ("torch_eager", "onnx_fp32", "onnx_int8") if e in a and e in b)
        lines.append(f"{labels[0]} / {other} (p50 ratio): {ratios}")
    for label, r in models.items():
        for engine, profile in r["profile"].items():
            ops = ", ".join(f"{op} {ms:.2f}" for op, ms in profile["ms_by_op"].items() if ms >= 0.01)
            lines.append(f"{label} {engine}: {profile['ms_per_run']:.2f} ms in kernels ({ops}); PReLU nodes {profile['prelu_ms']:.2f} ms "
                         f"({100 * profile['prelu_share']:.0f}%)")
    return "\n".join(lines)


def _server(args: argparse.Namespace) -> int:
    if min(args.devices, args.concurrency, args.workers) < 1 or args.aggregation_processes < 0:
        raise _usage("--devices, --concurrency and --workers must be at least 1, --aggregation-processes at least 0")
    if args.db is not None and not args.db.startswith("postgresql"):
        raise _usage("--db must be a postgresql:// URL (SQLite is the default)")
    if args.db is not None and args.secure:
        raise _usage("--secure runs on SQLite only")
    if args.secure and (args.trainable_blocks is not None or args.upload_bits is not None):
        raise _usage("--trainable-blocks and --upload-bits shape plain updates; --secure sends its own masked ones")
    if args.replicas is not None and (args.replicas < 2 or args.db is None or args.secure or args.workers != 1):
        raise _usage("--replicas N needs N >= 2 and --db postgresql://... (replicas share one database), without --secure or --workers")
    if args.secure and (args.devices < 3 or not 0 <= args.drop < 1 / 3):
        raise _usage("--secure: --devices must be >= 3 and 0 <= --drop < 1/3 (the threshold is 2n/3 + 1)")
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    from facecore.errors import FaceCoreError
    from facecore.models import backbone_names

    if args.db is not None:
        try:
            make_url(args.db)
        except (ArgumentError, ValueError) as error:  # the parser's message quotes the bad part, never the password
            raise _usage(f"--db is not a database URL ({error})") from None
    if args.backbone not in backbone_names():  # before a server is started for it, whose failure would say less
        raise _usage(f"--backbone {args.backbone!r} is not a backbone; valid names: {', '.join(backbone_names())}")
    from facecore.federation.status import RoundStatus
    from fedface_bench.server import describe, describe_replicas, describe_secure, run_replica_bench, run_secure_bench, run_server_bench

    progress = _progress(args)
    if args.secure:
        secure = run_secure_bench(args.devices, args.concurrency, args.backbone, args.drop, progress=progress)
        print(json.dumps(secure) if args.json else describe_secure(secure))
        return 0 if secure["secure"]["round_status"] == RoundStatus.COMPLETED and secure["secure"]["lost"] == 0 else 1
    try:
        local = {k: v for k, v in (("trainable_blocks", args.trainable_blocks), ("upload_bits", args.upload_bits)) if v is not None}
        if args.replicas is not None:
            assert args.db is not None
            replicas = run_replica_bench(args.devices, args.replicas, args.db, args.concurrency, args.backbone, progress, local)
            print(json.dumps(replicas) if args.json else describe_replicas(replicas))
            return 0 if replicas["all_accepted"] and replicas["round_completed"] else 1
        result = run_server_bench(args.devices, args.concurrency, args.backbone, args.workers, args.db, progress=progress, local=local,
                                  aggregation_processes=args.aggregation_processes)
    except SQLAlchemyError as error:
        # The driver's first line names the host and port, never the URL's password.
        reason = str(getattr(error, "orig", None) or error).strip().splitlines()[0]
        raise FaceCoreError(f"--db: cannot use that database: {reason}") from None
    print(json.dumps(result) if args.json else describe(result))
    # Non-zero when the round itself broke (rejected uploads, no aggregation); missed goals are results, not errors.
    return 0 if result["all_accepted"] and result["round_completed"] else 1
