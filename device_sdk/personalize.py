"""Opt-in: train the fused personal verifier (FedFusion) on the owner's faces, on the current global model.

Invariants:
- Nothing is sent to the server: the verifier is sealed in the state folder (`DeviceState.save_personal`), with
  its own ONNX graph, template, crop and, when public impostor faces are at hand, its calibrated threshold, which
  device_sdk.verify judges `personal` verifies at.
- Torch is imported only inside `personalize` (device_sdk.personal, and the backbone through
  device_sdk.model_cache); importing this module does not.
- The model it trains on is not remembered: its ONNX file is not cached here, and an offline verify falls back
  to the model remembered.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from device_sdk.enrolment import enrolled_faces
from device_sdk.link import ServerLink
from device_sdk.model_cache import current_model, download_precision, load_backbone

if TYPE_CHECKING:  # the type only: device_sdk.personal imports torch
    from device_sdk.personal import PersonalConfig


@dataclass(frozen=True)
class PersonalizeResult:
    fusion: str
    faces: int
    loss_before: float
    loss_after: float
    seconds: float
    model_version: str
    fusion_summary: dict[str, float]
    threshold: float | None = None  # the verifier's own, calibrated on public impostors at `far`
    far: float | None = None


def personalize(link: ServerLink, config: PersonalConfig | None, cohort: np.ndarray | None, fp16: bool) -> PersonalizeResult:
    """`FaceDevice.personalize`: train on the enrolled faces, save the verifier sealed. `fp16`: the backbone
    file's precision to download (the one rounds use)."""
    from device_sdk.personal import save_verifier, train_personal_verifier  # torch: it trains

    link.identity()
    faces = enrolled_faces(link.state)
    model = current_model(link, remember=False)
    backbone = load_backbone(link, model["backbone_url"], model["version"], download_precision(fp16))
    verifier, report = train_personal_verifier(backbone, faces, config, cohort=cohort)
    link.state.save_personal(save_verifier(verifier, model["version"]))
    calibrated = verifier.threshold  # set while saving, when public impostor faces are available
    return PersonalizeResult(report.fusion, report.faces, report.loss_before, report.loss_after, report.seconds,
                             model["version"], report.fusion_summary, calibrated.threshold if calibrated else None,
                             calibrated.far if calibrated else None)


__all__ = ["PersonalizeResult", "personalize"]
