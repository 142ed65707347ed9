"""Fixtures shared by every test folder."""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from facecore.errors import DataRootMissing
from facecore.paths import data_root

if TYPE_CHECKING:
    import torch


@pytest.fixture(scope="session")
def real_data() -> Path:
    """The real data root. In CI it must exist; elsewhere tests that need it are skipped."""
    try:
        return data_root()
    except DataRootMissing as error:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(error))


@pytest.fixture(scope="session")
def small_lfw_data(real_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root whose LFW keeps the first 80 people of each real fold and no pairs: the same real
    faces through the same detector, 149 of them in fold 1, where a whole fold takes minutes to align
    on a busy machine. In the seed-0 split three of fold 1's people are not public (151 impostor pairs)."""
    from facecore.data.lfw import LFW

    lfw = LFW(real_data / "lfw")
    root = tmp_path_factory.mktemp("small_lfw_data")
    (root / "lfw").mkdir()
    (root / "lfw" / lfw.images_dir.name).symlink_to(lfw.images_dir)
    lines = ["10"]
    for fold in lfw.people_folds():
        kept = list(fold.items())[:80]
        lines += [str(len(kept)), *(f"{name}\t{count}" for name, count in kept)]
    (root / "lfw" / "people.txt").write_text("\n".join(lines) + "\n")
    (root / "lfw" / "pairs.txt").write_text("10\t0\n")
    return root


@pytest.fixture()
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private aligned-face cache, so tests never depend on (or pollute) the user's cache.
    The published weights that `make test` fetched stay where they are."""
    from facecore.paths import PACKAGES_ENV, packages_root

    monkeypatch.setenv(PACKAGES_ENV, str(packages_root()))
    monkeypatch.setenv("FEDFACE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="session")
def calibrated_backbone() -> Callable[..., torch.nn.Module]:
    """Builds small untrained backbones that behave like trained ones where a unit test needs it
    (`_calibrated_backbone`); a test helper, so it lives here rather than in a product package."""
    return _calibrated_backbone


def _calibrated_backbone(name: str = "mobilefacenet_s", seed: int = 0) -> torch.nn.Module:
    """A seeded untrained backbone, in eval mode, whose BatchNorm statistics were estimated on
    64 synthetic faces. An untrained network's default statistics squash features to ~1e-5, where
    normalisation turns gradients into noise; pretraining would have set real ones."""
    import torch
    from torch import nn

    from facecore.data.synthetic import synthetic_faces
    from facecore.models.preprocess import faces_to_tensor
    from facecore.models.registry import get_backbone

    torch.manual_seed(seed)
    model = get_backbone(name)
    calibration, _ = synthetic_faces(16, 4, seed=6)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.momentum = None  # a cumulative average over the one calibration batch
        model.train()(faces_to_tensor(calibration))
    return model.eval()
