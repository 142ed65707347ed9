from pathlib import Path

import pytest

from facecore.data.celeba import read_celeba
from facecore.data.folders import list_photos, read_identity_folders
from facecore.data.records import group_by_identity
from facecore.errors import DatasetFormatError


def test_celeba_subset_has_249_identities_of_about_21_photos(real_data: Path) -> None:
    # Execute
    groups = group_by_identity(read_celeba(real_data / "celeba_subset"))
    # Assert
    assert len(groups) == 249
    assert sum(map(len, groups.values())) == 5295
    assert all(name.startswith("celeba:") for name in groups)


def test_celeba_reader_reports_a_listed_file_that_is_missing(tmp_path: Path) -> None:
    # Prepare
    (tmp_path / "img").mkdir()
    (tmp_path / "identity.txt").write_text("000001.jpg 7\n")
    # Execute / Assert
    with pytest.raises(DatasetFormatError, match="identity.txt:1: .*000001.jpg does not exist"):
        read_celeba(tmp_path)


def test_identity_folders_and_photo_lists(tmp_path: Path) -> None:
    # Prepare
    for person, count in (("ann", 2), ("bob", 1)):
        (tmp_path / person).mkdir()
        for k in range(count):
            (tmp_path / person / f"{k}.jpg").write_bytes(b"x")
    (tmp_path / "ann" / "notes.txt").write_text("not a photo")
    # Execute
    images = read_identity_folders(tmp_path, namespace="home")
    photos = list_photos([tmp_path / "ann", tmp_path / "bob" / "0.jpg"])
    # Assert
    assert [i.identity for i in images] == ["home:ann", "home:ann", "home:bob"]
    assert [p.name for p in photos] == ["0.jpg", "1.jpg", "0.jpg"]
    with pytest.raises(DatasetFormatError, match="does not exist"):
        list_photos([tmp_path / "nobody"])
