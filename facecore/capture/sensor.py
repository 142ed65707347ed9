"""What every simulated camera shares: sRGB <-> linear light, a face-shaped surface in the aligned crop,
and a photon-counting sensor.

Invariants:
- Pixels enter and leave as uint8 RGB of one aligned crop (`FaceGeometry`); all physics runs on
  float32 linear light in [0, 1].
- The surface is fixed by the crop's five template points, never by the photo: every face in one
  geometry gets the same head (an ellipsoid with a nose ridge), so a capture model's light falls
  the same way on every identity and only its sampled parameters vary.
- Noise is drawn from the generator passed in; nothing here keeps state.
"""
from __future__ import annotations

import numpy as np

from facecore.align.geometry import FaceGeometry


def to_linear(pixels: np.ndarray) -> np.ndarray:
    """uint8 sRGB to linear light in [0, 1] (the sRGB transfer curve)."""
    x = pixels.astype(np.float32) / 255.0
    return np.where(x <= 0.04045, x / 12.92, ((x + 0.055) / 1.055) ** 2.4).astype(np.float32)


def to_srgb(linear: np.ndarray) -> np.ndarray:
    """Linear light (clipped to [0, 1]) to uint8 sRGB."""
    x = np.clip(linear, 0.0, 1.0)
    encoded = np.where(x <= 0.0031308, x * 12.92, 1.055 * x ** (1 / 2.4) - 0.055)
    return np.clip(np.rint(encoded * 255.0), 0, 255).astype(np.uint8)


def inter_eye_pixels(geometry: FaceGeometry) -> float:
    left, right = geometry.points[0], geometry.points[1]
    return float(np.linalg.norm(right - left))


def head_depth(geometry: FaceGeometry) -> np.ndarray:
    """Height of the face towards the camera at every crop pixel, in crop pixels.

    An ellipsoid about as wide as two inter-eye distances and three tall, centred between the eyes
    and the mouth, plus a ridge from between the eyes to the nose tip. Outside the ellipse the depth
    falls to zero (background and hair receive the light but cast no shadow)."""
    points = geometry.points
    eye = inter_eye_pixels(geometry)
    eyes_mid, nose, mouth_mid = points[:2].mean(0), points[2], points[3:].mean(0)
    centre_x, centre_y = eyes_mid[0], (eyes_mid[1] + mouth_mid[1]) / 2
    half_width, half_height, depth = 1.05 * eye, 1.55 * eye, 0.95 * eye
    ys, xs = np.mgrid[0:geometry.size, 0:geometry.size].astype(np.float32) + 0.5
    inside = 1.0 - ((xs - centre_x) / half_width) ** 2 - ((ys - centre_y) / half_height) ** 2
    surface = depth * np.sqrt(np.clip(inside, 0.0, None))
    # The nose: a ridge whose height grows from the bridge to the tip, about a third of an eye distance.
    along = np.clip((ys - eyes_mid[1]) / max(nose[1] - eyes_mid[1], 1.0), 0.0, 1.0)
    beyond_tip = np.exp(-np.clip(ys - nose[1], 0.0, None) ** 2 / (2 * (0.12 * eye) ** 2))
    ridge_x = eyes_mid[0] + along * (nose[0] - eyes_mid[0])
    ridge = 0.35 * eye * along * beyond_tip * np.exp(-(xs - ridge_x) ** 2 / (2 * (0.13 * eye) ** 2))
    return (surface + ridge).astype(np.float32)


def surface_normals(depth: np.ndarray) -> np.ndarray:
    """(size, size, 3) unit normals (x right, y down, z towards the camera) of a depth map."""
    dz_dy, dz_dx = np.gradient(depth)
    normals = np.stack([-dz_dx, -dz_dy, np.ones_like(depth)], axis=-1)
    return (normals / np.linalg.norm(normals, axis=-1, keepdims=True)).astype(np.float32)


def light_direction(azimuth_deg: float, elevation_deg: float) -> np.ndarray:
    """A unit vector towards the light: azimuth from the camera axis (positive: image right), elevation
    upwards; Yale B's convention."""
    azimuth, elevation = np.radians(azimuth_deg), np.radians(elevation_deg)
    return np.array([np.sin(azimuth) * np.cos(elevation), -np.sin(elevation), np.cos(azimuth) * np.cos(elevation)], np.float32)


def lit_fraction(depth: np.ndarray, light: np.ndarray, steps: int = 48) -> np.ndarray:
    """1 where a pixel sees the light, 0 where the face between it and the light casts a shadow
    (the nose's shadow on the cheek, the far cheek behind the face): a march along the light's ray."""
    size = depth.shape[0]
    planar = float(np.hypot(light[0], light[1]))
    if planar < 1e-3:
        return np.ones_like(depth)
    step_x, step_y = light[0] / planar, light[1] / planar
    rise = light[2] / planar  # height gained per pixel walked towards the light
    ys, xs = np.mgrid[0:size, 0:size].astype(np.float32)
    lit = np.ones_like(depth)
    for step in range(1, steps + 1):
        sx = np.clip(np.rint(xs + step * step_x), 0, size - 1).astype(np.intp)
        sy = np.clip(np.rint(ys + step * step_y), 0, size - 1).astype(np.intp)
        lit = np.where(depth[sy, sx] > depth + step * rise + 0.5, 0.0, lit)
    return lit.astype(np.float32)


def photon_sensor(
    linear: np.ndarray, rng: np.random.Generator, electrons_at_white: float, read_noise: float, auto_exposure: float,
) -> np.ndarray:
    """Linear light through a sensor: Poisson photon noise at `electrons_at_white` electrons for a white
    pixel, Gaussian read noise in electrons, then the gain that brings the mean to `auto_exposure`
    (the camera's auto exposure, which amplifies the noise in a dark scene)."""
    electrons = rng.poisson(np.clip(linear, 0.0, None) * electrons_at_white).astype(np.float32)
    electrons += rng.normal(0.0, read_noise, size=electrons.shape).astype(np.float32)
    mean = max(float(electrons.mean()), 1e-3)
    return electrons * (auto_exposure / mean)
