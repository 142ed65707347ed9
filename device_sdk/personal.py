"""The opt-in personalised verifier: FedFusion on the phone.

The device keeps the global backbone it downloaded frozen (E_g) and trains a copy of its last
blocks (E_l) on the owner's faces with FedFace's positive-only loss, through a fusion module
F(E_l(x), E_g(x)) from `facecore.fusion`. Fusion acts on the embedding (a D×1×1 map), after the
backbone, where the paper puts it before the classifier. The owner's template is trained with it,
starting from the normalised mean feature, exactly like the FedFace class embedding.

Nothing here leaves the device: the fused model and the template are derived from the owner's
faces and are stored encrypted with the rest of the owner's data.
"""
from __future__ import annotations

import copy
import io
import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from device_sdk.training import Cohort, LocalTrainingConfig, PrefixCache, TrainingDiverged, fit_positive, mean_feature_embedding, split_backbone
from facecore.align.geometry import geometry_of
from facecore.errors import FaceCoreError
from facecore.fusion import FUSIONS, Fusion, make_fusion
from facecore.models.preprocess import faces_to_tensor


@dataclass(frozen=True)
class PersonalConfig:
    fusion: str = "single"  # none: the locally fine-tuned model alone, the ablation
    # The device trains only the last blocks: the frozen prefix is shared by E_g and E_l, so it
    # runs once per face, and a phone's few photos cannot re-learn early filters anyway.
    training: LocalTrainingConfig = field(default_factory=lambda: LocalTrainingConfig(epochs=20, trainable_blocks=2))
    # multi/single. Not the official 0: with the positive-only loss λ's gradient always favours the
    # local path (trained towards the template), so from 0 it never leaves 0 (measured: FEDFUSION.md).
    lambda_init: float = 0.5
    # With a cohort of public faces: impostors are pushed below this cosine to the template.
    cohort_margin: float = 0.0
    cohort_weight: float = 1.0

    def __post_init__(self) -> None:
        if self.fusion not in FUSIONS:
            raise ValueError(f"fusion must be one of {', '.join(FUSIONS)}, got {self.fusion!r}")
        if not 0.0 <= self.lambda_init <= 1.0:
            raise ValueError(f"lambda_init must be in [0, 1], got {self.lambda_init}")
        if self.training.trainable_blocks is None:
            raise ValueError("the personalised verifier needs training.trainable_blocks (a frozen shared prefix)")


class FusedSuffix(nn.Module):
    """Prefix activations → F(E_l, E_g) embedding (N, D). E_g never trains and stays in eval mode."""

    def __init__(self, local: nn.Module, global_: nn.Module, fusion: Fusion) -> None:
        super().__init__()
        self.local, self.global_, self.fusion = local, global_, fusion
        for p in self.global_.parameters():
            p.requires_grad_(False)
        self.global_.eval()

    def train(self, mode: bool = True) -> FusedSuffix:
        super().train(mode)
        self.global_.eval()
        return self

    def forward(self, x: Tensor, global_features: Tensor | None = None) -> Tensor:
        """`global_features`: E_g(x) when the caller already has it (it never changes)."""
        local = self.local(x)
        if not self.fusion.uses_global:
            return local
        if global_features is None:
            with torch.no_grad():
                global_features = self.global_(x)
        return self.fusion(local[:, :, None, None], global_features[:, :, None, None]).flatten(1)


class PersonalVerifier(nn.Module):
    """Aligned faces (the backbone's crop) → fused embeddings, and their cosine with the owner's template."""

    def __init__(self, global_backbone: nn.Module, config: PersonalConfig) -> None:
        super().__init__()
        self.config = config
        frozen = copy.deepcopy(global_backbone).float().eval()
        prefix, global_suffix = split_backbone(frozen, config.training.trainable_blocks)
        self.prefix = prefix
        for p in self.prefix.parameters():
            p.requires_grad_(False)
        size = geometry_of(frozen).size
        channels = int(frozen(torch.zeros(1, 3, size, size)).shape[1])
        self.fused = FusedSuffix(copy.deepcopy(global_suffix), global_suffix, make_fusion(config.fusion, channels, config.lambda_init))
        self.register_buffer("template", torch.zeros(channels))
        self.eval()

    def train(self, mode: bool = True) -> PersonalVerifier:
        super().train(mode)
        self.prefix.eval()
        return self

    @torch.no_grad()
    def embed_prefix(self, activations: Tensor, global_features: Tensor | None = None, batch: int = 64) -> Tensor:
        """L2-normalised fused embeddings of prefix activations (N, D)."""
        was = self.training
        self.eval()
        out = [
            self.fused(activations[i : i + batch], None if global_features is None else global_features[i : i + batch])
            for i in range(0, len(activations), batch)
        ]
        self.train(was)
        return nn.functional.normalize(torch.cat(out), dim=1)

    @torch.no_grad()
    def _prefix(self, inputs: Tensor, batch: int = 64) -> Tensor:
        return torch.cat([self.prefix(inputs[i : i + batch]) for i in range(0, len(inputs), batch)])

    def prefix_cache(self, faces: np.ndarray) -> PrefixCache:
        """The faces' (and their mirror images') activations of the frozen shared prefix."""
        inputs = faces_to_tensor(faces)
        return PrefixCache(self._prefix(inputs), self._prefix(inputs.flip(3)), self.config.training.trainable_blocks or 0)

    def embed(self, faces: np.ndarray) -> np.ndarray:
        """(N,112,112,3) uint8 aligned faces → (N, D) L2-normalised fused embeddings."""
        return self.embed_prefix(self._prefix(faces_to_tensor(faces))).numpy()

    def score(self, faces: np.ndarray) -> np.ndarray:
        """Cosine of each face's fused embedding with the owner's template."""
        return self.embed(faces) @ nn.functional.normalize(self.template, dim=0).numpy()

    def summary(self) -> dict[str, float]:
        return self.fused.fusion.summary()


