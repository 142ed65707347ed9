"""Real processes over gloo reproduce the in-process loop exactly (sync FV, same seeds)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from simulator.cross_silo.config import CrossSiloConfig
from simulator.cross_silo.data import SyntheticData
from simulator.cross_silo.distributed import Flat, run_distributed
from simulator.cross_silo.engine import CrossSiloSimulation

DATA = SyntheticData(trainer_identities=(5, 7), validators=1)
CONFIG = CrossSiloConfig(trainers=2, validators=1, backbone="tiny", K=2, rounds=2, batch=6, lr=0.05, method="pfm+fv", fv_mode="sync")


@pytest.mark.slow  # spawns 4 Python processes: ~25 s of CPU, most of it importing torch
def test_processes_match_the_in_process_run(tmp_path: Path) -> None:
    report = run_distributed(CONFIG, DATA, weights_out=tmp_path / "final.npz")
    sim = CrossSiloSimulation(CONFIG, [DATA.trainer(i) for i in range(2)], [DATA.validator(0)])
    local = sim.run()
    assert report["world_size"] == 4 and report["parties"] == ["a", "b"]
    assert report["losses"] == local["losses"] and report["fv"][0]["scores"] == local["fv"][0]["scores"]
    final = np.load(tmp_path / "final.npz")
    assert sim.final_weights is not None
    for key, value in sim.final_weights.items():
        np.testing.assert_array_equal(final[key], value)


@pytest.mark.slow
def test_threaded_fv_over_processes_finishes() -> None:
    report = run_distributed(dataclasses.replace(CONFIG, fv_mode="thread", method="fedavg+fv"), DATA)
    assert len(report["rounds"]) == 2 and len(report["fv"]) >= 1


def test_flat_round_trips_dtypes() -> None:
    weights = {"w": np.arange(6, dtype=np.float32).reshape(2, 3) / 7, "n": np.array(12345, dtype=np.int64)}
    flat = Flat(weights)
    back = flat.unpack(flat.pack(weights))
    np.testing.assert_array_equal(back["w"], weights["w"])
    assert back["n"] == 12345 and back["n"].dtype == np.int64
