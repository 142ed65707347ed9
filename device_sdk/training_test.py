import copy
from collections.abc import Callable

import numpy as np
import pytest
import torch

from device_sdk.training import (
    LocalTrainingConfig,
    PublicIdentities,
    TrainingDiverged,
    Workspace,
    centred_positive_loss,
    prefix_cache,
    split_backbone,
    train_local,
    trainable_keys,
)
from facecore.data.synthetic import synthetic_faces
from facecore.federation.wire import trained_entries
from facecore.models.preprocess import faces_to_tensor
from facecore.templates import mean_feature_embedding


@pytest.fixture(scope="module")
def owner(calibrated_backbone: Callable[..., torch.nn.Module]) -> tuple[torch.nn.Module, np.ndarray, np.ndarray]:
    model = calibrated_backbone("mobilefacenet_s", seed=0)
    # photos of several synthetic people, so the model starts far from the margin
    faces, _ = synthetic_faces(4, 3, seed=5)
    with torch.no_grad():
        features = model(faces_to_tensor(faces)).numpy()
    return model, faces, mean_feature_embedding(features)


def test_local_round_lowers_the_positive_loss_and_leaves_the_input_model_alone(owner) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    model, faces, embedding = owner
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # Execute
    update = train_local(model, embedding, faces, LocalTrainingConfig(epochs=3, batch=4, lr=0.01))
    # Assert
    assert update.loss_after < update.loss_before
    assert update.steps == 9 and update.n_samples == 12
    assert torch.linalg.norm(update.embedding).item() == pytest.approx(1.0, abs=1e-5)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_same_seed_same_update_and_frozen_batchnorm_statistics(owner) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    model, faces, embedding = owner
    config = LocalTrainingConfig(epochs=1, batch=4)
    # Execute
    a, b = (train_local(model, embedding, faces, config, seed=7) for _ in range(2))
    c = train_local(model, embedding, faces, config, seed=8)
    # Assert
    assert all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in a.state_dict)
    assert any(not torch.equal(a.state_dict[k], c.state_dict[k]) for k in a.state_dict)
    running = [k for k in a.state_dict if k.endswith("running_mean")]
    assert running and all(torch.equal(a.state_dict[k], model.state_dict()[k]) for k in running)


def test_frozen_prefix_trains_only_the_last_blocks(owner) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    model, faces, embedding = owner
    # Execute
    update = train_local(model, embedding, faces, LocalTrainingConfig(batch=4, trainable_blocks=2))
    # Assert
    changed = {k.split(".")[0] + "." + k.split(".")[1] for k, v in update.state_dict.items() if not torch.equal(v, model.state_dict()[k])}
    last = len(model.blocks)
    assert changed and changed <= {f"blocks.{last - 2}", f"blocks.{last - 1}"} | {k for k in changed if k.startswith("head.")}
    assert not any(k.startswith("stem.") for k in changed)


def test_public_negatives_move_the_owners_faces_away_from_other_peoples_templates(
        calibrated_backbone: Callable[..., torch.nn.Module]) -> None:
    # Prepare: an owner, and the templates of four other synthetic people under the starting model
    model = calibrated_backbone("mobilefacenet_s", seed=0)
    faces, labels = synthetic_faces(5, 4, seed=5)
    with torch.no_grad():
        features = model(faces_to_tensor(faces)).numpy()
    owner = faces[labels == 0]
    negatives = np.stack([mean_feature_embedding(features[labels == k]) for k in range(1, 5)])
    config = LocalTrainingConfig(epochs=3, batch=4, lr=0.05, trainable_blocks=2)

    def closeness(update) -> float:  # type: ignore[no-untyped-def]
        trained = copy.deepcopy(model)
        trained.load_state_dict({**model.state_dict(), **update.state_dict})
        with torch.no_grad():
            owned = torch.nn.functional.normalize(trained.eval()(faces_to_tensor(owner)), dim=1)
        return float((owned @ torch.from_numpy(negatives).T).mean())

    # Execute: the same round without and with the negatives
    plain = train_local(model, mean_feature_embedding(features[labels == 0]), owner, config, seed=1)
    public = PublicIdentities(torch.from_numpy(negatives))
    against = train_local(model, mean_feature_embedding(features[labels == 0]), owner, config, seed=1, public=public)
    # Assert: the owner's faces end further from the other people, and the reported loss stays the positive one
    assert closeness(against) < closeness(plain) - 0.01
    assert against.loss_before == pytest.approx(plain.loss_before)


