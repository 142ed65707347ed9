"""The presets: the official settings, validated like any config. (The command's flags: run_test.py.)"""
import dataclasses

import pytest

from simulator.fusion.config import PRESETS, FusionConfig, FusionInputError


def test_the_paper_preset_holds_the_official_settings() -> None:
    # Execute
    paper = PRESETS["paper"]
    # Assert: thu-media/FedFusion mnist_main.py, model/agent.py, model/mnist_models.py
    assert (paper.arch, paper.local_epochs, paper.rounds, paper.batch) == ("official", 5, 500, 64)
    assert (paper.lr, paper.momentum, paper.weight_decay, paper.lr_decay, paper.min_lr) == (2e-3, 0.9, 5e-4, 0.99, 1e-4)
    assert (paper.lambda_bound, paper.lambda_mu, paper.normalize, paper.augment) == ("none", 0.9, "dataset", "crop-flip")
    assert (paper.nodes, paper.per_round) == (5, 2)
    assert PRESETS["cpu"] == FusionConfig()


def test_every_problem_of_a_changed_preset_is_listed_in_one_error() -> None:
    # Execute: four problems, each `<flag> must be ...`, joined by '; ' on one line
    with pytest.raises(FusionInputError, match=r"^(?:[a-z-]+ must be [^;]+; ){3}[a-z-]+ must be [^;]+$") as error:
        dataclasses.replace(PRESETS["paper"], lambda_mu=1.0, lr_decay=0.0, weight_decay=-1.0, lambda_bound="sigmoid")
    # Assert
    message = str(error.value)
    assert "\n" not in message
    for fragment in ("lambda-mu must be in [0, 1)", "lr-decay must be in (0, 1]", "weight-decay must be >= 0", "lambda-bound must be one of unit, none"):
        assert fragment in message
