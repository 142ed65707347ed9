"""The opt-in personalised verifier: FedFusion on the phone.

The device keeps the global backbone it downloaded frozen (E_g) and trains a copy of its last
blocks (E_l) on the owner's faces with FedFace's positive-only loss, through a fusion module
F(E_l(x), E_g(x)) from `facecore.fusion`. Fusion acts on the embedding (a D×1×1 map), after the
backbone, where the paper puts it before the classifier. The owner's template is trained with it,
starting from the normalised mean feature, exactly like the FedFace class embedding.

Nothing here leaves the device: the fused model and the template are derived from the owner's
faces and are stored encrypted with the rest of the owner's data.

The verifier gets its own threshold (device_sdk.personal_calibration): the owner's enrollment
faces against public impostor faces, given to training (`calibration`) or, when training had none,
looked up by `save_verifier` in the public split. The saved file (device_sdk.personal_file)
carries it with an ONNX graph of the fused model, so `verify --personal` scores without torch.
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

from device_sdk.personal_calibration import DEFAULT_FAR, DEFAULT_IMPOSTORS, calibrate, public_impostor_faces
from device_sdk.personal_file import PersonalFile, PersonalThreshold, is_current_format, read_personal, write_personal
from device_sdk.training import Cohort, LocalTrainingConfig, PrefixCache, TrainingDiverged, fit_positive, split_backbone
from facecore.align.geometry import geometry_of
from facecore.errors import FaceCoreError
from facecore.fusion import FUSIONS, Fusion, make_fusion
from facecore.models.preprocess import faces_to_tensor
from facecore.templates import mean_feature_embedding


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
    # The verifier's own threshold: the false-accept rate it is set at, over this many public faces
    # (at least 1/far of them, or there is no threshold) when `save_verifier` looks them up itself.
    calibration_far: float = DEFAULT_FAR
    calibration_impostors: int = DEFAULT_IMPOSTORS

    def __post_init__(self) -> None:
        if self.fusion not in FUSIONS:
            raise ValueError(f"fusion must be one of {', '.join(FUSIONS)}, got {self.fusion!r}")
        if not 0.0 < self.calibration_far < 1.0:
            raise ValueError(f"calibration_far must be in (0, 1), got {self.calibration_far}")
        if self.calibration_impostors < 0:
            raise ValueError(f"calibration_impostors must be >= 0, got {self.calibration_impostors}")
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

    template: Tensor  # a buffer, registered in __init__

    def __init__(self, global_backbone: nn.Module, config: PersonalConfig) -> None:
        super().__init__()
        self.config = config
        frozen = copy.deepcopy(global_backbone).float().eval()
        prefix, global_suffix = split_backbone(frozen, config.training.trainable_blocks)
        self.prefix = prefix
        for p in self.prefix.parameters():
            p.requires_grad_(False)
        self.geometry = geometry_of(frozen)
        self.threshold: PersonalThreshold | None = None  # set by calibration
        self.enrollment_scores: np.ndarray | None = None  # the owner's training faces, set by training
        size = self.geometry.size
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
    threshold: PersonalThreshold | None = None


def train_personal_verifier(
    global_backbone: nn.Module, faces: np.ndarray, config: PersonalConfig | None = None, seed: int = 0,
    cache: PrefixCache | None = None, cohort: np.ndarray | Tensor | None = None, calibration: np.ndarray | None = None,
) -> tuple[PersonalVerifier, PersonalReport]:
    """Train E_l, the fusion and the template on the owner's aligned faces; `global_backbone` is
    not modified. `cache`: the faces' prefix activations, when the caller has them. `cohort`:
    public impostor faces to train against, aligned (N,S,S,3) uint8 or already as prefix
    activations. `calibration`: other public faces, aligned, that set the verifier's threshold at
    `config.calibration_far` (with a training cohort, of other people: an impostor the verifier
    was trained against would make the FAR look lower than it is)."""
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
    verifier.enrollment_scores = verifier.embed_prefix(cache.plain).numpy() @ verifier.template.numpy()
    if calibration is not None and len(calibration):
        calibrate_verifier(verifier, calibration)
    report = PersonalReport(config.fusion, len(faces), steps, loss_before, loss_after, time.perf_counter() - started,
                            fusion.summary(), verifier.threshold)
    return verifier, report


def calibrate_verifier(verifier: PersonalVerifier, impostor_faces: np.ndarray) -> PersonalThreshold | None:
    """Set (and return) the verifier's threshold at its config's FAR over aligned public faces,
    against its enrollment scores; None when the faces are too few to measure that FAR."""
    if verifier.enrollment_scores is None:
        raise FaceCoreError("calibration needs the owner's enrollment scores: train the verifier first")
    impostor = np.concatenate([verifier.score(impostor_faces[i : i + 128]) for i in range(0, len(impostor_faces), 128)])
    verifier.threshold = calibrate(verifier.enrollment_scores, impostor, verifier.config.calibration_far,
                                   f"{len(impostor_faces)} public split faces, one per identity")
    return verifier.threshold


class _FusedGraph(nn.Module):
    """Aligned faces (N, 3, S, S) in [-1, 1] -> fused embeddings: what the ONNX file computes."""

    def __init__(self, verifier: PersonalVerifier) -> None:
        super().__init__()
        self.prefix, self.fused = verifier.prefix, verifier.fused

    def forward(self, faces: Tensor) -> Tensor:
        return self.fused(self.prefix(faces))


def verifier_onnx(verifier: PersonalVerifier) -> bytes:
    """The fused model as ONNX (opset 17, dynamic batch): input `faces`, output `embedding`, unnormalised."""
    size = verifier.geometry.size
    buffer = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(
            # the TorchScript exporter (dynamo=False) writes to any binary file; torch annotates f as a path only
            _FusedGraph(verifier).eval(), (torch.zeros(1, 3, size, size),), buffer, dynamo=False, opset_version=17,  # type: ignore[arg-type]
            do_constant_folding=True, input_names=["faces"], output_names=["embedding"],
            dynamic_axes={"faces": {0: "batch"}, "embedding": {0: "batch"}},
        )
    return buffer.getvalue()


def save_verifier(verifier: PersonalVerifier, model_version: str, calibrate_on_public: bool = True) -> bytes:
    """The personal file: the trained parts (E_l, fusion, template) for torch, the whole fused model
    as ONNX for torch-free verification, and the calibrated threshold. E_g and the prefix are the
    public global model of `model_version`, which the device keeps in its model cache.

    A freshly trained verifier without a threshold is calibrated here first, on
    `config.calibration_impostors` public split faces when the face data is on this machine
    (scoring them is most of the cost); without the data it is saved without a threshold."""
    wanted = calibrate_on_public and verifier.config.calibration_impostors > 0
    if verifier.threshold is None and verifier.enrollment_scores is not None and wanted:
        impostors = public_impostor_faces(verifier.geometry, verifier.config.calibration_impostors)
        if impostors is not None:
            calibrate_verifier(verifier, impostors)
    trained = {k: v for k, v in verifier.state_dict().items() if not k.startswith(("prefix.", "fused.global_."))}
    config = {"fusion": verifier.config.fusion, "trainable_blocks": verifier.config.training.trainable_blocks,
              "calibration_far": verifier.config.calibration_far}
    buffer = io.BytesIO()
    torch.save({"model_version": model_version, "config": config, "state_dict": trained}, buffer)
    template = nn.functional.normalize(verifier.template, dim=0).numpy()
    return write_personal(PersonalFile(model_version, verifier.geometry, config, template, verifier.threshold,
                                       verifier_onnx(verifier), buffer.getvalue()))


def _trained_parts(payload: bytes) -> dict:  # type: ignore[type-arg]
    # A file of an earlier version is the bare torch file of the trained parts.
    raw = read_personal(payload).trained_state if is_current_format(payload) else payload
    return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)


def load_verifier(payload: bytes, global_backbone: nn.Module) -> PersonalVerifier:
    saved = _trained_parts(payload)
    training = LocalTrainingConfig(trainable_blocks=saved["config"]["trainable_blocks"])
    far = saved["config"].get("calibration_far", DEFAULT_FAR)
    config = PersonalConfig(saved["config"]["fusion"], training, calibration_far=far)
    verifier = PersonalVerifier(global_backbone, config)
    missing, unexpected = verifier.load_state_dict(saved["state_dict"], strict=False)
    if unexpected or any(not k.startswith(("prefix.", "fused.global_.")) for k in missing):
        raise FaceCoreError("the saved personalised verifier does not fit this model: personalise again")
    if is_current_format(payload):
        verifier.threshold = read_personal(payload).threshold
    return verifier.eval()


def saved_model_version(payload: bytes) -> str:
    if is_current_format(payload):
        return read_personal(payload).model_version
    return str(_trained_parts(payload)["model_version"])


__all__ = [
    "calibrate_verifier", "load_verifier", "save_verifier", "saved_model_version", "verifier_onnx", "FusedSuffix",
    "PersonalConfig", "PersonalReport", "PersonalVerifier", "train_personal_verifier",
]
