"""The aggregation chain: what `RoundConfig.chain` names is what `strategy_for` builds, in the documented
order; combinations that cannot work are refused in one line; every stage but the median and the
trimmed mean holds one update at a time; wrappers pass through what they do not change."""
from __future__ import annotations

import gc
import itertools
import weakref
from collections.abc import Iterator

import numpy as np
import pytest
from pydantic import ValidationError

from facecore.federation.config import AggregationSettings, RoundConfig, SecureAggregationSettings
from facecore.federation.secagg import SecAggClient, key_in_process, mask_bound, quantize, weighted_update
from facecore.federation.strategies import (
    ClientUpdate,
    CoordinateMedian,
    DPFedAvg,
    FedAvg,
    FedFace,
    NormClipping,
    SecureSum,
    ServerMomentum,
    TrimmedMean,
    chain_of,
    layer_of,
    strategy_for,
)
from facecore.federation.strategies.secure_fedavg import MASKED, UnmaskMaterial

METHODS = ("fedavg", "median", "trimmed_mean", "norm_bounded", "dp_fedavg")
SECURE = SecureAggregationSettings(enabled=True)


def _every_config() -> Iterator[RoundConfig]:
    """Every combination of the settings that shape the chain, the refused ones left out."""
    for strategy, method, weighting, momentum, secure in itertools.product(
        ("fedface", "fedavg"), METHODS, ("samples", "devices"), (0.0, 0.5), (False, True)
    ):
        try:
            aggregation = AggregationSettings(method=method, weighting=weighting, server_momentum=momentum)  # type: ignore[arg-type]
            yield RoundConfig(strategy=strategy, aggregation=aggregation, secure_aggregation=SecureAggregationSettings(enabled=secure))  # type: ignore[arg-type]
        except ValidationError:
            continue


def test_the_built_chain_is_the_one_the_config_names_for_every_accepted_config() -> None:
    # Execute
    pairs = [(config.chain, chain_of(strategy_for(config))) for config in _every_config()]
    # Assert: 2 strategies x 2 momenta x (2 fedavg weightings + 4 other methods + secure fedavg)
    assert len(pairs) == 28 and all(named == built for named, built in pairs), [p for p in pairs if p[0] != p[1]]


def test_wrappers_nest_in_the_documented_order() -> None:
    # Prepare
    dp = RoundConfig(aggregation=AggregationSettings(method="dp_fedavg", server_momentum=0.9))
    secure = RoundConfig(aggregation=AggregationSettings(server_momentum=0.9), secure_aggregation=SECURE)
    # Execute
    built = strategy_for(dp)
    # Assert: spreadout outermost, momentum on what the noise published, noise on the sum of clipped updates
    assert dp.chain == ("spreadout", "server_momentum", "dp_noise", "norm_clipping", "fedavg_by_devices")
    assert secure.chain == ("spreadout", "server_momentum", "secure_sum", "fedavg_by_samples")
    assert RoundConfig(strategy="fedavg", aggregation=AggregationSettings(method="median")).chain == ("median",)
    assert isinstance(built, FedFace) and isinstance(built.backbone, ServerMomentum) and isinstance(built.backbone.inner, DPFedAvg)


def test_a_config_stored_before_the_chain_reads_back_with_its_chain() -> None:
    # Prepare: the JSON a round row holds (fields as they were stored before `chain` existed)
    stored = {"target_participants": 8, "min_participants": 2, "deadline_s": 600, "selection_window_s": 5, "strategy": "fedface",
              "aggregation": {"method": "norm_bounded", "weighting": "samples", "trim_beta": 0.2, "max_update_norm": 2.0,
                              "dp_noise_multiplier": 1.0, "dp_delta": 1e-5, "server_momentum": 0.0}}
    # Execute
    config = RoundConfig.model_validate(stored)
    # Assert: the chain is derived, never stored
    assert config.chain == ("spreadout", "norm_clipping", "fedavg_by_devices") and "chain" not in config.model_dump()
    assert layer_of(strategy_for(config), NormClipping).max_norm == 2.0  # type: ignore[union-attr]


@pytest.mark.parametrize(("method", "weighting", "reason"), [
    ("median", "samples", r"secure aggregation reveals only the sum of the updates, so only fedavg can combine them, not median \(it needs each"),
    ("trimmed_mean", "samples", "only fedavg can combine them, not trimmed_mean"),
    ("norm_bounded", "samples", "norm_bounded clips each update on the server and secure aggregation hides them"),
    ("dp_fedavg", "samples", "dp_fedavg's noise is calibrated to updates the server clips one by one"),
    ("fedavg", "devices", "secure aggregation sums updates the devices weighted by their photos: use weighting 'samples'"),
])
def test_a_chain_that_cannot_run_under_secure_aggregation_is_refused_in_one_line(method: str, weighting: str, reason: str) -> None:
    # Execute / Assert
    with pytest.raises(ValidationError, match=reason) as refused:
        RoundConfig(aggregation=AggregationSettings(method=method, weighting=weighting), secure_aggregation=SECURE)  # type: ignore[arg-type]
    assert len(refused.value.errors()) == 1 and "\n" not in refused.value.errors()[0]["msg"]


