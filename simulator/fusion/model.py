"""A CNN with the fusion module between feature extractor and classifier (paper, Fig. 1).

Two architectures (``ARCHS``): ``small``, an 8/16-channel net sized for the CPU grid, and
``official``, the official code's MNIST net (thu-media/FedFusion ``MNISTModel``): conv5×5(→32,
pad 2)–ReLU–maxpool(3, stride 2, pad 1)–conv3×3(→64, pad 1)–ReLU–maxpool(3, 2, 1), then
FC(→512)–ReLU–Dropout(0.2)–FC(→classes), Xavier-uniform weights and zero biases. Both run
unchanged on any N×C×H×W input (official: 64×7×7 features on 28×28, 64×8×8 on 32×32).

Only parameters with ``requires_grad`` travel and get averaged: the local extractor, the fusion
parameters and the classifier. The global extractor E_g is a frozen copy of the extractor the node
downloaded at the start of the round, so it is never uploaded nor averaged.
"""
from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from facecore.fusion import Fusion, make_fusion
from simulator.fusion.config import ARCHS


def _extractor(in_channels: int, widths: tuple[int, int]) -> nn.Sequential:
    # Two valid 5×5 convolutions: about 0.3 MMAC per 28×28 image, so a whole experiment grid
    # fits in minutes on two shared cores; MNIST still reaches ~98% when pooled.
    return nn.Sequential(
        nn.Conv2d(in_channels, widths[0], 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(widths[0], widths[1], 5), nn.ReLU(), nn.MaxPool2d(2),
    )


def _official_extractor(in_channels: int) -> nn.Sequential:
    # About 4.2 MMAC per 28×28 image, 14× the small net's.
    return nn.Sequential(
        nn.Conv2d(in_channels, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1),
    )


def _xavier_(*modules: nn.Module) -> None:
    for module in modules:
        for layer in module.modules():
            if isinstance(layer, nn.Conv2d | nn.Linear):
                nn.init.xavier_uniform_(layer.weight)
                assert layer.bias is not None
                nn.init.zeros_(layer.bias)


class FusedCNN(nn.Module):
    def __init__(
        self, image_shape: tuple[int, int, int], classes: int, fusion: str, seed: int = 0,
        widths: tuple[int, int] = (8, 16), hidden: int = 64, dtype: torch.dtype = torch.float32,
        arch: str = "small", lambda_bound: str = "unit",
    ) -> None:
        super().__init__()
        if arch not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
        self.fusion_kind, self.arch = fusion, arch
        # Seed locally so every fusion kind starts from the same extractor and classifier, and
        # building a model never disturbs the caller's global RNG.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.extractor = _official_extractor(image_shape[0]) if arch == "official" else _extractor(image_shape[0], widths)
            with torch.no_grad():
                fmap = self.extractor(torch.zeros(1, *image_shape)).shape[1:]
            if arch == "official":
                self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(fmap)), 512), nn.ReLU(), nn.Dropout(0.2),
                                                nn.Linear(512, classes))
                _xavier_(self.extractor, self.classifier)
            else:
                self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(fmap)), hidden), nn.ReLU(), nn.Linear(hidden, classes))
            self.fusion: Fusion = make_fusion(fusion, int(fmap[0]), bound=lambda_bound)
        self.feature_shape = tuple(int(s) for s in fmap)
        self.global_extractor: nn.Sequential | None = copy.deepcopy(self.extractor) if self.fusion.uses_global else None
        if self.global_extractor is not None:
            self.global_extractor.requires_grad_(False)
        self.to(dtype)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The fused feature map the classifier sees."""
        local = self.extractor(x)
        if self.global_extractor is None:
            return self.fusion(local, None)
        with torch.no_grad():
            global_ = self.global_extractor(x)
        return self.fusion(local, global_)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))

    def refresh_global(self) -> None:
        """E_g := E_l, what a node does with the extractor it has just downloaded."""
        if self.global_extractor is not None:
            self.global_extractor.load_state_dict(self.extractor.state_dict())


@torch.no_grad()
def extractor_gap(model: FusedCNN, x: torch.Tensor) -> float | None:
    """‖E_g(x) − E_l(x)‖ / ‖E_g(x)‖ over a batch: how far this round moved the averaged extractor from
    the one broadcast at its start. λ's gradient, Σ ∂L/∂F ⊙ (E_g − E_l), scales with it. None
    without a global path (FedAvg)."""
    if model.global_extractor is None:
        return None
    model.eval()
    dtype = next(model.parameters()).dtype
    global_, local = model.global_extractor(x.to(dtype)), model.extractor(x.to(dtype))
    return float((global_ - local).norm() / global_.norm().clamp_min(1e-12))


def trainable_state(model: nn.Module) -> dict[str, np.ndarray]:
    """The parameters that train, travel and get averaged, as the strategy's numpy dict."""
    return {name: p.detach().cpu().numpy().copy() for name, p in model.named_parameters() if p.requires_grad}


def load_trainable(model: nn.Module, weights: dict[str, np.ndarray]) -> None:
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    if params.keys() != weights.keys():
        raise ValueError(f"weights do not match the model's trainable parameters: {sorted(params.keys() ^ weights.keys())[:3]}")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(torch.from_numpy(np.asarray(weights[name])).to(p.dtype))


def count_trainable(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)
