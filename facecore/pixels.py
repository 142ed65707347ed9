"""The pixel convention every backbone, exporter and device shares: RGB uint8 scaled to [-1, 1].

Kept free of torch, so a device that only runs ONNX models (device_sdk.inference) reads the same
two numbers as training does (facecore.models.preprocess re-exports them).
"""
from __future__ import annotations

# As in insightface's ArcFace recipes. The ONNX manifest publishes these numbers.
PIXEL_MEAN = 127.5
PIXEL_STD = 127.5