def test_a_diverging_round_is_refused(owner) -> None:  # type: ignore[no-untyped-def]
    model, faces, embedding = owner
    with pytest.raises(TrainingDiverged, match=r"^local training diverged \(loss (nan|-?inf)\); lower the learning rate$"):
        train_local(model, embedding, faces, LocalTrainingConfig(batch=4, lr=1e30, momentum=0.0))


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="lr must be > 0"):
        LocalTrainingConfig(lr=0)


def test_a_rounds_local_settings_map_onto_the_devices_training_config() -> None:
    # Prepare: what the server's default round sends, with a frozen prefix, and a key from a newer server
    from facecore.federation.config import LocalSettings as RoundLocal

    sent = {**RoundLocal(trainable_blocks=2, batch_size=16, train_embedding=False).model_dump(), "added_by_a_newer_server": 1}
    # Execute
    config = LocalTrainingConfig.from_round(sent)
    # Assert: every server setting lands under its device name; what the server does not set keeps the device default
    assert (config.epochs, config.steps, config.lr, config.margin, config.batch, config.trainable_blocks) == (1, None, 0.01, 0.9, 16, 2)
    assert config.train_embedding is False
    assert config.momentum == LocalTrainingConfig().momentum
    assert LocalTrainingConfig.from_round({}) == LocalTrainingConfig()


def test_prefix_and_suffix_compose_to_the_full_backbone_and_the_cache_matches(owner) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    from device_sdk.training import prefix_cache, split_backbone

    model, faces, embedding = owner
    prefix, suffix = split_backbone(model, 3)
    inputs = faces_to_tensor(faces)
    # Execute
    cache = prefix_cache(model, faces, 3)
    with torch.no_grad():
        composed = suffix.eval()(prefix.eval()(inputs))
        full = model.eval()(inputs)
        mirrored = prefix(inputs.flip(3))
    # Assert
    torch.testing.assert_close(composed, full)
    torch.testing.assert_close(cache.plain, prefix(inputs))
    torch.testing.assert_close(cache.flipped, mirrored)
    # a cache computed once gives exactly the update of a cache computed inside the round
    config = LocalTrainingConfig(batch=4, trainable_blocks=3)
    a = train_local(model, embedding, faces, config, seed=1, cache=cache)
    b = train_local(model, embedding, faces, config, seed=1)
    assert all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in a.state_dict)


@pytest.mark.parametrize("batch", [1, 4, 64])
def test_a_prefix_cache_filled_batch_by_batch_holds_each_faces_activations_in_their_layout(owner, batch: int) -> None:  # type: ignore[no-untyped-def]
    # Prepare: batches that divide the faces, that leave a short last batch, and one batch for all
    from device_sdk.training import prefix_cache, split_backbone

    model, faces, _ = owner
    faces = faces[:11]
    prefix, _ = split_backbone(model.eval(), 3)
    inputs = faces_to_tensor(faces)
    with torch.no_grad():
        plain, mirrored = prefix(inputs), prefix(inputs.flip(3))

    # Execute
    cache = prefix_cache(model, faces, 3, batch=batch)

    # Assert
    assert len(faces) % 4 != 0 and len(cache.plain) == len(cache.flipped) == len(faces)
    torch.testing.assert_close(cache.plain, plain)
    torch.testing.assert_close(cache.flipped, mirrored)
    assert cache.plain.stride() == cache.flipped.stride() == plain.stride()  # channels_last, as the prefix gives it
    with pytest.raises(ValueError, match="no faces"):
        prefix_cache(model, faces[:0], 3)


@pytest.mark.parametrize("trainable_blocks", [None, 2])
def test_a_reused_workspace_gives_the_same_update_as_a_fresh_copy(owner, trainable_blocks) -> None:  # type: ignore[no-untyped-def]
    # Prepare: the workspace has just trained another device, so stale weights, grads and modes are in it
    model, faces, embedding = owner
    config = LocalTrainingConfig(epochs=2, batch=4, trainable_blocks=trainable_blocks)
    workspace = Workspace(copy.deepcopy(model))
    train_local(model, -embedding, faces[::-1].copy(), config, seed=3, workspace=workspace)
    # Execute
    fresh = train_local(model, embedding, faces, config, seed=7)
    reused = train_local(model, embedding, faces, config, seed=7, workspace=workspace)
    # Assert
    assert all(torch.equal(fresh.state_dict[k], reused.state_dict[k]) for k in fresh.state_dict)
    assert torch.equal(fresh.embedding, reused.embedding) and fresh.loss_after == reused.loss_after


