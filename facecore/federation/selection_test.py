"""The selection rule the round server and the simulator share."""
import random

from facecore.federation.selection import least_recently_selected


def test_never_selected_come_first_then_the_longest_ago_and_ties_are_random() -> None:
    # Prepare: candidates last selected in rounds 5, never, 2, 5, never
    last = [5, None, 2, 5, None]
    # Execute
    picks = [least_recently_selected(last, 3, random.Random(seed).random) for seed in range(50)]
    # Assert
    assert all(p[:2] in ([1, 4], [4, 1]) and p[2] == 2 for p in picks)
    assert {tuple(p[:2]) for p in picks} == {(1, 4), (4, 1)}
    assert {tuple(least_recently_selected(last, 5, random.Random(seed).random)[3:]) for seed in range(50)} == {(0, 3), (3, 0)}


def test_no_slots_or_no_candidates_select_nobody() -> None:
    assert least_recently_selected([None, 1], 0, random.random) == []
    assert least_recently_selected([None, 1], -2, random.random) == []
    assert least_recently_selected([], 3, random.random) == []
