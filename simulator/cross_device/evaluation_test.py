"""The simulator's evaluation is remembered per weights and setting, never across them."""
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from facecore.paths import CACHE_ENV
from simulator.cross_device.evaluation import devices_digest, remembered
from simulator.cross_device.population import SimDevice


def test_an_evaluation_is_reused_only_for_the_same_weights_setting_and_owners(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: an evaluator that counts its calls
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    calls: list[float] = []

    def evaluate(model: torch.nn.Module) -> dict[str, Any]:
        calls.append(float(next(model.parameters()).detach().sum()))
        return {"accuracy": calls[-1], "tar_at_far": {"1e-4": float("nan")}}

    owners = [SimDevice(0, "a", np.zeros((2, 4, 4, 3), np.uint8), np.ones((1, 4, 4, 3), np.uint8))]
    model = torch.nn.Linear(2, 2, bias=False)
    first = remembered(evaluate, {"folds": [1, 2], "devices": devices_digest(owners)})
    # Execute: the same weights twice, then changed weights, another setting, other owner photos
    a = first(model)
    b = remembered(evaluate, {"folds": [1, 2], "devices": devices_digest(owners)})(model)  # a new run, same start
    with torch.no_grad():
        model.weight.add_(1.0)
    c = first(model)
    remembered(evaluate, {"folds": [1, 3], "devices": devices_digest(owners)})(model)
    other = [SimDevice(0, "a", np.zeros((2, 4, 4, 3), np.uint8), np.zeros((1, 4, 4, 3), np.uint8))]
    remembered(evaluate, {"folds": [1, 2], "devices": devices_digest(other)})(model)
    # Assert: evaluated once per distinct input; a remembered result reads back whole, NaN included
    assert len(calls) == 4
    assert a["accuracy"] == b["accuracy"] and c["accuracy"] == pytest.approx(a["accuracy"] + 4)
    assert np.isnan(b["tar_at_far"]["1e-4"])
