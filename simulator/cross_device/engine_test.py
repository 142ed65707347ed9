"""The simulator runs the SDK's training and the server's strategies, and resumes exactly."""
import copy
import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from device_sdk.training import LocalTrainingConfig, train_local
from facecore.data.synthetic import synthetic_faces
from facecore.errors import CheckpointError
from facecore.federation.config import Weighting, training_seed
from facecore.federation.quantize import received_deltas
from facecore.federation.selection import least_recently_selected
from facecore.federation.strategies import ClientUpdate, FedAvg
from facecore.federation.wire import Precision, as_received, update_tensors
from facecore.models.checkpoint import int8_received
from facecore.models.registry import embedding_dim_of
from simulator.cross_device.config import CrossDeviceConfig
from simulator.cross_device.engine import CrossDeviceSimulation, mean_pairwise_cosine
from simulator.cross_device.population import Population, SimDevice


@pytest.fixture(scope="module")
def model(calibrated_backbone: Callable[..., torch.nn.Module]) -> torch.nn.Module:
    return calibrated_backbone("mobilefacenet_s", seed=0)


def _population(devices: int = 4, photos: tuple[int, ...] | None = None) -> Population:
    """`devices` synthetic owners with 4 photos each, or with `photos[i]` of them."""
    faces, labels = synthetic_faces(devices, 4, seed=9)
    counts = photos or (4,) * devices
    return Population(tuple(SimDevice(i, f"syn:{i}", faces[labels == i][: counts[i]]) for i in range(devices)), devices, 0)


def _config(**overrides: object) -> CrossDeviceConfig:
    local = LocalTrainingConfig(epochs=1, batch=4, lr=0.01)
    return CrossDeviceConfig(**{"devices": 4, "rounds": 2, "per_round": 2, "eval_every": 1, "local": local, **overrides})  # type: ignore[arg-type]


@pytest.mark.parametrize(("selection", "wire", "seeding", "weighting"), [
    ("least_recent", "fp16", "live", "samples"), ("uniform", "fp32", "per_device", "samples"), ("least_recent", "fp16", "live", "devices"),
])
def test_a_simulated_round_is_sdk_updates_through_the_wire_aggregated_by_the_server_strategy(
    model: torch.nn.Module, tmp_path: Path, selection: str, wire: Precision, seeding: str, weighting: Weighting,
) -> None:
    # Prepare: owners with unequal photo counts, so the two weightings differ
    population = _population(photos=(4, 2, 4, 3))
    config = _config(method="fedavg", rounds=1, selection=selection, wire=wire, seeding=seeding, weighting=weighting)
    sim = CrossDeviceSimulation(config, population, model, tmp_path)
    # Execute
    state = sim.run(resume=False)
    # Assert: recompute round 1 by hand with the server's selection rule, the SDK, the wire and the strategy
    rng = np.random.default_rng([config.seed, 1])
    if selection == "uniform":
        chosen = sorted(rng.choice(4, 2, replace=False).tolist())
    else:
        chosen = sorted(least_recently_selected([None] * 4, 2, rng.random))
    W0 = CrossDeviceSimulation(config, population, model, tmp_path / "x").initial_templates()[0]
    base = {k: v.numpy() for k, v in model.state_dict().items()}
    received = copy.deepcopy(model)
    received.load_state_dict({k: torch.from_numpy(v) for k, v in as_received(base, wire).items()})
    updates = []
    for i in chosen:
        seed = training_seed(1, config.seed) if seeding == "live" else config.seed * 1_000_003 + 10_007 + i
        u = train_local(received, W0[i], population.devices[i].faces, config.local, seed=seed)
        tensors = update_tensors({k: (u.state_dict[k] - received.state_dict()[k]).numpy() for k in base}, u.embedding.numpy(), wire)
        updates.append(ClientUpdate(received_deltas(tensors, {k: v.shape for k, v in base.items()}), u.n_samples))
        np.testing.assert_allclose(state.W[i], u.embedding.numpy(), rtol=1e-6)
    expected = FedAvg(weighting).aggregate_train(1, base, updates).weights
    lengths = [np.sqrt(sum(np.square(d, dtype=np.float64).sum() for d in u.weights.values() if d.dtype.kind == "f")) for u in updates]
    assert len({u.n_samples for u in updates}) == 2  # the weightings differ on this round
    assert state.history[1]["update_length"] == pytest.approx({"median": np.median(lengths), "p90": np.quantile(lengths, 0.9), "max": max(lengths)})
    assert min(lengths) > 0  # the devices trained
    assert state.last_selected == [1 if i in chosen else None for i in range(4)]
    for key, value in expected.items():
        np.testing.assert_allclose(sim.model.state_dict()[key].numpy(), value, rtol=1e-5, atol=1e-7)


