"""Face packs: what a run loads, in one file, and refused for a run cut otherwise."""
from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from facecore.errors import FaceCoreError
from simulator.cross_silo.data import SyntheticData
from simulator.cross_silo.packed import PackedData, pack_faces
from simulator.cross_silo.validator import PairSet

SOURCE = SyntheticData(trainer_identities=(5, 7), validators=1, size=32, with_evaluation=True)
SETTINGS: dict[str, Any] = {"trainers": 2, "parties": 2, "validators": 1, "seed": 0, "size": 32, "eval_folds": (6, 7, 8, 9, 10), "split": None}


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pack") / "faces.npz"
    pack_faces(SOURCE, parties=2, validators=1, settings=SETTINGS, path=path, quality=95)
    return path


def test_a_pack_returns_every_party_with_exact_labels_and_pairs(pack: Path) -> None:
    # Prepare
    packed = PackedData(str(pack))
    # Execute
    silos = [packed.trainer(i) for i in range(2)]
    validator, evaluation = packed.validator(0), packed.evaluation()
    # Assert
    for i, silo in enumerate(silos):
        original = SOURCE.trainer(i)
        assert (silo.name, silo.classes) == (original.name, original.classes) == (packed.trainer_name(i), original.classes)
        np.testing.assert_array_equal(silo.labels, original.labels)
        assert silo.faces.shape == original.faces.shape and silo.faces.dtype == np.uint8
        # JPEG is lossy: each face comes back nearest to its own original, in the original's order
        error = np.abs(silo.faces.reshape(len(silo.faces), 1, -1).astype(int) - original.faces.reshape(1, len(original.faces), -1)).mean(axis=2)
        np.testing.assert_array_equal(error.argmin(axis=1), np.arange(len(silo.faces)))
    pair_sets: list[tuple[PairSet | None, PairSet | None]] = [(validator, SOURCE.validator(0)), (evaluation, SOURCE.evaluation())]
    for got, expected in pair_sets:
        assert got is not None and expected is not None and got.name == expected.name
        np.testing.assert_array_equal(got.pair_index, expected.pair_index)
        np.testing.assert_array_equal(got.same, expected.same)
        np.testing.assert_array_equal(got.folds, expected.folds)
    assert [t["faces"] for t in packed.describe_plan()["trainers"]] == [len(s.labels) for s in silos]
    assert pickle.loads(pickle.dumps(packed)) == packed  # each process opens it for its own party


def test_a_run_cut_otherwise_is_refused(pack: Path) -> None:
    # Prepare
    packed = PackedData(str(pack))
    # Execute / Assert
    packed.check(SETTINGS)
    with pytest.raises(FaceCoreError, match=r"seed 0 \(pack\) vs 1 \(run\)"):
        packed.check({**SETTINGS, "seed": 1})


def test_a_file_that_is_no_pack_gets_a_one_line_error(tmp_path: Path) -> None:
    # Prepare
    junk = tmp_path / "faces.npz"
    junk.write_bytes(b"not a pack")
    # Execute / Assert
    with pytest.raises(FaceCoreError, match="not a face pack"):
        PackedData(str(junk)).check(SETTINGS)
    with pytest.raises(FaceCoreError, match="not a face pack"):
        PackedData(str(tmp_path / "missing.npz")).meta  # noqa: B018 -- reading it is the check
