from pathlib import Path

import numpy as np
import pytest

from facecore.errors import FaceCoreError
from facecore.eval.calibration import calibrate_threshold
from facecore.eval.geometry_search import search_geometry
from facecore.eval.lfw import refuse_test_folds
from facecore.models.registry import get_backbone


@pytest.mark.parametrize("folds", [(6,), (1, 2, 10), tuple(range(1, 11))])
def test_no_choice_is_made_on_the_test_folds(folds: tuple[int, ...], tmp_path: Path) -> None:
    # Prepare
    model = get_backbone("mobilefacenet")
    # Execute / Assert: the threshold, the crop and any other choice refuse folds 6-10 before any work
    with pytest.raises(FaceCoreError, match="are the test set"):
        calibrate_threshold(model, tmp_path, folds)
    with pytest.raises(FaceCoreError, match="are the test set"):
        search_geometry(model, tmp_path, folds, [1.0], [0.0])
    with pytest.raises(FaceCoreError, match="choose a checkpoint on folds 1-5"):
        refuse_test_folds(list(folds), "a checkpoint")


@pytest.mark.slow
def test_the_threshold_accepts_the_calibrated_fraction_of_impostors(small_lfw_data: Path) -> None:
    # Prepare: a cheap seeded backbone (the rule does not depend on the model) on one non-test fold,
    # its first 80 people (149 real faces)
    from facecore.eval.lfw import load_lfw_faces
    from facecore.eval.metrics import all_pairs_scores
    from facecore.models.checkpoint import load_backbone
    from facecore.models.preprocess import embed_faces

    model = load_backbone("random", backbone="mobilefacenet_s")
    # Execute
    calibrated = calibrate_threshold(model, small_lfw_data / "lfw", (1,), far=1e-2)
    # Assert: at most 1% of the fold's impostor pairs score above it, and just barely
    data = load_lfw_faces(small_lfw_data / "lfw", (1,))
    _, impostor = all_pairs_scores(embed_faces(model, data.faces), data.identities)
    accepted = float(np.mean(impostor > calibrated.threshold))
    assert 0.009 <= accepted <= 0.01
    assert calibrated.far == 1e-2 and calibrated.calibration is not None and "LFW folds 1-1" in calibrated.calibration
    # a FAR finer than the fold's impostor pairs can resolve is refused, not answered with NaN
    with pytest.raises(FaceCoreError, match=f"give {impostor.size:,}: calibrate on more folds"):
        calibrate_threshold(model, small_lfw_data / "lfw", (1,), far=0.1 / impostor.size)
    # and a model that trained on the fold's people has nobody left to calibrate on
    with pytest.raises(FaceCoreError, match="fewer than 2 people the model did not train on"):
        calibrate_threshold(model, small_lfw_data / "lfw", (1,), exclude=set(data.identities.tolist()))
