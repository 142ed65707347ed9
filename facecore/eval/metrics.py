"""LFW-style face-verification metrics, in pure numpy.

Conventions shared by every function here: a higher score means "more likely the
same person", labels are 1 (same) / 0 (different), and a threshold ``t`` predicts
"same" for ``score >= t`` (accuracy, ROC) or ``score > t`` (TAR@FAR, see there).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from facecore.errors import FaceCoreError


def _scores_labels(scores: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels).ravel()
    if s.size == 0 or s.shape != y.shape:
        raise FaceCoreError(f"need equally many scores and labels, got {s.size} and {y.size}")
    if not np.all(np.isfinite(s)):
        raise FaceCoreError("scores must be finite")
    if not np.all(np.isin(y, (0, 1))):
        raise FaceCoreError("labels must be 0 (different) or 1 (same)")
    return s, y.astype(bool)


def _unit_rows(x: np.ndarray, dtype: type = np.float64) -> np.ndarray:
    x = np.asarray(x, dtype=dtype)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    # A zero row stays zero (cosine 0 with everything) instead of becoming NaN.
    return x / np.maximum(norms, np.finfo(dtype).tiny)


def cosine_scores(emb_a: np.ndarray, emb_b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two (N, D) arrays; zero rows score 0."""
    a, b = np.asarray(emb_a), np.asarray(emb_b)
    if a.ndim != 2 or a.shape != b.shape:
        raise FaceCoreError(f"need two (N, D) arrays of one shape, got {a.shape} and {b.shape}")
    return np.einsum("ij,ij->i", _unit_rows(a), _unit_rows(b))


