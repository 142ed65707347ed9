import numpy as np
import torch
from torch import nn

from simulator.cross_device.capture_lab import owner_figures, verification
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


def test_owner_figures_read_the_threshold_given_and_the_owners_own_operating_points() -> None:
    # Prepare: 30 owners in 16 dimensions, each held-out photo near its owner's clean photos; the suffix passes features on
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    centres = torch.from_numpy(rng.normal(size=(30, 16))).float()
    labels = torch.arange(30).repeat_interleave(4)
    held_labels = torch.arange(30).repeat_interleave(2)
    sets = {"train_clean": centres[labels] + 0.05 * torch.randn(len(labels), 16), "labels": labels,
            "owners": (centres[held_labels] + 0.05 * torch.randn(len(held_labels), 16), held_labels)}
    # Execute
    open_door, shut_door = owner_figures(nn.Identity(), sets, threshold=0.9), owner_figures(nn.Identity(), sets, threshold=1.01)
    # Assert: every owner accepted and no impostor at 0.9; nothing accepted above a cosine of 1; the owners' own points read 100
    assert (open_door["genuine"], open_door["impostor"]) == (100.0, 0.0)
    assert (shut_door["genuine"], shut_door["impostor"]) == (0.0, 0.0)
    assert open_door["genuine_at_impostor_1"] == open_door["genuine_at_impostor_0.1"] == 100.0
