"""The command end to end on tiny synthetic .npz files, grey and colour, and its one-line errors."""
import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from facecore.errors import DatasetFormatError, FaceCoreError
from fedface.commands import fusion as command
from simulator.fusion.config import PRESETS
from simulator.fusion.data import load_npz, resolve_data


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


def test_the_paper_preset_shrunk_by_flags_runs_end_to_end_on_colour_images(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare
    data = _npz(tmp_path / "colour.npz", (32, 32, 3))
    # Execute
    code = command.run(_args(data, tmp_path / "out", "--preset", "paper", "--fusion", "multi", "--local-epochs", "1", "--batch", "16"))
    # Assert: the paper's network, unbounded λ and smoothed λ, the lr schedule, the flags' sizes
    report = json.loads(Path(json.loads(capsys.readouterr().out)["report"]).read_text())
    assert code == 0 and report["preset"] == "paper"
    config = report["config"]
    assert (config["arch"], config["lambda_bound"], config["lambda_mu"], config["rounds"], config["nodes"]) == ("official", "none", 0.9, 2, 4)
    assert report["fusion_params"] == 64
    rounds = report["history"][1:]
    assert [h["lr"] for h in rounds] == [2e-3, 2e-3 * 0.99]
    assert all("lambda_mean_averaged" in h and h["extractor_gap"] > 0 for h in rounds)


def test_named_fashion_mnist_resolves_to_the_cached_conversion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: a conversion already in the cache
    monkeypatch.setenv("FEDFACE_CACHE", str(tmp_path))
    cached = _npz(tmp_path / "fashion-mnist.npz", (28, 28))
    (tmp_path / "fashion-mnist").mkdir()
    cached.rename(tmp_path / "fashion-mnist" / "fashion-mnist.npz")
    # Execute
    path = resolve_data("fashion-mnist")
    # Assert
    assert path == tmp_path / "fashion-mnist" / "fashion-mnist.npz"
    assert load_npz(path).image_shape == (1, 28, 28)


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_explicit_flags_override_the_preset_and_the_rest_stays() -> None:
    # Execute
    config = command.config_from_args(_parse("--preset", "paper", "--rounds", "3", "--nodes", "4", "--lambda-bound", "unit"))
    # Assert
    assert (config.rounds, config.nodes, config.lambda_bound) == (3, 4, "unit")
    assert (config.arch, config.local_epochs, config.lr, config.lambda_mu) == ("official", 5, 2e-3, 0.9)


def test_without_flags_each_preset_comes_back_unchanged() -> None:
    # Execute / Assert
    assert command.config_from_args(_parse()) == PRESETS["cpu"]
    assert command.config_from_args(_parse("--preset", "paper")) == PRESETS["paper"]


def test_bad_flags_on_a_preset_are_one_face_core_error_listing_each() -> None:
    # Execute
    with pytest.raises(FaceCoreError, match=r"^[a-z-]+ must be [^;]+; [a-z-]+ must be [^;]+$") as error:  # two problems, one line
        command.config_from_args(_parse("--preset", "paper", "--lambda-mu", "1", "--lr-decay", "0"))
    # Assert
    assert "lr-decay must be in (0, 1]" in str(error.value) and "lambda-mu must be in [0, 1)" in str(error.value)
