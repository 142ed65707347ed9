"""The Fashion-MNIST fetch: idx parsing, conversion to .npz, first-use caching, one-line errors."""
import gzip
import stat
from pathlib import Path

import numpy as np
import pytest

from facecore.data import fashion_mnist
from facecore.errors import DatasetFormatError


def _idx(path: Path, array: np.ndarray) -> Path:
    """Write an unsigned-byte idx file by the format's definition: 0, 0, 0x08, ndim, big-endian sizes, data."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    with gzip.open(path, "wb") as handle:
        handle.write(header + array.astype(np.uint8).tobytes())
    return path


def _package_dir(folder: Path, train: int = 6, test: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    arrays = {"x_train": rng.integers(0, 256, (train, 3, 2)), "y_train": np.arange(train) % 10,
              "x_test": rng.integers(0, 256, (test, 3, 2)), "y_test": (np.arange(test) + 3) % 10}
    folder.mkdir(parents=True, exist_ok=True)
    for key, name in fashion_mnist.FILES.items():
        _idx(folder / name, arrays[key])
    return arrays


def test_a_hand_made_idx_file_is_read_back_exactly(tmp_path: Path) -> None:
    # Prepare: 2 images of 3×4 pixels, values 0..23
    images = np.arange(24).reshape(2, 3, 4)
    path = _idx(tmp_path / "images-idx3-ubyte.gz", images)
    # Execute
    got = fashion_mnist.read_idx(path)
    # Assert
    assert got.dtype == np.uint8 and got.shape == (2, 3, 4)
    np.testing.assert_array_equal(got, images)


def test_an_idx_file_whose_header_disagrees_with_its_data_is_a_format_error(tmp_path: Path) -> None:
    # Prepare: the header promises 3 labels, the data holds 2
    path = tmp_path / "labels-idx1-ubyte"
    path.write_bytes(bytes([0, 0, 0x08, 1]) + (3).to_bytes(4, "big") + bytes([1, 2]))
    # Execute / Assert
    with pytest.raises(DatasetFormatError, match="header says"):
        fashion_mnist.read_idx(path)


def test_the_converter_writes_a_keras_style_npz(tmp_path: Path) -> None:
    # Prepare
    arrays = _package_dir(tmp_path / "pkg")
    # Execute
    out = fashion_mnist.convert(tmp_path / "pkg", tmp_path / "out" / "f.npz", sizes={"train": 6, "test": 4})
    # Assert
    with np.load(out) as npz:
        assert sorted(npz.files) == ["x_test", "x_train", "y_test", "y_train"]
        for key, value in arrays.items():
            np.testing.assert_array_equal(npz[key], value)
            assert npz[key].dtype == np.uint8
    assert not list((tmp_path / "out").glob("*partial*"))


def test_first_use_converts_the_installed_package_into_the_cache_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare
    monkeypatch.setenv("FEDFACE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(fashion_mnist, "SIZES", {"train": 6, "test": 4})
    _package_dir(tmp_path / "usr")
    # Execute
    first = fashion_mnist.fashion_mnist_npz(system_dir=tmp_path / "usr", download=False)
    stamp = first.stat().st_mtime_ns
    second = fashion_mnist.fashion_mnist_npz(system_dir=tmp_path / "nowhere", download=False)
    # Assert: cached under the cache root, and the second call reuses it without any source
    assert first == second == tmp_path / "cache" / "fashion-mnist" / "fashion-mnist.npz"
    assert second.stat().st_mtime_ns == stamp


def test_a_failed_download_is_one_line_naming_the_failing_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: an apt-get that fails as it does without network, and no installed package
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, script in (("apt-get", "echo 'E: Failed to fetch dataset-fashion-mnist' >&2; exit 100"), ("dpkg-deb", "exit 0")):
        (bin_dir / tool).write_text(f"#!/bin/sh\n{script}\n")
        (bin_dir / tool).chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("FEDFACE_CACHE", str(tmp_path / "cache"))
    # Execute
    with pytest.raises(DatasetFormatError, match="^cannot fetch Fashion-MNIST: apt-get download dataset-fashion-mnist failed") as error:
        fashion_mnist.fashion_mnist_npz(system_dir=tmp_path / "absent")
    # Assert: one line, carrying apt-get's own reason
    message = str(error.value)
    assert "\n" not in message
    assert "E: Failed to fetch" in message
    assert not (tmp_path / "cache" / "fashion-mnist" / "fashion-mnist.npz").exists()
