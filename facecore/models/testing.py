"""Small untrained backbones that behave like trained ones where tests need it."""
from __future__ import annotations

import torch
from torch import nn

from facecore.data.synthetic import synthetic_faces
from facecore.models.preprocess import faces_to_tensor
from facecore.models.registry import get_backbone


def calibrated_backbone(name: str = "mobilefacenet_s", seed: int = 0) -> nn.Module:
    """A seeded untrained backbone, in eval mode, whose BatchNorm statistics were estimated on
    64 synthetic faces. An untrained network's default statistics squash features to ~1e-5, where
    normalisation turns gradients into noise; pretraining would have set real ones."""
    torch.manual_seed(seed)
    model = get_backbone(name)
    calibration, _ = synthetic_faces(16, 4, seed=6)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.momentum = None  # a cumulative average over the one calibration batch
        model.train()(faces_to_tensor(calibration))
    return model.eval()
