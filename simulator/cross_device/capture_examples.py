"""What the fleet's cameras make of real faces: a grid of LFW crops, clean and through each capture model.

The photos are of people in LFW folds 1-5 (never the test folds 6-10), aligned in the default
model's crop, so the grid shows exactly what a run with `--capture` trains and scores on.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from facecore.align.geometry import FaceGeometry
from facecore.align.pipeline import FaceAligner
from facecore.capture import CAPTURES
from facecore.data.lfw import LFW
from facecore.errors import FaceCoreError
from facecore.eval.calibration import CALIBRATION_FOLDS

LABEL_WIDTH = 90


def example_faces(root: Path, photos: int, seed: int, geometry: FaceGeometry) -> np.ndarray:
    """`photos` aligned crops, one per person, of people chosen by `seed` from LFW people folds 1-5."""
    lfw = LFW(root / "lfw")
    people = sorted(name for fold in (lfw.people_folds()[f - 1] for f in CALIBRATION_FOLDS) for name in fold)
    order = np.random.default_rng(seed).permutation(len(people))
    # Twice as many candidates as needed: a photo without a detected face is skipped, not shown.
    paths = [lfw.image(people[i], 1).path for i in order[: 2 * photos]]
    aligned = FaceAligner(geometry=geometry).align_paths(paths, progress=False)
    if len(aligned.faces) < photos:
        raise FaceCoreError(f"only {len(aligned.faces)} of {len(paths)} LFW photos have a detected face: ask for fewer --photos")
    return aligned.faces[:photos]


def capture_grid(faces: np.ndarray, geometry: FaceGeometry, seed: int) -> Image.Image:
    """Row 1 the clean crops, then one row per capture model, each row named on its left."""
    rows = [("clean", faces)] + [(name, model.capture(faces, geometry, seed)) for name, model in CAPTURES.items()]
    size = geometry.size
    grid = Image.new("RGB", (LABEL_WIDTH + size * len(faces), size * len(rows)), "white")
    draw = ImageDraw.Draw(grid)
    for r, (name, crops) in enumerate(rows):
        draw.text((6, r * size + size // 2 - 6), name, fill="black")
        for c, crop in enumerate(crops):
            grid.paste(Image.fromarray(crop), (LABEL_WIDTH + c * size, r * size))
    return grid


def write_capture_examples(root: Path, out: Path, geometry: FaceGeometry, photos: int = 6, seed: int = 0) -> Path:
    if photos < 1:
        raise FaceCoreError("--photos must be >= 1")
    grid = capture_grid(example_faces(root, photos, seed, geometry), geometry, seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    grid.save(out)
    return out