def test_a_workspace_moving_between_cuts_gives_the_updates_of_fresh_copies(owner) -> None:  # type: ignore[no-untyped-def]
    # Prepare: one workspace trains the whole model, then the last 2 blocks, then the whole model again
    model, faces, embedding = owner
    configs = [LocalTrainingConfig(batch=4, trainable_blocks=blocks) for blocks in (None, 2, None)]
    workspace = Workspace(copy.deepcopy(model))
    # Execute
    reused = [train_local(model, embedding, faces, config, seed=9, workspace=workspace) for config in configs]
    fresh = [train_local(model, embedding, faces, config, seed=9) for config in configs]
    # Assert
    for a, b in zip(reused, fresh, strict=True):
        assert list(a.state_dict) == list(b.state_dict) and all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in a.state_dict)


def test_a_workspace_with_cached_activations_trains_from_the_backbone_as_it_is_now(owner) -> None:  # type: ignore[no-untyped-def]
    # Prepare: a workspace trains one device from the backbone, then the backbone changes in place (a new round)
    model, faces, embedding = owner
    config = LocalTrainingConfig(batch=4, trainable_blocks=2)
    backbone = copy.deepcopy(model)
    cache = prefix_cache(backbone, faces, 2)
    workspace = Workspace(copy.deepcopy(backbone))
    first = train_local(backbone, embedding, faces, config, seed=3, cache=cache, workspace=workspace)
    backbone.load_state_dict(first.state_dict, strict=False)
    # Execute
    reused = train_local(backbone, embedding, faces, config, seed=4, cache=cache, workspace=workspace)
    fresh = train_local(backbone, embedding, faces, config, seed=4, cache=cache, workspace=Workspace(copy.deepcopy(backbone)))
    # Assert: the second round started from the changed backbone, not from the packed copy of the first
    assert all(torch.equal(reused.state_dict[k], fresh.state_dict[k]) for k in fresh.state_dict)
    assert not torch.equal(reused.packed, first.packed)


def test_training_losses_come_from_the_first_and_last_epoch_without_extra_passes(owner) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    model, faces, embedding = owner
    exact = LocalTrainingConfig(epochs=3, batch=4, flip=False)
    cheap = LocalTrainingConfig(epochs=3, batch=4, flip=False, exact_losses=False)
    # Execute
    a = train_local(model, embedding, faces, exact, seed=1)
    b = train_local(model, embedding, faces, cheap, seed=1)
    # Assert: the same training; the first batch of epoch 1 is scored before any step, so the
    # cheap round-start loss starts from the exact one and lies between the exact before/after.
    assert all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in a.state_dict)
    assert a.loss_after < b.loss_before <= a.loss_before + 1e-6
    assert a.loss_after <= b.loss_after < b.loss_before


def test_a_frozen_prefix_update_carries_only_the_trainable_suffix(owner) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    model, faces, embedding = owner
    config = LocalTrainingConfig(batch=4, trainable_blocks=2)
    _, suffix = split_backbone(model, 2)
    # Execute
    update = train_local(model, embedding, faces, config, seed=5, workspace=Workspace(copy.deepcopy(model)))
    # Assert: exactly the suffix's entries (by identity, in the model's order), and they moved
    keys = trainable_keys(model, 2)
    assert list(update.state_dict) == keys and len(keys) == len(suffix.state_dict()) < len(model.state_dict())
    base = model.state_dict()
    assert any(not torch.equal(update.state_dict[k], base[k]) for k in keys)
    assert trainable_keys(model, None) == list(base)


def test_an_update_packs_its_floating_entries_in_one_copy_that_its_state_dict_views(owner) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    model, faces, embedding = owner
    workspace = Workspace(copy.deepcopy(model))
    # Execute
    update = train_local(model, embedding, faces, LocalTrainingConfig(batch=4, trainable_blocks=2), seed=5, workspace=workspace)
    trained = {k: v.detach().clone() for k, v in workspace.entries.items()}
    train_local(model, -embedding, faces, LocalTrainingConfig(batch=4, trainable_blocks=2), seed=6, workspace=workspace)
    # Assert: the floating entries lie in the packed buffer in its layout's order, the counters aside; the
    # update keeps what it trained while the workspace trains on
    floating = [k for k in trainable_keys(model, 2) if trained[k].is_floating_point()]
    assert list(update.layout.keys) == floating and set(update.rest) == set(trainable_keys(model, 2)) - set(floating)
    assert update.packed.shape == (update.layout.size,) and len(update.rest) > 0
    torch.testing.assert_close(update.packed, torch.cat([trained[k].reshape(-1) for k in floating]), rtol=0, atol=0)
    for key, value in update.state_dict.items():
        assert torch.equal(value, trained[key])
        if key in update.layout.keys:
            assert value.untyped_storage().data_ptr() == update.packed.untyped_storage().data_ptr()


