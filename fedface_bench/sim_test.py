"""`fedface bench sim` measures what it says: the same device work as the floor, timed side by side."""

import pytest
import torch

from facecore.data.synthetic import synthetic_faces
from facecore.models import get_backbone
from fedface_bench.sim import GOAL_DEVICES, RSS_RATIO_GOAL, bench_sim, flower_python, tile_population, with_memory_goal
from simulator.conftest import one_torch_thread  # noqa: F401  the simulator tests' autouse fixture, here too
from simulator.cross_device.population import Population, SimDevice


def _population(devices: int = 3) -> Population:
    faces, labels = synthetic_faces(devices, 5, seed=4)
    return Population(tuple(SimDevice(i, f"syn:{i}", faces[labels == i]) for i in range(devices)), devices, 0)


def test_tiling_reuses_real_identities_cyclically() -> None:
    # Execute
    tiled = tile_population(_population(3), 7)
    # Assert
    assert [d.index for d in tiled.devices] == list(range(7))
    assert [d.identity for d in tiled.devices] == ["syn:0", "syn:1", "syn:2", "syn:0", "syn:1", "syn:2", "syn:0"]


def test_bench_reports_both_timings_and_their_ratio() -> None:
    # Prepare
    torch.manual_seed(0)
    model = get_backbone("mobilefacenet_s").eval()
    # Execute
    results = bench_sim(_population(), model, device_counts=(2, 4), trainable_blocks=1, repeats=1, workers=2)
    # Assert
    assert [r["devices"] for r in results] == [2, 4]
    for r in results:
        assert r["round_seconds"] > 0 and r["floor_seconds"] > 0
        # the reported seconds are rounded to 0.1 ms, so their ratio matches the exact one only to a few %
        assert r["floor_ratio"] == pytest.approx(r["floor_seconds"] / r["round_seconds"], rel=0.05)
        assert r["images_per_round"] == 5 * r["devices"]
        # this process and its two device workers, each at least a Python with torch loaded
        assert r["peak_rss_mb"] > r["peak_rss_mb_main"] > 100
        # the goals are stated for 1,000 devices: a smaller round reports them unjudged
        assert r["goals_met"]["floor_ratio"]["met"] is None and r["all_goals_met"] is None


def test_the_floor_steps_on_each_devices_row_of_W_only(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Prepare: a simulation of 7 devices, and the optimizer the floor builds recorded
    from device_sdk.training import LocalTrainingConfig
    from fedface_bench import sim

    torch.manual_seed(0)
    simulation, state = sim._simulation(tile_population(_population(3), 7), get_backbone("mobilefacenet_s").eval(),
                                        LocalTrainingConfig(trainable_blocks=1, exact_losses=False), tmp_path)
    built: list[list[torch.Tensor]] = []
    real_sgd = torch.optim.SGD

    def recording_sgd(params, **settings):  # type: ignore[no-untyped-def]
        built.append(list(params))
        return real_sgd(built[-1], **settings)

    monkeypatch.setattr(torch.optim, "SGD", recording_sgd)
    W = state.W.copy()

    # Execute
    sim.floor_seconds(simulation, state)

    # Assert: one embedding row trains (a step over all of W would grow with the devices), and state.W is left alone
    (params,) = built
    assert params[-1].shape == (W.shape[1],) and not any(p.shape == W.shape for p in params)
    assert (state.W == W).all()


def test_the_floor_needs_cached_prefix_activations() -> None:
    with pytest.raises(ValueError, match="trainable_blocks"):
        bench_sim(_population(), get_backbone("mobilefacenet_s"), (2,), trainable_blocks=None)


@pytest.mark.skipif(flower_python() is None, reason="the optional Flower environment is not installed (make flower-venv)")
def test_flower_reference_trains_every_device_and_reports_its_ratio() -> None:
    # Prepare
    torch.manual_seed(0)
    model = get_backbone("mobilefacenet_s").eval()
    # Execute: Flower + Ray run the same devices' local training in their own interpreter
    (result,) = bench_sim(_population(4), model, device_counts=(4,), trainable_blocks=1, repeats=1, flower=True)
    # Assert: a warm-up and a timed round, each with every client's training loss aggregated
    assert result["flower_seconds"] > 0 and result["flower_ratio"] == pytest.approx(result["flower_seconds"] / result["round_seconds"], rel=0.05)
    assert len(result["flower_train_losses"]) == 2 and all(0 < loss < 4 for loss in result["flower_train_losses"])


def _row(devices: int, peak_rss_mb: float) -> dict[str, object]:
    return {"devices": devices, "peak_rss_mb": peak_rss_mb, "goals_met": {}}


def test_memory_is_judged_from_ten_times_the_goals_devices() -> None:
    # Execute
    flat = with_memory_goal([_row(100, 900.0), _row(GOAL_DEVICES, 1000.0), _row(10 * GOAL_DEVICES, 1090.0)])
    grown = with_memory_goal([_row(GOAL_DEVICES, 1000.0), _row(10 * GOAL_DEVICES, 1500.0)])
    short = with_memory_goal([_row(GOAL_DEVICES, 1000.0), _row(5 * GOAL_DEVICES, 1500.0)])
    unmeasured = with_memory_goal([_row(100, 900.0), _row(10 * GOAL_DEVICES, 1500.0)])

    # Assert: the largest count against the goal's count, and only there
    assert flat[-1]["rss_ratio"] == 1.09 and flat[-1]["goals_met"]["rss_ratio"]["met"] is True
    assert "rss_ratio" not in flat[0] and "rss_ratio" not in flat[1]
    assert grown[-1]["goals_met"]["rss_ratio"] == {"target": RSS_RATIO_GOAL, "compare": "<=", "measured": 1.5, "met": False}
    assert short[-1]["rss_ratio"] == 1.5 and short[-1]["goals_met"]["rss_ratio"]["met"] is None
    assert "rss_ratio" not in unmeasured[-1]
