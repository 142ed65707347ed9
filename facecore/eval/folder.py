"""Verification on a user's own folder of people: ``DIR/<person>/<photos>``, all pairs scored.

Invariants:

- A person is a direct subfolder of the folder; every file anywhere under it is one of that
  person's photos. Names starting with ``.`` (``.DS_Store``, ``.git``) are ignored everywhere;
  any other file directly in the folder is skipped as ``outside_person_folder``.
- Every other file is either used or skipped with exactly one reason, never dropped silently:
  ``not_image`` (Pillow does not recognise it), ``undecodable`` (Pillow recognises it but cannot
  decode it, e.g. a truncated JPEG) or ``noface`` (no face detected). There is no fallback crop:
  a photo is used only if the detector found a face in it.
- Faces are aligned with the model's own crop geometry (:func:`geometry_of`), so a model never
  sees a crop made for another.
- Pairs are all ``i < j`` pairs of used photos, scored by cosine: same person = genuine, the
  rest impostor. So ``genuine = sum C(n_p, 2)`` and ``genuine + impostor = C(N, 2)``. A person
  with a single used photo contributes impostor pairs only; one with none contributes nothing.
- TAR at a FAR the impostor count cannot measure (FAR < 1 / impostors) is NaN (``n/a``, JSON
  null), never an optimistic number.
- At the threshold the model shipped with (facecore.models.verification.shipped_in its meta),
  FAR and TAR use the device rule ``score >= threshold``: what a user of this model gets.
- Fewer than 2 persons with a used photo, or no genuine pair, is a :class:`FolderEvalError`.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError
from tqdm import tqdm

from facecore.align.cache import STATUS_OK, STATUS_UNREADABLE
from facecore.align.geometry import geometry_of
from facecore.align.pipeline import FaceAligner
from facecore.errors import FaceCoreError
from facecore.eval.metrics import all_pairs_scores, equal_error_rate, roc_auc, tar_at_far
from facecore.models.verification import Verification, shipped_in

FARS = (1e-2, 1e-3, 1e-4)
EMBED_CHUNK = 256  # faces per progress-bar step

NOT_IMAGE = "not_image"
UNDECODABLE = "undecodable"
NOFACE = "noface"
OUTSIDE = "outside_person_folder"
REASONS: dict[str, str] = {  # reason -> how the report says it
    NOT_IMAGE: "not an image",
    UNDECODABLE: "image cannot be decoded",
    NOFACE: "no face detected",
    OUTSIDE: "not inside a person folder",
}


class FolderEvalError(FaceCoreError):
    """A folder that cannot be evaluated: missing, or too few persons or pairs left."""


@dataclass(frozen=True)
class SkippedPhoto:
    path: str  # relative to the evaluated folder, e.g. "Ann/IMG_0001.jpg"
    reason: str  # a key of REASONS


@dataclass(frozen=True)
class ThresholdCheck:
    """FAR and TAR on this folder at the threshold the model ships with (accept: score >= t)."""

    threshold: float
    calibrated_far: float | None  # the FAR the threshold was calibrated for, if the model says
    calibration: str | None
    far: float
    tar: float
    false_accepts: int
    false_rejects: int

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "threshold": self.threshold, "calibrated_far": self.calibrated_far, "calibration": self.calibration,
            "far": self.far, "tar": self.tar, "false_accepts": self.false_accepts, "false_rejects": self.false_rejects,
        }


@dataclass(frozen=True)
class FolderReport:
    folder: str
    model: str  # the backbone's architecture name
    geometry: str  # the crop geometry key faces were aligned to
    files: int  # candidate files found (used + skipped)
    photos: int  # photos used
    persons: tuple[str, ...]  # persons with at least one used photo
    single_photo_persons: tuple[str, ...]  # exactly one used photo: impostor pairs only
    empty_persons: tuple[str, ...]  # person folders with no used photo: not scored
    genuine_pairs: int
    impostor_pairs: int
    genuine_mean: float
    impostor_mean: float
    auc: float
    eer: float
    tar_at_far: dict[str, float]  # "1e-3" -> TAR; NaN where the impostor count cannot measure the FAR
    skipped: tuple[SkippedPhoto, ...]
    verification: ThresholdCheck | None  # None when the model ships no threshold
    genuine: np.ndarray = field(repr=False, compare=False, default_factory=lambda: np.zeros(0, np.float32))
    impostor: np.ndarray = field(repr=False, compare=False, default_factory=lambda: np.zeros(0, np.float32))

    def skipped_counts(self) -> dict[str, int]:
        counts = Counter(s.reason for s in self.skipped)
        return {reason: counts[reason] for reason in REASONS if counts[reason]}

    def to_json_dict(self) -> dict[str, Any]:
        """JSON-ready dict; NaN (an unmeasurable TAR@FAR) becomes None."""
        return {
            "folder": self.folder, "model": self.model, "geometry": self.geometry,
            "files": self.files, "photos": self.photos, "persons": len(self.persons),
            "single_photo_persons": list(self.single_photo_persons), "empty_persons": list(self.empty_persons),
            "genuine_pairs": self.genuine_pairs, "impostor_pairs": self.impostor_pairs,
            "genuine_mean": self.genuine_mean, "impostor_mean": self.impostor_mean,
            "auc": self.auc, "eer": self.eer,
            "tar_at_far": {k: None if math.isnan(v) else v for k, v in self.tar_at_far.items()},
            "skipped_counts": self.skipped_counts(),
            "skipped": [{"file": s.path, "reason": s.reason} for s in self.skipped],
            "verification": None if self.verification is None else self.verification.to_json_dict(),
        }


def list_folder(folder: Path) -> tuple[list[tuple[str, Path]], list[Path], list[str]]:
    """([(person, file)] sorted, files directly in the folder, person names), dot-names left out."""
    if not folder.is_dir():
        raise FolderEvalError(f"{folder} is not a folder (expected one subfolder per person)")
    photos: list[tuple[str, Path]] = []
    loose: list[Path] = []
    persons: list[str] = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            persons.append(entry.name)
            photos += [(entry.name, p) for p in sorted(entry.rglob("*")) if p.is_file() and not _hidden(p, entry)]
        elif entry.is_file():
            loose.append(entry)
    return photos, loose, persons


def _hidden(path: Path, person_dir: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(person_dir).parts)


def undecodable_reason(path: Path) -> str:
    """Why the aligner could not read a file: Pillow does not know it, or cannot decode it."""
    try:
        with Image.open(path) as image:
            image.load()
    except UnidentifiedImageError:
        return NOT_IMAGE
    except Exception:  # noqa: BLE001 - Pillow raises OSError, ValueError, SyntaxError, ... for broken files
        return UNDECODABLE
    return UNDECODABLE  # Pillow decodes it but the aligner could not (e.g. a mode it cannot convert)


def threshold_check(genuine: np.ndarray, impostor: np.ndarray, verification: Verification | None) -> ThresholdCheck | None:
    """FAR/TAR at the model's shipped threshold, or None when it ships none."""
    if verification is None:
        return None
    t = verification.threshold
    accepted_impostors = int(np.count_nonzero(impostor >= t))
    accepted_genuine = int(np.count_nonzero(genuine >= t))
    return ThresholdCheck(
        threshold=t, calibrated_far=verification.far, calibration=verification.calibration,
        far=accepted_impostors / impostor.size, tar=accepted_genuine / genuine.size,
        false_accepts=accepted_impostors, false_rejects=int(genuine.size - accepted_genuine),
    )


