"""torch backbone -> ONNX (fp32) and static per-channel int8, with atomic file writes."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from facecore.align.geometry import geometry_of
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
    """Dynamic batch axis, opset 17, constant-folded (BatchNorm folds into the convolutions).

    The input is the backbone's crop (`geometry_of(model).size`, 112 for MobileFaceNet, 150 for
    the dlib ResNet). Three rewrites keep onnxruntime in its blocked (NCHWc) float layout and in
    uint8 once quantized: PReLUs become convolutions (`rewrite_prelu`), pad amounts the tracer
    computed from tensor shapes become constants (`fold_shape_arithmetic`), and zero padding
    becomes an identity 1x1 convolution (`rewrite_zero_pad`)."""
    model = model.float().eval().to(memory_format=torch.contiguous_format)
    size = geometry_of(model).size
    example = torch.zeros(1, 3, size, size)
    with staged_file(path) as temp:
        torch.onnx.export(
            model, (example,), str(temp), dynamo=False, opset_version=OPSET, do_constant_folding=True,
            input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
            dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
        )
        graph = rewrite_zero_pad(fold_shape_arithmetic(rewrite_prelu(onnx.load(str(temp)))))
        onnx.checker.check_model(graph, full_check=True)
        onnx.save(graph, str(temp))
    return path


def fold_shape_arithmetic(model: onnx.ModelProto) -> onnx.ModelProto:
    """Make each Pad's amounts a constant when they do not depend on the batch size.

    torch's tracer records `F.pad(x, (0, a.shape[3] - b.shape[3], ...))` as Shape, Gather, Sub,
    Concat, Slice... nodes evaluated on every run (the dlib ResNet's down blocks pad this way).
    With a fixed crop size they are constants: they are evaluated here at batch 1 and batch 2 and
    replaced by one initializer when both agree; the nodes only they used are dropped."""
    import onnxruntime as ort

    initializers = {init.name for init in model.graph.initializer}
    computed = sorted({n.input[1] for n in model.graph.node if n.op_type == "Pad" and len(n.input) > 1 and n.input[1] and n.input[1] not in initializers})
    if not computed:
        return model
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    probe.graph.output.extend(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.INT64, None) for name in computed)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    (graph_input,) = [i for i in model.graph.input if i.name not in initializers]
    dims = [d.dim_value for d in graph_input.type.tensor_type.shape.dim]
    if not all(dims[1:]):
        return model  # only the batch axis may be dynamic for the values to be constants
    at_batch = [session.run(None, {graph_input.name: np.zeros((batch, *dims[1:]), np.float32)}) for batch in (1, 2)]
    for name, one, two in zip(computed, *at_batch):
        if np.array_equal(one, two):
            model.graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(one, np.int64), name))
    return _drop_dead_nodes(model)


def _drop_dead_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Remove the nodes (and initializers) no graph output depends on; an initializer wins over
    the node that used to compute the same name."""
    initializers = {init.name for init in model.graph.initializer}
    needed = {out.name for out in model.graph.output}
    kept = []
    for node in reversed(model.graph.node):
        outputs = [o for o in node.output if o]
        if any(o in needed for o in outputs) and not all(o in initializers for o in outputs):
            kept.append(node)
            needed.update(i for i in node.input if i)
    del model.graph.node[:]
    model.graph.node.extend(reversed(kept))
    for init in [init for init in model.graph.initializer if init.name not in needed]:
        model.graph.initializer.remove(init)
    return model


def rewrite_zero_pad(model: onnx.ModelProto) -> onnx.ModelProto:
    """Replace each zero-valued, constant-amount Pad of a 4-D float tensor by a 1x1 convolution
    with identity weights: the spatial amounts become the convolution's pads, channels added at
    the start or end become output channels with zero weights (a depthwise convolution when
    no channel is added). The result is exact (x * 1 + 0).

    onnxruntime has no blocked-layout Pad: each one sent the tensor back to plain NCHW, and with
    it the residual Add and Relu of every later block (the dlib ResNet's shortcut widens with
    zero channels; its last two down blocks pad the convolution path by a row and a column).
    As a convolution, the optimizer fuses the following Add and Relu into it: the dlib ResNet's fp32
    graph went from 25 layout changes (ReorderInput/ReorderOutput) to 1, its int8 graph from 5 Pads
    and 7 Transposes to none and 3. The dense identity costs C_in x C_out multiply-adds per pixel
    (at most 0.6M in the dlib ResNet). Its time is dominated by 3x3 convolutions either way, so the
    gain is small: measured side by side (1 thread, batch 1, 600 runs each, interleaved), fp32
    10.44 -> 10.25 ms, int8 2.67 -> 2.61 ms."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {
        v.name: (v.type.tensor_type.elem_type, [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim])
        for v in (*inferred.graph.value_info, *inferred.graph.input)
    }
    constants = {init.name: onnx.numpy_helper.to_array(init) for init in model.graph.initializer}
    nodes = []
    for node in model.graph.node:
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        data = node.input[0] if node.input else ""
        elem_type, dims = shapes.get(data, (None, []))
        pads = constants.get(node.input[1]) if len(node.input) > 1 else None
        value = constants.get(node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros(())
        if (
            node.op_type != "Pad" or attributes.get("mode", b"constant") != b"constant" or len(node.input) > 3
            or elem_type != onnx.TensorProto.FLOAT or len(dims) != 4 or dims[1] is None
            or pads is None or pads.shape != (8,) or (pads < 0).any() or pads[0] or pads[4] or value is None or np.any(value != 0)
        ):
            nodes.append(node)
            continue
        (_, c_begin, top, left, _, c_end, bottom, right), channels = pads.tolist(), dims[1]
        name = node.name or node.output[0]
        if c_begin or c_end:
            weight = np.zeros((c_begin + channels + c_end, channels, 1, 1), np.float32)
            weight[np.arange(channels) + c_begin, np.arange(channels)] = 1.0
            group = 1
        else:
            weight, group = np.ones((channels, 1, 1, 1), np.float32), channels
        model.graph.initializer.append(onnx.numpy_helper.from_array(weight, f"{name}/identity_weight"))
        nodes.append(onnx.helper.make_node(
            "Conv", [data, f"{name}/identity_weight"], list(node.output), name=f"{name}/pad_as_conv",
            kernel_shape=[1, 1], pads=[top, left, bottom, right], group=group,
        ))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return _drop_dead_nodes(model)


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
    depthwise: dict[str, Any] = {"group": channels, "kernel_shape": [1, 1]}
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
