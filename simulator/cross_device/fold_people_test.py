from __future__ import annotations

import numpy as np
import pytest

from facecore.errors import FaceCoreError
from facecore.eval.metrics import all_pairs_scores, tar_at_far
from simulator.cross_device.fold_people import fold_changes, main, markdown


def _normalised(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _two_folds(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Two folds of 40 people; 'big' in fold 1 has 30 photos, everyone else 3."""
    rng = np.random.default_rng(seed)
    counts = [30] + [3] * 79
    identities = np.concatenate([np.full(n, "big" if i == 0 else f"p{i}") for i, n in enumerate(counts)])
    face_fold = np.concatenate([np.full(n, 1 if i < 40 else 2) for i, n in enumerate(counts)])
    centres = {name: rng.standard_normal(64) for name in np.unique(identities)}
    noise = rng.standard_normal((len(identities), 64))
    before = _normalised(np.stack([centres[n] for n in identities]) + 1.2 * noise)
    return before, identities, face_fold, noise


def test_contributions_add_up_to_each_folds_tar_change_and_match_the_metric() -> None:
    # Prepare: the after model sharpens only the big person (less noise on their photos).
    before, identities, face_fold, noise = _two_folds()
    after = before.copy()
    big = identities == "big"
    after[big] = _normalised(before[big] - 0.5 * _normalised(noise[big]))

    # Execute
    changes = fold_changes(before, after, identities, face_fold)

    # Assert
    assert [c.fold for c in changes] == [1, 2]
    for change in changes:
        rows = face_fold == change.fold
        for index, embeddings in enumerate((before, after)):
            genuine, impostor = all_pairs_scores(embeddings[rows], identities[rows])
            assert change.tar[index] == pytest.approx(100 * tar_at_far(genuine, impostor, (1e-3,))["1e-3"])
        assert sum(p.contribution for p in change.people) == pytest.approx(change.tar[1] - change.tar[0])
    fold1 = changes[0]
    assert fold1.people[0].name == "big" and fold1.people[0].pairs == 435
    assert fold1.people[0].contribution > 0
    assert changes[1].tar == changes[1].tar[::-1]  # fold 2 did not change


def test_the_table_names_the_people_who_carry_a_fold() -> None:
    before, identities, face_fold, _ = _two_folds()

    text = markdown(fold_changes(before, before, identities, face_fold), top=2)

    assert "### Fold 1" in text and "| big | 435 |" in text
    assert "| the other 38 people |" in text


def test_mismatched_inputs_are_one_clear_error() -> None:
    before, identities, face_fold, _ = _two_folds()
    with pytest.raises(FaceCoreError, match="same faces"):
        fold_changes(before, before[:-1], identities, face_fold)


def test_models_with_different_crops_are_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare: `mobilefacenet` crops 112x112, the default dlib model 150x150.
    specs = ["mobilefacenet", "default"]

    # Execute
    with pytest.raises(SystemExit, match="^2$") as exit_info:
        main(specs)

    # Assert
    assert exit_info.value.code == 2
    assert "the models use different crops" in capsys.readouterr().err