def embed_with_progress(model: Any, faces: np.ndarray, progress: bool = True, desc: str = "embedding faces") -> np.ndarray:
    """``embed_faces`` in chunks, with a progress bar when there is more than one chunk."""
    from facecore.models.preprocess import embed_faces

    chunks = range(0, len(faces), EMBED_CHUNK)
    bar = tqdm(total=len(faces), desc=desc, unit="img", disable=not progress or len(faces) <= EMBED_CHUNK)
    out = []
    for start in chunks:
        out.append(embed_faces(model, faces[start : start + EMBED_CHUNK]))
        bar.update(len(out[-1]))
    bar.close()
    return np.concatenate(out) if out else np.zeros((0, getattr(model, "embedding_dim", 0)), np.float32)


def evaluate_folder(
    folder: str | Path, model: Any, aligner: FaceAligner | None = None, fars: Sequence[float] = FARS, progress: bool = True,
) -> FolderReport:
    """Align, embed and score every photo of ``folder`` (see the module docstring)."""
    folder = Path(folder)
    photos, loose, person_dirs = list_folder(folder)
    skipped = [SkippedPhoto(p.name, OUTSIDE) for p in loose]
    with_files = sorted({person for person, _ in photos})
    if len(with_files) < 2:
        raise FolderEvalError(
            f"{folder}: need photos of at least 2 persons (one subfolder each), found {len(with_files)}"
            + (f" ({with_files[0]})" if with_files else "")
        )
    aligner = aligner or FaceAligner(geometry=geometry_of(model))
    if aligner.geometry != geometry_of(model):
        raise FolderEvalError(f"aligner crops {aligner.geometry.key}, the model expects {geometry_of(model).key}")
    aligned = aligner.align_paths([p for _, p in photos], allow_fallback=False, desc=f"aligning {folder.name}")
    for (_, path), status in zip(photos, aligned.statuses):
        if status != STATUS_OK:  # "fallback" is a crop without a detected face: not used here
            reason = undecodable_reason(path) if status == STATUS_UNREADABLE else NOFACE
            skipped.append(SkippedPhoto(path.relative_to(folder).as_posix(), reason))
    identities = [photos[k][0] for k in aligned.kept]
    per_person = Counter(identities)
    persons = tuple(sorted(per_person))
    if len(persons) < 2:
        raise FolderEvalError(
            f"{folder}: need usable photos of at least 2 persons, found {len(persons)} "
            f"({_skip_summary(skipped)})"
        )
    if all(n < 2 for n in per_person.values()):
        raise FolderEvalError(
            f"{folder}: no genuine pair: every person has fewer than 2 usable photos ({_skip_summary(skipped)})"
        )
    embeddings = embed_with_progress(model, aligned.faces, progress)
    code_of = {p: i for i, p in enumerate(persons)}
    codes = np.array([code_of[p] for p in identities])
    genuine, impostor = all_pairs_scores(embeddings, codes)
    scores = np.concatenate([genuine, impostor])
    labels = np.concatenate([np.ones(genuine.size, bool), np.zeros(impostor.size, bool)])
    return FolderReport(
        folder=str(folder), model=str(getattr(model, "name", type(model).__name__)), geometry=aligner.geometry.key,
        files=len(photos) + len(loose), photos=len(identities), persons=persons,
        single_photo_persons=tuple(p for p in persons if per_person[p] == 1),
        empty_persons=tuple(p for p in person_dirs if p not in per_person),
        genuine_pairs=int(genuine.size), impostor_pairs=int(impostor.size),
        genuine_mean=float(genuine.mean()), impostor_mean=float(impostor.mean()),
        auc=roc_auc(scores, labels), eer=equal_error_rate(scores, labels),
        tar_at_far=tar_at_far(genuine, impostor, fars) if fars else {},
        skipped=tuple(skipped),
        verification=threshold_check(genuine, impostor, shipped_in(getattr(model, "meta", None) or {})),
        genuine=genuine, impostor=impostor,
    )


def _skip_summary(skipped: Sequence[SkippedPhoto]) -> str:
    counts = Counter(s.reason for s in skipped)
    if not counts:
        return "no file skipped"
    return "skipped: " + ", ".join(f"{counts[r]} {REASONS[r]}" for r in REASONS if counts[r])


__all__ = ["FARS", "REASONS", "FolderEvalError", "FolderReport", "SkippedPhoto", "ThresholdCheck", "evaluate_folder"]
