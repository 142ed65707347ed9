from pathlib import Path

import pytest

from facecore.data.lfw import LFW
from facecore.data.split import SplitConfig, SplitManifest, build_split
from facecore.errors import SplitOverlap


@pytest.fixture(scope="module")
def manifest(real_data: Path) -> SplitManifest:
    return build_split(real_data, SplitConfig(seed=0))


def test_sets_are_disjoint_and_evaluation_is_whole_lfw_folds(manifest: SplitManifest, real_data: Path) -> None:
    # Prepare
    folds = LFW(real_data / "lfw").people_folds()
    expected_eval = {f"lfw:{n}" for k in range(6, 11) for n in folds[k - 1]}
    # Execute
    public, devices, evaluation = (set(manifest.identities(r)) for r in ("public", "devices", "evaluation"))
    # Assert
    assert evaluation == expected_eval
    assert not (public & devices) and not (public & evaluation) and not (devices & evaluation)
    assert len(public) + len(devices) + len(evaluation) == 5749 + 249


def test_every_device_has_enough_photos_and_both_sources_appear(manifest: SplitManifest) -> None:
    # Execute
    sizes = {identity: len(paths) for identity, paths in manifest.sets["devices"].items()}
    # Assert
    assert min(sizes.values()) >= manifest.config.device_min_photos
    assert {i.split(":")[0] for i in sizes} == {"lfw", "celeba"}


def test_split_is_deterministic_per_seed_and_differs_across_seeds(real_data: Path, manifest: SplitManifest) -> None:
    # Execute
    again = build_split(real_data, SplitConfig(seed=0))
    other = build_split(real_data, SplitConfig(seed=1))
    # Assert
    assert again.sets == manifest.sets
    assert other.identities("devices") != manifest.identities("devices")


def test_manifest_round_trips_and_reports_sizes(manifest: SplitManifest, tmp_path: Path) -> None:
    # Execute
    loaded = SplitManifest.load(manifest.save(tmp_path / "split.json"))
    # Assert
    assert loaded.sets == manifest.sets and loaded.config == manifest.config
    sizes = loaded.sizes()
    assert sizes["evaluation"] == {"identities": 2914, "images": 7068}
    assert "devices" in loaded.describe()


def test_overlapping_sets_are_refused(manifest: SplitManifest) -> None:
    # Prepare
    leaked = next(iter(manifest.sets["evaluation"]))
    sets = {**manifest.sets, "public": {**manifest.sets["public"], leaked: manifest.sets["evaluation"][leaked]}}
    # Execute / Assert
    with pytest.raises(SplitOverlap, match="'public' and 'evaluation' share 1 identities"):
        SplitManifest(manifest.config, sets)


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="device_fraction"):
        SplitConfig(device_fraction=1.5)
