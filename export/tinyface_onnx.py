"""Build face-api.js's TinyFaceDetector as an ONNX file, from the npm package's weights.

Run by `fedface models fetch`, beside the recognition weights of the same package. The graphs are
written op by op from face-api.js 1.7.15's source (`src/tinyYolov2`):

- detector: conv 3x3 'valid' + leaky ReLU (0.1), then five depthwise-separable convs (padded by one,
  leaky), each followed by a 2x2 max pool ('same'; stride 2, the last stride 1), and a 1x1 conv to
  5 anchors x (x, y, w, h, score). Input (N, S, S, 3) uint8 RGB, S any multiple of 32; the graph
  feeds the nets (RGB - MEAN_RGB) / 255, as face-api.js does.

TF's 'same' padding puts the odd pixel at the bottom and right: ONNX's SAME_UPPER. Nothing here
needs torch; the folder is installed whole by `export.detector_folder`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from export.detector_folder import install_folder
from facecore.align.detector_files import DetectorCorrupt, DetectorMissing
from facecore.align.tiny_detector import (
    FORMAT,
    MEAN_RGB,
    NETS,
    SOURCE,
    tinyface_dir,
    tinyface_files,
)
from facecore.models.published import FACE_API, read_face_api_tensors

OPSET = 17
LEAK = 0.10000000149011612  # face-api.js's leaky ReLU slope, as float32


class _Graph:
    """Accumulates nodes and initialisers; names are generated in order."""

    def __init__(self, tensors: dict[str, np.ndarray]) -> None:
        self.tensors, self.nodes, self.weights = tensors, [], []  # type: ignore[var-annotated]
        self._count = 0

    def _name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def constant(self, hint: str, value: np.ndarray) -> str:
        name = self._name(hint)
        self.weights.append(numpy_helper.from_array(np.ascontiguousarray(value, np.float32), name))
        return name

    def op(self, kind: str, inputs: list[str], **attributes: Any) -> str:
        out = self._name(kind.lower())
        self.nodes.append(helper.make_node(kind, inputs, [out], **attributes))
        return out

    def conv(self, x: str, filters_hwio: np.ndarray, bias: np.ndarray) -> str:
        """A 'valid' convolution, stride 1."""
        weight = self.constant("w", filters_hwio.transpose(3, 2, 0, 1))
        return self.op("Conv", [x, weight, self.constant("b", bias)], strides=[1, 1])

    def separable(self, x: str, prefix: str) -> str:
        """A depthwise 3x3 convolution padded by one pixel, then a pointwise one with bias."""
        depthwise = self.tensors[f"{prefix}/depthwise_filter"]  # (3, 3, C, 1)
        channels = depthwise.shape[2]
        weight = self.constant("dw", depthwise.transpose(2, 3, 0, 1))  # (C, 1, 3, 3), one group per channel
        out = self.op("Conv", [x, weight], strides=[1, 1], group=channels, pads=[1, 1, 1, 1])
        return self.conv(out, self.tensors[f"{prefix}/pointwise_filter"], self.tensors[f"{prefix}/bias"])

    def pixels(self, mean: np.ndarray) -> str:
        """The uint8 (N, H, W, 3) input as face-api.js feeds its nets: (RGB - mean) / 255, channels first."""
        as_float = self.op("Cast", ["image"], to=TensorProto.FLOAT)
        centred = self.op("Sub", [as_float, self.constant("mean", mean.reshape(1, 1, 1, 3))])
        scaled = self.op("Div", [centred, self.constant("range", np.array(255.0))])
        return self.op("Transpose", [scaled], perm=[0, 3, 1, 2])

    def model(self, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto], name: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.weights)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="fedface")
        onnx.checker.check_model(model)
        return model


def detector_graph(tensors: dict[str, np.ndarray]) -> onnx.ModelProto:
    g = _Graph(tensors)
    out = g.op("LeakyRelu", [g.conv(g.pixels(MEAN_RGB), tensors["conv0/filters"], tensors["conv0/bias"])], alpha=LEAK)
    for index in range(1, 6):
        out = g.op("MaxPool", [out], kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_UPPER")
        out = g.op("LeakyRelu", [g.separable(out, f"conv{index}")], alpha=LEAK)
    out = g.op("MaxPool", [out], kernel_shape=[2, 2], strides=[1, 1], auto_pad="SAME_UPPER")
    last = g.conv(out, tensors["conv8/filters"], tensors["conv8/bias"])
    g.nodes.append(helper.make_node("Identity", [last], ["grid"]))
    image = helper.make_tensor_value_info("image", TensorProto.UINT8, ["batch", "height", "width", 3])
    grid = helper.make_tensor_value_info("grid", TensorProto.FLOAT, ["batch", 25, "rows", "cols"])
    return g.model([image], [grid], "tinyface_detector")


def export_tinyface_onnx(folder: Path | None = None, force: bool = False) -> Path:
    """The folder holding detector.onnx and manifest.json; built only when missing,
    corrupt or `force`d."""
    folder = folder or tinyface_dir()
    if not force:
        try:
            tinyface_files(folder)
            return folder
        except (DetectorMissing, DetectorCorrupt):
            pass
    graphs = {
        "detector": detector_graph(read_face_api_tensors("tiny_face_detector_model")),
    }
    assert set(graphs) == set(NETS)

    def write(staging: Path) -> dict[str, Path]:
        for name, graph in graphs.items():
            onnx.save(graph, str(staging / f"{name}.onnx"))
        return {name: staging / f"{name}.onnx" for name in graphs}

    install_folder(folder, write, {"format": FORMAT, "source": SOURCE, "package": FACE_API.spec, "opset": OPSET})
    tinyface_files(folder)
    return folder
