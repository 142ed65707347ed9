"""The operator page's charts: readable axis ends for values of any size, and a mark only where there is a value."""

from datetime import UTC, datetime

from server_api.ui.plot import _nice_ceiling, change_svg, threshold_svg
from server_api.ui.view import RoundRow, VersionRow

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _round(round_id: int, status: str, change_norm: float | None) -> RoundRow:
    return RoundRow(
        id=round_id, status=status, strategy="fedface", aggregation="fedavg", secure=False, n_checked_in=2, n_selected=2,
        n_uploaded=2 if status == "completed" else 0, target=2, minimum=2, created_at=NOW, closed_at=NOW, duration_s=3.0,
        deadline_s=600.0, failure_reason=None, base_version="a" * 64, result_version=None, metrics={}, change_norm=change_norm,
    )


def test_axis_ends_are_readable_for_small_and_large_values() -> None:
    # Execute / Assert: a backbone change of 0.0123 gets an axis to 0.02, not to 1
    assert [_nice_ceiling(v) for v in (0.0123, 0.3, 1.0, 7, 180, 0)] == [0.02, 0.5, 1.0, 10.0, 200.0, 1.0]


def test_a_failed_round_has_no_change_bar_and_an_unpublished_threshold_no_point() -> None:
    # Prepare: a completed round, then a failed one; a version without a threshold
    rounds = [_round(1, "completed", 0.0123), _round(2, "failed", None)]
    versions = [VersionRow("b" * 64, "mobilefacenet", 128, None, NOW, None, None, None, False, {})]
    # Execute
    change = change_svg(rounds)
    threshold = threshold_svg(versions)
    # Assert
    assert change.count('<g class="mark"') == 1 and 'data-value="0.0123"' in change and ">0.02</text>" in change
    assert "<svg" not in threshold and "No version publishes a verification threshold" in threshold
