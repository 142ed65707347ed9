"""Identity splits: public (server pretraining), devices (one identity each) and evaluation.

Evaluation always takes whole LFW View-2 people folds, which are identity-disjoint, so a
model can be scored on pairs of people it never saw. Every set is stored with its image
paths relative to the data root, so a manifest alone says exactly what was used.
"""
from __future__ import annotations

import json
import os
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from facecore.data.celeba import read_celeba
from facecore.data.lfw import LFW
from facecore.data.records import FaceImage, group_by_identity
from facecore.errors import DatasetFormatError, SplitOverlap

ROLES = ("public", "devices", "evaluation")
MANIFEST_VERSION = 1


@dataclass(frozen=True)
class SplitConfig:
    seed: int = 0
    eval_folds: tuple[int, ...] = (6, 7, 8, 9, 10)
    device_fraction: float = 0.5
    device_min_photos: int = 5
    use_celeba: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.device_fraction <= 1.0:
            raise ValueError(f"device_fraction must be in [0, 1], got {self.device_fraction}")
        if self.device_min_photos < 2:
            raise ValueError("a device needs at least 2 photos (one to enroll, one to verify)")
        if not self.eval_folds or min(self.eval_folds) < 1 or max(self.eval_folds) > 10:
            raise ValueError(f"eval_folds must be LFW folds 1..10, got {self.eval_folds}")


@dataclass(frozen=True)
class SplitManifest:
    config: SplitConfig
    sets: dict[str, dict[str, tuple[str, ...]]]  # role -> identity -> image paths relative to the data root
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        self.check_disjoint()

    def check_disjoint(self) -> None:
        for i, first in enumerate(ROLES):
            for second in ROLES[i + 1 :]:
                shared = set(self.sets.get(first, {})) & set(self.sets.get(second, {}))
                if shared:
                    sample = ", ".join(sorted(shared)[:5])
                    raise SplitOverlap(f"split sets {first!r} and {second!r} share {len(shared)} identities, e.g. {sample}")

    def identities(self, role: str) -> list[str]:
        return sorted(self.sets[role])

    def images(self, role: str, root: str | Path) -> list[FaceImage]:
        root = Path(root)
        return [FaceImage(identity, root / path) for identity, paths in sorted(self.sets[role].items()) for path in paths]

    def sizes(self) -> dict[str, dict[str, int]]:
        return {
            role: {"identities": len(self.sets[role]), "images": sum(len(v) for v in self.sets[role].values())}
            for role in ROLES
        }

    def describe(self) -> str:
        lines = [f"split (seed {self.config.seed}, evaluation = LFW folds {_fold_text(self.config.eval_folds)}):"]
        for role, size in self.sizes().items():
            lines.append(f"  {role:<10} {size['identities']:>5} identities {size['images']:>6} images")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def to_json(self) -> dict[str, object]:
        return {
            "version": MANIFEST_VERSION,
            "config": {**self.config.__dict__, "eval_folds": list(self.config.eval_folds)},
            "sizes": self.sizes(),
            "notes": list(self.notes),
            "sets": {role: {k: list(v) for k, v in ids.items()} for role, ids in self.sets.items()},
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as handle:
            json.dump(self.to_json(), handle, indent=1, sort_keys=True)
        os.chmod(handle.name, 0o644)
        os.replace(handle.name, path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> SplitManifest:
        try:
            data = json.loads(Path(path).read_text())
            if data.get("version") != MANIFEST_VERSION:
                raise DatasetFormatError(f"{path}: manifest version {data.get('version')!r}, expected {MANIFEST_VERSION}")
            config = SplitConfig(**{**data["config"], "eval_folds": tuple(data["config"]["eval_folds"])})
            sets = {role: {k: tuple(v) for k, v in data["sets"][role].items()} for role in ROLES}
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as error:
            raise DatasetFormatError(f"{path}: not a split manifest ({error})") from None
        return cls(config, sets, tuple(data.get("notes", ())))


def build_split(root: str | Path, config: SplitConfig = SplitConfig()) -> SplitManifest:
    root = Path(root)
    lfw = LFW(root / "lfw")
    folds = lfw.people_folds()
    evaluation: dict[str, list[FaceImage]] = {}
    candidates: dict[str, list[FaceImage]] = {}
    for number, people in enumerate(folds, start=1):
        target = evaluation if number in config.eval_folds else candidates
        for name, count in people.items():
            target[f"lfw:{name}"] = lfw.images_of(name, count)
    notes = []
    if config.use_celeba and (root / "celeba_subset").is_dir():
        candidates.update(group_by_identity(read_celeba(root / "celeba_subset")))
    elif config.use_celeba:
        notes.append("celeba_subset/ not found: devices come from LFW only")

    rng = random.Random(config.seed)
    devices: dict[str, list[FaceImage]] = {}
    # Sample per source so both kinds of photos (LFW press photos, CelebA in-the-wild) reach devices.
    for source in sorted({identity.split(":")[0] for identity in candidates}):
        eligible = sorted(i for i, imgs in candidates.items() if i.startswith(source + ":") and len(imgs) >= config.device_min_photos)
        for identity in rng.sample(eligible, round(len(eligible) * config.device_fraction)):
            devices[identity] = candidates[identity]
    public = {i: imgs for i, imgs in candidates.items() if i not in devices}
    sets = {role: _relative(group, root) for role, group in zip(ROLES, (public, devices, evaluation))}
    return SplitManifest(config, sets, tuple(notes))


def _relative(groups: dict[str, list[FaceImage]], root: Path) -> dict[str, tuple[str, ...]]:
    return {identity: tuple(str(img.path.relative_to(root)) for img in imgs) for identity, imgs in sorted(groups.items())}


def _fold_text(folds: tuple[int, ...]) -> str:
    if folds == tuple(range(folds[0], folds[-1] + 1)):
        return f"{folds[0]}-{folds[-1]}"
    return ",".join(map(str, folds))
