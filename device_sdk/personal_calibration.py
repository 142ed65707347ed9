"""The personal verifier's own threshold: the owner's enrollment faces against public impostor faces.

The global threshold is calibrated for the global model; fused scores of owners and of impostors
both run higher (simulator/FEDFUSION.md), so the personal verifier is judged at its own.

Invariants:
- Impostors are faces of the public split (the server's pretraining identities): never a device
  owner, never a person of LFW people folds 6-10 (the test folds; checked here, not assumed).
- One photo per identity, so each impostor score is another person.
- The threshold is `threshold_at_far` over the impostor scores (at most `far` of them score above
  it); with fewer than 1/far impostors there is no threshold rather than an optimistic guess.
- The genuine side is the owner's enrollment faces, which the verifier trained on: what they accept
  is reported as an upper bound, never used to move the threshold.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from device_sdk.personal_file import PersonalThreshold
from facecore.align.geometry import FaceGeometry
from facecore.errors import DataRootMissing, FaceCoreError
from facecore.eval.lfw import TEST_FOLDS
from facecore.eval.metrics import threshold_at_far

DEFAULT_IMPOSTORS = 1000  # the fewest that can measure the global threshold's FAR of 1e-3
DEFAULT_FAR = 1e-3
MARGIN = 1e-4


def public_impostor_faces(geometry: FaceGeometry, count: int = DEFAULT_IMPOSTORS, seed: int = 0,
                          root: str | Path | None = None) -> np.ndarray | None:
    """One aligned face of each of `count` public identities (chosen by `seed`), or None when the
    face data is not on this machine. Public photos enter the shared aligned-face cache."""
    from facecore.align.pipeline import FaceAligner
    from facecore.data.lfw import LFW
    from facecore.data.split import SplitConfig, build_split
    from facecore.paths import data_root

    try:
        found = data_root(root)
    except DataRootMissing:
        return None
    split = build_split(found, SplitConfig(seed=0))
    folds = LFW(found / "lfw").people_folds()
    tested = {f"lfw:{name}" for number, people in enumerate(folds, start=1) if number in TEST_FOLDS for name in people}
    identities = sorted(set(split.sets["public"]) - set(split.sets["evaluation"]) - tested)
    if count > len(identities):
        raise FaceCoreError(f"the public split has {len(identities)} identities, fewer than the {count} impostors "
                            "asked for")
    chosen = sorted(np.random.default_rng(seed).choice(len(identities), count, replace=False))
    paths = [found / sorted(split.sets["public"][identities[i]])[0] for i in chosen]
    aligner = FaceAligner(geometry=geometry, detector=_detector())  # type: ignore[arg-type]
    aligned = aligner.align_paths(paths, desc="aligning public impostor faces")
    return aligned.faces


def _detector() -> object | None:
    """The ONNX MTCNN when it is exported (5x faster, same landmarks within 1e-3 px); else the torch one."""
    from facecore.align.onnx_detector import DetectorCorrupt, DetectorMissing, OnnxMTCNN

    try:
        return OnnxMTCNN()
    except (DetectorMissing, DetectorCorrupt):
        return None


def calibrate(genuine: np.ndarray, impostor: np.ndarray, far: float = DEFAULT_FAR,
              source: str = "public split faces") -> PersonalThreshold | None:
    """The threshold at `far` over the impostor scores, with what it does on both sides; None when
    the impostors are too few to measure `far`."""
    genuine, impostor = np.asarray(genuine, np.float64), np.asarray(impostor, np.float64)
    at_far = threshold_at_far(impostor, far)  # at most `far` of the impostors score strictly above it
    if not np.isfinite(at_far) or len(genuine) == 0:
        return None
    # Verify accepts score >= threshold, so the threshold sits just above the impostor at `at_far`: far
    # enough that scoring it again (onnxruntime instead of torch, another batch: ~1e-6) cannot let it
    # through, and below the next impostor up.
    above = impostor[impostor > at_far]
    threshold = at_far + min(MARGIN, (above.min() - at_far) / 2 if above.size else MARGIN)
    return PersonalThreshold(
        threshold=float(threshold), far=far, impostor_far=float((impostor >= threshold).mean()),
        impostors=len(impostor),
        genuine_accept=float((genuine >= threshold).mean()), genuine=len(genuine), impostor_source=source,
    )


__all__ = ["DEFAULT_FAR", "DEFAULT_IMPOSTORS", "calibrate", "public_impostor_faces"]
