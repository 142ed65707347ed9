"""`fedface bench <target>`: benchmarks (medians and ratios from one run), never timed unit tests."""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    targets = parser.add_subparsers(dest="target", metavar="TARGET", required=True)
    export = targets.add_parser("export", help="batch-1 single-thread latency: torch eager vs ONNX fp32 vs ONNX int8")
    export.add_argument("--model", default="default")
    export.add_argument("--dir", help="an existing export directory (default: export --int8 into a temporary one)")
    export.add_argument("--runs", type=int, default=300)
    export.add_argument("--data")
    export.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    return {"export": _export}[args.target](args)


def _export(args: argparse.Namespace) -> int:
    from export.bench import bench_export
    from export.pipeline import export_model
    from facecore.models.checkpoint import load_backbone
    from facecore.paths import data_root

    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(args.dir) if args.dir else Path(scratch)
        if not args.dir:
            export_model(args.model, folder, data_root(args.data), int8=True)
        result = bench_export(load_backbone(args.model), folder, runs=args.runs)
    if args.json:
        print(json.dumps(result))
        return 0
    for engine in ("torch_eager", "onnx_fp32", "onnx_int8"):
        if engine in result:
            print(f"{engine:>12}: p50 {result[engine]['p50_ms']:.2f} ms  p95 {result[engine]['p95_ms']:.2f} ms")
    print(f"int8 vs fp32: {result.get('int8_speedup_vs_fp32', float('nan')):.2f}x; fp32 vs torch: {result['fp32_speedup_vs_torch']:.2f}x")
    print("bytes: " + ", ".join(f"{k} {v:,}" for k, v in result["bytes"].items()))
    return 0
