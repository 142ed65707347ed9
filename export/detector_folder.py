"""Write a detector's ONNX files as one folder, whole or not at all.

The files are written into a staging folder beside the final one, listed with their sha256 in
`manifest.json` (which loading checks, `facecore.align.detector_files`), and the folder is moved into
place in one rename: a crash mid-export leaves the old folder or none, never a half-written one.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from facecore.digest import file_sha256


def install_folder(folder: Path, write: Callable[[Path], dict[str, Path]], manifest: dict[str, Any]) -> None:
    """`write(staging)` writes the nets and returns {net: path}; `manifest` gets their "files" entry."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}-staging-") as scratch:
        staging = Path(scratch) / folder.name
        staging.mkdir()
        files = {name: {"path": path.name, "sha256": file_sha256(path), "bytes": path.stat().st_size}
                 for name, path in write(staging).items()}
        (staging / "manifest.json").write_text(json.dumps({**manifest, "files": files}, indent=1))
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staging, folder)
