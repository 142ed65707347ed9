import numpy as np
import pytest

from facecore.errors import FaceCoreError
from facecore.eval.lfw import LFWFaces, per_fold_tar


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
