"""On-device inference with onnxruntime on the shipped ONNX backbone."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from facecore.models.preprocess import PIXEL_MEAN, PIXEL_STD


class OnnxEmbedder:
    def __init__(self, model_path: str | Path, threads: int = 1) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name

    def embed(self, faces: np.ndarray, batch: int = 32) -> np.ndarray:
        """(N,112,112,3) uint8 aligned faces -> (N,D) L2-normalised float32 embeddings."""
        out = []
        for start in range(0, len(faces), batch):
            x = (faces[start : start + batch].astype(np.float32) - PIXEL_MEAN) / PIXEL_STD
            out.append(self.session.run(None, {self.input_name: np.ascontiguousarray(x.transpose(0, 3, 1, 2))})[0])
        features = np.concatenate(out)
        return features / np.linalg.norm(features, axis=1, keepdims=True)
