"""What a cross-device run is scored on: LFW verification, and what the phones' owners get.

Invariants:
- Accuracy claims use LFW folds 6-10, whose people are on no device. On tuning folds (1-5) the
  devices' people are left out, since they train.
- Every TAR@FAR also comes per people fold: a gain counts only beyond the fold-to-fold spread.
- Owners are verified on held-out photos no device trained on, at the published threshold (which a
  federated version inherits) and at one recalibrated for the model being scored, on LFW folds 1-5
  less the devices' people, as a publisher who recalibrates would set it. Never on folds 6-10.
- Owners enroll as the run's devices enrolled: from their clean photos under `enrolment` clean (an
  owner enrolled on a phone, verified by the fleet's camera). Then the figures of owners enrolled on
  the camera's own photos come beside them (`owners_camera_enrolled`).
- With a fleet camera (facecore.capture) LFW is scored on its photos as that camera takes them, drawn
  with a fixed seed of their own: every arm and run seed scores the same captured photos. The clean
  photos' figures come beside them (`clean`), so a gain on the camera is told from a loss on the web.
- With a fleet camera the CelebA people of the split's public role (whom the default model never
  trained on and no device holds) are scored too, captured and clean (`celeba`), over all their pairs
  and per five groups of people hashed by name. The centre a run may take from public CelebA photos
  (`--center-source celeba` or `model`) makes this a check of the same people's mean, not an
  independent one.
- The same weights under the same setting score the same, so results are remembered in the cache.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from facecore.align.detectors import detector_version
from facecore.align.geometry import FaceGeometry, geometry_of
from facecore.align.pipeline import FaceAligner
from facecore.capture import get_capture
from facecore.data.faces import load_labelled_faces
from facecore.data.split import SplitManifest
from facecore.errors import FaceCoreError
from facecore.eval.calibration import CALIBRATION_FOLDS
from facecore.eval.lfw import FARS, SUBSET_SEED, TEST_FOLDS, evaluate, load_lfw_faces
from facecore.eval.metrics import all_pairs_scores, equal_error_rate, roc_auc, tar_at_far, threshold_at_far
from facecore.eval.owners import OwnerFaces, owner_verifications
from facecore.models.checkpoint import shipped_verification
from facecore.models.preprocess import embed_faces
from facecore.paths import cache_root
from simulator.cross_device.engine import Evaluator
from simulator.cross_device.population import Population, SimDevice

EVALUATED = ("accuracy", "accuracy_std", "auc", "tar_at_far", "tar_at_far_per_fold", "owners", "owners_recalibrated", "owners_camera_enrolled",
             "lfw_subset", "clean", "celeba")
# The captured LFW photos' draws: independent of the run's seed, and below the devices' streams
# (simulator.cross_device.population.DEVICE_STREAM), which a run with seed 0 also draws from.
LFW_CAPTURE_SEED, LFW_CAPTURE_STREAM = 0, 1
CELEBA_CAPTURE_STREAM = 2  # the CelebA public people's draws, with LFW_CAPTURE_SEED
PEOPLE_GROUPS = 5
# Bump when what an evaluation computes changes: a remembered result would be stale.
EVALUATION_VERSION = 2


def published_threshold(model: torch.nn.Module) -> float | None:
    """The threshold the model's file shipped with: a simulated run has no server to publish another."""
    shipped = shipped_verification(model)
    return None if shipped is None else shipped.threshold


def lfw_evaluator(
    root: Path, folds: tuple[int, ...], geometry: FaceGeometry, devices: Sequence[SimDevice] = (), trained_on: Collection[str] = (),
    max_photos: int | None = None, capture: str | None = None,
) -> Evaluator:
    """LFW accuracy and TAR@FAR on `folds`, with each fold's own TAR; on tuning folds, less the
    people of `devices` and the other people devices trained against (`trained_on`). `max_photos`:
    on a seeded subset of the folds' photos (facecore.eval.lfw.subset_pairs), named in `lfw_subset`.
    `capture`: on the photos as that fleet camera takes them, the clean photos' figures under `clean`."""
    clean = load_lfw_faces(root / "lfw", folds, aligner=FaceAligner(geometry=geometry), max_photos=max_photos)
    # Captured before people leave, so each photo's draw is the same whichever devices ran.
    data = clean if capture is None else replace(
        clean, faces=get_capture(capture).capture(clean.faces, geometry, LFW_CAPTURE_SEED, LFW_CAPTURE_STREAM))
    if not TEST_FOLDS & set(folds):
        left_out = {d.identity for d in devices} | set(trained_on)
        clean, data = clean.without(left_out), data.without(left_out)

    def score(model: torch.nn.Module) -> dict[str, Any]:
        report = evaluate(data, lambda faces: embed_faces(model, faces)).report
        result = {"accuracy": report.accuracy, "accuracy_std": report.accuracy_std, "auc": report.auc, "tar_at_far": report.tar_at_far,
                  "tar_at_far_per_fold": report.extra.get("per_fold_tar_at_far"), **({"lfw_subset": data.subset} if data.subset else {})}
        if capture is not None:
            plain = evaluate(clean, lambda faces: embed_faces(model, faces)).report
            result["clean"] = {"accuracy": plain.accuracy, "tar_at_far": plain.tar_at_far, "tar_at_far_per_fold": plain.extra.get("per_fold_tar_at_far")}
        return result

    return score


