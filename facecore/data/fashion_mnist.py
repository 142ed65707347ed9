"""Fashion-MNIST as a keras-style .npz (x_train, y_train, x_test, y_test), fetched on first use.

Source: Debian's ``dataset-fashion-mnist`` package, which ships the four original idx files as
``/usr/share/datasets/fashion-mnist/*-ubyte.gz``. If the package is installed they are read from
there; otherwise ``apt-get download`` fetches the .deb (verified by apt against the signed archive
index) into a temporary folder and ``dpkg-deb -x`` unpacks it. The converted file lives in
``facecore.paths.cache_root()/fashion-mnist/fashion-mnist.npz`` and is never part of the project.
Any failure is one :class:`DatasetFormatError` line.
"""
from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from facecore.errors import DatasetFormatError
from facecore.paths import cache_root

PACKAGE = "dataset-fashion-mnist"
SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
FILES = {
    "x_train": "train-images-idx3-ubyte.gz", "y_train": "train-labels-idx1-ubyte.gz",
    "x_test": "t10k-images-idx3-ubyte.gz", "y_test": "t10k-labels-idx1-ubyte.gz",
}
SIZES = {"train": 60000, "test": 10000}


def read_idx(path: Path) -> np.ndarray:
    """One idx file (gzip or plain) as a uint8 array: magic 0x0000 08 NDIM, NDIM big-endian sizes, data."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            raw = handle.read()
    except (OSError, EOFError) as error:
        raise DatasetFormatError(f"{path}: unreadable idx file: {error}") from error
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08 or raw[3] == 0:
        raise DatasetFormatError(f"{path}: not an unsigned-byte idx file (bad magic {raw[:4].hex()})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DatasetFormatError(f"{path}: idx header truncated")
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    if len(raw) - header != int(np.prod(shape)):
        raise DatasetFormatError(f"{path}: idx data holds {len(raw) - header} bytes, its header says {shape}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape).copy()


def convert(folder: Path, out: Path, sizes: dict[str, int] | None = None) -> Path:
    """The four idx files in ``folder`` → ``out`` (.npz), checked, written atomically."""
    arrays = {key: read_idx(folder / name) for key, name in FILES.items()}
    for split, n in (sizes or SIZES).items():
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if x.ndim != 3 or len(x) != n or y.shape != (n,) or (len(y) and y.max() > 9):
            raise DatasetFormatError(f"{folder}: {split} split has images {x.shape} and labels {y.shape}, expected {n} of each, labels 0-9")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial.npz")  # np.savez appends .npz to names without it
    np.savez_compressed(partial, x_train=arrays["x_train"], y_train=arrays["y_train"], x_test=arrays["x_test"], y_test=arrays["y_test"])
    os.replace(partial, out)
    return out


def cached_path() -> Path:
    return cache_root() / "fashion-mnist" / "fashion-mnist.npz"


def _download(into: Path) -> Path:
    """Fetch and unpack the Debian package; returns the folder holding the idx files."""
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise DatasetFormatError(f"cannot fetch Fashion-MNIST: {tool} not found (install Debian package {PACKAGE}, or run on Debian/Ubuntu)")
    try:
        subprocess.run(["apt-get", "download", PACKAGE], cwd=into, check=True, capture_output=True, text=True, timeout=600)
        debs = sorted(into.glob(f"{PACKAGE}_*.deb"))
        if not debs:
            raise DatasetFormatError(f"cannot fetch Fashion-MNIST: apt-get download left no {PACKAGE} .deb")
        subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(into / "root")], check=True, capture_output=True, text=True, timeout=600)
    except subprocess.CalledProcessError as error:
        last = (error.stderr or error.stdout or "").strip().splitlines()
        raise DatasetFormatError(f"cannot fetch Fashion-MNIST: {' '.join(error.cmd)} failed: {last[-1] if last else error}") from error
    except subprocess.TimeoutExpired as error:
        raise DatasetFormatError(f"cannot fetch Fashion-MNIST: {' '.join(map(str, error.cmd))} timed out") from error
    return into / "root" / SYSTEM_DIR.relative_to("/")


def fashion_mnist_npz(system_dir: Path = SYSTEM_DIR, download: bool = True) -> Path:
    """The cached .npz, made on first use from the installed package or a fresh download."""
    out = cached_path()
    if out.is_file():
        return out
    if all((system_dir / name).is_file() for name in FILES.values()):
        return convert(system_dir, out)
    if not download:
        raise DatasetFormatError(f"Fashion-MNIST not found in {system_dir} and download disabled")
    with tempfile.TemporaryDirectory(prefix="fedface-fashion-") as tmp:
        return convert(_download(Path(tmp)), out)