def test_stages_refuse_an_inner_strategy_they_cannot_wrap() -> None:
    # Execute / Assert: clipping and noise need a sum; secure aggregation delivers one only FedAvg by samples can divide
    with pytest.raises(TypeError, match="norm clipping feeds a sum, and median is not one"):
        NormClipping(CoordinateMedian(), 1.0)
    with pytest.raises(TypeError, match="the server cannot clip updates secure aggregation hides"):
        NormClipping(SecureSum(FedAvg(), None), 1.0)
    with pytest.raises(TypeError, match="DP noise needs norm clipping around FedAvg by devices beneath it, not trimmed_mean"):
        DPFedAvg(TrimmedMean(), 1.0, 5)
    with pytest.raises(TypeError, match="not norm_clipping > fedavg_by_samples"):
        DPFedAvg(NormClipping(FedAvg("samples"), 1.0), 1.0, 5)
    with pytest.raises(TypeError, match="only FedAvg by samples can divide it, not fedavg_by_devices"):
        SecureSum(FedAvg("devices"), None)
    with pytest.raises(TypeError, match="not median"):
        SecureSum(CoordinateMedian(), None)


def test_unmasking_material_is_refused_without_secure_aggregation_and_required_to_aggregate_with_it() -> None:
    # Prepare
    material = UnmaskMaterial({}, [], [], 2, 2.0**14)
    base = {"w": np.zeros(2, np.float32)}
    # Execute / Assert
    with pytest.raises(ValueError, match="unmasking material was given for a round without secure aggregation"):
        strategy_for(RoundConfig(), secure=material)
    with pytest.raises(ValueError, match="aggregated with its unmasking material"):
        strategy_for(RoundConfig(secure_aggregation=SECURE)).aggregate_train(1, base, [])


def test_wrappers_pass_instructions_and_the_embedding_step_through() -> None:
    # Prepare: spreadout placed inside momentum (not the factory's order) still spreads
    config = RoundConfig(aggregation=AggregationSettings(method="dp_fedavg", server_momentum=0.5))
    W = (np.ones((4, 8)) + 0.1 * np.random.default_rng(0).standard_normal((4, 8))).astype(np.float32)
    # Execute
    instructions = strategy_for(config).configure_train(3, ["a", "b"], {"lr": 0.1})
    inside = ServerMomentum(FedFace(), 0.5).aggregate_embeddings(W)
    # Assert
    assert instructions == FedAvg().configure_train(3, ["a", "b"], {"lr": 0.1})
    np.testing.assert_array_equal(inside, FedFace().aggregate_embeddings(W))


def _secure_stream(refs: list[weakref.ref[np.ndarray]]) -> tuple[UnmaskMaterial, Iterator[ClientUpdate]]:
    clients = {i: SecAggClient(i, 2) for i in (1, 2, 3, 4)}
    adverts = key_in_process(clients)

    def stream() -> Iterator[ClientUpdate]:
        for u, client in clients.items():
            gc.collect()
            assert all(ref() is None for ref in refs[:-1]), "the strategy kept an older update alive"
            masked = client.masked_input(quantize(weighted_update({"w": np.full(3, 0.01 * u)}, u), mask_bound(4, 2.0**14), 2.0**14), list(clients))
            refs.append(weakref.ref(masked))
            yield ClientUpdate({MASKED: masked}, u, client_id=str(u))
            del masked

    answers = [clients[u].unmask_shares([], list(clients)) for u in (1, 2)]
    return UnmaskMaterial(adverts, list(clients), answers, 2, 2.0**14, 1.0), stream()


@pytest.mark.parametrize("method", ["fedavg", "norm_bounded", "dp_fedavg", "secure"])
def test_every_summing_chain_holds_one_update_at_a_time(method: str) -> None:
    # Prepare: fresh updates from a generator; weak references tell which are still alive
    base = {"w": np.zeros(3, np.float32)}
    refs: list[weakref.ref[np.ndarray]] = []
    aggregation = AggregationSettings(method="fedavg" if method == "secure" else method, server_momentum=0.5)  # type: ignore[arg-type]
    config = RoundConfig(aggregation=aggregation, secure_aggregation=SecureAggregationSettings(enabled=method == "secure"))

    def stream() -> Iterator[ClientUpdate]:
        for i in range(6):
            gc.collect()
            assert all(ref() is None for ref in refs[:-1]), "the strategy kept an older update alive"
            weights = {"w": np.full(3, 0.1 * i, np.float32)}
            refs.append(weakref.ref(weights["w"]))
            yield ClientUpdate(weights, n_samples=i + 1)
            del weights

    material, updates = _secure_stream(refs) if method == "secure" else (None, stream())
    # Execute
    result = strategy_for(config, seed=0, secure=material).aggregate_train(1, base, updates)
    # Assert
    assert result.n_clients == len(refs) >= 4
