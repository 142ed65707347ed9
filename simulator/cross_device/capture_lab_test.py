import numpy as np

from simulator.cross_device.capture_lab import verification
from simulator.cross_device.evaluation import PEOPLE_GROUPS


def test_verification_separates_distinct_people_and_reports_each_group() -> None:
    # Prepare: 20 people, 6 photos each, tight clusters around random directions in 64 dimensions
    rng = np.random.default_rng(0)
    people = np.repeat(np.arange(20), 6)
    centres = rng.normal(size=(20, 64))
    tight = centres[people] + 0.05 * rng.normal(size=(len(people), 64))
    loose = centres[people] + 3.0 * rng.normal(size=(len(people), 64))
    groups = people % PEOPLE_GROUPS
    # Execute
    separated, blurred = verification(tight, people, groups), verification(loose, people, groups)
    # Assert: clean clusters verify every genuine pair; noise that swamps them does not; one TAR per group
    assert separated["tar3"] == 100.0 and separated["eer"] == 0.0 and separated["auc"] == 1.0
    assert blurred["tar3"] < 50.0 and blurred["eer"] > separated["eer"]
    assert len(separated["tar3_per_group"]) == PEOPLE_GROUPS

