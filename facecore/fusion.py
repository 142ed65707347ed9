"""FedFusion's fusion modules, shared by the simulator's classification benchmark and the device's
personalised verifier: fusion of the frozen global extractor's feature map E_g(x) with the local
one E_l(x), both B×C×H×W.

λ's range (``bound``): ``unit`` (the default) keeps λ in [0, 1] by projection: the raw parameter
is used as is and clamped after every optimiser step (``project_``). ``none`` leaves it unbounded,
as the official code (thu-media/FedFusion) does. The official code starts λ at 0 (so the fused map
starts as the local path, i.e. as FedAvg). A sigmoid parametrisation cannot reach λ = 0 and its
gradient vanishes near the ends; projection keeps the official start exactly, gives the full
gradient inside the box, and the server's FedAvg of values in [0, 1] stays in [0, 1] (a convex
combination), so the aggregated model needs no extra step.

``LambdaMovingAverage`` is the official server's ``update_shadow`` (μ = 0.9).
"""
from __future__ import annotations

import torch
from torch import nn

FUSIONS = ("none", "conv", "multi", "single")
LAMBDA_BOUNDS = ("unit", "none")


class Fusion(nn.Module):
    """F(E_l(x), E_g(x)) → B×C×H×W."""

    uses_global = True

    def forward(self, local: torch.Tensor, global_: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def project_(self) -> None:
        """Bring parameters back into their feasible set; called after every optimiser step."""

    def summary(self) -> dict[str, float]:
        return {}


class NoFusion(Fusion):
    """FedAvg: the local path only."""

    uses_global = False

    def forward(self, local: torch.Tensor, global_: torch.Tensor | None) -> torch.Tensor:
        return local


class ConvFusion(Fusion):
    """1×1 convolution of concat(E_g(x), E_l(x)): 2C → C channels (paper's W_conv).

    Initialised to pass the local half through unchanged (identity on E_l, zeros on E_g, no bias),
    so that, like λ = 0, round 1 starts from the FedAvg model; the paper does not say, and the
    official code's default random 1×1 init would make conv's first rounds a different model.
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.channels = channels
        self.conv = nn.Conv2d(2 * channels, channels, kernel_size=1)
        with torch.no_grad():
            self.conv.weight.zero_()
            self.conv.weight[:, channels:, 0, 0] = torch.eye(channels)
            assert self.conv.bias is not None  # Conv2d's default: a bias
            self.conv.bias.zero_()

    def forward(self, local: torch.Tensor, global_: torch.Tensor | None) -> torch.Tensor:
        assert global_ is not None
        return self.conv(torch.cat((global_, local), dim=1))

    def summary(self) -> dict[str, float]:
        w = self.conv.weight.detach()[:, :, 0, 0]
        # Share of the 1×1 weights' magnitude on the global half: 0 at start, grows as E_g is used.
        return {"global_weight_share": float(w[:, : self.channels].abs().sum() / w.abs().sum().clamp_min(1e-12))}


class LambdaFusion(Fusion):
    """λ⊙E_g(x) + (1−λ)⊙E_l(x), with λ per channel (multi) or one scalar (single)."""

    def __init__(self, channels: int, per_channel: bool, lambda_init: float = 0.0, bound: str = "unit") -> None:
        super().__init__()
        if bound not in LAMBDA_BOUNDS:
            raise ValueError(f"bound must be one of {LAMBDA_BOUNDS}, got {bound!r}")
        if bound == "unit" and not 0.0 <= lambda_init <= 1.0:
            raise ValueError(f"lambda_init must be in [0, 1], got {lambda_init}")
        self.bound = bound
        self.lam = nn.Parameter(torch.full((1, channels, 1, 1) if per_channel else (1,), float(lambda_init)))

    def forward(self, local: torch.Tensor, global_: torch.Tensor | None) -> torch.Tensor:
        assert global_ is not None
        return self.lam * global_ + (1 - self.lam) * local

    def project_(self) -> None:
        if self.bound == "unit":
            with torch.no_grad():
                self.lam.clamp_(0.0, 1.0)

    def summary(self) -> dict[str, float]:
        lam = self.lam.detach()
        return {"lambda_mean": float(lam.mean()), "lambda_min": float(lam.min()), "lambda_max": float(lam.max())}


def make_fusion(kind: str, channels: int, lambda_init: float = 0.0, bound: str = "unit") -> Fusion:
    if kind == "none":
        return NoFusion()
    if kind == "conv":
        return ConvFusion(channels)
    if kind in ("multi", "single"):
        return LambdaFusion(channels, per_channel=kind == "multi", lambda_init=lambda_init, bound=bound)
    raise ValueError(f"fusion must be one of {FUSIONS}, got {kind!r}")


class LambdaMovingAverage:
    """The official server's moving average of λ (``Agent.update_shadow``, μ = 0.9).

    After the server has averaged the nodes' models (so λ holds the plain average λ̄_t), it sets
    λ_t := (1 − μ)·λ̄_t + μ·s_{t−1} and s_t := λ_t; that smoothed λ_t is what the server tests and
    broadcasts next round. The official shadow s_0 is zeros, which equals the official λ start (0);
    here s_0 is the model's λ at construction, the same thing for that start. μ = 0 is plain FedAvg.
    Only λ is smoothed (multi and single); conv's weights and every other parameter are not.
    """

    def __init__(self, fusion: LambdaFusion, mu: float = 0.9) -> None:
        if not 0.0 <= mu < 1.0:
            raise ValueError(f"mu must be in [0, 1), got {mu}")
        self.fusion, self.mu = fusion, mu
        self.shadow = fusion.lam.detach().clone()

    def update_(self) -> None:
        """Smooth the freshly averaged λ in place; call once per round, after aggregation."""
        with torch.no_grad():
            self.fusion.lam.mul_(1.0 - self.mu).add_(self.mu * self.shadow)
        self.shadow = self.fusion.lam.detach().clone()
