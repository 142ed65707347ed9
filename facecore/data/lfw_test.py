import re
from pathlib import Path

import pytest

from facecore.data.lfw import LFW, parse_folds
from facecore.errors import DatasetFormatError


def test_view2_has_6000_pairs_in_10_identity_disjoint_folds(real_data: Path) -> None:
    # Prepare
    lfw = LFW(real_data / "lfw")
    # Execute
    pairs, folds = lfw.pairs(), lfw.people_folds()
    # Assert
    assert len(pairs) == 6000 and {p.fold for p in pairs} == set(range(1, 11))
    assert sum(p.same for p in pairs) == 3000
    assert sum(len(f) for f in folds) == 5749
    names = [set(f) for f in folds]
    assert all(not (names[i] & names[j]) for i in range(10) for j in range(i + 1, 10))
    for pair in pairs:  # every person in a pair of fold k belongs to people fold k
        for image in (pair.a, pair.b):
            assert image.identity.removeprefix("lfw:") in names[pair.fold - 1]
            assert image.path.is_file()


def test_view1_files_read_as_one_fold(real_data: Path) -> None:
    # Prepare
    lfw = LFW(real_data / "lfw")
    # Execute
    train = lfw.pairs("pairsDevTrain.txt")
    (people,) = lfw.people_folds("peopleDevTrain.txt")
    # Assert
    assert len(train) == 2200 and len(people) == 4038


def test_malformed_pairs_file_names_the_line(tmp_path: Path) -> None:
    # Prepare
    (tmp_path / "lfw-deepfunneled").mkdir()
    (tmp_path / "pairs.txt").write_text("1\t1\nAlice\t1\t2\nBob\tone\tCarol\t1\n")
    # Execute / Assert
    with pytest.raises(DatasetFormatError, match=r"pairs.txt:3: expected a number, got 'one'"):
        LFW(tmp_path).pairs()


def test_missing_image_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetFormatError, match="no LFW image folder"):
        LFW(tmp_path)


@pytest.mark.parametrize(("spec", "expected"), [("6-10", (6, 7, 8, 9, 10)), ("1,3,5", (1, 3, 5)), ("all", tuple(range(1, 11)))])
def test_parse_folds(spec: str, expected: tuple[int, ...]) -> None:
    assert parse_folds(spec) == expected


@pytest.mark.parametrize("spec", ["0-3", "x", "9-11"])
def test_parse_folds_rejects_nonsense(spec: str) -> None:
    with pytest.raises(DatasetFormatError, match=f"^bad fold spec {re.escape(repr(spec))}: "):
        parse_folds(spec)