def people_groups(identities: np.ndarray) -> np.ndarray:
    """Each identity's group of PEOPLE_GROUPS, by a hash of its name: the same on every machine and run."""
    return np.array([int(hashlib.sha256(str(i).encode()).hexdigest(), 16) % PEOPLE_GROUPS for i in identities])


def people_verification(embeddings: np.ndarray, identities: np.ndarray, groups: np.ndarray, fars: tuple[float, ...] = FARS) -> dict[str, Any]:
    """TAR@FAR over all genuine and impostor pairs, AUC and EER, and TAR@FAR within each group of people."""
    genuine, impostor = all_pairs_scores(embeddings, identities)
    scores, same = np.concatenate([genuine, impostor]), np.concatenate([np.ones(len(genuine)), np.zeros(len(impostor))])
    per_group = [tar_at_far(*all_pairs_scores(embeddings[groups == g], identities[groups == g]), fars) for g in np.unique(groups)]
    return {"tar_at_far": tar_at_far(genuine, impostor, fars), "auc": roc_auc(scores, same), "eer": equal_error_rate(scores, same),
            "tar_at_far_per_group": {key: [round(t[key], 6) for t in per_group] for key in per_group[0]}}


def celeba_evaluator(root: Path, manifest: SplitManifest, geometry: FaceGeometry, capture: str) -> Evaluator:
    """The split's public CelebA people, as the fleet camera takes them and clean (module docstring)."""
    public = [image for image in manifest.images("public", root) if image.identity.startswith("celeba:")]
    if not public:
        raise FaceCoreError("the split has no public CelebA people to score under the camera")
    people = load_labelled_faces(public, FaceAligner(geometry=geometry), desc="CelebA public people")
    identities = np.array(people.classes)[people.labels]
    groups = people_groups(identities)
    views = {"captured": get_capture(capture).capture(people.faces, geometry, LFW_CAPTURE_SEED, CELEBA_CAPTURE_STREAM), "clean": people.faces}

    def score(model: torch.nn.Module) -> dict[str, Any]:
        return {"celeba": {name: people_verification(embed_faces(model, faces), identities, groups) for name, faces in views.items()}}

    return score


def owner_evaluator(
    root: Path, geometry: FaceGeometry, devices: Sequence[SimDevice], threshold: float | None, far: float, enrolment: str = "captured",
) -> Evaluator:
    """Each owner's held-out photos against every template (facecore.eval.owners), at `threshold`
    and at the threshold recalibrated at `far` on LFW folds 1-5 less the devices' people. The owners
    enroll as the devices did (`enrolment`); enrolled clean, the camera-enrolled figures come beside."""
    held = [(d, d.held_out) for d in devices if d.held_out is not None]
    owners = [OwnerFaces(d.identity, d.clean if enrolment == "clean" and d.clean is not None else d.faces, photos) for d, photos in held]
    camera_enrolled = [OwnerFaces(d.identity, d.faces, photos) for d, photos in held] if enrolment == "clean" else None
    calibration = load_lfw_faces(root / "lfw", CALIBRATION_FOLDS, aligner=FaceAligner(geometry=geometry)).without({d.identity for d in devices})

    def score(model: torch.nn.Module) -> dict[str, Any]:
        def embed(faces: np.ndarray) -> np.ndarray:
            return embed_faces(model, faces)

        _, impostor = all_pairs_scores(embed(calibration.faces), calibration.identities)
        thresholds = [float(threshold_at_far(impostor, far))] + ([] if threshold is None else [threshold])

        def reports(faces: list[OwnerFaces]) -> dict[str, Any]:
            found = owner_verifications(embed, faces, thresholds)
            return {"owners_recalibrated": found[0].to_dict(), **({"owners": found[1].to_dict()} if threshold is not None else {})}

        return reports(owners) | ({} if camera_enrolled is None else {"owners_camera_enrolled": reports(camera_enrolled)})

    return score