def test_with_int8_downloads_devices_train_from_the_models_int8_file_and_the_server_keeps_fp32(
    model: torch.nn.Module, tmp_path: Path,
) -> None:
    # Prepare
    config = _config(method="fedavg", rounds=1, per_round=1, download_bits=8)
    sim = CrossDeviceSimulation(config, _population(), model, tmp_path)
    expected = int8_received(model.state_dict())

    # Execute
    state = sim.run(resume=False)

    # Assert: what devices got is the int8 file's weights, and the round's delta landed on the fp32 model
    (index,) = [i for i, chosen in enumerate(state.last_selected) if chosen]
    W0 = CrossDeviceSimulation(config, _population(), model, tmp_path / "x").initial_templates()[0]
    received = copy.deepcopy(model)
    received.load_state_dict(expected)
    u = train_local(received, W0[index], _population().devices[index].faces, config.local, seed=training_seed(1, config.seed))
    for key, value in model.state_dict().items():
        if not value.is_floating_point():
            continue
        moved = u.state_dict[key] - expected[key]
        torch.testing.assert_close(sim.model.state_dict()[key], value + moved.half().float(), rtol=1e-5, atol=1e-6)


def test_least_recent_selection_takes_every_device_before_any_twice(model: torch.nn.Module, tmp_path: Path) -> None:
    # Prepare: 4 devices, 2 a round
    config = _config(method="fedavg", rounds=4, local=LocalTrainingConfig(epochs=1, steps=1, batch=4))
    # Execute
    sim = CrossDeviceSimulation(config, _population(), model, tmp_path)
    state = sim.run(resume=False)
    # Assert: rounds 1-2 cover all four devices, and so do rounds 3-4
    assert sorted(state.last_selected) == [3, 3, 4, 4]  # type: ignore[type-var]
    assert [r["participants"] for r in state.history[1:]] == [2, 2, 2, 2]


@pytest.mark.parametrize(("momentum", "center"), [(0.0, False), (0.9, False), (0.0, True)])
def test_resuming_after_round_1_equals_a_straight_run(model: torch.nn.Module, tmp_path: Path, momentum: float, center: bool) -> None:
    # Prepare: with server momentum, round 2 steps on from round 1's step, and with centred features the
    # centre is the one the run started with, whatever the resuming process computes: the checkpoint carries both,
    # and the templates' lengths, which the starting model gave
    settings = {"method": "fedface", "server_momentum": momentum, "center_features": center}
    start_center, other_center = (np.eye(embedding_dim_of(model))[i] if center else None for i in (0, 1))
    straight = CrossDeviceSimulation(_config(**settings), _population(), model, tmp_path / "straight", feature_center=start_center).run(resume=False)
    CrossDeviceSimulation(_config(**settings, rounds=1), _population(), model, tmp_path / "stopped", feature_center=start_center).run(resume=False)
    # Execute: a new process picks the run up from its round-1 checkpoint
    resumed = CrossDeviceSimulation(_config(**settings), _population(), model, tmp_path / "stopped", feature_center=other_center).run(resume=True)
    # Assert
    assert resumed.round == straight.round == 2
    np.testing.assert_allclose(resumed.W, straight.W, rtol=1e-6)
    assert straight.template_lengths is not None and resumed.template_lengths is not None
    assert np.all(straight.template_lengths < 1) and np.array_equal(resumed.template_lengths, straight.template_lengths)
    for key, value in straight.model_state.items():
        torch.testing.assert_close(resumed.model_state[key], value)


def test_quantised_uploads_keep_each_devices_residual_across_rounds_and_a_checkpoint(model: torch.nn.Module, tmp_path: Path) -> None:
    # Prepare: every device every round, 4-bit uploads
    settings = {"method": "fedavg", "per_round": 4, "upload_bits": 4, "rounds": 3}
    straight = CrossDeviceSimulation(_config(**settings), _population(), model, tmp_path / "straight").run(resume=False)
    CrossDeviceSimulation(_config(**{**settings, "rounds": 1}), _population(), model, tmp_path / "stopped").run(resume=False)
    # Execute: a new process picks the run up from its round-1 checkpoint; and the same run without quantisation
    resumed = CrossDeviceSimulation(_config(**settings), _population(), model, tmp_path / "stopped").run(resume=True)
    plain = CrossDeviceSimulation(_config(**{**settings, "upload_bits": None}), _population(), model, tmp_path / "plain").run(resume=False)
    # Assert: each device holds a non-zero residual, the checkpoint carried them, and the codes changed the model
    assert sorted(straight.residuals) == [0, 1, 2, 3] and all(any(v.any() for v in r.values()) for r in straight.residuals.values())
    for index, residual in straight.residuals.items():
        for name, kept in residual.items():
            np.testing.assert_array_equal(resumed.residuals[index][name], kept)
    for key, value in straight.model_state.items():
        torch.testing.assert_close(resumed.model_state[key], value)
    assert any(not torch.equal(plain.model_state[k], v) for k, v in straight.model_state.items() if v.is_floating_point())


