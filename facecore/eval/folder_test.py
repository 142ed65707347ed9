"""`fedface eval folder` on a small folder of real LFW people, end to end through the CLI."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from facecore.data.lfw import LFW
from facecore.eval.folder import FolderEvalError, evaluate_folder, list_folder, threshold_check
from facecore.models.verification import Verification
from fedface.cli import main

PHOTOS_PER_PERSON = 4


def _people(real_data: Path, n: int) -> list[list[Path]]:
    """Photos of the first ``n`` people of LFW people fold 6 with 4..8 photos (none the bundled model trained on)."""
    lfw = LFW(real_data / "lfw")
    chosen = [(name, count) for name, count in lfw.people_folds()[5].items() if 4 <= count <= 8][:n]
    return [[img.path for img in lfw.images_of(name, count)] for name, count in chosen]


def _blank(path: Path) -> None:
    Image.fromarray(np.full((250, 250, 3), 128, np.uint8)).save(path)


def _one_json_line(out: str) -> dict:  # type: ignore[type-arg]
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    return json.loads(lines[0])


@pytest.mark.slow
def test_folder_of_real_people_end_to_end(
    real_data: Path, isolated_cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare: 3 people with 4 photos (JPEG, PNG, one PGM) and a fourth with a single photo,
    # plus a text file named like an image, a truncated JPEG and a photo of a blank wall
    people = _people(real_data, 4)
    root = tmp_path / "people"
    usable: dict[str, int] = {}
    for p, photos in enumerate(people):
        person = root / photos[0].parent.name
        person.mkdir(parents=True)
        kept = photos[: PHOTOS_PER_PERSON if p < 3 else 1]
        for k, photo in enumerate(kept):
            if k == 1:
                Image.open(photo).save(person / f"{photo.stem}.png")
            elif k == 2 and p == 0:
                Image.open(photo).convert("L").save(person / f"{photo.stem}.pgm")
            else:
                shutil.copy(photo, person / photo.name)
        usable[person.name] = len(kept)
    names = sorted(usable)
    (root / names[0] / "notes.jpg").write_text("a text file named like an image\n")
    jpeg = people[1][0].read_bytes()
    (root / people[1][0].parent.name / "cut.jpg").write_bytes(jpeg[: len(jpeg) // 3])
    _blank(root / people[2][0].parent.name / "wall.png")
    n = sum(usable.values())
    expected_genuine = sum(c * (c - 1) // 2 for c in usable.values())
    expected_impostor = n * (n - 1) // 2 - expected_genuine
    single = people[3][0].parent.name
    # Execute
    code_json = main(["eval", "folder", str(root), "--model", "mobilefacenet", "--json"])
    report = _one_json_line(capsys.readouterr().out)
    code_text = main(["eval", "folder", str(root), "--model", "mobilefacenet"])
    table = capsys.readouterr().out
    # Assert: every file is used or skipped with its reason
    assert code_json == 0 and code_text == 0
    assert report["skipped_counts"] == {"not_image": 1, "undecodable": 1, "noface": 1}
    assert {s["file"]: s["reason"] for s in report["skipped"]} == {
        f"{names[0]}/notes.jpg": "not_image",
        f"{people[1][0].parent.name}/cut.jpg": "undecodable",
        f"{people[2][0].parent.name}/wall.png": "noface",
    }
    assert report["files"] == n + 3 and report["photos"] == n and report["persons"] == 4
    assert report["single_photo_persons"] == [single] and report["empty_persons"] == []
    # ... pairs are exactly all pairs of the usable photos
    assert report["genuine_pairs"] == expected_genuine == 18
    assert report["impostor_pairs"] == expected_impostor == 60
    # ... the model tells these people apart
    assert report["genuine_mean"] > report["impostor_mean"] + 0.1
    assert report["auc"] > 0.8 and 0.0 <= report["eer"] < 0.5
    # ... 60 impostor pairs cannot measure FAR 1e-2 or below: null, not a number
    assert report["tar_at_far"] == {"1e-2": None, "1e-3": None, "1e-4": None}
    check = report["verification"]
    assert set(check) == {"threshold", "calibrated_far", "calibration", "far", "tar", "false_accepts", "false_rejects"}
    assert check["far"] == pytest.approx(check["false_accepts"] / 60)
    assert check["tar"] == pytest.approx(1 - check["false_rejects"] / 18)
    assert report["model"] == "mobilefacenet" and report["geometry"] == "arcface112"
    # ... and the table says the same
    assert "persons: 4" in table and "18 genuine, 60 impostor" in table
    assert f"impostor pairs only: {single}" in table
    assert "1 not an image, 1 image cannot be decoded, 1 no face detected" in table
    assert "TAR@FAR 1e-3 n/a" in " ".join(table.split()) and f"threshold {check['threshold']:.4f}" in table


def test_a_single_person_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare: one person folder; a loose file in the folder is no second person
    (tmp_path / "people" / "Ann").mkdir(parents=True)
    _blank(tmp_path / "people" / "Ann" / "a.png")
    _blank(tmp_path / "people" / "b.png")
    # Execute
    code = main(["eval", "folder", str(tmp_path / "people"), "--model", "mobilefacenet"])
    # Assert
    captured = capsys.readouterr()
    assert code == 1 and captured.out == ""
    assert captured.err.strip().count("\n") == 0
    assert "at least 2 persons" in captured.err and "found 1 (Ann)" in captured.err


@pytest.mark.slow
def test_too_few_persons_or_no_genuine_pair_after_skipping(
    real_data: Path, isolated_cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare: (a) B's only photo shows no face, so one person remains;
    # (b) two persons with one photo each: impostor pairs only
    (a_photos, b_photos) = _people(real_data, 2)
    only_one = tmp_path / "only_one"
    for name in ("A", "B"):
        (only_one / name).mkdir(parents=True)
    shutil.copy(a_photos[0], only_one / "A" / "1.jpg")
    shutil.copy(a_photos[1], only_one / "A" / "2.jpg")
    _blank(only_one / "B" / "wall.png")
    no_genuine = tmp_path / "no_genuine"
    for name, photo in (("A", a_photos[0]), ("B", b_photos[0])):
        (no_genuine / name).mkdir(parents=True)
        shutil.copy(photo, no_genuine / name / photo.name)
    # Execute
    code_one = main(["eval", "folder", str(only_one), "--model", "mobilefacenet"])
    err_one = capsys.readouterr().err
    code_none = main(["eval", "folder", str(no_genuine), "--model", "mobilefacenet"])
    err_none = capsys.readouterr().err
    # Assert: one line each (progress bars use carriage returns), naming the cause
    assert code_one == 1 and code_none == 1
    assert err_one.strip().splitlines()[-1].startswith("fedface eval: error:")
    assert "usable photos of at least 2 persons, found 1" in err_one and "1 no face detected" in err_one
    assert "no genuine pair" in err_none.strip().splitlines()[-1]


def test_threshold_check_accepts_ties_like_a_device() -> None:
    # Prepare: a device accepts score >= threshold
    genuine = np.array([0.4, 0.5, 0.9], np.float32)
    impostor = np.array([0.1, 0.5, 0.2, 0.3], np.float32)
    # Execute
    check = threshold_check(genuine, impostor, Verification(0.5, 1e-3, "lfw"))
    plain = threshold_check(genuine, impostor, Verification(0.95))
    # Assert
    assert check is not None and plain is not None
    assert (check.far, check.tar, check.false_accepts, check.false_rejects) == (0.25, 2 / 3, 1, 1)
    assert check.calibrated_far == 1e-3 and check.calibration == "lfw"
    assert (plain.far, plain.tar, plain.calibrated_far) == (0.0, 0.0, None)
    assert threshold_check(genuine, impostor, None) is None


def test_list_folder_ignores_dot_names_and_finds_nested_photos(tmp_path: Path) -> None:
    # Prepare
    for rel in ("Ann/a.jpg", "Ann/2019/b.jpg", "Ann/.DS_Store", ".hidden/c.jpg", "Bob/.thumbs/d.jpg", "loose.jpg"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    # Execute
    photos, loose, persons = list_folder(tmp_path)
    # Assert
    assert [(p, f.relative_to(tmp_path).as_posix()) for p, f in photos] == [("Ann", "Ann/2019/b.jpg"), ("Ann", "Ann/a.jpg")]
    assert [f.name for f in loose] == ["loose.jpg"] and persons == ["Ann", "Bob"]
    with pytest.raises(FolderEvalError, match="not a folder"):
        evaluate_folder(tmp_path / "missing", model=None)

