"""Detect, align and cache: paths of photos in, faces aligned to a backbone's geometry out.

Images without a face are never dropped silently: each one keeps a status that the
caller reports by file name. For a dataset whose photos are already roughly centred
(LFW deep-funneled), a miss can be rescued with the median landmarks of the detected
photos of the same size; that crop is marked `fallback` and callers decide whether
to use it (evaluation does and counts it; training does not).

Detection does not depend on the geometry, so a geometry's cache misses first reuse the
landmarks (and statuses) that the same detector's 112x112 ArcFace cache already holds; the detector runs only on
photos no cache has seen.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from facecore.align.cache import (
    STATUS_FALLBACK,
    STATUS_NOFACE,
    STATUS_OK,
    STATUS_UNREADABLE,
    AlignedFaceCache,
    CacheEntry,
)
from facecore.align.detector import Detection
from facecore.align.detectors import FaceDetector, detector_name, detector_version, load_detector
from facecore.align.geometry import ARCFACE_112, FaceGeometry
from facecore.align.photos import load_rgb
from facecore.align.template import warp_to_template
from facecore.paths import cache_root

MIN_DETECTIONS_FOR_FALLBACK = 8


@dataclass(frozen=True)
class AlignedSet:
    paths: tuple[Path, ...]
    statuses: tuple[str, ...]
    faces: np.ndarray  # (K,size,size,3) uint8, one row per usable input, in input order
    kept: np.ndarray  # (K,) indices into `paths` of the rows of `faces`

    def with_status(self, status: str) -> list[Path]:
        return [p for p, s in zip(self.paths, self.statuses) if s == status]

    def summary(self) -> str:
        counts = {s: self.statuses.count(s) for s in (STATUS_OK, STATUS_FALLBACK, STATUS_NOFACE, STATUS_UNREADABLE)}
        return (
            f"{len(self.paths)} images: {counts[STATUS_OK]} aligned, {counts[STATUS_FALLBACK]} without a detected face "
            f"(fallback crop), {counts[STATUS_NOFACE]} without a face, {counts[STATUS_UNREADABLE]} unreadable"
        )


def aligner_version(geometry: FaceGeometry = ARCFACE_112, detector: str | None = None) -> str:
    """Names a crop: the detector's version (nets and settings) and the geometry."""
    return f"{detector_version(detector)}-{geometry.key}-v1"


def default_cache(geometry: FaceGeometry = ARCFACE_112, detector: str | None = None) -> AlignedFaceCache:
    return AlignedFaceCache(cache_root() / f"aligned-{aligner_version(geometry, detector)}", size=geometry.size)


