"""Tuning on people nothing trained on: the device identities a `--devices N` run leaves out.

`mobile` pretrained on the public split, which holds about 96% of the people of LFW folds 1-5, so a
tuning gain there mixes generalisation with forgetting. The split's device identities are in no
pretraining set, and a run that simulates N of them puts the rest on no device either. This scores
those left-out people all photos against all, in identity-disjoint groups, so a tuning gain has its
own group-to-group spread, as the fold-by-fold gain has on LFW. Never on folds 6-10.

Invariants:
- The left-out people are exactly those `load_population` does not choose for the same
  (`devices`, `seed`): `device_people` decides both.
- Groups are a seeded permutation of the left-out identities, the same for every model scored, so
  gains are paired group by group.

`python -m simulator.cross_device.left_out --devices 163 mobile runs/a/model.pt ...` prints each
model's TAR@FAR on them and its gain over the first model, group by group.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from facecore.align.geometry import FaceGeometry, geometry_of
from facecore.data.split import SplitConfig, build_split
from facecore.errors import FaceCoreError
from facecore.eval.folder import embed_with_progress
from facecore.eval.metrics import all_pairs_scores, far_key, tar_at_far
from facecore.models.checkpoint import load_backbone
from facecore.paths import data_root
from simulator.cross_device.markdown import beyond_noise, paired_gain
from simulator.cross_device.population import device_people

FARS = (1e-3, 1e-4)


@dataclass(frozen=True)
class LeftOutPeople:
    faces: np.ndarray  # (N, S, S, 3) uint8, in one model's crop
    identities: np.ndarray  # (N,) identity index
    groups: np.ndarray  # (N,) group of each photo's identity

    @property
    def n_people(self) -> int:
        return int(len(np.unique(self.identities)))


def left_out_people(people: Sequence[tuple[str, np.ndarray]], n_groups: int = 5, seed: int = 0) -> LeftOutPeople:
    if len(people) < 2 * n_groups:
        raise FaceCoreError(f"{len(people)} left-out people cannot make {n_groups} groups of 2: simulate fewer devices")
    group_of = np.random.default_rng([seed, 7]).permutation(len(people)) % n_groups
    return LeftOutPeople(
        faces=np.concatenate([faces for _, faces in people]),
        identities=np.concatenate([np.full(len(faces), i) for i, (_, faces) in enumerate(people)]),
        groups=np.concatenate([np.full(len(faces), group_of[i]) for i, (_, faces) in enumerate(people)]),
    )


def score(embeddings: np.ndarray, people: LeftOutPeople) -> dict[str, Any]:
    """Pooled TAR@FAR over every pair of the left-out photos, and each group's own."""
    genuine, impostor = all_pairs_scores(embeddings, people.identities)
    per_group: dict[str, list[float]] = {far_key(far): [] for far in FARS}
    for group in np.unique(people.groups):
        member = people.groups == group
        group_genuine, group_impostor = all_pairs_scores(embeddings[member], people.identities[member])
        for key, value in tar_at_far(group_genuine, group_impostor, FARS).items():
            per_group[key].append(value)
    return {"tar_at_far": tar_at_far(genuine, impostor, FARS), "tar_at_far_per_group": per_group,
            "genuine_pairs": int(genuine.size), "impostor_pairs": int(impostor.size)}


def models_of_one_crop(specs: Sequence[str]) -> tuple[list[torch.nn.Module], FaceGeometry]:
    """The backbones `specs` name, and the one crop they share: scores compare only on the same faces."""
    models = [load_backbone(spec) for spec in specs]
    geometries = {geometry_of(m) for m in models}
    if len(geometries) != 1:
        raise FaceCoreError("the models use different crops; score one crop at a time")
    return models, geometries.pop()


def gain_text(per_group: Sequence[float], base: Sequence[float]) -> str:
    mean, std, up = paired_gain(base, per_group)
    verdict = ", beyond noise" if beyond_noise(mean, std, len(base)) else ""
    return f"{mean:+.2f} ± {std:.2f} ({up}/{len(base)} up{verdict})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulator.cross_device.left_out", description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="'mobile', 'default' or checkpoint paths; gains are against the first")
    parser.add_argument("--devices", type=int, required=True, help="the --devices of the runs that trained the checkpoints")
    parser.add_argument("--seed", type=int, default=0, help="the --seed of those runs")
    parser.add_argument("--groups", type=int, default=5)
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here")
    args = parser.parse_args(argv)
    root = args.data or data_root()
    manifest = build_split(root, SplitConfig(seed=0))
    try:
        models, geometry = models_of_one_crop(args.models)
    except FaceCoreError as error:
        parser.error(str(error))
    _, left_out, _ = device_people(manifest, root, args.devices, args.seed, geometry=geometry)
    people = left_out_people(left_out, args.groups, args.seed)
    results = [score(embed_with_progress(m, people.faces, desc=f"embedding for {spec}"), people) for spec, m in zip(args.models, models)]
    first = results[0]
    print(f"{people.n_people} left-out people, {len(people.faces)} photos, {args.groups} groups; "
          f"{first['genuine_pairs']:,} genuine and {first['impostor_pairs']:,} impostor pairs")
    for index, (spec, result) in enumerate(zip(args.models, results)):
        line = [f"{spec}:"]
        for key in (far_key(f) for f in FARS):
            line.append(f"TAR@{key} {100 * result['tar_at_far'][key]:.2f}")
            if index:
                line.append(f"gain {gain_text(result['tar_at_far_per_group'][key], first['tar_at_far_per_group'][key])}")
        print("  ".join(line))
    if args.json:
        args.json.write_text(json.dumps(dict(zip(args.models, results)), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
