"""The client process of `fedface bench server` (``python -m fedface_bench.server_load``): one round's load,
plain (:mod:`fedface_bench.server_client`) or secure (:mod:`fedface_bench.server_secure`), against a running
`fedface server --dev`. It waits for /readyz itself, so its imports overlap the server's start-up.
Progress goes to stderr; exactly one JSON object goes to stdout.
"""
from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

from facecore.lifetime import exit_with_parent
from fedface_bench.server_client import run
from fedface_bench.server_secure import run_secure


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True, action="append", help="a server process; repeated: replicas behind one address")
    parser.add_argument("--data-dir", type=Path, required=True, help="the --dev server's data dir (admin_token)")
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--drop-fraction", type=float, default=0.0,
                        help="devices that drop mid-upload (--secure: after sharing keys)")
    parser.add_argument("--secure", action="store_true", help="a secure-aggregation round")
    parser.add_argument("--local", type=json.loads, default=None, help="a plain round's `local` settings, as JSON (trainable_blocks, upload_bits)")
    args = parser.parse_args(argv)
    exit_with_parent("fedface bench client")  # a load on a server nobody measures any more is no use
    if args.secure:
        result = asyncio.run(run_secure(args.url[0], args.data_dir, args.devices, args.concurrency, args.drop_fraction))
    else:
        result = asyncio.run(run(args.url, args.data_dir, args.devices, args.concurrency, args.drop_fraction, args.local))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
