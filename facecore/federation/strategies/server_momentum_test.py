"""Server momentum: heavy-ball steps whose only state is the model lineage."""
import numpy as np
import pytest

from facecore.federation.config import AggregationSettings, RoundConfig, SpreadoutSettings
from facecore.federation.strategies import ClientUpdate, FedAvg, FedFace, ServerMomentum, last_step, strategy_for
from facecore.federation.strategies.base import Weights


def _model(w: float) -> Weights:
    return {"w": np.full(3, w, np.float32), "n": np.array(0, np.int64)}


def _round(step: float) -> list[ClientUpdate]:
    """Two devices whose deltas average to `step` on every weight; a BatchNorm counter rides along."""
    return [ClientUpdate({"w": np.full(3, 2 * step, np.float32), "n": np.array(1, np.int64)}, 1),
            ClientUpdate({"w": np.zeros(3, np.float32), "n": np.array(1, np.int64)}, 1)]


def test_three_rounds_of_one_step_add_up_like_heavy_ball_from_the_lineage_alone() -> None:
    # Prepare: the rounds of a live server, each building its strategy from the base and the base's parent
    momentum, models = 0.9, [_model(0.0)]
    parent: Weights | None = None
    # Execute
    for round_number in (1, 2, 3):
        base = models[-1]
        strategy = ServerMomentum(FedAvg(), momentum, last_step(base, parent))
        models.append(strategy.aggregate_train(round_number, base, iter(_round(0.1))).weights)
        parent = base
    # Assert: steps 0.1, 0.1 + 0.09, 0.1 + 0.09 + 0.081; the counter moves by FedAvg's 1 a round, never by momentum
    np.testing.assert_allclose(np.array([m["w"][0] for m in models]), np.array([0, 0.1, 0.29, 0.561]), rtol=1e-6)
    assert models[-1]["w"].dtype == np.float32 and [int(m["n"]) for m in models] == [0, 1, 2, 3]


def test_no_momentum_publishes_the_inner_step_exactly_and_bad_momentum_is_refused() -> None:
    # Prepare
    base = _model(0.3)
    # Execute
    plain = FedAvg().aggregate_train(1, base, iter(_round(0.1)))
    wrapped = ServerMomentum(FedAvg(), 0.0, {"w": np.ones(3)}).aggregate_train(1, base, iter(_round(0.1)))
    # Assert
    np.testing.assert_array_equal(wrapped.weights["w"], plain.weights["w"])
    with pytest.raises(ValueError, match=r"server momentum must be in \[0, 1\)"):
        ServerMomentum(FedAvg(), 1.0)


def test_round_settings_wrap_the_backbone_step_of_fedface_and_keep_spreadout() -> None:
    # Prepare
    config = RoundConfig(aggregation=AggregationSettings(server_momentum=0.5), spreadout=SpreadoutSettings(steps=0))
    base = _model(0.0)
    # Execute
    strategy = strategy_for(config, previous_step={"w": np.full(3, 0.2)})
    result = strategy.aggregate_train(2, base, iter(_round(0.1)))
    # Assert: 0.1 + 0.5 x 0.2
    assert isinstance(strategy, FedFace) and isinstance(strategy.backbone, ServerMomentum)
    np.testing.assert_allclose(result.weights["w"], 0.2, rtol=1e-6)
    plain = strategy_for(RoundConfig())
    assert isinstance(plain, FedFace) and type(plain.backbone) is FedAvg
