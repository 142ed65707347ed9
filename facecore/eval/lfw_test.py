from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from facecore.align.pipeline import AlignedSet
from facecore.data.lfw import LFW
from facecore.errors import FaceCoreError
from facecore.eval.lfw import LFWFaces, evaluate, folds_text, load_lfw_faces, per_fold_tar, subset_pairs


def _faces(identities: np.ndarray, face_fold: np.ndarray | None) -> LFWFaces:
    empty = np.zeros((0, 2), np.int64)
    return LFWFaces((1, 2), np.zeros((len(identities), 1, 1, 3), np.uint8), identities, empty, np.zeros(0, bool), np.zeros(0),
                    None, (), face_fold)  # type: ignore[arg-type]


def test_each_fold_is_scored_on_its_own_pairs_only() -> None:
    # Prepare: fold 1's people are perfectly separated; fold 2's share one direction, so its
    # impostors score as high as its genuine pairs
    rng = np.random.default_rng(0)
    people = 60
    identities = np.array([f"lfw:p{i}" for i in range(people) for _ in range(3)])
    face_fold = np.array([1 if i < people // 2 else 2 for i in range(people) for _ in range(3)])
    directions = np.eye(people)[[i for i in range(people) for _ in range(3)]] + 0.01 * rng.standard_normal((3 * people, people))
    directions[face_fold == 2] = 1.0 + 0.01 * rng.standard_normal((int((face_fold == 2).sum()), people))
    # Execute
    tar = per_fold_tar(_faces(identities, face_fold), directions, fars=(1e-2,))
    # Assert: one figure per fold, in fold order; a fold's impostors never meet the other fold's faces
    assert tar["1e-2"][0] == 1.0
    assert tar["1e-2"][1] < 0.2


def test_per_fold_tar_needs_the_folds_of_the_people() -> None:
    # Execute / Assert
    with pytest.raises(FaceCoreError, match="all_people=True"):
        per_fold_tar(_faces(np.array(["lfw:a", "lfw:b"]), None), np.eye(2))


def test_without_drops_the_people_and_every_pair_showing_them() -> None:
    # Prepare: 4 faces of 3 people; pairs (a,a'), (a,b), (b,c)
    identities = np.array(["lfw:a", "lfw:a", "lfw:b", "lfw:c"])
    data = LFWFaces((1, 2), np.arange(4).reshape(4, 1, 1, 1).repeat(3, axis=3).astype(np.uint8), identities,
                    np.array([[0, 1], [0, 2], [2, 3]]), np.array([True, False, False]), np.array([1, 1, 2]), None, (),  # type: ignore[arg-type]
                    np.array([1, 1, 1, 2]))
    # Execute
    rest = data.without({"lfw:b"})
    # Assert: b's face and both pairs with b are gone; the kept pair points at the same two faces
    assert rest.identities.tolist() == ["lfw:a", "lfw:a", "lfw:c"]
    assert rest.pair_index.tolist() == [[0, 1]] and rest.pair_same.tolist() == [True] and rest.pair_fold.tolist() == [1]
    assert rest.face_fold is not None and rest.face_fold.tolist() == [1, 1, 2]
    assert rest.faces[:, 0, 0, 0].tolist() == [0, 1, 3]
    assert data.without({"lfw:nobody"}) is data


class _EveryPhotoAligner:
    """Stands in for FaceAligner: every photo 'aligns' to a 1x1 crop, and the paths asked for are kept."""

    def __init__(self) -> None:
        self.asked: list[Path] = []

    def align_paths(self, paths: list[Path], allow_fallback: bool = False, desc: str = "") -> AlignedSet:
        self.asked = list(paths)
        return AlignedSet(tuple(paths), ("ok",) * len(paths), np.zeros((len(paths), 1, 1, 3), np.uint8), np.arange(len(paths)))


def test_a_subset_is_seeded_balanced_and_within_its_photos(real_data: Path) -> None:
    # Prepare
    pairs = [p for p in LFW(real_data / "lfw").pairs() if p.fold in (6, 7, 8)]
    # Execute
    chosen = subset_pairs(pairs, (6, 7, 8), 300)
    again = subset_pairs(pairs, (6, 7, 8), 300)
    other_seed = subset_pairs(pairs, (6, 7, 8), 300, seed=1)
    # Assert: the same pairs every time, no more photos than asked, each fold and kind within one pair of the others
    photos = {img.path for p in chosen for img in (p.a, p.b)}
    shares = Counter((p.fold, p.same) for p in chosen)
    assert chosen == again and chosen != other_seed
    assert 290 <= len(photos) <= 300
    assert set(shares) == {(f, s) for f in (6, 7, 8) for s in (True, False)}
    assert max(shares.values()) - min(shares.values()) <= 1
    firsts = {p for f in (6, 7, 8) for s in (True, False) for p in [q for q in pairs if (q.fold, q.same) == (f, s)][: shares[(f, s)]]}
    assert set(chosen) != firsts  # drawn, not each fold's first pairs in the file


def test_a_subset_too_small_for_a_pair_of_each_kind_per_fold_is_refused(real_data: Path) -> None:
    # Prepare
    pairs = [p for p in LFW(real_data / "lfw").pairs() if p.fold in (6, 7)]
    # Execute / Assert
    with pytest.raises(FaceCoreError, match="at least 8"):
        subset_pairs(pairs, (6, 7), 7)


def test_load_with_max_photos_aligns_only_the_subset_and_says_so(real_data: Path) -> None:
    # Prepare
    aligner = _EveryPhotoAligner()
    # Execute
    data = load_lfw_faces(real_data / "lfw", (6, 7), aligner=aligner, max_photos=200)  # type: ignore[arg-type]
    # Assert: only the subset's photos are aligned; its pairs index them; each face knows its people fold
    assert data.subset is not None and data.subset["photos"] == len(aligner.asked) <= 200
    assert data.subset["of_photos"] == 1166 + 1690 and data.subset["of_pairs"] == 1200
    assert data.subset["pairs"] == len(data.pair_index) and 90 <= len(data.pair_index) < 200
    assert data.face_fold is not None and set(data.face_fold.tolist()) == {6, 7}
    for (a, b), fold in zip(data.pair_index, data.pair_fold, strict=True):
        assert data.face_fold[a] == data.face_fold[b] == fold


def test_max_photos_beyond_the_folds_photos_is_the_whole_evaluation(real_data: Path) -> None:
    # Prepare
    aligner = _EveryPhotoAligner()
    # Execute
    data = load_lfw_faces(real_data / "lfw", (6, 7), aligner=aligner, max_photos=10_000)  # type: ignore[arg-type]
    # Assert
    assert data.subset is None and len(aligner.asked) == 1166 + 1690 and len(data.pair_index) == 1200


def test_a_subset_report_names_itself() -> None:
    # Prepare: two folds of four faces of two people, one matched and one mismatched pair each
    identities = np.array(["lfw:a", "lfw:a", "lfw:b", "lfw:b", "lfw:c", "lfw:c", "lfw:d", "lfw:d"])
    embeddings = np.eye(8)[[0, 0, 1, 1, 2, 2, 3, 3]].astype(np.float32)
    subset = {"photos": 8, "of_photos": 100, "pairs": 4, "of_pairs": 40, "seed": 0}
    data = LFWFaces((6, 7), np.zeros((8, 1, 1, 3), np.uint8), identities, np.array([[0, 1], [0, 2], [4, 5], [4, 6]]),
                    np.array([True, False, True, False]), np.array([6, 6, 7, 7]),
                    AlignedSet((), (), np.zeros((0, 1, 1, 3), np.uint8), np.zeros(0, np.int64)), (), np.array([6, 6, 6, 6, 7, 7, 7, 7]), subset)
    # Execute
    report = evaluate(data, lambda faces: embeddings, fars=(0.1,)).report
    # Assert
    assert report.extra["subset"] == subset and report.accuracy == 1.0


def test_folds_are_named_as_a_range_only_when_they_are_one() -> None:
    # Execute / Assert
    assert (folds_text((6, 7, 8, 9, 10)), folds_text((6, 8)), folds_text((7,))) == ("6-10", "6,8", "7")
