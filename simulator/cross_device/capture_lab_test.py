import numpy as np

from simulator.cross_device.capture_lab import GROUPS, _groups, verification


def test_verification_separates_distinct_people_and_reports_each_group() -> None:
    # Prepare: 20 people, 6 photos each, tight clusters around random directions in 64 dimensions
    rng = np.random.default_rng(0)
    people = np.repeat(np.arange(20), 6)
    centres = rng.normal(size=(20, 64))
    tight = centres[people] + 0.05 * rng.normal(size=(len(people), 64))
    loose = centres[people] + 3.0 * rng.normal(size=(len(people), 64))
    groups = people % GROUPS
    # Execute
    separated, blurred = verification(tight, people, groups), verification(loose, people, groups)
    # Assert: clean clusters verify every genuine pair; noise that swamps them does not; one TAR per group
    assert separated["tar3"] == 100.0 and separated["eer"] == 0.0 and separated["auc"] == 1.0
    assert blurred["tar3"] < 50.0 and blurred["eer"] > separated["eer"]
    assert len(separated["tar3_per_group"]) == GROUPS


def test_people_fall_into_the_same_group_every_time() -> None:
    # Prepare
    names = np.array([f"celeba:{i}" for i in range(200)])
    # Execute
    first, again = _groups(names), _groups(names[::-1])[::-1]
    # Assert: the group is a function of the name alone, and every group is used
    np.testing.assert_array_equal(first, again)
    assert set(first.tolist()) == set(range(GROUPS))
