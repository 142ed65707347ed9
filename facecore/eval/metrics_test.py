from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from facecore.errors import FaceCoreError
from facecore.eval.metrics import (
    VerificationReport,
    all_pairs_scores,
    best_threshold,
    cosine_scores,
    equal_error_rate,
    kfold_accuracy,
    roc_auc,
    roc_curve,
    tar_at_far,
    threshold_at_far,
    verification_report,
)


def _pair_lists(embeddings: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    genuine, impostor = all_pairs_scores(embeddings, ids)
    scores = np.concatenate([genuine, impostor])
    labels = np.concatenate([np.ones(genuine.size, int), np.zeros(impostor.size, int)])
    return scores, labels


def test_cosine_scores_known_vectors_and_zero_row() -> None:
    # Prepare
    a = np.array([[1.0, 0.0], [3.0, 4.0], [0.0, 0.0]])
    b = np.array([[0.0, 2.0], [6.0, 8.0], [1.0, 1.0]])
    # Execute
    s = cosine_scores(a, b)
    # Assert
    np.testing.assert_allclose(s, [0.0, 1.0, 0.0])


def test_identical_embeddings_per_identity_are_perfect() -> None:
    # Prepare: 20 identities, 5 copies each at different scales (cosine ignores scale)
    rng = np.random.default_rng(0)
    base = rng.normal(size=(20, 64))
    ids = np.repeat(np.arange(20), 5)
    emb = base[ids] * rng.uniform(0.5, 2.0, size=(ids.size, 1))
    scores, labels = _pair_lists(emb, ids)
    folds = rng.integers(0, 10, size=scores.size)
    # Execute
    acc = kfold_accuracy(scores, labels, folds)
    auc = roc_auc(scores, labels)
    # Assert
    assert acc.mean == 1.0 and acc.std == 0.0
    assert len(acc.per_fold) == 10 and len(acc.thresholds) == 10
    assert auc == 1.0


def test_random_embeddings_are_at_chance() -> None:
    # Prepare: 3,000 pairs of unrelated Gaussian embeddings with random labels
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(3000, 128)), rng.normal(size=(3000, 128))
    labels = rng.integers(0, 2, size=3000)
    folds = np.arange(3000) % 10
    scores = cosine_scores(a, b)
    # Execute
    acc = kfold_accuracy(scores, labels, folds)
    auc = roc_auc(scores, labels)
    # Assert
    assert abs(acc.mean - 0.5) <= 0.05
    assert abs(auc - 0.5) <= 0.05


def test_best_threshold_hand_cases() -> None:
    # Prepare
    overlap = ([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1])
    separable = ([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1])
    # Execute
    t_overlap = best_threshold(*overlap)
    t_separable = best_threshold(*separable)
    t_all_same = best_threshold([0.3, 0.7], [1, 1])
    t_all_diff = best_threshold([0.3, 0.7], [0, 0])
    # Assert: cuts at 0.225 and 0.6 both reach 3/4; the smaller one wins
    assert t_overlap == pytest.approx(0.225)
    assert t_separable == pytest.approx(0.5)
    assert t_all_same == 0.3
    assert t_all_diff > 0.7 and t_all_diff == pytest.approx(0.7)


def test_kfold_uses_other_folds_and_population_std() -> None:
    # Prepare: fold 1 holds an impostor at 0.6 that fold 0's threshold (0.5) misses
    scores = [0.1, 0.9, 0.2, 0.8, 0.6]
    labels = [0, 1, 0, 1, 0]
    folds = [0, 0, 1, 1, 1]
    # Execute
    acc = kfold_accuracy(scores, labels, folds)
    # Assert
    assert acc.per_fold == pytest.approx((1.0, 2 / 3))
    assert acc.thresholds == pytest.approx((0.7, 0.5))
    assert acc.mean == pytest.approx(5 / 6)
    assert acc.std == pytest.approx(1 / 6)  # population std; sample std would be 0.236


