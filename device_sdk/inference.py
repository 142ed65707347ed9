"""On-device inference with onnxruntime on the shipped ONNX backbone (or the personal verifier's graph).

Imports no torch: verification (device_sdk.verify) runs on numpy, PIL and onnxruntime only.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from facecore.errors import FaceCoreError
from facecore.onnx_session import open_session
from facecore.pixels import PIXEL_MEAN, PIXEL_STD


class OnnxEmbedder:
    """Embeds aligned faces of the size the model's input declares (its manifest's `input.shape`
    and `geometry.size`: 112 for MobileFaceNet, 150 for the dlib ResNet); nothing else about the
    architecture is read. `model`: a file, or the ONNX bytes themselves (the personal verifier's
    graph, which lives only inside the sealed personal.enc, and so is never saved optimised)."""

    def __init__(self, model: str | Path | bytes, threads: int = 1, sha256: str | None = None) -> None:
        # A file's optimised graph is saved once and reloaded by later processes (facecore.onnx_session);
        # `sha256`: the file's, when the caller has just checked it, so it is not hashed twice.
        self.session = open_session(model, threads, sha256)
        model_input = self.session.get_inputs()[0]
        self.input_name = model_input.name
        _, channels, height, width = model_input.shape
        if channels != 3 or not isinstance(height, int) or height != width:
            where = "the ONNX model" if isinstance(model, bytes) else str(model)
            raise FaceCoreError(f"{where}: expected an input of shape (batch, 3, size, size), got {model_input.shape}")
        self.size: int = height

    def embed(self, faces: np.ndarray, batch: int = 32) -> np.ndarray:
        """(N,size,size,3) uint8 aligned faces -> (N,D) L2-normalised float32 embeddings."""
        if faces.ndim != 4 or faces.shape[1:] != (self.size, self.size, 3):
            raise FaceCoreError(f"this model embeds ({self.size},{self.size},3) aligned faces, got rows of shape {faces.shape[1:]}")
        if len(faces) == 0:
            return np.zeros((0, self.session.get_outputs()[0].shape[1]), np.float32)
        out = []
        for start in range(0, len(faces), batch):
            x = (faces[start : start + batch].astype(np.float32) - PIXEL_MEAN) / PIXEL_STD
            out.append(self.session.run(None, {self.input_name: np.ascontiguousarray(x.transpose(0, 3, 1, 2))})[0])
        features = np.concatenate(out)
        return features / np.linalg.norm(features, axis=1, keepdims=True)
