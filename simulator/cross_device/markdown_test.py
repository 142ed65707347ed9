"""The markdown report reads the numbers runs recorded, and convergence is counted from them."""
from pathlib import Path
from typing import Any

from simulator.cross_device.markdown import clean_table, gain_table, label, rounds_to_loss, summary_table, write_markdown


def _report(method: str = "fedface", losses: tuple[float, ...] = (0.5, 0.3, 0.1)) -> dict[str, Any]:
    history = [{"round": 0, "embedding_mean_cos": 0.1, "accuracy": 0.80, "tar_at_far": {"1e-3": 0.1, "1e-4": 0.05}}]
    history += [{"round": i + 1, "loss_before": loss, "train_loss": loss / 2, "embedding_mean_cos": 0.1 * (i + 2), "seconds": 2.0}
                for i, loss in enumerate(losses)]
    history[-1] |= {"accuracy": 0.82, "tar_at_far": {"1e-3": 0.2, "1e-4": 0.07}}
    return {
        "method": method, "init": "mean", "devices": 5, "rounds": len(losses), "per_round": 2, "accuracy": 0.82,
        "tar_at_far": {"1e-3": 0.2, "1e-4": 0.07}, "initial_accuracy": 0.80, "initial_tar_at_far": {"1e-3": 0.1, "1e-4": 0.05},
        "rounds_to_target": None, "target_accuracy": None, "seconds_per_round": 2.0, "wall_seconds": 60.0, "device_images": 50,
        "split_sizes": {"devices": 5}, "seed": 0, "history": history,
        "config": {"local": {"epochs": 1, "lr": 0.01, "momentum": 0.9, "margin": 0.9, "batch": 32, "trainable_blocks": None}},
    }


def test_rounds_to_loss_is_the_first_round_at_or_below_the_target() -> None:
    # Prepare
    report = _report(losses=(0.5, 0.3, 0.1))
    # Execute / Assert
    assert rounds_to_loss(report, 0.3) == 2
    assert rounds_to_loss(report, 0.05) is None


def test_summary_row_shows_start_and_end_figures() -> None:
    # Prepare
    reports = [_report(), _report("central")]
    # Execute
    table = summary_table(reports, loss_target=0.3)
    # Assert
    assert "80.00 → 82.00" in table and "10.00 → 20.00" in table and "0.10000 → 0.40000" in table
    assert label(reports[1]) == "central (3 epochs)" and "| central (3 epochs) |" in table
    assert table.splitlines()[2].split("|")[-3].strip() == "2"  # rounds to loss <= 0.3


def test_write_markdown_names_seed_split_and_plots(tmp_path: Path) -> None:
    # Prepare
    plot = tmp_path / "accuracy.png"
    # Execute
    path = write_markdown([_report()], tmp_path, [plot])
    # Assert
    text = path.read_text()
    assert "Seed(s): [0]" in text and "'devices': 5" in text and "![accuracy](accuracy.png)" in text
    assert "| 3 | 0.1000 → 0.0500 | 0.4000 | 82.00 | 20.00 | 2.0 |" in text


def test_gain_is_paired_fold_by_fold_and_judged_against_its_spread() -> None:
    # Prepare: one run gains 1 point on every fold; one gains 5 on one fold and loses 1 on four
    steady, noisy = _report(), _report()
    steady |= {"initial_tar_at_far_per_fold": {"1e-3": [0.90, 0.80, 0.85, 0.95, 0.70]},
               "tar_at_far_per_fold": {"1e-3": [0.91, 0.81, 0.86, 0.96, 0.71]},
               "initial_owners": {"genuine_accept": 0.9, "impostor_accept": 0.01}, "owners": {"genuine_accept": 0.95, "impostor_accept": 0.008}}
    noisy |= {"initial_tar_at_far_per_fold": {"1e-3": [0.90, 0.80, 0.85, 0.95, 0.70]},
              "tar_at_far_per_fold": {"1e-3": [0.95, 0.79, 0.84, 0.94, 0.69]}}
    noisy["config"] = {**noisy["config"], "local": {**noisy["config"]["local"], "trainable_blocks": 2, "margin": 0.995}}
    # Execute
    rows = gain_table([steady, noisy]).splitlines()[2:]
    # Assert: the same mean gain (+0.2 and +1.0 aside) is judged by its fold-to-fold spread
    assert rows[0].split("|")[2].strip() == "+1.00 ± 0.00" and "| 5/5 |" in rows[0] and "| yes |" in rows[0]
    assert "90.00 / 1.00 → 95.00 / 0.80" in rows[0]
    assert rows[1].split("|")[2].strip() == "+0.20 ± 2.68" and "| 1/5 |" in rows[1] and "| no |" in rows[1]
    assert "m=0.995, last 2 blocks" in rows[1] and "| n/a |" in rows[1]


def test_a_run_through_a_fleet_camera_shows_its_clean_figures_beside(tmp_path: Path) -> None:
    # Prepare: a run on captured photos, with the same photos' clean figures recorded
    captured = _report() | {"capture": "far", "initial_clean": {"accuracy": 0.90, "tar_at_far": {"1e-3": 0.5}},
                            "clean": {"accuracy": 0.91, "tar_at_far": {"1e-3": 0.6}}}
    # Execute
    table = clean_table([captured, _report()])
    text = write_markdown([captured], tmp_path, []).read_text()
    # Assert: one row, for the captured run only, and the camera named in the label and the report
    rows = table.splitlines()[2:]
    assert len(rows) == 1 and label(captured).endswith("[camera: far]")
    assert "| far | 80.00 → 82.00 | 90.00 → 91.00 | 10.00 → 20.00 | 50.00 → 60.00 |" in rows[0]
    assert "Fleet camera(s): ['far']" in text and rows[0] in text and "camera far;" in text
    assert "camera none" in write_markdown([_report()], tmp_path, []).read_text()


def test_a_clean_enrolment_with_fixed_templates_is_named_in_the_label() -> None:
    # Prepare
    report = _report() | {"capture": "lowlight-ir"}
    report["config"] = {"enrolment": "clean", "local": {**report["config"]["local"], "train_embedding": False}}
    # Execute / Assert: an older report without the fields reads as the paper's setting
    assert label(report) == "fedface (mean init, clean enrolment, templates fixed) [camera: lowlight-ir]"
    assert label(_report()) == "fedface (mean init)"
    report["config"]["train_enrolment"] = True
    assert label(report) == "fedface (mean init, clean enrolment, trained on, templates fixed) [camera: lowlight-ir]"