def _accuracy_per_cut(s: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy when the first ``i`` unique scores are called "different", i = 0..m."""
    uniq, inverse = np.unique(s, return_inverse=True)
    pos = np.bincount(inverse, weights=y, minlength=uniq.size)
    neg = np.bincount(inverse, weights=~y, minlength=uniq.size)
    tn = np.concatenate(([0.0], np.cumsum(neg)))
    tp = pos.sum() - np.concatenate(([0.0], np.cumsum(pos)))
    return uniq, (tp + tn) / s.size


def best_threshold(scores: Any, labels: Any) -> float:
    """Threshold maximising accuracy of ``score >= t``.

    Candidates are the lowest score (everything "same"), the midpoints between
    consecutive unique scores, and the next float above the highest score
    (everything "different"). Ties in accuracy go to the smallest candidate, so the
    result is deterministic.
    """
    s, y = _scores_labels(scores, labels)
    uniq, acc = _accuracy_per_cut(s, y)
    i = int(np.argmax(acc))  # argmax returns the first, i.e. smallest, best cut
    if i == 0:
        return float(uniq[0])
    if i == uniq.size:
        return float(np.nextafter(uniq[-1], np.inf))
    mid = (uniq[i - 1] + uniq[i]) / 2.0
    # Adjacent floats can round the midpoint down onto the lower score.
    return float(mid if mid > uniq[i - 1] else uniq[i])


@dataclass(frozen=True)
class FoldAccuracy:
    """Cross-validated accuracy; ``std`` is the population std (np.std, ddof=0)."""

    mean: float
    std: float
    per_fold: tuple[float, ...]
    thresholds: tuple[float, ...]


def kfold_accuracy(scores: Any, labels: Any, fold_ids: Any) -> FoldAccuracy:
    """For each fold, pick the threshold on the other folds and score this fold."""
    s, y = _scores_labels(scores, labels)
    folds = np.asarray(fold_ids).ravel()
    if folds.shape != s.shape:
        raise FaceCoreError(f"need one fold id per score, got {folds.size} for {s.size}")
    unique_folds = np.unique(folds)
    if unique_folds.size < 2:
        raise FaceCoreError("k-fold accuracy needs at least 2 folds")
    accs: list[float] = []
    thresholds: list[float] = []
    for k in unique_folds:
        test = folds == k
        train_y = y[~test]
        if train_y.all() or not train_y.any():
            raise FaceCoreError(
                f"folds other than {k!r} hold only one class; cannot pick a threshold"
            )
        t = best_threshold(s[~test], train_y)
        thresholds.append(t)
        accs.append(float(np.mean((s[test] >= t) == y[test])))
    return FoldAccuracy(float(np.mean(accs)), float(np.std(accs)), tuple(accs), tuple(thresholds))


def roc_curve(scores: Any, labels: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(far, tar, thresholds) for ``score >= t`` at each unique score, descending.

    The first point is (0, 0) at threshold +inf, so the curve runs from (0, 0) to
    (1, 1). Tied scores move together, which gives the diagonal step that counts
    a tie as half a correct ordering.
    """
    s, y = _scores_labels(scores, labels)
    n_pos = int(y.sum())
    if n_pos == 0 or n_pos == y.size:
        raise FaceCoreError("a ROC curve needs both genuine and impostor pairs")
    uniq, inverse = np.unique(s, return_inverse=True)
    pos = np.bincount(inverse, weights=y, minlength=uniq.size)[::-1]
    neg = np.bincount(inverse, weights=~y, minlength=uniq.size)[::-1]
    tar = np.concatenate(([0.0], np.cumsum(pos))) / n_pos
    far = np.concatenate(([0.0], np.cumsum(neg))) / (y.size - n_pos)
    return far, tar, np.concatenate(([np.inf], uniq[::-1]))


def roc_auc(scores: Any, labels: Any) -> float:
    """Trapezoid area under the ROC = P(genuine > impostor) + P(tie) / 2."""
    far, tar, _ = roc_curve(scores, labels)
    return float(np.sum(np.diff(far) * (tar[1:] + tar[:-1]) / 2.0))


def equal_error_rate(scores: Any, labels: Any) -> float:
    """The rate where FAR equals FRR (1 - TAR), on the ROC of :func:`roc_curve`.

    FAR - FRR rises from -1 at (0, 0) to 1 at (1, 1); the EER is read off where the ROC's
    straight segment crosses zero (linear interpolation between its two end points), so
    tied scores count the same way as in :func:`roc_auc`: 0 for separable scores, 0.5 for
    all-tied ones, 1 for perfectly inverted ones.
    """
    far, tar, _ = roc_curve(scores, labels)
    gap = far - (1.0 - tar)  # non-decreasing, from -1 to 1
    k = int(np.argmax(gap >= 0.0))  # first point at or past the crossing; k >= 1 since gap[0] = -1
    step = gap[k] - gap[k - 1]
    t = -gap[k - 1] / step if step > 0 else 1.0
    return float(far[k - 1] + t * (far[k] - far[k - 1]))


def _measurable(n_impostors: int, far: float) -> bool:
    # Tolerance so that e.g. 1 / 1e-3 does not round up to 1001.
    return n_impostors >= math.ceil(1.0 / far - 1e-9)


def threshold_at_far(impostor: Any, far: float) -> float:
    """Smallest t with fraction(impostor > t) <= far; NaN if not measurable.

    Strictly-greater counting means tied impostors at t never push the FAR over
    the target. With fewer than ceil(1/far) impostors the target cannot be told
    apart from zero, so the answer is NaN rather than an optimistic guess.
    """
    if not 0.0 < far < 1.0:
        raise FaceCoreError(f"FAR must lie in (0, 1), got {far}")
    imp = np.asarray(impostor).ravel()
    if not _measurable(imp.size, far):
        return float("nan")
    allowed = int(math.floor(far * imp.size + 1e-9))  # impostors allowed above t
    # The (allowed+1)-th largest value: partition is O(n) on ~25M scores, sort is not.
    kth = imp.size - 1 - allowed
    return float(np.partition(imp, kth)[kth])


def far_key(far: float) -> str:
    """``1e-3`` style key: mantissa without trailing zeros, exponent without padding."""
    mantissa, exponent = f"{far:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def tar_at_far(
    genuine: Any, impostor: Any, fars: Sequence[float] = (1e-3, 1e-4)
) -> dict[str, float]:
    """TAR (fraction of genuine > threshold_at_far) per FAR, keyed like ``"1e-3"``.

    A FAR that the impostor count cannot measure (see threshold_at_far) maps to NaN.
    """
    gen = np.asarray(genuine).ravel()
    if gen.size == 0:
        raise FaceCoreError("TAR needs at least one genuine score")
    out: dict[str, float] = {}
    for far in fars:
        t = threshold_at_far(impostor, far)
        out[far_key(far)] = float("nan") if math.isnan(t) else float(np.mean(gen > t))
    return out


