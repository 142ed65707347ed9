from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from facecore.errors import FaceCoreError
from simulator.cross_device.left_out import gain_text, left_out_people, score


def _people(n_people: int, photos: int) -> list[tuple[str, np.ndarray]]:
    return [(f"person{i}", np.full((photos, 4, 4, 3), i, np.uint8)) for i in range(n_people)]


def test_groups_are_identity_disjoint_and_the_same_for_every_call() -> None:
    # Prepare
    people = _people(23, 3)

    # Execute
    first, again = left_out_people(people, n_groups=5, seed=0), left_out_people(people, n_groups=5, seed=0)

    # Assert
    assert np.array_equal(first.groups, again.groups)
    for identity in range(23):
        assert len(set(first.groups[first.identities == identity])) == 1
    assert sorted(np.unique(first.groups)) == [0, 1, 2, 3, 4]
    assert first.n_people == 23 and len(first.faces) == 69


def test_too_few_people_for_the_groups_is_one_clear_error() -> None:
    with pytest.raises(FaceCoreError, match="9 left-out people cannot make 5 groups"):
        left_out_people(_people(9, 2), n_groups=5)


def test_a_model_that_parts_identities_better_gains_in_every_group() -> None:
    # Prepare: 60 people of 6 photos; the sharp model puts each person's photos closer to its centre.
    rng = np.random.default_rng(1)
    people = left_out_people(_people(60, 6), n_groups=5)
    centres = rng.standard_normal((60, 32))[people.identities]
    noise = rng.standard_normal(centres.shape)

    # Execute
    blurred, sharp = score(centres + 1.2 * noise, people), score(centres + 0.6 * noise, people)

    # Assert
    assert blurred["genuine_pairs"] == 60 * 15 and blurred["impostor_pairs"] == 360 * 359 // 2 - 900
    assert all(s > b for s, b in zip(sharp["tar_at_far_per_group"]["1e-3"], blurred["tar_at_far_per_group"]["1e-3"]))
    assert "5/5 up, beyond noise" in gain_text(sharp["tar_at_far_per_group"]["1e-3"], blurred["tar_at_far_per_group"]["1e-3"])
    assert "beyond noise" not in gain_text(blurred["tar_at_far_per_group"]["1e-3"], blurred["tar_at_far_per_group"]["1e-3"])


def test_the_left_out_people_are_exactly_the_device_identities_a_run_does_not_simulate(monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: 30 device identities with 1 to 4 faces each (the ones with 1 can be on no device)
    import simulator.cross_device.population as population
    from facecore.data.faces import LabelledFaces

    counts = [1 + i % 4 for i in range(30)]
    labels = np.concatenate([np.full(c, i) for i, c in enumerate(counts)])
    faces = LabelledFaces(np.zeros((len(labels), 4, 4, 3), np.uint8), labels, tuple(f"p{i:02d}" for i in range(30)), (), ())
    monkeypatch.setattr(population, "load_labelled_faces", lambda *args, **kwargs: faces)
    manifest = type("Manifest", (), {"images": lambda self, role, root: []})()

    # Execute
    simulated, left_out, _ = population.device_people(manifest, Path("."), requested=15, seed=3)
    chosen = population.load_population(manifest, Path("."), 15, seed=3)

    # Assert
    eligible = {f"p{i:02d}" for i, c in enumerate(counts) if c >= 2}
    assert [d.identity for d in chosen.devices] == [name for name, _ in simulated]
    assert len(simulated) == 15 and {n for n, _ in simulated} | {n for n, _ in left_out} == eligible
    assert not {n for n, _ in simulated} & {n for n, _ in left_out}
