"""`fedface sim cross-silo` (the command module) on synthetic faces: arguments, report, saved backbone."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from fedface.commands import cross_silo


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cross_silo.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_synthetic_run_writes_a_report_and_the_backbone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = parse("--synthetic", "--backbone", "tiny", "--method", "pfm+fv", "--fv-mode", "sync", "--K", "2", "--rounds", "2",
                 "--batch", "6", "--out", str(tmp_path), "--json")
    assert cross_silo.run(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["method"] == "pfm+fv" and summary["mode"] == "in-process" and len(summary["parties"]) == 3
    report = json.loads((tmp_path / "report.json").read_text())
    assert len(report["fv"]) == 2 and report["config"]["K"] == 2
    assert np.load(tmp_path / "backbone.npz").files


def test_choices_match_the_config() -> None:
    from simulator.cross_silo import config

    assert (cross_silo.METHODS, cross_silo.BACKBONES, cross_silo.FV_MODES) == (config.METHODS, config.BACKBONES, config.FV_MODES)


def test_paper_defaults_and_invalid_settings() -> None:
    args = parse()
    assert (args.trainers, args.validators, args.K, args.backbone, args.loss, args.method) == (3, 2, 100, "iresnet18", "arcface", "pfm+fv")
    with pytest.raises(ValueError, match="parties"):
        cross_silo.run(parse("--synthetic", "--parties", "5"))


def test_two_sources_of_faces_are_refused_in_one_line(tmp_path: Path) -> None:
    from facecore.errors import FaceCoreError

    with pytest.raises(FaceCoreError, match="two sources"):
        cross_silo.run(parse("--synthetic", "--faces", str(tmp_path / "faces.npz")))
    with pytest.raises(FaceCoreError, match="packs the data root"):
        cross_silo.run(parse("--synthetic", "--backbone", "tiny", "--pack-faces", str(tmp_path / "faces.npz")))
    with pytest.raises(FaceCoreError, match="not a face pack"):
        cross_silo.run(parse("--faces", str(tmp_path / "missing.npz"), "--backbone", "tiny"))