def all_pairs_scores(
    embeddings: np.ndarray, identities: Sequence[Any] | np.ndarray, block: int = 2048
) -> tuple[np.ndarray, np.ndarray]:
    """Cosine scores of all pairs i < j as (genuine, impostor) float32 arrays.

    Works on L2-normalised float32 rows one block of rows at a time, so the working
    memory is about ``block * N`` floats plus the two outputs. Pairs appear in
    row-major (i, then j) order.
    """
    x = np.asarray(embeddings)
    ids = np.asarray(identities)
    if x.ndim != 2 or ids.ndim != 1 or ids.size != x.shape[0]:
        raise FaceCoreError(f"need (N, D) embeddings and N identities, got {x.shape}, {ids.shape}")
    if block < 1:
        raise FaceCoreError(f"block must be positive, got {block}")
    n = x.shape[0]
    x = _unit_rows(x, np.float32)
    _, codes, counts = np.unique(ids, return_inverse=True, return_counts=True)
    codes = codes.ravel()
    n_genuine = int(np.sum(counts * (counts - 1) // 2))
    # Preallocated outputs: concatenating per-block pieces would double peak memory.
    genuine = np.empty(n_genuine, dtype=np.float32)
    impostor = np.empty(n * (n - 1) // 2 - n_genuine, dtype=np.float32)
    g = i = 0
    for start in range(0, n, block):
        stop = min(start + block, n)
        sims = x[start:stop] @ x[start:].T
        upper = np.arange(n - start)[None, :] > np.arange(stop - start)[:, None]
        same = codes[start:stop, None] == codes[None, start:]
        gen_part, imp_part = sims[upper & same], sims[upper & ~same]
        genuine[g : g + gen_part.size] = gen_part
        impostor[i : i + imp_part.size] = imp_part
        g, i = g + gen_part.size, i + imp_part.size
    return genuine, impostor


def _json_float(v: float) -> float | None:
    # NaN (an unmeasurable FAR) becomes null so the dict survives strict JSON.
    return None if math.isnan(v) else float(v)


_REPORT_KEYS = ("accuracy", "accuracy_std", "auc", "tar_at_far", "folds", "pairs")


@dataclass(frozen=True)
class VerificationReport:
    """Summary of one verification run.

    ``folds`` holds the ids of the folds evaluated (e.g. LFW folds 6..10), ``pairs``
    the number of scored pairs; ``extra`` holds caller keys merged into the JSON.
    """

    accuracy: float
    accuracy_std: float
    auc: float
    tar_at_far: dict[str, float]
    folds: tuple[int, ...]
    pairs: int
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        clash = set(self.extra) & set(_REPORT_KEYS)
        if clash:
            raise FaceCoreError(f"extra keys would overwrite report fields: {sorted(clash)}")

    def to_json_dict(self) -> dict[str, Any]:
        """JSON-ready dict; NaN values (e.g. unmeasurable TAR@FAR) become None."""
        return {
            "accuracy": _json_float(self.accuracy),
            "accuracy_std": _json_float(self.accuracy_std),
            "auc": _json_float(self.auc),
            "tar_at_far": {k: _json_float(v) for k, v in self.tar_at_far.items()},
            "folds": [int(f) for f in self.folds],
            "pairs": int(self.pairs),
            **self.extra,
        }


def verification_report(
    scores: Any,
    labels: Any,
    fold_ids: Any,
    fars: Sequence[float] = (1e-3, 1e-4),
    extra: dict[str, Any] | None = None,
) -> VerificationReport:
    """All metrics for a labelled pair list (e.g. LFW's 6,000 pairs in 10 folds)."""
    s, y = _scores_labels(scores, labels)
    folds = kfold_accuracy(s, y, fold_ids)
    return VerificationReport(
        accuracy=folds.mean,
        accuracy_std=folds.std,
        auc=roc_auc(s, y),
        tar_at_far=tar_at_far(s[y], s[~y], fars),
        folds=tuple(int(f) for f in np.unique(np.asarray(fold_ids).ravel())),
        pairs=int(s.size),
        extra=dict(extra or {}),
    )
