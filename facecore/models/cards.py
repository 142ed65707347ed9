"""The named models' cards: where their weights are, and the figures measured for them
(`facecore/weights/<name>.json`), read without torch.

Invariants:
- Importing this module loads no torch or numpy: `fedface models list` reads the cards without building a model.
- A figures file names no machine's checkout: the bundled model is named by its path in the repository
  (`model_source`), and `facecore/models/figures_test.py` reads every committed figures file for absolute paths.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

WEIGHTS_DIR = Path(__file__).resolve().parents[1] / "weights"
# The models whose weights are files in this repository: `mobile`, the compact model cut from the teacher
# (pretrain/TEACHER_CUT.md), and `mobilefacenet`, the MobileFaceNet that `mobile` was until it.
BUNDLED_MODELS = {"mobile": WEIGHTS_DIR / "mobile.pt", "mobilefacenet": WEIGHTS_DIR / "mobilefacenet.pt"}
MOBILE_MODEL = BUNDLED_MODELS["mobile"]
PUBLISHED_MODELS = ("default", "dlib-resnet")
MODEL_NAMES = (*PUBLISHED_MODELS, *BUNDLED_MODELS, "random")
# The named models with weights of their own, once each (`dlib-resnet` is another name for `default`).
TRAINED_MODELS = ("default", *BUNDLED_MODELS)
# The measured figures of each named model (`fedface models measure NAME --write`); its verification
# threshold, calibrated on LFW folds 1-5, is read from here, the one place it is stored.
FIGURES = {
    "default": WEIGHTS_DIR / "dlib-resnet.json", "dlib-resnet": WEIGHTS_DIR / "dlib-resnet.json",
    **{name: path.with_suffix(".json") for name, path in BUNDLED_MODELS.items()},
}


def model_source(spec: str | Path) -> str:
    """Where a --model spec's weights come from, for manifests and reports; the bundled model by its path in
    the repository, so a committed figures file names no machine's checkout."""
    if str(spec) in PUBLISHED_MODELS:
        from facecore.models.published import FACE_API

        return f"npm {FACE_API.spec}"
    if str(spec) in BUNDLED_MODELS:
        return BUNDLED_MODELS[str(spec)].relative_to(WEIGHTS_DIR.parents[1]).as_posix()
    return str(spec)


def figures_of(name: str) -> dict[str, Any]:
    """The named model's figures file, or {} where it has none yet."""
    path = FIGURES[name]
    return json.loads(path.read_text()) if path.is_file() else {}


def weights_problem(name: str) -> str | None:
    """Why the named model's weights cannot be loaded here (not fetched, corrupt, missing), or None: the
    published package's files are checked against their sha256s, the bundled file for being there."""
    if name in PUBLISHED_MODELS:
        from facecore.models.published import WeightsCorrupt, WeightsMissing, installed_files

        try:
            installed_files()
        except (WeightsMissing, WeightsCorrupt) as error:
            return str(error)
        return None
    if name in BUNDLED_MODELS and not BUNDLED_MODELS[name].is_file():
        return f"model file {BUNDLED_MODELS[name]} does not exist"
    return None
