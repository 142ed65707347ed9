"""torch backbone -> ONNX (fp32) and static per-channel int8, with atomic file writes."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import torch

from facecore.models.preprocess import faces_to_tensor

OPSET = 17
INPUT_NAME = "faces"
OUTPUT_NAME = "embedding"


@contextmanager
def staged_file(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; it replaces `path` only if the block succeeds."""
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    try:
        yield Path(temp)
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)


def export_fp32(model: torch.nn.Module, path: Path) -> Path:
    """Dynamic batch axis, opset 17, constant-folded (BatchNorm folds into the convolutions)."""
    model = model.float().eval().to(memory_format=torch.contiguous_format)
    example = torch.zeros(1, 3, model.input_size, model.input_size)
    with staged_file(path) as temp:
        torch.onnx.export(
            model, (example,), str(temp), dynamo=False, opset_version=OPSET, do_constant_folding=True,
            input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
            dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
        )
        graph = rewrite_prelu(onnx.load(str(temp)))
        onnx.checker.check_model(graph, full_check=True)
        onnx.save(graph, str(temp))
    return path


FLOAT_PRELU_TAG = "/prelu_float_"  # names the nodes of a PRelu that int8 must keep in float


def rewrite_prelu(model: onnx.ModelProto) -> onnx.ModelProto:
    """Replace each PRelu(x, a) by a * x + Relu((1 - a) * x): two depthwise 1x1 convolutions, a Relu, an Add.

    onnxruntime's PRelu broadcasts its per-channel slope generically and cannot stay in the
    blocked (NCHWc) or NHWC int8 layouts its convolutions use; its 33 PRelus took 38% of
    mobilefacenet's fp32 time at batch 1. As convolutions, the optimizer fuses the Relu and the Add
    into them, and int8 quantizes each slope per channel and never leaves uint8. Measured side by
    side with `fedface bench export` (1 thread, batch 1): fp32 11.6 -> 6.9 ms (torch eager 14.7 ms),
    int8 9.7 -> 6.0 ms. The identity needs 1 - a >= 0; a PRelu with a slope above 1, or one whose
    slope is not a per-channel constant, falls back to Relu(x) + a * (x - Relu(x)), kept in float."""
    constants = {init.name: init for init in model.graph.initializer}
    nodes = []
    for node in model.graph.node:
        if node.op_type != "PRelu":
            nodes.append(node)
            continue
        (x, slope), out, name = node.input, node.output[0], node.name or node.output[0]
        values = onnx.numpy_helper.to_array(constants[slope]).astype(np.float32) if slope in constants else None
        if values is not None and values.ndim == 3 and values.shape[1:] == (1, 1) and (values <= 1).all():
            nodes += _prelu_as_convolutions(model, x, values.reshape(-1), out, name)
        else:
            nodes += _prelu_in_float(x, slope, out, name)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    used = {name for node in nodes for name in node.input}
    unused = [init for init in model.graph.initializer if init.name not in used]  # the slopes now in conv weights
    for init in unused:
        model.graph.initializer.remove(init)
    return model


def _prelu_as_convolutions(model: onnx.ModelProto, x: str, slope: np.ndarray, out: str, name: str) -> list[onnx.NodeProto]:
    channels = len(slope)
    model.graph.initializer.extend([
        onnx.numpy_helper.from_array(slope.reshape(channels, 1, 1, 1), f"{name}/linear_weight"),
        onnx.numpy_helper.from_array((1 - slope).reshape(channels, 1, 1, 1), f"{name}/positive_weight"),
    ])
    depthwise = {"group": channels, "kernel_shape": [1, 1]}
    return [
        onnx.helper.make_node("Conv", [x, f"{name}/linear_weight"], [f"{name}/linear"], name=f"{name}/prelu_linear", **depthwise),
        onnx.helper.make_node("Conv", [x, f"{name}/positive_weight"], [f"{name}/scaled"], name=f"{name}/prelu_scaled", **depthwise),
        onnx.helper.make_node("Relu", [f"{name}/scaled"], [f"{name}/positive"], name=f"{name}/prelu_relu"),
        onnx.helper.make_node("Add", [f"{name}/linear", f"{name}/positive"], [out], name=f"{name}/prelu_add"),
    ]


def _prelu_in_float(x: str, slope: str, out: str, name: str) -> list[onnx.NodeProto]:
    tag = f"{name}{FLOAT_PRELU_TAG}"
    return [
        onnx.helper.make_node("Relu", [x], [f"{name}/pos"], name=f"{tag}relu"),
        onnx.helper.make_node("Sub", [x, f"{name}/pos"], [f"{name}/neg"], name=f"{tag}sub"),
        onnx.helper.make_node("Mul", [f"{name}/neg", slope], [f"{name}/scaled"], name=f"{tag}mul"),
        onnx.helper.make_node("Add", [f"{name}/pos", f"{name}/scaled"], [out], name=f"{tag}add"),
    ]


class _FaceCalibration:
    """onnxruntime CalibrationDataReader over aligned uint8 faces."""

    def __init__(self, faces: np.ndarray, batch: int = 16) -> None:
        self._batches = iter([faces_to_tensor(faces[i : i + batch]).contiguous().numpy() for i in range(0, len(faces), batch)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        batch = next(self._batches, None)
        return None if batch is None else {INPUT_NAME: batch}


def float_nodes(model: onnx.ModelProto) -> list[str]:
    """The nodes of fallback PRelus: quantized, their per-channel slopes become one uint8 tensor,
    and with them in uint8 the int8 model lost 9 LFW points (mean cosine to torch 0.59, measured)."""
    return [n.name for n in model.graph.node if FLOAT_PRELU_TAG in n.name]


def quantize_int8(fp32_path: Path, path: Path, calibration_faces: np.ndarray) -> Path:
    """Static per-channel quantization (QOperator), calibrated on real aligned faces.

    Every convolution is quantized, depthwise ones included: once the PRelus are convolutions too,
    the graph stays uint8 from end to end, and keeping the depthwise 3x3 convolutions in float
    was slower (6.45 vs 6.13 ms, measured side by side)."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
        prepared = Path(scratch) / "prepared.onnx"
        quant_pre_process(str(fp32_path), str(prepared), skip_symbolic_shape=True)
        with staged_file(path) as temp:
            quantize_static(
                str(prepared), str(temp), _FaceCalibration(calibration_faces),
                quant_format=QuantFormat.QOperator, per_channel=True, activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax,
                nodes_to_exclude=float_nodes(onnx.load(str(prepared))),
            )
            onnx.checker.check_model(onnx.load(str(temp)))
    return path


def ort_session(path: Path, threads: int = 1, profile_prefix: str | None = None):  # type: ignore[no-untyped-def]
    """The session devices run; with `profile_prefix`, onnxruntime's profiler records every kernel
    (`session.end_profiling()` writes the JSON)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if profile_prefix is not None:
        options.enable_profiling, options.profile_file_prefix = True, profile_prefix
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def ort_embed(session, faces: np.ndarray, batch: int = 64) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Raw (un-normalised) embeddings from an ONNX session, same input convention as torch."""
    out = [session.run(None, {INPUT_NAME: faces_to_tensor(faces[i : i + batch]).contiguous().numpy()})[0] for i in range(0, len(faces), batch)]
    return np.concatenate(out)
