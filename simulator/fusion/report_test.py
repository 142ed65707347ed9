"""The FedFusion report's tables, from hand-made run reports."""
from typing import Any

from simulator.fusion.report import _data_name, tables


def _report(fusion: str, accs: list[float], partition: str = "pathological") -> dict[str, Any]:
    history = [{"round": i, "acc": a} for i, a in enumerate(accs)]
    reached = next((h["round"] for h in history[1:] if h["acc"] >= 0.9), None)
    return {
        "fusion": fusion, "partition": partition, "target_acc": 0.9, "config": {"rounds": len(accs) - 1}, "history": history,
        "final_acc": accs[-1], "final_acc_last5_mean": accs[-1], "best_acc": max(accs), "rounds_to_target": reached,
        "bytes_per_round": 1000, "bytes_to_target": None if reached is None else reached * 1000,
        "late_join": {"target": 0.9, "epochs_to_target": None, "acc_by_epoch": [0.5]},
    }


def test_fusion_saves_against_fedavg_and_a_partition_without_fedavg_still_renders() -> None:
    # Prepare: conv reaches 90% in 2 rounds where FedAvg needs 4; a second partition has no FedAvg run
    reports = [_report("none", [0.1, 0.5, 0.7, 0.8, 0.9]), _report("conv", [0.1, 0.8, 0.9, 0.9, 0.9]),
               _report("multi", [0.1, 0.8, 0.9, 0.9, 0.9], partition="user")]
    # Execute
    text = tables(reports)
    # Assert
    assert "| conv | 90.0 |" in text and "| 50% |" in text
    assert "### user" in text and "| multi | 90.0 |" in text


def test_plot_titles_name_the_data_set_a_run_used() -> None:
    # Execute / Assert: the source recorded by `fedface sim fusion`; earlier reports were MNIST
    assert _data_name({"data": {"source": "fashion-mnist"}}) == "Fashion-MNIST"
    assert _data_name({"data": {"source": "/data/cifar10.npz"}}) == "cifar10.npz"
    assert _data_name({"data": {"train": [1, 28, 28]}}) == "MNIST"