def _both(first: Evaluator, second: Evaluator) -> Evaluator:
    return lambda model: first(model) | second(model)


def devices_digest(devices: Sequence[SimDevice]) -> str:
    """The sha256 of the devices' identities and photos, enrolled and held out."""
    digest = hashlib.sha256()
    for device in devices:
        digest.update(device.identity.encode())
        for photos in (device.faces, device.held_out):
            digest.update(b"-" if photos is None else np.ascontiguousarray(photos).tobytes())
    return digest.hexdigest()


def remembered(evaluator: Evaluator, setting: dict[str, Any]) -> Evaluator:
    """`evaluator`, its results kept in the cache keyed by the weights and `setting` (which names
    everything else the result depends on, the devices' photos by `devices_digest`): every arm of a
    comparison starts from the same model, and one evaluation of the dlib ResNet takes minutes on
    2 cores."""
    folder = cache_root() / "evaluations"
    inputs = hashlib.sha256(json.dumps({**setting, "version": EVALUATION_VERSION}, sort_keys=True).encode())

    def score(model: torch.nn.Module) -> dict[str, Any]:
        digest = inputs.copy()
        for key, value in model.state_dict().items():
            digest.update(key.encode())
            digest.update(value.detach().cpu().contiguous().numpy().tobytes())
        path = folder / f"{digest.hexdigest()}.json"
        if path.is_file():
            return json.loads(path.read_text())
        result = evaluator(model)
        folder.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".tmp")
        partial.write_text(json.dumps(result))
        partial.replace(path)
        return result

    return score


def evaluators(
    root: Path, folds: tuple[int, ...], model: torch.nn.Module, population: Population, trained_on: Collection[str] = (),
    max_photos: int | None = None, capture: str | None = None, enrolment: str = "captured", manifest: SplitManifest | None = None,
) -> tuple[Evaluator, Evaluator | None]:
    """(LFW, owners) for a run starting from `model`; owners is None without held-out photos.
    `trained_on`: public people the devices train against, left out of tuning folds like the devices'.
    `max_photos`: LFW on a seeded subset of the folds' photos (the owners' figures are unchanged).
    `capture`: LFW on the photos as that fleet camera takes them, beside the clean photos' figures.
    `enrolment`: how the owners enroll, as the run's devices do. With a capture and `manifest`, the
    LFW evaluator also scores the split's public CelebA people (`celeba`)."""
    geometry = geometry_of(model)
    shipped = shipped_verification(model)
    far = 1e-3 if shipped is None or shipped.far is None else shipped.far
    threshold = published_threshold(model)
    setting = {"data": str(root), "geometry": repr(geometry), "detector": detector_version(),
               "devices": devices_digest(population.devices)}
    lfw_setting: dict[str, Any] = {**setting, "kind": "lfw", "folds": folds}
    if max_photos is not None:  # only then, so results remembered before the option existed still count
        lfw_setting |= {"photos": max_photos, "subset_seed": SUBSET_SEED}
    if trained_on and not TEST_FOLDS & set(folds):
        lfw_setting["trained_on"] = hashlib.sha256("\n".join(sorted(trained_on)).encode()).hexdigest()
    if capture is not None:  # only then, like photos: results remembered before captures existed still count
        lfw_setting |= {"capture": capture, "capture_version": get_capture(capture).version, "capture_seed": LFW_CAPTURE_SEED,
                        "capture_stream": LFW_CAPTURE_STREAM}
    lfw = remembered(lfw_evaluator(root, folds, geometry, population.devices, trained_on, max_photos, capture), lfw_setting)
    if capture is not None and manifest is not None:
        people = hashlib.sha256("\n".join(i for i in manifest.identities("public") if i.startswith("celeba:")).encode()).hexdigest()
        celeba = remembered(celeba_evaluator(root, manifest, geometry, capture),
                            {**setting, "kind": "celeba", "capture": capture, "capture_version": get_capture(capture).version, "people": people})
        lfw = _both(lfw, celeba)
    if not any(d.held_out is not None for d in population.devices):
        return lfw, None
    owners_setting: dict[str, Any] = {**setting, "kind": "owners", "threshold": threshold, "far": far}
    if enrolment != "captured":  # only then, like capture: results remembered before the option existed still count
        owners_setting["enrolment"] = enrolment
    owners = remembered(owner_evaluator(root, geometry, population.devices, threshold, far, enrolment), owners_setting)
    return lfw, owners
