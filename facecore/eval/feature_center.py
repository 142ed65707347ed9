"""A model's feature centre: the direction its features of public faces share.

A strong face model's unit features all lean one way (their mean has length about 0.9), so two
faces of anyone score high and FedFace's positive loss at the paper's margin is zero. Rounds that
centre the loss (device_sdk.training.centred_positive_loss) subtract this fixed vector first.

Invariants:
- Only public photos of the split enter it (a seeded sample), never a device's or an evaluation
  person's: it is published with the model and sent to every device.
- It is made as a template is (facecore.templates.mean_feature_embedding), under the model as it is
  at the start of the rounds, and stays fixed while they run: a centre that followed the model
  would move the target the rounds aim at.
- Its source matters beyond its cosine with other choices: the mean of the public CelebA photos
  adapts the default model to a fleet camera where the public LFW photos' mean does not
  (simulator/REPORT.md, section 8).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from facecore.align.detectors import detector_version
from facecore.align.geometry import FaceGeometry
from facecore.align.pipeline import FaceAligner
from facecore.data.faces import load_labelled_faces
from facecore.data.split import SplitManifest
from facecore.errors import FaceCoreError
from facecore.models.preprocess import embed_faces
from facecore.templates import mean_feature_embedding

CENTER_PHOTOS = 1000
CENTER_SOURCE = "celeba"


def public_feature_center(
    manifest: SplitManifest, root: Path, model: torch.nn.Module, geometry: FaceGeometry, seed: int = 0, source: str = CENTER_SOURCE,
) -> np.ndarray:
    """The unit mean of the model's unit features of a seeded sample of CENTER_PHOTOS public photos of `source` (lfw or celeba)."""
    images = [image for image in manifest.images("public", root) if image.identity.startswith(f"{source}:")]
    if len(images) < 2:
        raise FaceCoreError(f"the feature centre needs public {source} photos in the split")
    picked = np.random.default_rng([seed, 13]).choice(len(images), min(CENTER_PHOTOS, len(images)), replace=False)
    faces = load_labelled_faces([images[i] for i in sorted(picked)], FaceAligner(geometry=geometry), desc="public faces for the feature centre").faces
    return mean_feature_embedding(embed_faces(model, faces))


def center_source(source: str = CENTER_SOURCE) -> str:
    """How a published centre names the photos it is the mean of."""
    return f"{CENTER_PHOTOS} public {source} photos of the seed-0 split"


def feature_center_figures(manifest: SplitManifest, root: Path, model: torch.nn.Module, geometry: FaceGeometry) -> dict[str, Any]:
    """The centre a model ships with (`facecore/weights/<name>.json`, `feature_center`) and what it was made from."""
    center = public_feature_center(manifest, root, model, geometry)
    return {"vector": [round(float(x), 7) for x in center], "source": center_source(), "detector": detector_version()}


__all__ = ["CENTER_PHOTOS", "CENTER_SOURCE", "center_source", "feature_center_figures", "public_feature_center"]
