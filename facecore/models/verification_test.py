"""The verification record: what rows, files and cards stored before it read as, and where a file keeps it."""
import pytest

from facecore.models.verification import FAR_10_KEY, LEGACY_KEY, SHIPPED_KEY, Verification, shipped_in, shipping


def test_a_record_writes_the_keys_stored_before_it_and_reads_them_back() -> None:
    # Prepare: a recalibrated row with its FAR 10% point, and an inherited one, as they were stored as plain JSON
    row = {"threshold": 0.56, "far": 0.001, "calibration": "LFW folds 1-5", FAR_10_KEY: 0.25}
    inherited = row | {"calibrated_for": "ab" * 32}
    # Execute
    read, read_inherited = Verification.from_json(row), Verification.from_json(inherited)
    # Assert
    assert read == Verification(0.56, 0.001, "LFW folds 1-5", 0.25) and read.to_json() == row
    assert read_inherited is not None and read_inherited.to_json() == inherited and list(read_inherited.to_json()) == list(inherited)


def test_what_reads_as_no_record_a_bare_threshold_and_a_figure_that_is_not_a_number() -> None:
    # Execute / Assert: nothing, or an object without a threshold, is no record; a bare number is a threshold
    assert Verification.from_json(None) is None and Verification.from_json({}) is None and Verification.from_json({"threshold": None}) is None
    assert Verification.from_json(0.5) == Verification(0.5)
    # a FAR 10% point that is not a finite number cannot refuse a threshold, so it reads as none
    assert Verification.from_json({"threshold": 0.5, FAR_10_KEY: "0.2"}) == Verification(0.5)
    assert Verification.from_json({"threshold": 0.5, FAR_10_KEY: float("nan")}) == Verification(0.5)


def test_a_record_that_is_no_threshold_is_refused() -> None:
    with pytest.raises(ValueError, match="a verification threshold is a finite number, got '0.5'"):
        Verification.from_json({"threshold": "0.5"})
    with pytest.raises(ValueError, match="a verification record is an object or a threshold, got 'True'"):
        Verification.from_json(True)


def test_an_inherited_record_names_the_version_it_was_calibrated_on_through_generations() -> None:
    # Prepare
    own = Verification(0.5, 0.001, "LFW folds 1-5", 0.25)
    # Execute
    child = own.inherited("parent")
    grandchild = child.inherited("child")
    # Assert: the threshold and figures are the same; the version named is the one calibrated on
    assert child == Verification(0.5, 0.001, "LFW folds 1-5", 0.25, "parent") and grandchild == child


def test_a_files_meta_ships_its_record_under_one_key_and_files_written_before_still_read() -> None:
    # Prepare: a file's meta as written before the shipped key (the record under "verification")
    legacy = {"source": "round 3", LEGACY_KEY: {"threshold": 0.4, "far": 0.001, "calibration": "c"}}
    # Execute
    meta = shipping(legacy, Verification(0.6))
    # Assert: the old key is read, and replaced by the shipped one, every other entry kept
    assert shipped_in(legacy) == Verification(0.4, 0.001, "c") and shipped_in({}) is None
    assert meta == {"source": "round 3", SHIPPED_KEY: {"threshold": 0.6}} and shipped_in(meta) == Verification(0.6)
    assert shipped_in(shipping(meta, None)) is None and LEGACY_KEY not in shipping(meta, None)