def test_spreadout_keeps_embeddings_apart_where_fedavg_lets_them_collapse(model: torch.nn.Module, tmp_path: Path) -> None:
    # Prepare: random init, strong local pull; same devices and seeds for both
    config = dict(init="mean", rounds=3, per_round=4, local=LocalTrainingConfig(epochs=2, batch=4, lr=0.1))
    # Execute
    plain = CrossDeviceSimulation(_config(method="fedavg", **config), _population(), model, tmp_path / "a").run(resume=False)
    spread = CrossDeviceSimulation(_config(method="fedface", **config), _population(), model, tmp_path / "b").run(resume=False)
    # Assert
    assert mean_pairwise_cosine(spread.W) < mean_pairwise_cosine(plain.W)


def test_mean_pairwise_cosine_of_known_matrices() -> None:
    assert mean_pairwise_cosine(np.eye(3)) == pytest.approx(0.0)
    assert mean_pairwise_cosine(np.ones((4, 2))) == pytest.approx(1.0)
    W = np.random.default_rng(0).standard_normal((9, 5)).astype(np.float32)
    unit = W / np.linalg.norm(W, axis=1, keepdims=True)
    gram = unit.astype(np.float64) @ unit.T
    assert mean_pairwise_cosine(W) == pytest.approx((gram.sum() - np.trace(gram)) / (9 * 8), abs=1e-7)


def test_a_dp_run_uses_the_server_dp_fedavg_spends_its_epsilon_and_resumes_exactly(model: torch.nn.Module, tmp_path: Path) -> None:
    # Prepare
    config = _config(method="fedface", dp_epsilon=5.0, dp_clip=0.5, dp_delta=1e-3)
    # Execute
    straight = CrossDeviceSimulation(config, _population(), model, tmp_path / "straight")
    state = straight.run(resume=False)
    one_round = _config(method="fedface", dp_epsilon=5.0, dp_clip=0.5, dp_delta=1e-3, rounds=1)
    CrossDeviceSimulation(one_round, _population(), model, tmp_path / "stopped").run(resume=False)
    # Assert: noise calibrated to the whole run's budget (2 rounds at q = 2/4), reported per round
    assert straight.dp is not None and straight.dp.noise_multiplier > 0
    records = [h for h in state.history if h["round"] > 0]
    assert records[0]["dp_epsilon"] < records[-1]["dp_epsilon"] <= 5.0
    assert records[-1]["dp_epsilon"] > 4.5  # the calibration spends the budget, it does not waste it
    # a DP run's noise depends on its length, so round 1 of a 1-round run is not round 1 of this run
    with pytest.raises(Exception, match="another configuration"):
        CrossDeviceSimulation(config, _population(), model, tmp_path / "stopped").run(resume=True)


def test_template_noise_blurs_what_the_server_sees_to_the_calibrated_cosine(model: torch.nn.Module, tmp_path: Path) -> None:
    # Prepare
    population = _population(8)
    clean = CrossDeviceSimulation(_config(devices=8), population, model, tmp_path / "a").initial_templates()[0]
    # Execute
    blurred = CrossDeviceSimulation(_config(devices=8, template_noise_cos=0.8), population, model, tmp_path / "b").initial_templates()[0]
    # Assert: unit rows whose cosine with the clean template is about 0.8 (8 draws: loose bound)
    np.testing.assert_allclose(np.linalg.norm(blurred, axis=1), 1.0, rtol=1e-5)
    assert np.mean(np.sum(blurred * clean, axis=1)) == pytest.approx(0.8, abs=0.05)


