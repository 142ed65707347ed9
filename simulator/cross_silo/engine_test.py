"""The in-process loop end to end on tiny synthetic faces (never used for accuracy claims)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simulator.cross_silo.config import CrossSiloConfig
from simulator.cross_silo.data import SyntheticData
from simulator.cross_silo.engine import CrossSiloSimulation

DATA = SyntheticData(with_evaluation=True)
SILOS = [DATA.trainer(i) for i in range(3)]
VALIDATORS = [DATA.validator(i) for i in range(2)]
BASE = CrossSiloConfig(backbone="tiny", K=2, rounds=2, batch=6, lr=0.05, method="pfm+fv", fv_mode="sync", validators=2)


@pytest.mark.parametrize("method", ["pfm+fv", "fedavg+fv", "pfm", "fedavg"])
def test_federated_methods_run_and_report(method: str) -> None:
    config = dataclasses.replace(BASE, method=method)
    report = CrossSiloSimulation(config, SILOS, VALIDATORS, evaluation=DATA.evaluation()).run()
    assert report["parties"] == ["a", "b", "c"] and len(report["rounds"]) == 2
    assert all(len(v) == 4 and np.all(np.isfinite(v)) for v in report["losses"].values())
    assert 0.0 <= report["eval"]["accuracy"] <= 1.0 and "global_weights" not in report
    if method.endswith("+fv"):
        assert len(report["fv"]) == 2 and len(report["fv"][0]["scores"]) == 2  # one search per round, 2 validators
        np.testing.assert_allclose(sum(report["weighting"]), 1.0)
    if method.startswith("pfm"):
        assert report["rounds"][-1]["momentum_norm"] > 0


def test_threaded_fv_searches_beside_training() -> None:
    config = dataclasses.replace(BASE, fv_mode="thread", rounds=3)
    report = CrossSiloSimulation(config, SILOS, VALIDATORS).run()
    assert 1 <= len(report["fv"]) <= 3  # asynchronous: at most one search per published round


def test_central_and_solo_baselines_run() -> None:
    central = CrossSiloSimulation(dataclasses.replace(BASE, method="central"), SILOS).run()
    solo = CrossSiloSimulation(dataclasses.replace(BASE, method="solo"), SILOS).run()
    for report in (central, solo):
        assert set(report["loss_ema"]) == {"a", "b", "c"} and all(len(v) == 4 for v in report["losses"].values())


def test_central_scores_the_validators_so_a_setting_is_chosen_off_the_test_folds() -> None:
    # Prepare
    config = dataclasses.replace(BASE, method="central")
    # Execute
    with_validators = CrossSiloSimulation(config, SILOS, VALIDATORS).run()
    without = CrossSiloSimulation(config, SILOS).run()
    # Assert
    assert set(with_validators["validation"]) == {"v1", "v2"} and all(0.0 <= a <= 1.0 for a in with_validators["validation"].values())
    assert "validation" not in without


def test_mismatched_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="trainers"):
        CrossSiloSimulation(BASE, SILOS[:2], VALIDATORS)
    with pytest.raises(ValueError, match="px"):
        CrossSiloSimulation(dataclasses.replace(BASE, backbone="mobilefacenet_s"), SILOS, VALIDATORS)
    with pytest.raises(ValueError, match="FV needs"):
        CrossSiloConfig(method="pfm+fv", validators=0)
