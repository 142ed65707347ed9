"""Fleet cameras as capture models: what a device's sensor does to a face the web photos never showed.

Invariants:
- A capture model maps an aligned uint8 RGB crop to the crop the fleet's camera would have given of
  the same face, in the same geometry, so alignment, caches and every backbone stay as they are.
  It acts on the aligned crop: the detector is not part of what is simulated.
- Each photo's parameters are drawn from ranges written from the sensor's physics (the `RANGES`
  tables, also in the README) by a generator seeded with (seed, stream, photo index): the same
  photo in the same stream is always captured the same way, across arms, runs and machines.
- `lowlight-ir` returns grey crops (three equal channels), as a near-infrared sensor gives.
"""
from __future__ import annotations

import io
from abc import ABC, abstractmethod
from collections.abc import Mapping
from functools import lru_cache
from typing import ClassVar

import numpy as np
from PIL import Image

from facecore.align.geometry import FaceGeometry
from facecore.capture.sensor import head_depth, inter_eye_pixels, light_direction, lit_fraction, photon_sensor, surface_normals, to_linear, to_srgb
from facecore.errors import FaceCoreError

Parameters = dict[str, float]


class UnknownCapture(FaceCoreError):
    pass


class CaptureModel(ABC):
    name: ClassVar[str]
    summary: ClassVar[str]
    # Bumped whenever what `render` does changes: cached captured photos and results name it.
    version: ClassVar[int] = 1
    # parameter -> (low, high): each photo draws uniformly in between.
    RANGES: ClassVar[Mapping[str, tuple[float, float]]]

    def sample(self, rng: np.random.Generator) -> Parameters:
        return {key: float(rng.uniform(low, high)) for key, (low, high) in self.RANGES.items()}

    @abstractmethod
    def render(self, face: np.ndarray, geometry: FaceGeometry, parameters: Parameters, rng: np.random.Generator) -> np.ndarray:
        """One aligned crop as this camera takes it; `rng` draws the sensor noise."""

    def capture(self, faces: np.ndarray, geometry: FaceGeometry, seed: int, stream: int = 0) -> np.ndarray:
        """Every crop of `faces` (n, size, size, 3) through this camera; photo i draws from (seed, stream, i)."""
        if faces.ndim != 4 or faces.shape[1:] != geometry.row_shape:
            raise ValueError(f"capture needs aligned crops of shape (n, {geometry.size}, {geometry.size}, 3), got {faces.shape}")
        out = np.empty_like(faces)
        for index, face in enumerate(faces):
            rng = np.random.default_rng([seed, stream, index])
            out[index] = self.render(face, geometry, self.sample(rng), rng)
        return out


@lru_cache(maxsize=8)
def _head(geometry: FaceGeometry) -> tuple[np.ndarray, np.ndarray]:
    depth = head_depth(geometry)
    return depth, surface_normals(depth)


class LowLightIR(CaptureModel):
    """A near-infrared face-unlock or cabin camera at night: one strong light from the side, little else.

    Skin reflects near infrared mostly as it reflects red (less melanin and blood contrast), so the
    grey albedo is the photo's linear light weighted towards red. The light is a point source at
    `azimuth` degrees to one side (`side` < 0.5: image left) and `elevation` degrees up; it shades the
    head Lambertian-wise and the head casts its own shadows. `ambient` is the fill that reaches the far
    side (the camera's own weak emitter), as a fraction of the direct light. Few photons reach the
    sensor (`electrons` for a white pixel), read noise adds a few electrons, and auto exposure gains
    the mean up to `exposure`, noise included."""

    name = "lowlight-ir"
    summary = "grey near-infrared sensor, one strong side light, low light and its noise"
    NIR_FROM_RGB: ClassVar[np.ndarray] = np.array([0.70, 0.25, 0.05], np.float32)
    RANGES = {
        "side": (0.0, 1.0), "azimuth": (35.0, 80.0), "elevation": (-10.0, 30.0), "ambient": (0.03, 0.15),
        "electrons": (60.0, 300.0), "read_noise": (2.0, 4.0), "exposure": (0.16, 0.24),
    }

    def render(self, face: np.ndarray, geometry: FaceGeometry, parameters: Parameters, rng: np.random.Generator) -> np.ndarray:
        depth, normals = _head(geometry)
        albedo = to_linear(face) @ self.NIR_FROM_RGB
        azimuth = parameters["azimuth"] if parameters["side"] >= 0.5 else -parameters["azimuth"]
        light = light_direction(azimuth, parameters["elevation"])
        direct = np.clip(normals @ light, 0.0, None) * lit_fraction(depth, light)
        ambient = parameters["ambient"]
        scene = albedo * (ambient + (1.0 - ambient) * direct)
        grey = photon_sensor(scene, rng, parameters["electrons"], parameters["read_noise"], parameters["exposure"])
        return np.repeat(to_srgb(grey)[..., None], 3, axis=-1)