def test_kfold_errors() -> None:
    # Prepare
    scores, labels = [0.1, 0.2, 0.8, 0.9], [0, 1, 1, 1]
    # Execute / Assert
    with pytest.raises(FaceCoreError, match="at least 2 folds"):
        kfold_accuracy(scores, labels, [3, 3, 3, 3])
    with pytest.raises(FaceCoreError, match="only one class"):
        kfold_accuracy(scores, labels, [0, 1, 1, 1])
    with pytest.raises(FaceCoreError, match="^need one fold id per score, got 2 for 4$"):
        kfold_accuracy(scores, labels, [0, 1])


def test_roc_auc_with_ties_matches_mann_whitney() -> None:
    # Prepare: integer scores force many ties
    rng = np.random.default_rng(2)
    scores = rng.integers(0, 5, size=200).astype(float)
    labels = rng.integers(0, 2, size=200)
    pos, neg = scores[labels == 1], scores[labels == 0]
    mann_whitney = np.mean((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :]))
    # Execute
    auc = roc_auc(scores, labels)
    # Assert
    assert roc_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert roc_auc([0.5, 0.5, 0.5], [0, 1, 1]) == pytest.approx(0.5)
    assert auc == pytest.approx(mann_whitney)


def test_equal_error_rate_hand_cases_and_gaussians() -> None:
    # Prepare: genuine ~ N(1, 1), impostor ~ N(-1, 1): FAR = FRR at 0, where both are Phi(-1)
    rng = np.random.default_rng(5)
    gaussian = np.r_[rng.normal(1.0, 1.0, 20_000), rng.normal(-1.0, 1.0, 20_000)]
    gaussian_labels = np.r_[np.ones(20_000, int), np.zeros(20_000, int)]
    phi_minus_one = 0.5 * math.erfc(1.0 / math.sqrt(2.0))
    # Execute
    separable = equal_error_rate([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1])
    overlap = equal_error_rate([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1])
    inverted = equal_error_rate([0.1, 0.2, 0.8, 0.9], [1, 1, 0, 0])
    all_tied = equal_error_rate([0.5, 0.5, 0.5], [0, 1, 1])
    between = equal_error_rate([0.1, 0.2, 0.3, 0.6, 0.7, 0.4, 0.8, 0.9], [0, 0, 0, 0, 0, 1, 1, 1])
    gaussian_eer = equal_error_rate(gaussian, gaussian_labels)
    # Assert: at any t in (0.35, 0.4) one of two impostors and one of two genuine are wrong
    assert separable == 0.0
    assert overlap == pytest.approx(0.5)
    assert inverted == pytest.approx(1.0)
    assert all_tied == pytest.approx(0.5)
    # FAR 2/5 > FRR 1/3 at t = 0.4 and FAR 1/5 < FRR 1/3 at t = 0.7: the crossing lies between
    assert 1 / 5 < between < 2 / 5
    assert gaussian_eer == pytest.approx(phi_minus_one, abs=0.01)


def test_roc_curve_runs_from_origin_to_one() -> None:
    # Prepare
    scores, labels = [0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]
    # Execute
    far, tar, thresholds = roc_curve(scores, labels)
    # Assert
    np.testing.assert_allclose(far, [0.0, 0.0, 0.5, 0.5, 1.0])
    np.testing.assert_allclose(tar, [0.0, 0.5, 0.5, 1.0, 1.0])
    assert thresholds[0] == np.inf
    np.testing.assert_allclose(thresholds[1:], [0.8, 0.4, 0.35, 0.1])


