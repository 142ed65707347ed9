"""Jittered views of the public photos, and the once-built cache of what distillation trains on.

Invariants:
* One view = one random similarity jitter (rotation, scale, shift) of a photo's five landmarks plus
  an optional mirror. The SAME jittered landmarks feed both warps (the teacher's crop at the
  teacher's geometry, the student's at its own), and both crops are mirrored together, so the two
  crops always show the same face region: only the templates' fixed scale/offset differs.
* A view is a pure function of (view seed, the photo's content hash, view number): rebuilding the
  cache, or building it for another photo order, draws the same jitter for the same photo.
* With `mix`, a jittered view may blend its photo with another photo of the list (its partner is
  drawn over the sorted content hashes, so it too does not depend on the order): both crops are the
  same pixel blend of the two photos under the same jitter, so the teacher embeds what the student
  sees. A blend is a face nobody photographed; it has no label (distillation alone may train on it).
* The cache folder is named by teacher name, a digest of the teacher's weights, the teacher's and
  student's geometry keys, the jitter, the number of views, the view seed and a digest of the photo
  list. It is written under a temporary name and renamed when complete, so it is either complete
  or absent; a complete folder is only ever read (the teacher is never called for it again).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from facecore.align.geometry import FaceGeometry, geometry_of
from facecore.align.template import apply_transform, similarity_transform, warp_to_template
from facecore.models.preprocess import faces_to_tensor

CACHE_VERSION = "distill-views-v1"


@dataclass(frozen=True)
class ViewJitter:
    rotation_deg: float = 10.0  # uniform in ±rotation_deg
    scale: float = 0.08  # uniform factor in 1 ± scale
    shift_px: float = 4.0  # uniform in ±shift_px, in pixels of the student's crop
    flip: bool = True  # mirror both crops with probability 1/2
    mix: float = 0.0  # the chance that a jittered view blends its photo with another one

    def tag(self) -> str:
        blend = f"-m{self.mix:g}" if self.mix else ""
        return f"r{self.rotation_deg:g}-s{self.scale:g}-t{self.shift_px:g}-f{int(self.flip)}{blend}"


@dataclass(frozen=True)
class View:
    angle_deg: float
    scale: float
    shift: tuple[float, float]
    flip: bool
    own: float = 1.0  # the photo's weight in a blend (1: no blend), the partner's is 1 - own
    partner_draw: float = 0.0  # uniform in [0, 1): which photo of the sorted list is the partner


@dataclass(frozen=True)
class Photo:
    """One training photo: content hash, label, and its detected landmarks (source pixels)."""

    key: str
    label: int
    landmarks: np.ndarray  # (5, 2)
    load: Callable[[], np.ndarray | None]  # RGB uint8 image, None if unreadable

    def image(self) -> np.ndarray:
        """The RGB image: callers drop unreadable photos before building views, so one here is an error."""
        image = self.load()
        if image is None:
            raise ValueError(f"photo {self.key[:12]} is unreadable: drop it before building views")
        return image


def draw_view(seed: int, key: str, view: int, jitter: ViewJitter) -> View:
    """The jitter of view `view` of the photo whose content hash is `key` (view 0 is no jitter)."""
    if view == 0:
        return View(0.0, 1.0, (0.0, 0.0), False)
    rng = np.random.default_rng([seed, int(key[:15], 16), view])
    angle, scale = rng.uniform(-1, 1) * jitter.rotation_deg, 1.0 + rng.uniform(-1, 1) * jitter.scale
    shift = rng.uniform(-1, 1, 2) * jitter.shift_px
    flip = bool(jitter.flip and rng.random() < 0.5)
    own, partner_draw = 1.0, 0.0
    if jitter.mix and rng.random() < jitter.mix:  # drawn after the jitter, so a view without blends is unchanged
        own, partner_draw = float(rng.uniform()), float(rng.random())
    return View(float(angle), float(scale), (float(shift[0]), float(shift[1])), flip, own, partner_draw)


def jitter_landmarks(landmarks: np.ndarray, view: View, reference: FaceGeometry) -> np.ndarray:
    """Landmarks moved by the view's similarity, applied in `reference`'s crop frame about its centre."""
    to_crop = similarity_transform(landmarks, reference.points)
    points = apply_transform(to_crop, landmarks)
    theta = math.radians(view.angle_deg)
    rotation = view.scale * np.array([[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]])
    centre = reference.size / 2.0
    moved = (points - centre) @ rotation.T + centre + np.asarray(view.shift)
    back = np.linalg.inv(np.vstack([to_crop, [0.0, 0.0, 1.0]]))[:2]
    return apply_transform(back, moved)


def view_crops(
    image: np.ndarray, landmarks: np.ndarray, view: View, geometries: Sequence[FaceGeometry], frame: FaceGeometry
) -> list[np.ndarray]:
    """The view's crop at every geometry, all from the same jittered landmarks (jitter drawn in `frame`'s pixels)."""
    moved = jitter_landmarks(landmarks, view, frame)
    crops = [warp_to_template(image, moved, g.size, g.points)[0] for g in geometries]
    return [np.ascontiguousarray(c[:, ::-1]) if view.flip else c for c in crops]


@dataclass(frozen=True)
class ViewCache:
    """Memory-mapped views: student crops (N*K, s, s, 3) uint8 and teacher embeddings (N*K, D) float32,
    row = photo * views + view, photo in the order of `keys`."""

    folder: Path
    keys: tuple[str, ...]
    views: int
    student: np.ndarray
    teacher: np.ndarray

    def __len__(self) -> int:
        return len(self.keys)


def weights_digest(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, value in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(value.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:12]


def cache_folder(
    root: Path, teacher: torch.nn.Module, teacher_name: str, student_geometry: FaceGeometry, views: int, seed: int,
    jitter: ViewJitter, keys: Sequence[str],
) -> Path:
    photos = hashlib.sha256("\n".join(keys).encode()).hexdigest()[:12]
    name = (
        f"{CACHE_VERSION}-{teacher_name}-{weights_digest(teacher)}-{geometry_of(teacher).key}-{student_geometry.key}"
        f"-k{views}-seed{seed}-{jitter.tag()}-{photos}"
    )
    return root / name


def open_view_cache(folder: Path) -> ViewCache:
    meta = json.loads((folder / "meta.json").read_text())
    rows, size, dim = len(meta["keys"]) * meta["views"], meta["student_size"], meta["teacher_dim"]
    student = np.memmap(folder / "student.u8", dtype=np.uint8, mode="r", shape=(rows, size, size, 3))
    teacher = np.memmap(folder / "teacher.f32", dtype=np.float32, mode="r", shape=(rows, dim))
    return ViewCache(folder, tuple(meta["keys"]), meta["views"], student, teacher)


def _partner(by_key: dict[str, Photo], ordered: Sequence[str], key: str, draw: float) -> Photo:
    """The photo a blend of `key` mixes in: the draw's place in the sorted hashes, the next one if that is `key` itself."""
    place = min(int(draw * len(ordered)), len(ordered) - 1)
    if ordered[place] == key:
        place = (place + 1) % len(ordered)
    return by_key[ordered[place]]


