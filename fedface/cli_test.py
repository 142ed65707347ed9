"""The command line as a user meets it: one clear error line for each kind of bad input."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedface.cli import main


def _fedface(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fedface", *args], capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=600
    )


def test_missing_data_root_names_fedface_data(tmp_path: Path) -> None:
    # Execute
    result = _fedface("data", "split", "--out", str(tmp_path / "s.json"), env={"FEDFACE_DATA": str(tmp_path / "nowhere")})
    # Assert
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "FEDFACE_DATA" in result.stderr and "nowhere" in result.stderr


def test_unknown_backbone_lists_the_valid_names(capsys: pytest.CaptureFixture[str], real_data: Path) -> None:
    # Execute
    code = main(["eval", "lfw", "--model", "random", "--backbone", "resnet9000"])
    # Assert
    err = capsys.readouterr().err
    assert code == 2
    assert "unknown backbone 'resnet9000'" in err and "mobilefacenet" in err and "iresnet18" in err


def test_a_model_file_that_is_not_a_checkpoint_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], real_data: Path) -> None:
    # Prepare
    bogus = tmp_path / "weights.pt"
    bogus.write_text("definitely not torch")
    # Execute
    code = main(["eval", "lfw", "--model", str(bogus)])
    # Assert
    assert code == 2 and "is not a readable torch file" in capsys.readouterr().err


def test_data_split_writes_a_manifest_and_prints_sizes(tmp_path: Path, real_data: Path) -> None:
    # Execute
    result = _fedface("data", "split", "--seed", "3", "--out", str(tmp_path / "split.json"))
    # Assert
    assert result.returncode == 0, result.stderr
    assert "evaluation  2914 identities   7068 images" in result.stdout
    manifest = json.loads((tmp_path / "split.json").read_text())
    assert manifest["config"]["seed"] == 3 and manifest["sizes"]["evaluation"]["identities"] == 2914