def file_key(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class FaceAligner:
    def __init__(
        self, cache: AlignedFaceCache | None = None, detector: FaceDetector | str | None = None, batch_size: int = 64,
        geometry: FaceGeometry = ARCFACE_112, landmark_source: AlignedFaceCache | None = None,
    ) -> None:
        """`detector`: a loaded detector, or a name (see `facecore.align.detectors`), loaded on first use."""
        if cache is not None and cache.row_shape != geometry.row_shape:
            raise ValueError(f"cache rows {cache.row_shape} do not fit geometry {geometry.key} {geometry.row_shape}")
        self._cache = cache
        self.detector_name = detector.name if detector is not None and not isinstance(detector, str) else detector_name(detector)
        self._detector = None if detector is None or isinstance(detector, str) else detector
        self.batch_size = batch_size
        self.geometry = geometry
        self._landmark_source = landmark_source
        # Only the default caches are known to sit side by side; a caller's own cache brings its own source.
        self._reuse_default_detections = cache is None and landmark_source is None and geometry != ARCFACE_112

    @property
    def cache(self) -> AlignedFaceCache:
        # Lazy: a device that only aligns in memory (align_image) never creates a cache on disk.
        if self._cache is None:
            self._cache = default_cache(self.geometry, self.detector_name)
        return self._cache

    @property
    def landmark_source(self) -> AlignedFaceCache | None:
        """The ArcFace 112 cache beside this one, whose detections a new geometry reuses."""
        if self._landmark_source is None and self._reuse_default_detections:
            self._landmark_source = default_cache(ARCFACE_112, self.detector_name)
        return self._landmark_source

    @property
    def detector(self) -> FaceDetector:
        if self._detector is None:
            self._detector = load_detector(self.detector_name)
        return self._detector

    def with_geometry(self, geometry: FaceGeometry) -> FaceAligner:
        """This aligner for another crop, sharing its loaded detector (in-memory use: no cache)."""
        if geometry == self.geometry:
            return self
        return FaceAligner(detector=self._detector or self.detector_name, batch_size=self.batch_size, geometry=geometry)

    def align_image(self, image: np.ndarray) -> tuple[np.ndarray, Detection] | None:
        """One in-memory RGB image -> (aligned face, detection), uncached; None if no face."""
        (detection,) = self.detector.detect([image])
        if detection is None:
            return None
        return self.warp(image, detection.landmarks), detection

    def warp(self, image: np.ndarray, landmarks: np.ndarray) -> np.ndarray:
        face, _ = warp_to_template(image, landmarks, self.geometry.size, self.geometry.points)
        return face

    def align_paths(
        self, paths: Sequence[str | Path], allow_fallback: bool = False, progress: bool = True, desc: str = "aligning faces"
    ) -> AlignedSet:
        files = tuple(Path(p) for p in paths)
        keys = [file_key(p) for p in files]
        entries = self.cache.lookup(keys)
        todo = [i for i, k in enumerate(keys) if k not in entries]
        if todo and self.landmark_source is not None:
            entries.update(self.cache.add(self._rewarp_known([files[i] for i in todo], [keys[i] for i in todo])))
            todo = [i for i in todo if keys[i] not in entries]
        from tqdm import tqdm  # here: a device's enroll imports this module, yet aligns in memory (align_image)

        bar = tqdm(total=len(todo), desc=desc, unit="img", disable=not progress or not todo)
        for start in range(0, len(todo), self.batch_size):
            chunk = todo[start : start + self.batch_size]
            items = self._align_chunk([files[i] for i in chunk], [keys[i] for i in chunk])
            entries.update(self.cache.add([(key, face, entry) for key, face, entry, _ in items]))
            if self.landmark_source is not None:  # later geometries then reuse these detections too
                self.landmark_source.add([(key, arcface, entry) for key, _, entry, arcface in items])
            bar.update(len(chunk))
            bar.set_postfix(no_face=sum(entries[keys[i]].status != STATUS_OK for i in todo[: start + len(chunk)]))
        bar.close()
        statuses = tuple(entries[k].status for k in keys)
        usable = {STATUS_OK, STATUS_FALLBACK} if allow_fallback else {STATUS_OK}
        kept = np.array([i for i, s in enumerate(statuses) if s in usable], dtype=np.int64)
        rows = [entries[keys[i]].row for i in kept]
        faces = self.cache.faces(rows) if rows else np.zeros((0, *self.geometry.row_shape), np.uint8)
        return AlignedSet(files, statuses, faces, kept)

    def _align_chunk(self, paths: list[Path], keys: list[str]) -> list[tuple[str, np.ndarray | None, CacheEntry, np.ndarray | None]]:
        """(key, face in this geometry, entry, face in the landmark source's ArcFace 112 crop)."""
        images = [load_rgb(p) for p in paths]
        readable = [i for i, im in enumerate(images) if im is not None]
        detections = dict(zip(readable, self.detector.detect([image for image in images if image is not None]))) if readable else {}
        typical = _typical_landmarks([(images[i].shape, d) for i, d in detections.items() if d is not None])  # type: ignore[union-attr]
        items: list[tuple[str, np.ndarray | None, CacheEntry, np.ndarray | None]] = []
        for i, (path, key) in enumerate(zip(paths, keys)):
            image = images[i]
            if image is None:
                items.append((key, None, CacheEntry(-1, STATUS_UNREADABLE, 0.0, None, f"cannot decode {path.name}"), None))
                continue
            detection = detections[i]
            if detection is not None:
                landmarks, entry = detection.landmarks, CacheEntry(-1, STATUS_OK, detection.score, _points(detection.landmarks))
            elif image.shape in typical:
                landmarks, entry = typical[image.shape], CacheEntry(-1, STATUS_FALLBACK, 0.0, _points(typical[image.shape]))
            else:
                items.append((key, None, CacheEntry(-1, STATUS_NOFACE, 0.0, None), None))
                continue
            arcface = warp_to_template(image, landmarks)[0] if self.landmark_source is not None else None
            items.append((key, self.warp(image, landmarks), entry, arcface))
        return items

    def _rewarp_known(self, paths: list[Path], keys: list[str]) -> list[tuple[str, np.ndarray | None, CacheEntry]]:
        """Entries for the photos whose detection the landmark source already holds."""
        assert self.landmark_source is not None
        known = self.landmark_source.lookup(keys)
        items: list[tuple[str, np.ndarray | None, CacheEntry]] = []
        for path, key in zip(paths, keys):
            entry = known.get(key)
            if entry is None:
                continue
            if entry.landmarks is None:  # no face or unreadable: the verdict does not depend on the crop
                items.append((key, None, entry))
                continue
            image = load_rgb(path)
            if image is None:
                continue
            items.append((key, self.warp(image, np.asarray(entry.landmarks)), entry))
        return items


def _typical_landmarks(found: list[tuple[tuple[int, ...], Detection]]) -> dict[tuple[int, ...], np.ndarray]:
    by_shape: dict[tuple[int, ...], list[np.ndarray]] = {}
    for shape, detection in found:
        by_shape.setdefault(shape, []).append(detection.landmarks)
    return {s: np.median(np.stack(v), axis=0) for s, v in by_shape.items() if len(v) >= MIN_DETECTIONS_FOR_FALLBACK}


def _points(landmarks: np.ndarray) -> tuple[tuple[float, float], ...]:
    return tuple((float(x), float(y)) for x, y in landmarks)
