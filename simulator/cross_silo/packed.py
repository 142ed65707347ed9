"""A run's faces in one file, so that a machine without the data set (a GPU box, say) trains on them.

Invariants:

* A pack holds what its source loads for every party and the evaluation: labels, classes, pairs and
  folds exactly; each face JPEG-coded once, at the quality the pack records.
* It records the settings that decided who holds what (trainers, parties, validators, seed, size,
  evaluation folds, split); :meth:`PackedData.check` refuses a run whose settings differ, so a pack
  never trains a plan it was not cut for.
* Each process decodes only its own party's faces, as :class:`~simulator.cross_silo.data.RealData` does.
"""
from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from tqdm import tqdm

from facecore.errors import FaceCoreError
from simulator.cross_silo.data import DataSpec
from simulator.cross_silo.trainer import SiloData
from simulator.cross_silo.validator import PairSet

PACK_VERSION = 1
DEFAULT_QUALITY = 90


def _encode(faces: np.ndarray, quality: int, desc: str) -> tuple[np.ndarray, np.ndarray]:
    """(N, S, S, 3) uint8 -> (all JPEG bytes, N + 1 offsets)."""
    blobs = []
    for face in tqdm(faces, desc=desc, unit="face", leave=False):
        buffer = io.BytesIO()
        Image.fromarray(face).save(buffer, format="JPEG", quality=quality)
        blobs.append(np.frombuffer(buffer.getvalue(), np.uint8))
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in blobs])]).astype(np.int64)
    return np.concatenate(blobs), offsets


def _decode(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    faces = [np.asarray(Image.open(io.BytesIO(data[a:b].tobytes())).convert("RGB")) for a, b in zip(offsets[:-1], offsets[1:])]
    return np.stack(faces)


def pack_faces(source: DataSpec, parties: int, validators: int, settings: Mapping[str, Any], path: Path, quality: int = DEFAULT_QUALITY) -> dict[str, Any]:
    """Write every party's and the evaluation's faces from ``source`` to ``path``; returns the pack's summary."""
    arrays: dict[str, np.ndarray] = {}
    summary: dict[str, Any] = {"version": PACK_VERSION, "quality": quality, "settings": dict(settings), "trainers": [], "validators": [], "evaluation": None}
    for i in range(parties):
        silo = source.trainer(i)
        arrays[f"t{i}_jpeg"], arrays[f"t{i}_offsets"] = _encode(silo.faces, quality, f"packing {silo.name}")
        arrays[f"t{i}_labels"] = silo.labels
        summary["trainers"].append({"name": silo.name, "classes": silo.classes, "faces": len(silo.labels)})
    pair_sets = [("v", i, source.validator(i)) for i in range(validators)]
    evaluation = source.evaluation()
    if evaluation is not None:
        pair_sets.append(("e", 0, evaluation))
    for role, i, pairs in pair_sets:
        key = f"{role}{i}"
        arrays[f"{key}_jpeg"], arrays[f"{key}_offsets"] = _encode(pairs.faces, quality, f"packing {pairs.name}")
        arrays[f"{key}_pairs"], arrays[f"{key}_same"], arrays[f"{key}_folds"] = pairs.pair_index, pairs.same, pairs.folds
        entry = {"name": pairs.name, "faces": len(pairs.faces), "pairs": len(pairs.same)}
        if role == "v":
            summary["validators"].append(entry)
        else:
            summary["evaluation"] = entry
    arrays["meta"] = np.frombuffer(json.dumps(summary).encode(), np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with partial.open("wb") as f:  # np.savez would append .npz to a bare name
        np.savez(f, **arrays)  # type: ignore[arg-type]  # numpy's stub lets ** reach allow_pickle
    partial.replace(path)
    return {**summary, "bytes": path.stat().st_size}


@dataclass(frozen=True)
class PackedData:
    """A :func:`pack_faces` file as a data source; picklable, so each process opens it for its own party."""

    path: str

    @cached_property
    def meta(self) -> dict[str, Any]:
        """The pack's summary, read once per process (each process opens the pack for its own party)."""
        try:
            with np.load(self.path, allow_pickle=False) as pack:
                meta: dict[str, Any] = json.loads(pack["meta"].tobytes())
        except (OSError, ValueError, KeyError) as exc:
            raise FaceCoreError(f"{self.path} is not a face pack written by --pack-faces ({exc})") from exc
        if meta.get("version") != PACK_VERSION:
            raise FaceCoreError(f"{self.path} is pack version {meta.get('version')}, this code reads version {PACK_VERSION}")
        return meta

    def check(self, settings: Mapping[str, Any]) -> None:
        """Refuse a run whose silo settings are not the ones the pack was cut for."""
        packed = self.meta["settings"]
        wanted = json.loads(json.dumps(dict(settings)))  # tuples as JSON lists, like the stored ones
        differ = [f"{k} {packed.get(k)!r} (pack) vs {v!r} (run)" for k, v in wanted.items() if packed.get(k) != v]
        if differ:
            raise FaceCoreError(f"{self.path} was packed for other settings: " + "; ".join(differ))

    def describe_plan(self) -> dict[str, Any]:
        return {k: self.meta[k] for k in ("trainers", "validators", "evaluation", "quality")}

    def _faces(self, pack: Any, key: str) -> np.ndarray:
        return _decode(pack[f"{key}_jpeg"], pack[f"{key}_offsets"])

    def trainer_name(self, index: int) -> str:
        return str(self.meta["trainers"][index]["name"])

    def trainer(self, index: int) -> SiloData:
        entry = self.meta["trainers"][index]
        with np.load(self.path, allow_pickle=False) as pack:
            return SiloData(entry["name"], self._faces(pack, f"t{index}"), pack[f"t{index}_labels"], entry["classes"])

    def _pairs(self, key: str, name: str) -> PairSet:
        with np.load(self.path, allow_pickle=False) as pack:
            return PairSet(name, self._faces(pack, key), pack[f"{key}_pairs"], pack[f"{key}_same"], pack[f"{key}_folds"])

    def validator(self, index: int) -> PairSet:
        return self._pairs(f"v{index}", self.meta["validators"][index]["name"])

    def evaluation(self) -> PairSet | None:
        entry = self.meta["evaluation"]
        return None if entry is None else self._pairs("e0", entry["name"])
