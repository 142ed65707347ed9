"""`fedface <command> ...`: the one console script.

Each command lives in its own module and is imported only when used, so `fedface data`
does not pay for FastAPI and `fedface server` does not pay for MTCNN.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from facecore.errors import FaceCoreError

# command -> (module with `add_arguments(parser)` and `run(args) -> int`, help)
COMMANDS: dict[str, tuple[str, str]] = {
    "data": ("fedface.commands.data", "face data: split identities, align and cache faces, show statistics"),
    "eval": ("fedface.commands.evaluate", "evaluate a backbone on identity-disjoint LFW folds"),
    "pretrain": ("fedface.commands.pretrain", "pretrain the backbone on public identities (or fine-tune on devices)"),
    "models": ("fedface.commands.models", "the named models (default, mobile): fetch and verify published weights, list them"),
    "export": ("fedface.commands.export", "export a backbone to ONNX (fp32 and int8) with parity checks"),
    "server": ("fedface.commands.server", "run the cross-device FedFace round server"),
    "admin": ("fedface.commands.admin", "operate a round server: open rounds, show their status"),
    "device": ("fedface.commands.device", "the on-device client: register, enroll, train, verify, unenroll"),
    "demo": ("fedface.commands.demo", "the whole system on one machine: server + real-face devices over HTTP (make run)"),
    "sim": ("fedface.commands.sim", "simulations: cross-device FedFace (in process or --http), FedFusion, ..."),
    "bench": ("fedface.commands.bench", "benchmarks (medians and ratios from one run): export, ..."),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedface", description="FedFace: federated face recognition.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(_module=module_name)
        importlib.import_module(module_name).add_arguments(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module = importlib.import_module(args._module)
    try:
        return int(module.run(args) or 0)
    except FaceCoreError as error:
        print(f"fedface {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fedface {args.command}: interrupted", file=sys.stderr)
        return 130
