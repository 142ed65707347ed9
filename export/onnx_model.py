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
        graph = decompose_prelu(onnx.load(str(temp)))
        onnx.checker.check_model(graph, full_check=True)
        onnx.save(graph, str(temp))
    return path


PRELU_TAG = "/prelu_"  # in the names of the nodes a PRelu became; int8 keeps them in float, as PRelu was


def decompose_prelu(model: onnx.ModelProto) -> onnx.ModelProto:
    """PRelu(x, a) -> Relu(x) + a * (x - Relu(x)): the same function, in ops onnxruntime runs well.

    onnxruntime's PRelu broadcasts its per-channel slope generically and cannot stay in the
    blocked (NCHWc) layout its convolutions use: on mobilefacenet at batch 1 its 33 PRelus took
    38% of the fp32 run time. Measured side by side with `fedface bench export` (1 thread, batch 1):
    fp32 18.0 -> 11.6 ms against torch eager's 16.7-18.4 ms, int8 15.9 -> 9.7 ms."""
    nodes = []
    for node in model.graph.node:
        if node.op_type != "PRelu":
            nodes.append(node)
            continue
        (x, slope), out, name = node.input, node.output[0], node.name or node.output[0]
        nodes += [
            onnx.helper.make_node("Relu", [x], [f"{name}/pos"], name=f"{name}{PRELU_TAG}relu"),
            onnx.helper.make_node("Sub", [x, f"{name}/pos"], [f"{name}/neg"], name=f"{name}{PRELU_TAG}sub"),
            onnx.helper.make_node("Mul", [f"{name}/neg", slope], [f"{name}/scaled"], name=f"{name}{PRELU_TAG}mul"),
            onnx.helper.make_node("Add", [f"{name}/pos", f"{name}/scaled"], [out], name=f"{name}{PRELU_TAG}add"),
        ]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


class _FaceCalibration:
    """onnxruntime CalibrationDataReader over aligned uint8 faces."""

    def __init__(self, faces: np.ndarray, batch: int = 16) -> None:
        self._batches = iter([faces_to_tensor(faces[i : i + batch]).contiguous().numpy() for i in range(0, len(faces), batch)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        batch = next(self._batches, None)
        return None if batch is None else {INPUT_NAME: batch}


def depthwise_convs(model: onnx.ModelProto) -> list[str]:
    return [n.name for n in model.graph.node if n.op_type == "Conv" and any(a.name == "group" and a.i > 1 for a in n.attribute)]


def float_nodes(model: onnx.ModelProto) -> list[str]:
    """Nodes the int8 model keeps in float: depthwise convolutions (see quantize_int8) and the
    decomposed PRelus, whose per-channel negative slopes lose 9 LFW points when their
    Mul/Add run in uint8 (mean cosine to torch 0.59, measured)."""
    return depthwise_convs(model) + [n.name for n in model.graph.node if PRELU_TAG in n.name]


def quantize_int8(fp32_path: Path, path: Path, calibration_faces: np.ndarray) -> Path:
    """Static per-channel quantization (QOperator), calibrated on real aligned faces.

    Depthwise convolutions stay fp32: onnxruntime's CPU int8 kernels for grouped convolutions
    are slower than its fp32 ones, and with them quantized the int8 model ran 0.86x the fp32
    speed at batch 1 (1.24x without them, measured side by side); they hold few weights anyway."""
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


def ort_session(path: Path, threads: int = 1):  # type: ignore[no-untyped-def]
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def ort_embed(session, faces: np.ndarray, batch: int = 64) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Raw (un-normalised) embeddings from an ONNX session, same input convention as torch."""
    out = [session.run(None, {INPUT_NAME: faces_to_tensor(faces[i : i + batch]).contiguous().numpy()})[0] for i in range(0, len(faces), batch)]
    return np.concatenate(out)