class FarCamera(CaptureModel):
    """A fixed camera that sees the face small: `inter_eye` pixels between the eyes on its sensor.

    The lens blurs with a Gaussian spot of `blur` sensor pixels (defocus and diffraction), each sensor
    pixel integrates the light over its area, daylight gives `electrons` per white pixel with read
    noise, and the camera stores JPEG at `quality`. The aligner then enlarges the small face back to
    the crop with bilinear interpolation, as it does for any small face."""

    name = "far"
    summary = "a face 24-40 px between the eyes, lens blur, sensor noise, JPEG"
    RANGES = {"inter_eye": (24.0, 40.0), "blur": (0.5, 1.2), "electrons": (300.0, 1500.0), "read_noise": (2.0, 4.0), "quality": (30.0, 70.0)}

    def render(self, face: np.ndarray, geometry: FaceGeometry, parameters: Parameters, rng: np.random.Generator) -> np.ndarray:
        scale = min(1.0, parameters["inter_eye"] / inter_eye_pixels(geometry))
        small = max(8, round(geometry.size * scale))
        linear = _gaussian_blur(to_linear(face), parameters["blur"] / scale)
        sensor = np.stack([np.asarray(Image.fromarray(linear[..., c], mode="F").resize((small, small), Image.Resampling.BOX))
                           for c in range(3)], axis=-1)
        exposure = float(sensor.mean())
        noisy = photon_sensor(sensor, rng, parameters["electrons"], parameters["read_noise"], exposure)
        stored = io.BytesIO()
        Image.fromarray(to_srgb(noisy)).save(stored, format="JPEG", quality=round(parameters["quality"]))
        decoded = Image.open(stored).convert("RGB")
        return np.asarray(decoded.resize((geometry.size, geometry.size), Image.Resampling.BILINEAR))


def _gaussian_blur(image: np.ndarray, sigma: float) -> np.ndarray:
    """Separable Gaussian blur of an (h, w, c) float image, edges reflected."""
    radius = max(1, int(np.ceil(3 * sigma)))
    taps = np.exp(-np.arange(-radius, radius + 1, dtype=np.float32) ** 2 / (2 * sigma ** 2))
    taps /= taps.sum()
    padded = np.pad(image, ((radius, radius), (0, 0), (0, 0)), mode="reflect")
    image = np.tensordot(np.lib.stride_tricks.sliding_window_view(padded, 2 * radius + 1, axis=0), taps, axes=([-1], [0]))
    padded = np.pad(image, ((0, 0), (radius, radius), (0, 0)), mode="reflect")
    image = np.tensordot(np.lib.stride_tricks.sliding_window_view(padded, 2 * radius + 1, axis=1), taps, axes=([-1], [0]))
    return image.astype(np.float32)


CAPTURES: dict[str, CaptureModel] = {model.name: model for model in (LowLightIR(), FarCamera())}


def get_capture(name: str) -> CaptureModel:
    if name not in CAPTURES:
        raise UnknownCapture(f"unknown capture model {name!r}: choose one of {', '.join(CAPTURES)}")
    return CAPTURES[name]
