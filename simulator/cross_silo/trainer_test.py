"""PFM end to end (server strategy + trainer), exactly, in float64 on a 2-layer MLP."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from facecore.federation.strategies.base import ClientUpdate
from facecore.federation.strategies.pfm import PFM
from facecore.losses import make_margin_head
from simulator.cross_silo.trainer import SiloTrainer

BETA, LR, DIM, CLASSES, BATCH = 0.9, 0.05, 6, 5, 8


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, DIM)).double()


def head(seed: int) -> nn.Module:
    torch.manual_seed(100 + seed)
    return make_margin_head("cosface", DIM, CLASSES, s=8.0).double()


def fixed_batches(seed: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(BATCH, 10, generator=g, dtype=torch.float64), torch.randint(0, CLASSES, (BATCH,), generator=g)) for _ in range(count)]


def replay(batches: list[tuple[torch.Tensor, torch.Tensor]]):  # type: ignore[no-untyped-def]
    it = iter(batches)
    return lambda: next(it)


def numpy_state(model: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def run_pfm(trainers: list[SiloTrainer], rounds: int, K: int) -> tuple[dict[str, np.ndarray], list]:  # type: ignore[type-arg]
    strategy = PFM(LR, BETA, momentum_keys=list(trainers[0].params))
    global_w = trainers[0].weights()
    momentum = strategy.initial_momentum(global_w)
    history = []
    for r in range(1, rounds + 1):
        updates = [ClientUpdate(t.train_round(global_w, momentum, LR, K).weights, 1, client_id=t.name, kind="full") for t in trainers]
        result = strategy.aggregate_train(r, global_w, updates)
        history.append((global_w, result))
        global_w, momentum = result.weights, result.momentum
    return global_w, history


@pytest.mark.parametrize("n_trainers", [1, 3])
def test_pfm_with_k1_equals_centralized_momentum_sgd(n_trainers: int) -> None:
    steps = 6
    data = [fixed_batches(seed, steps) for seed in range(n_trainers)]
    # PFM: each trainer owns its head; K = 1 step per round.
    trainers = [SiloTrainer(f"t{i}", mlp(), head(i), replay(data[i]), beta=BETA, use_pfm=True) for i in range(n_trainers)]
    final, _ = run_pfm(trainers, rounds=steps, K=1)
    # Centralized: one backbone, the same heads, torch's momentum SGD on the mean loss
    # (the mean over equally weighted trainers; each head only sees its own trainer's loss).
    backbone, heads = mlp(), [head(i) for i in range(n_trainers)]
    opt_backbone = torch.optim.SGD(backbone.parameters(), lr=LR, momentum=BETA)
    opt_heads = [torch.optim.SGD(h.parameters(), lr=LR, momentum=BETA) for h in heads]
    for step in range(steps):
        losses = [h(backbone(data[i][step][0]), data[i][step][1]) for i, h in enumerate(heads)]
        for opt in [opt_backbone, *opt_heads]:
            opt.zero_grad()
        # Head i's gradient is d(loss_i), as on its trainer; the backbone's is the mean over trainers.
        grads = torch.autograd.grad(sum(losses) / n_trainers, list(backbone.parameters()), retain_graph=True)
        for p, g in zip(backbone.parameters(), grads):
            p.grad = g
        for h, loss in zip(heads, losses):
            for p, g in zip(h.parameters(), torch.autograd.grad(loss, list(h.parameters()), retain_graph=True)):
                p.grad = g
        for opt in [opt_backbone, *opt_heads]:
            opt.step()
    for key, value in numpy_state(backbone).items():
        np.testing.assert_allclose(final[key], value, rtol=0, atol=1e-6)
    for trainer, h in zip(trainers, heads):
        for mine, ref in zip(trainer.head.parameters(), h.parameters()):
            np.testing.assert_allclose(mine.detach().numpy(), ref.detach().numpy(), rtol=0, atol=1e-6)


def test_momentum_is_the_scaled_global_step_and_is_applied_as_beta_m_over_k() -> None:
    K, n = 4, 2
    data = [fixed_batches(10 + i, 2 * K) for i in range(n)]
    trainers = [SiloTrainer(f"t{i}", mlp(), head(i), replay(data[i]), beta=BETA, use_pfm=True) for i in range(n)]
    strategy = PFM(LR, BETA, momentum_keys=list(trainers[0].params))
    start = trainers[0].weights()
    M0 = strategy.initial_momentum(start)
    first = strategy.aggregate_train(1, start, [ClientUpdate(t.train_round(start, M0, LR, K).weights, 1, client_id=t.name, kind="full") for t in trainers])
    # Server: M_1 = (Theta_0 - Theta_1) / eta, the paper's sign (eq. 6, Alg. 1 line 16).
    for key in M0:
        np.testing.assert_array_equal(first.momentum[key], (start[key] - first.weights[key]) / LR)
    assert not any(np.allclose(first.momentum[k], 0) for k in M0)
    # Round 2 on trainer 0, replayed by hand: theta <- theta - eta * (g + beta * M_1 / K) at each step.
    shadow_backbone, shadow_head = copy.deepcopy(trainers[0].backbone), copy.deepcopy(trainers[0].head)
    shadow_backbone.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in first.weights.items()})
    head_m = [m.clone() for m in trainers[0].head_momentum]
    result = trainers[0].train_round(first.weights, first.momentum, LR, K)
    for k in range(K):
        x, y = data[0][K + k]
        loss = shadow_head(shadow_backbone(x), y)
        names = [name for name, _ in shadow_backbone.named_parameters()]
        params: list[torch.Tensor] = [p for _, p in shadow_backbone.named_parameters()]
        head_params: list[torch.Tensor] = list(shadow_head.parameters())
        grads = torch.autograd.grad(loss, params + head_params)
        with torch.no_grad():
            for name, p, g in zip(names, params, grads):
                p -= LR * (g + BETA * torch.from_numpy(first.momentum[name]) / K)
            for p, h, m in zip(head_params, grads[len(params):], head_m):
                m.mul_(BETA).add_(h)
                p -= LR * m
    for key, value in numpy_state(shadow_backbone).items():
        np.testing.assert_allclose(result.weights[key], value, rtol=0, atol=1e-12)


def test_fedavg_trainer_keeps_its_local_momentum_and_pfm_needs_m() -> None:
    trainer = SiloTrainer("t", mlp(), head(0), replay(fixed_batches(0, 4)), beta=BETA, use_pfm=False)
    w = trainer.weights()
    trainer.train_round(w, None, LR, 2)
    assert trainer.local_momentum is not None and any(m.abs().sum() > 0 for m in trainer.local_momentum.values())
    pfm = SiloTrainer("p", mlp(), head(0), replay(fixed_batches(0, 4)), beta=BETA, use_pfm=True)
    with pytest.raises(ValueError, match="momentum"):
        pfm.train_round(w, None, LR, 1)
