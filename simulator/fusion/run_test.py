"""The command end to end on tiny synthetic .npz files, grey and colour, and its one-line errors."""
import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from facecore.errors import DatasetFormatError, FaceCoreError
from fedface.commands import fusion as command
from simulator.fusion.data import load_npz


def _npz(path: Path, shape: tuple[int, ...], classes: int = 4, per_class: int = 80, seed: int = 0) -> Path:
    """Class k images are brighter in stripe k, so even two rounds learn something."""
    rng = np.random.default_rng(seed)

    def split(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = np.repeat(np.arange(classes), n)
        x = rng.integers(0, 100, (len(y), *shape), dtype=np.uint8)
        for k in range(classes):
            x[y == k, 4 * k : 4 * k + 4] += 150
        return x, y.astype(np.uint8)

    (x_train, y_train), (x_test, y_test) = split(per_class), split(per_class // 2)
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    return path


def _args(data: Path, out: Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(["--data", str(data), "--out", str(out), "--nodes", "4", "--per-round", "2", "--rounds", "2",
                              "--per-node", "30", "--test-size", "40", "--late-per-node", "20", "--late-epochs", "2", "--json", *extra])


@pytest.mark.parametrize("partition", ["pathological", "user-specific", "iid"])
def test_a_colour_npz_runs_unchanged(tmp_path: Path, partition: str, capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare: CIFAR-like N×32×32×3 uint8
    data = _npz(tmp_path / "colour.npz", (32, 32, 3))
    # Execute
    code = command.run(_args(data, tmp_path / "out", "--fusion", "conv", "--partition", partition))
    # Assert
    summary = json.loads(capsys.readouterr().out)
    report = json.loads(Path(summary["report"]).read_text())
    assert code == 0
    assert report["data"]["train"] == [320, 32, 32, 3]
    assert {"fusion", "partition", "final_acc", "rounds_to_target", "bytes_per_round", "history"} <= report.keys()
    assert [h["round"] for h in report["history"]] == [0, 1, 2]
    assert 0.0 <= report["final_acc"] <= 1.0 and len(report["late_join"]["acc_by_epoch"]) == 3


def test_grey_images_with_and_without_a_channel_axis_load_alike(tmp_path: Path) -> None:
    # Prepare
    flat = _npz(tmp_path / "flat.npz", (20, 20))
    with np.load(flat) as raw:
        np.savez(tmp_path / "axis.npz", **{k: (raw[k][..., None] if k.startswith("x") else raw[k]) for k in raw.files})
    # Execute
    a, b = load_npz(flat), load_npz(tmp_path / "axis.npz")
    # Assert
    assert a.image_shape == b.image_shape == (1, 20, 20)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert a.classes == 4


def test_an_npz_without_test_labels_is_a_format_error(tmp_path: Path) -> None:
    # Prepare
    np.savez(tmp_path / "bad.npz", x_train=np.zeros((2, 8, 8), np.uint8), y_train=np.zeros(2, np.uint8), x_test=np.zeros((2, 8, 8), np.uint8))
    # Execute / Assert
    with pytest.raises(DatasetFormatError, match="y_test"):
        load_npz(tmp_path / "bad.npz")


def test_bad_settings_are_one_face_core_error_before_any_data_is_read(tmp_path: Path) -> None:
    # Execute / Assert: --per-round above --nodes, on a data file that does not even exist
    with pytest.raises(FaceCoreError, match="per-round"):
        command.run(_args(tmp_path / "missing.npz", tmp_path, "--per-round", "9"))
    with pytest.raises(FaceCoreError, match="not found"):
        command.run(_args(tmp_path / "missing.npz", tmp_path))
