"""How far a model's features share one direction, by photo source: the length of the mean unit feature.

A model whose unit features all lean one way raises every impostor score; a test fold's threshold
rises with them, and only the people whose own scores rise as fast still pass it (fold_people.py).
This measures the lean on the split's public and device photos, LFW and CelebA apart, because the
two sources sit apart in feature space and training can move one without the other. It never reads
LFW folds 6-10.

Invariants:
- The photos are a seeded sample of each (role, source), the same for every model scored.
- The length is that of the mean of L2-normalised features: 0 when they spread evenly, 1 when all coincide.

`python -m simulator.cross_device.feature_mean mobile runs/a/model.pt ...` prints a row per model.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from facecore.align.geometry import FaceGeometry
from facecore.align.pipeline import FaceAligner
from facecore.data.faces import load_labelled_faces
from facecore.data.split import SplitConfig, SplitManifest, build_split
from facecore.errors import FaceCoreError
from facecore.eval.folder import embed_with_progress
from facecore.paths import data_root
from simulator.cross_device.left_out import models_of_one_crop

ROLES = ("public", "devices")
SOURCES = ("lfw", "celeba")


def mean_length(embeddings: np.ndarray) -> float:
    """Length of the mean of the rows, which must be unit vectors."""
    if embeddings.ndim != 2 or len(embeddings) == 0:
        raise FaceCoreError("mean_length needs a non-empty (N, D) array of unit rows")
    return float(np.linalg.norm(embeddings.mean(0)))


def source_samples(manifest: SplitManifest, root: Path, geometry: FaceGeometry, per_set: int = 800, seed: int = 0) -> dict[str, np.ndarray]:
    """'role/source' -> up to `per_set` aligned photos of that role's identities from that source."""
    rng = np.random.default_rng([seed, 13])
    aligner = FaceAligner(geometry=geometry)
    samples = {}
    for role in ROLES:
        images = list(manifest.images(role, root))
        for source in SOURCES:
            pool = [image for image in images if image.identity.startswith(source + ":")]
            if not pool:
                continue
            chosen = sorted(rng.choice(len(pool), min(per_set, len(pool)), replace=False))
            samples[f"{role}/{source}"] = load_labelled_faces([pool[i] for i in chosen], aligner, desc=f"aligning {role}/{source}").faces
    return samples


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulator.cross_device.feature_mean", description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="'mobile', 'default' or checkpoint paths")
    parser.add_argument("--per-set", type=int, default=800, help="photos sampled from each role and source")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.per_set < 2:
        parser.error("--per-set must be at least 2")
    try:
        models, geometry = models_of_one_crop(args.models)
    except FaceCoreError as error:
        parser.error(str(error))
    root = data_root(args.data)
    samples = source_samples(build_split(root, SplitConfig(seed=0)), root, geometry, args.per_set, args.seed)
    table = {spec: {name: mean_length(embed_with_progress(model, faces, desc=f"{spec}: {name}")) for name, faces in samples.items()}
             for spec, model in zip(args.models, models)}
    print("mean unit feature length; " + ", ".join(f"{name}: {len(faces)} photos" for name, faces in samples.items()))
    for spec, row in table.items():
        print(f"{spec}:  " + "  ".join(f"{name} {value:.3f}" for name, value in row.items()))
    if args.json:
        args.json.write_text(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