def test_tar_at_far_on_uniform_grid() -> None:
    # Prepare: impostors 0.0000 .. 0.9999; at FAR 1e-3 ten of them may lie above t
    rng = np.random.default_rng(3)
    impostor = rng.permutation(np.arange(10_000) / 10_000)
    genuine = np.array([0.5, 0.99885, 0.9989, 0.99895, 0.99985, 1.0])
    # Execute
    t3 = threshold_at_far(impostor, 1e-3)
    t4 = threshold_at_far(impostor, 1e-4)
    tar = tar_at_far(genuine, impostor)
    # Assert
    assert t3 == pytest.approx(0.9989)
    assert t4 == pytest.approx(0.9998)
    assert set(tar) == {"1e-3", "1e-4"}
    assert tar["1e-3"] == pytest.approx(3 / 6)  # 0.9989 itself is not above t
    assert tar["1e-4"] == pytest.approx(2 / 6)


def test_threshold_at_far_ties_never_exceed_target() -> None:
    # Prepare: 1,000 impostors whose top five tie at 0.9; only one may lie above t
    impostor = np.concatenate([np.linspace(0.0, 0.5, 995), np.full(5, 0.9)])
    # Execute
    t = threshold_at_far(impostor, 1e-3)
    # Assert
    assert t == 0.9
    assert np.mean(impostor > t) <= 1e-3


def test_tar_at_far_is_nan_when_too_few_impostors() -> None:
    # Prepare
    genuine = np.array([0.9, 0.95])
    # Execute
    few = tar_at_far(genuine, np.linspace(0, 0.5, 999))
    enough = tar_at_far(genuine, np.linspace(0, 0.5, 1000))
    # Assert
    assert math.isnan(few["1e-3"]) and math.isnan(few["1e-4"])
    assert enough["1e-3"] == 1.0 and math.isnan(enough["1e-4"])


@pytest.mark.parametrize("ids", [list("aabbbcdddde") * 3 + ["f", "g", "g", "h"], list(range(37))])
def test_all_pairs_scores_matches_brute_force(ids: list[str] | list[int]) -> None:
    # Prepare: 37 rows in blocks of 8 so the last block is partial
    rng = np.random.default_rng(4)
    emb = rng.normal(size=(37, 16))
    expected_gen: list[float] = []
    expected_imp: list[float] = []
    for i, j in itertools.combinations(range(37), 2):
        cos = emb[i] @ emb[j] / (np.linalg.norm(emb[i]) * np.linalg.norm(emb[j]))
        (expected_gen if ids[i] == ids[j] else expected_imp).append(cos)
    # Execute
    genuine, impostor = all_pairs_scores(emb, ids, block=8)
    # Assert
    assert genuine.dtype == np.float32 and impostor.dtype == np.float32
    assert genuine.size + impostor.size == 37 * 36 // 2
    np.testing.assert_allclose(genuine, expected_gen, atol=1e-5)
    np.testing.assert_allclose(impostor, expected_imp, atol=1e-5)


def test_verification_report_json_keys_and_nan() -> None:
    # Prepare: 20 separable pairs in 2 folds; 10 impostors cannot measure FAR 1e-3
    scores = np.r_[np.linspace(0.6, 0.9, 10), np.linspace(0.0, 0.3, 10)]
    labels = np.r_[np.ones(10, int), np.zeros(10, int)]
    folds = np.arange(20) % 2 + 6
    # Execute
    report = verification_report(scores, labels, folds, extra={"model": "lbp"})
    as_json = report.to_json_dict()
    # Assert
    assert report.accuracy == 1.0 and report.auc == 1.0 and report.folds == (6, 7)
    expected = {"accuracy", "accuracy_std", "auc", "tar_at_far", "folds", "pairs", "model"}
    assert set(as_json) == expected
    assert as_json["tar_at_far"] == {"1e-3": None, "1e-4": None}
    assert as_json["pairs"] == 20 and as_json["folds"] == [6, 7]
    json.dumps(as_json, allow_nan=False)


def test_verification_report_rejects_clashing_extra() -> None:
    # Prepare / Execute / Assert
    with pytest.raises(FaceCoreError, match="overwrite"):
        VerificationReport(1.0, 0.0, 1.0, {}, (1,), 1, extra={"auc": 0.3})
