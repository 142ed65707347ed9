"""Owner verification on embeddings whose answer is known: the split, the template, the rates."""
import numpy as np
import pytest

from facecore.errors import FaceCoreError
from facecore.eval.owners import OwnerFaces, holdout_split, owner_scores, owner_verification, owner_verifications


def _embed(faces: np.ndarray) -> np.ndarray:
    """A stand-in embedder: each 'face' carries its embedding in its first pixels."""
    return faces.reshape(len(faces), -1)[:, :3].astype(np.float64) - 100.0


def _faces(direction: list[float], n: int, rng: np.random.Generator, noise: float = 3.0) -> np.ndarray:
    base = 100.0 + 50.0 * np.asarray(direction) / np.linalg.norm(direction)
    faces = np.zeros((n, 2, 2, 3), np.float64)
    faces.reshape(n, -1)[:, :3] = base + noise * rng.standard_normal((n, 3))
    return faces


def test_the_holdout_split_is_seeded_disjoint_and_keeps_one_on_each_side() -> None:
    # Prepare
    faces = np.arange(10)[:, None, None, None] * np.ones((10, 1, 1, 1))
    # Execute
    enroll, held = holdout_split(faces, 0.3, seed=0, index=4)
    again, _ = holdout_split(faces, 0.3, seed=0, index=4)
    other, _ = holdout_split(faces, 0.3, seed=0, index=5)
    two_enroll, two_held = holdout_split(faces[:2], 0.9, seed=0, index=0)
    # Assert
    assert len(held) == 3 and len(enroll) == 7 and not set(enroll.ravel()) & set(held.ravel())
    np.testing.assert_array_equal(enroll, again)
    assert not np.array_equal(enroll, other)
    assert len(two_enroll) == len(two_held) == 1
    with pytest.raises(FaceCoreError, match="at least 2 photos"):
        holdout_split(faces[:1], 0.3, seed=0, index=0)


def test_separable_owners_are_all_accepted_and_every_impostor_refused() -> None:
    # Prepare: three identities along orthogonal directions, one photo each held out
    rng = np.random.default_rng(0)
    owners = [OwnerFaces(str(i), _faces(d, 4, rng), _faces(d, 2, rng)) for i, d in enumerate(np.eye(3).tolist())]
    # Execute
    report = owner_verification(_embed, owners, threshold=0.8)
    # Assert
    assert (report.genuine_pairs, report.impostor_pairs) == (6, 12)
    assert report.genuine_accept == report.owners_all_accepted == report.worst_owner_accept == 1.0
    assert report.impostor_accept == report.impostor_accept_worst_template == 0.0


def test_a_look_alike_is_counted_against_the_template_it_passes() -> None:
    # Prepare: identity 1 is close to identity 0; identity 2 is far from both
    rng = np.random.default_rng(1)
    directions: list[list[float]] = [[1, 0, 0], [1, 0.2, 0], [0, 0, 1]]
    owners = [OwnerFaces(str(i), _faces(d, 4, rng, 0.5), _faces(d, 2, rng, 0.5)) for i, d in enumerate(directions)]
    # Execute
    report = owner_verification(_embed, owners, threshold=0.95)
    # Assert: 1's two photos pass 0's template and 0's pass 1's: 4 of the 12 impostor pairs; 2 of 4 against each of those templates
    assert report.genuine_accept == 1.0
    assert report.impostor_accept == pytest.approx(4 / 12) and report.impostor_accept_worst_template == pytest.approx(2 / 4)


def test_several_thresholds_embed_each_photo_once_and_match_one_threshold_at_a_time() -> None:
    # Prepare: the look-alike owners, an embedder that counts the photos it sees
    rng = np.random.default_rng(1)
    directions: list[list[float]] = [[1, 0, 0], [1, 0.2, 0], [0, 0, 1]]
    owners = [OwnerFaces(str(i), _faces(d, 4, rng, 0.5), _faces(d, 2, rng, 0.5)) for i, d in enumerate(directions)]
    seen: list[int] = []

    def counting(faces: np.ndarray) -> np.ndarray:
        seen.append(len(faces))
        return _embed(faces)

    # Execute
    reports = owner_verifications(counting, owners, (0.95, 0.5))
    # Assert: 18 photos embedded once, and each report is what one threshold alone gives
    assert sum(seen) == 18
    assert reports == [owner_verification(_embed, owners, 0.95), owner_verification(_embed, owners, 0.5)]


def test_scores_from_embeddings_give_the_reports_of_the_photos_and_refuse_owners_without_held_out_photos() -> None:
    # Prepare: the look-alike owners, embedded by hand
    rng = np.random.default_rng(1)
    directions: list[list[float]] = [[1, 0, 0], [1, 0.2, 0], [0, 0, 1]]
    owners = [OwnerFaces(str(i), _faces(d, 4, rng, 0.5), _faces(d, 2, rng, 0.5)) for i, d in enumerate(directions)]
    # Execute
    scores = owner_scores([_embed(o.enroll) for o in owners], [_embed(o.held_out) for o in owners])
    genuine, impostor = scores.genuine_and_impostor()
    # Assert: 6 genuine and 12 impostor scores; each threshold's report is the photos' own
    assert (len(genuine), len(impostor)) == (6, 12)
    assert [scores.report(t) for t in (0.95, 0.5)] == owner_verifications(_embed, owners, (0.95, 0.5))
    assert genuine.min() > 0.99 and np.sort(impostor)[-4] > 0.95 > np.sort(impostor)[-5]
    with pytest.raises(FaceCoreError, match="3 owners enrolled but 2"):
        owner_scores([_embed(o.enroll) for o in owners], [_embed(o.held_out) for o in owners[:2]])