@dataclass(frozen=True)
class PersonalReport:
    fusion: str
    faces: int
    steps: int
    loss_before: float
    loss_after: float
    seconds: float
    fusion_summary: dict[str, float]


def train_personal_verifier(
    global_backbone: nn.Module, faces: np.ndarray, config: PersonalConfig | None = None, seed: int = 0,
    cache: PrefixCache | None = None, cohort: np.ndarray | Tensor | None = None,
) -> tuple[PersonalVerifier, PersonalReport]:
    """Train E_l, the fusion and the template on the owner's aligned faces; `global_backbone` is
    not modified. `cache`: the faces' prefix activations, when the caller has them. `cohort`:
    public impostor faces, aligned (N,112,112,3) uint8 or already as prefix activations."""
    config = config or PersonalConfig()
    if len(faces) == 0:
        raise FaceCoreError("the personalised verifier needs at least one aligned face")
    started = time.perf_counter()
    verifier = PersonalVerifier(global_backbone, config)
    blocks = config.training.trainable_blocks
    if cache is None or cache.trainable_blocks != blocks:
        cache = verifier.prefix_cache(faces)
    verifier.template.copy_(torch.from_numpy(mean_feature_embedding(verifier.embed_prefix(cache.plain))))
    w = nn.Parameter(verifier.template.clone())
    trainable = [*verifier.fused.local.parameters(), *verifier.fused.fusion.parameters()]
    fusion = verifier.fused.fusion
    impostors = None
    if cohort is not None and len(cohort):
        activations = cohort if isinstance(cohort, Tensor) else verifier.prefix_cache(cohort).plain
        impostors = Cohort(activations, config.cohort_margin, config.cohort_weight)
    loss_before, loss_after, steps = fit_positive(
        verifier.fused, w, trainable, cache.plain, cache.flipped, config.training, seed, after_step=fusion.project_, cohort=impostors,
    )
    verifier.eval()
    if not (math.isfinite(loss_after) and all(torch.isfinite(p).all() for p in trainable) and torch.isfinite(w).all()):
        raise TrainingDiverged(f"personalisation diverged (loss {loss_after}); lower the learning rate")
    verifier.template.copy_(nn.functional.normalize(w.detach(), dim=0))
    report = PersonalReport(config.fusion, len(faces), steps, loss_before, loss_after, time.perf_counter() - started, fusion.summary())
    return verifier, report


def save_verifier(verifier: PersonalVerifier, model_version: str) -> bytes:
    """The trained parts only (E_l, fusion, template); E_g and the prefix are the public global
    model of `model_version`, which the device keeps in its model cache."""
    trained = {k: v for k, v in verifier.state_dict().items() if not k.startswith(("prefix.", "fused.global_."))}
    config = {"fusion": verifier.config.fusion, "trainable_blocks": verifier.config.training.trainable_blocks}
    buffer = io.BytesIO()
    torch.save({"model_version": model_version, "config": config, "state_dict": trained}, buffer)
    return buffer.getvalue()


def load_verifier(payload: bytes, global_backbone: nn.Module) -> PersonalVerifier:
    saved = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    config = PersonalConfig(saved["config"]["fusion"], LocalTrainingConfig(trainable_blocks=saved["config"]["trainable_blocks"]))
    verifier = PersonalVerifier(global_backbone, config)
    missing, unexpected = verifier.load_state_dict(saved["state_dict"], strict=False)
    if unexpected or any(not k.startswith(("prefix.", "fused.global_.")) for k in missing):
        raise FaceCoreError("the saved personalised verifier does not fit this model: personalise again")
    return verifier.eval()


def saved_model_version(payload: bytes) -> str:
    return str(torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)["model_version"])


__all__ = ["load_verifier", "save_verifier", "saved_model_version", "FusedSuffix", "PersonalConfig", "PersonalReport", "PersonalVerifier", "train_personal_verifier"]