def test_training_sets_only_the_modes_it_needs_from_any_start(owner) -> None:  # type: ignore[no-untyped-def]
    # Prepare: a workspace whose modules are all in eval mode, then all in train mode
    model, faces, embedding = owner
    workspace = Workspace(copy.deepcopy(model))
    norms = [m for m in workspace.model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for start in (workspace.model.eval, workspace.model.train):
        start()
        # Execute
        train_local(model, embedding, faces, LocalTrainingConfig(batch=4, exact_losses=False), seed=1, workspace=workspace)
        # Assert: as it trained (no scoring pass after): frozen batch norms, every other module training
        assert norms and not any(m.training for m in norms)
        assert all(m.training for m in workspace.model.modules() if m not in norms)


@pytest.mark.parametrize("name", ["dlib-resnet", "mobilefacenet", "iresnet18"])
def test_the_servers_reading_of_the_trained_entries_is_the_suffix_the_device_trains(name: str) -> None:
    # Prepare: the registry backbone on the meta device (no weights), as the server knows it: by its entry names
    from facecore.models.registry import get_backbone

    with torch.device("meta"):
        model = get_backbone(name)
    names = list(model.state_dict())
    # Execute / Assert: the names alone give the split's suffix, at every cut
    for blocks in (0, 1, 4, 100):
        _, suffix = split_backbone(model, blocks)
        suffix_ids = {id(t) for t in suffix.state_dict(keep_vars=True).values()}
        expected = [k for k, t in model.state_dict(keep_vars=True).items() if id(t) in suffix_ids]
        assert trainable_keys(model, blocks) == trained_entries(names, blocks) == expected


def test_centred_loss_sees_what_a_shared_direction_hides_and_a_centre_must_be_a_unit_vector() -> None:
    # Prepare: two faces and a template that all lean along a shared x axis; the faces differ from the template elsewhere
    center = torch.tensor([1.0, 0.0, 0.0])
    template = torch.nn.functional.normalize(torch.tensor([1.0, 0.25, 0.0]), dim=0)
    features = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0, 0.25], [1.0, 0.0, 0.25]]), dim=1)
    # Execute
    raw = centred_positive_loss(features, template, 0.9, None)
    centred = centred_positive_loss(features, template, 0.9, center)
    # Assert: at cosine 0.94 the paper's loss is zero. Less x, each unit vector keeps 1/n - 1 along x and
    # 0.25/n on its own axis (n = |(1, 0.25)|), so their cosine is 0.0149 and the loss (0.9 - 0.0149)^2
    n = (1 + 0.25**2) ** 0.5
    cosine = (1 / n - 1) ** 2 / ((1 / n - 1) ** 2 + (0.25 / n) ** 2)
    assert raw.item() == 0.0
    assert centred.item() == pytest.approx((0.9 - cosine) ** 2, abs=1e-6) and cosine == pytest.approx(0.0149, abs=1e-4)
    with pytest.raises(ValueError, match="feature_center must be a unit vector"):
        LocalTrainingConfig(feature_center=(2.0, 0.0))


def test_the_template_length_sets_a_centred_rounds_target_and_nothing_else(owner) -> None:  # type: ignore[no-untyped-def]
    # Prepare: the owner's template and a centre, the normalised mean feature of the other people's photos
    model, faces, embedding = owner
    with torch.no_grad():
        center = mean_feature_embedding(model(faces_to_tensor(faces[3:])).numpy())
    paper = LocalTrainingConfig(epochs=1, batch=4, train_embedding=False)
    centred = LocalTrainingConfig(epochs=1, batch=4, train_embedding=False, feature_center=tuple(center.tolist()))
    # Execute
    paper_full, paper_short = (train_local(model, embedding, faces, paper, seed=3, template_length=n) for n in (1.0, 0.8))
    centred_full, centred_short = (train_local(model, embedding, faces, centred, seed=3, template_length=n) for n in (1.0, 0.8))
    # Assert: the paper's loss ignores the length; the centred loss trains towards another target and
    # reports its loss against it; the template the device sends back is the unit one either way
    assert all(torch.equal(paper_full.state_dict[k], paper_short.state_dict[k]) for k in paper_full.state_dict)
    assert any(not torch.equal(centred_full.state_dict[k], centred_short.state_dict[k]) for k in centred_full.state_dict)
    assert centred_full.loss_before != pytest.approx(centred_short.loss_before)
    np.testing.assert_allclose(centred_short.embedding.numpy(), embedding, atol=1e-6)
    with pytest.raises(ValueError, match=r"template_length must be in \(0, 1\]"):
        train_local(model, embedding, faces, centred, template_length=1.5)
