"""`fedface export --model default|dlib-resnet|mobile|random|PATH --out DIR [--int8] [--json]`."""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="default",
                        help="'default' (= 'dlib-resnet', the published weights), 'mobile' (the bundled compact cut of it), "
                             "'mobilefacenet', 'random', or a backbone file PATH; "
                             "faces are aligned to the backbone's own crop, which the manifest records")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--int8", action="store_true", help="also write model.int8.onnx (static per-channel quantization)")
    parser.add_argument("--data", help="data root for calibration and parity faces (default: FEDFACE_DATA or ../shared/data)")
    parser.add_argument("--json", action="store_true", help="print the parity figures as one JSON object")


def run(args: argparse.Namespace) -> int:
    from export.pipeline import export_model
    from facecore.paths import data_root

    result = export_model(args.model, Path(args.out), data_root(args.data), int8=args.int8)
    if args.json:
        keys = ("fp32_min_cos", "int8_mean_cos", "int8_lfw_drop", "fp32_bytes", "int8_bytes")
        print(json.dumps({k: result.metrics[k] for k in keys} | {k: v for k, v in result.metrics.items() if k not in keys}))
    else:
        for key, value in result.metrics.items():
            print(f"{key:>20}: {value}")
        crop = result.manifest["geometry"]
        print(f"{'geometry':>20}: {crop['key']} ({crop['size']}x{crop['size']} crop)")
        print(f"wrote {', '.join(sorted(f['path'] for f in result.manifest['files'].values()))} and manifest.json to {args.out}")
    return 0