def _blended(
    crops: tuple[np.ndarray, np.ndarray], partner: Photo, view: View, geometries: Sequence[FaceGeometry], frame: FaceGeometry,
) -> tuple[np.ndarray, np.ndarray]:
    """Each crop blended with the partner's crop at the same geometry, jitter and mirror."""
    others = view_crops(partner.image(), partner.landmarks, view, geometries, frame)
    mixed = [np.rint(view.own * c.astype(np.float32) + (1 - view.own) * o.astype(np.float32)).astype(np.uint8) for c, o in zip(crops, others, strict=True)]
    return mixed[0], mixed[1]


@torch.inference_mode()
def _embed(teacher: torch.nn.Module, crops: list[np.ndarray]) -> np.ndarray:
    return torch.nn.functional.normalize(teacher(faces_to_tensor(np.stack(crops))).float(), dim=1).numpy()


def build_view_cache(
    photos: Sequence[Photo], teacher: torch.nn.Module, teacher_name: str, student_geometry: FaceGeometry, root: Path,
    views: int = 8, seed: int = 0, jitter: ViewJitter = ViewJitter(), batch: int = 64, progress: bool = True,
) -> ViewCache:
    """Open the cache of these photos' views, building it first (the only time the teacher runs) if absent.

    Every photo must be readable: callers drop undetected or unreadable photos beforehand."""
    keys = [p.key for p in photos]
    by_key = {p.key: p for p in photos}
    ordered = sorted(by_key)
    folder = cache_folder(root, teacher, teacher_name, student_geometry, views, seed, jitter, keys)
    if (folder / "meta.json").is_file():
        return open_view_cache(folder)
    teacher.eval()
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    geometries = (geometry_of(teacher), student_geometry)
    size, rows = student_geometry.size, len(photos) * views
    student = np.memmap(tmp / "student.u8", dtype=np.uint8, mode="w+", shape=(max(rows, 1), size, size, 3))
    teacher_rows: list[np.ndarray] = []
    pending: list[np.ndarray] = []
    bar = tqdm(total=rows, desc=f"teacher views ({teacher_name})", unit="view", disable=not progress)
    try:
        for index, photo in enumerate(photos):
            image = photo.image()
            for v in range(views):
                view = draw_view(seed, photo.key, v, jitter)
                teacher_crop, student_crop = view_crops(image, photo.landmarks, view, geometries, student_geometry)
                if view.own < 1.0:
                    teacher_crop, student_crop = _blended(
                        (teacher_crop, student_crop), _partner(by_key, ordered, photo.key, view.partner_draw), view, geometries, student_geometry)
                student[index * views + v] = student_crop
                pending.append(teacher_crop)
            if len(pending) >= batch or index == len(photos) - 1:
                teacher_rows.append(_embed(teacher, pending))
                bar.update(len(pending))
                pending = []
        bar.close()
        student.flush()
        del student
        embeddings = np.concatenate(teacher_rows) if teacher_rows else np.zeros((0, 1), np.float32)
        embeddings.astype(np.float32).tofile(tmp / "teacher.f32")
        meta = {
            "version": CACHE_VERSION, "teacher": teacher_name, "teacher_geometry": geometries[0].key,
            "student_geometry": student_geometry.key, "student_size": size, "teacher_dim": int(embeddings.shape[1]),
            "views": views, "seed": seed, "jitter": asdict(jitter), "keys": keys,
        }
        (tmp / "meta.json").write_text(json.dumps(meta))
        for name in ("student.u8", "teacher.f32", "meta.json"):
            with open(tmp / name, "rb") as handle:
                os.fsync(handle.fileno())
        try:
            os.rename(tmp, folder)
        except OSError:  # another process completed the same cache first: use theirs
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return open_view_cache(folder)
