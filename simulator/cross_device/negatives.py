"""Public negatives for cross-device rounds: the templates of public identities that the server computes
with the current model each round and sends to every selected device with it (`train_local`'s
`public`), so that a device trains its owner's faces away from other people's, not only towards its
own embedding. Measured to hurt (simulator/REPORT.md, section 6): kept to reproduce that, off by
default, and not part of live rounds.

Invariants:
- Only the split's public identities, a seeded choice: no device owner and no evaluation person.
- A template is the L2-normalised mean of the identity's L2-normalised features (each photo and its
  mirror image) under the model as devices receive it, at the wire's precision.
- On tuning folds (1-5) these people are left out of the scored pairs, as the devices' people are
  (simulator.cross_device.evaluation): devices train against them.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from device_sdk.training import PrefixCache, PublicIdentities, prefix_cache, split_backbone
from facecore.align.geometry import FaceGeometry
from facecore.align.pipeline import FaceAligner
from facecore.data.faces import load_labelled_faces
from facecore.data.split import SplitManifest
from facecore.errors import FaceCoreError
from facecore.federation.wire import Precision
from facecore.models.preprocess import embed_faces, faces_to_tensor


class PublicNegatives:
    def __init__(self, identities: tuple[str, ...], faces: np.ndarray, labels: np.ndarray) -> None:
        if len(identities) == 0 or len(faces) != len(labels):
            raise FaceCoreError("public negatives need at least one identity and one label per face")
        self.identities = identities
        self.faces = faces
        self.labels = torch.from_numpy(labels)
        self._activations: dict[int, PrefixCache] = {}  # per prefix cut: a frozen prefix never trains

    @torch.no_grad()
    def _features(self, model: torch.nn.Module, trainable_blocks: int | None, batch: int = 256) -> torch.Tensor:
        """Each photo's unit feature, its own plus its mirror image's (embed_faces with flip)."""
        if trainable_blocks is None:
            return torch.from_numpy(embed_faces(model, self.faces, flip=True))
        if trainable_blocks not in self._activations:
            self._activations[trainable_blocks] = prefix_cache(model, self.faces, trainable_blocks)
        cache = self._activations[trainable_blocks]
        _, suffix = split_backbone(model, trainable_blocks)
        suffix.eval()
        features = torch.cat([suffix(cache.plain[i : i + batch]) + suffix(cache.flipped[i : i + batch]) for i in range(0, len(self.faces), batch)])
        return torch.nn.functional.normalize(features.float(), dim=1)

    def templates(self, model: torch.nn.Module, trainable_blocks: int | None, wire: Precision = "fp32") -> torch.Tensor:
        """(K, D) unit templates of the K identities under `model`, at the wire's precision."""
        features = self._features(model, trainable_blocks)
        sums = torch.zeros(len(self.identities), features.shape[1]).index_add_(0, self.labels, features)
        templates = torch.nn.functional.normalize(sums, dim=1)
        return templates.half().float() if wire == "fp16" else templates

    def for_round(self, model: torch.nn.Module, trainable_blocks: int | None, wire: Precision, rehearsal: bool) -> PublicIdentities:
        """What devices get this round: the templates, and with `rehearsal` the faces themselves as
        the trainable part's inputs."""
        templates = self.templates(model, trainable_blocks, wire)
        if not rehearsal:
            return PublicIdentities(templates)
        faces = faces_to_tensor(self.faces) if trainable_blocks is None else self._activations[trainable_blocks].plain
        return PublicIdentities(templates, faces, self.labels)


def load_public_negatives(manifest: SplitManifest, root: Path, count: int, geometry: FaceGeometry, seed: int = 0) -> PublicNegatives:
    """`count` public identities, chosen with `seed`, with all their aligned photos."""
    public = sorted(manifest.identities("public"))
    if not 0 < count <= len(public):
        raise FaceCoreError(f"public negatives: asked for {count} identities, the public split has {len(public)}")
    chosen = {public[i] for i in np.random.default_rng([seed, 11]).choice(len(public), count, replace=False)}
    images = [image for image in manifest.images("public", root) if image.identity in chosen]
    data = load_labelled_faces(images, FaceAligner(geometry=geometry), desc="aligning public negatives")
    return PublicNegatives(data.classes, data.faces, data.labels)