def _has_ray() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize(
    ("trainable_blocks", "backend"),
    [(None, "process"), (1, "process"),
     pytest.param(1, "ray", marks=pytest.mark.skipif(not _has_ray(), reason="the ray extra is not installed (pip install 'fedface[ray]')"))],
)
def test_worker_pools_give_the_in_process_rounds(
    model: torch.nn.Module, tmp_path: Path, trainable_blocks: int | None, backend: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prepare: the same run, in process and in two persistent workers (processes or Ray actors; those get one device per call)
    monkeypatch.setattr("simulator.cross_device.ray_backend.CHUNK", 1)
    local = LocalTrainingConfig(epochs=1, batch=4, lr=0.05, trainable_blocks=trainable_blocks)
    config = _config(method="fedface", per_round=3, local=local)
    # Execute
    inline = CrossDeviceSimulation(config, _population(), model, tmp_path / "inline")
    inline_state = inline.run(resume=False)
    pooled = CrossDeviceSimulation(dataclasses.replace(config, workers=2, backend=backend), _population(), model, tmp_path / "pooled")
    pooled_state = pooled.run(resume=False)
    # Assert: the same updates to float rounding (single- vs multi-threaded torch), the workers gone
    assert pooled.pool is None
    np.testing.assert_allclose(pooled_state.W, inline_state.W, atol=1e-5)
    moved = 0
    for key, value in inline.model.state_dict().items():
        np.testing.assert_allclose(pooled.model.state_dict()[key].numpy(), value.numpy(), rtol=1e-4, atol=1e-5, err_msg=key)
        moved += int(not torch.equal(value, model.state_dict()[key]))
    assert moved > 0
    assert [h["train_loss"] for h in pooled_state.history[1:]] == pytest.approx([h["train_loss"] for h in inline_state.history[1:]], rel=1e-4)


def test_ray_backend_without_ray_is_one_clear_error(model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: `import ray` fails, as where the extra is not installed
    import sys

    from simulator.cross_device.ray_backend import RayDevicePool, RayUnavailable

    monkeypatch.setitem(sys.modules, "ray", None)
    # Execute / Assert
    with pytest.raises(RayUnavailable, match=r"pip install 'fedface\[ray\]'"):
        RayDevicePool(2, model, LocalTrainingConfig())


def test_a_checkpoint_from_before_the_live_rules_resumes_with_uniform_fp32_only(model: torch.nn.Module, tmp_path: Path) -> None:
    # Prepare: a one-round run whose checkpoint is rewritten as an older simulator wrote it (no selection, wire
    # or spreadout centring)
    old = _config(method="fedavg", rounds=1, selection="uniform", wire="fp32", seeding="per_device")
    CrossDeviceSimulation(old, _population(), model, tmp_path).run(resume=False)
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    for key in ("selection", "wire", "seeding", "weighting"):
        del saved["config"][key]
    del saved["config"]["server_spreadout"]["center"]
    del saved["last_selected"]
    torch.save(saved, tmp_path / "checkpoint.pt")
    # Execute
    resumed = CrossDeviceSimulation(dataclasses.replace(old, rounds=2), _population(), model, tmp_path).run(resume=True)
    # Assert: it ran on with its own rules; with today's defaults it is another run
    assert resumed.round == 2
    with pytest.raises(CheckpointError, match="another configuration"):
        CrossDeviceSimulation(_config(method="fedavg", rounds=3), _population(), model, tmp_path).run(resume=True)


@pytest.mark.parametrize("rehearsal", [False, True])
def test_public_negatives_reach_every_device_as_unit_templates_of_the_current_model(
    model: torch.nn.Module, tmp_path: Path, rehearsal: bool,
) -> None:
    # Prepare: two public people the devices do not hold, and the same run without them
    from simulator.cross_device.negatives import PublicNegatives

    faces, labels = synthetic_faces(2, 3, seed=21)
    negatives = PublicNegatives(("pub:0", "pub:1"), faces, labels)
    blocks = dataclasses.replace(_config().local, trainable_blocks=2)
    plain = CrossDeviceSimulation(_config(rounds=1, local=blocks), _population(), model, tmp_path / "plain")
    against = CrossDeviceSimulation(_config(rounds=1, local=blocks, public_negatives=2, public_rehearsal=rehearsal), _population(), model,
                                    tmp_path / "against", negatives=negatives)
    # Execute
    public = negatives.for_round(model, 2, "fp32", rehearsal)
    a, b = plain.run(resume=False), against.run(resume=False)
    # Assert: templates are the people's unit mean features under the model; the devices trained with them
    features = negatives._features(model, 2)
    np.testing.assert_allclose(public.templates[0].numpy(), torch.nn.functional.normalize(features[labels == 0].sum(0), dim=0).numpy(), atol=1e-5)
    assert (public.faces is not None) == rehearsal
    assert any(not torch.equal(a.model_state[k], b.model_state[k]) for k in a.model_state)
    with pytest.raises(ValueError, match="public negatives"):
        CrossDeviceSimulation(_config(public_negatives=2), _population(), model, tmp_path / "missing")
    with pytest.raises(ValueError, match="public_rehearsal needs public_negatives"):
        _config(public_rehearsal=True)
