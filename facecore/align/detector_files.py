"""The ONNX files of a face detector: a folder with a manifest that records each file's sha256.

Invariants: a detector loads only files whose sha256 matches its manifest, so a truncated or edited
file is one clear error (naming `fedface models fetch`, which builds them), never a silently wrong
face. Its sessions start from the optimised graphs `facecore.onnx_session` saved (keyed by that
sha256): the same outputs, bit for bit, without optimising the nets again in every process.
numpy, onnxruntime and torch are not imported here.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from facecore.digest import file_sha256
from facecore.errors import FaceCoreError

if TYPE_CHECKING:
    import onnxruntime as ort

FETCH_HINT = "fedface models fetch"


class DetectorMissing(FaceCoreError):
    """A detector's ONNX files have not been built yet."""


class DetectorCorrupt(FaceCoreError):
    """A detector's ONNX file whose content is not what its manifest records."""


def verified_files(folder: Path, format_: str, nets: tuple[str, ...], what: str) -> dict[str, Path]:
    """{net: path} of the folder's files, each checked against the manifest's sha256."""
    return {net: path for net, (path, _) in _verified(folder, format_, nets, what).items()}


def detector_sessions(folder: Path, format_: str, nets: tuple[str, ...], what: str,
                      threads: int = 1) -> dict[str, ort.InferenceSession]:
    """{net: session} of the folder's files, each checked against the manifest's sha256 first."""
    from facecore.onnx_session import open_session

    verified = _verified(folder, format_, nets, what)
    return {net: open_session(path, threads, sha256=digest) for net, (path, digest) in verified.items()}


def _verified(folder: Path, format_: str, nets: tuple[str, ...], what: str) -> dict[str, tuple[Path, str]]:
    manifest_path = folder / "manifest.json"
    if not manifest_path.is_file():
        raise DetectorMissing(f"{what} is not in {folder}: run `{FETCH_HINT}` (it builds it once)")
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("format") != format_:
        raise DetectorCorrupt(f"{manifest_path} is not a {format_} manifest: run `{FETCH_HINT} --force`")
    files = {}
    for net in nets:
        entry = manifest["files"][net]
        path = folder / entry["path"]
        if not path.is_file():
            raise DetectorMissing(f"{path} is missing: run `{FETCH_HINT} --force`")
        if file_sha256(path) != entry["sha256"]:
            raise DetectorCorrupt(f"{path} does not match the sha256 in {manifest_path}: run `{FETCH_HINT} --force`")
        files[net] = (path, entry["sha256"])
    return files
