"""Export of both architectures on real faces (the bundled MobileFaceNet at 112x112, the dlib ResNet with
its published weights at 150x150): parity, graph, manifest and its geometry, bad input, atomicity."""
import json
import os
from pathlib import Path

import numpy as np
import pytest

from export.pipeline import ExportError, export_model, sha256
from export.profile import op_profile
from facecore.align.geometry import ARCFACE_112, FaceGeometry
from facecore.errors import CheckpointError, FaceCoreError
from facecore.models import get_backbone
from facecore.models.checkpoint import BUNDLED_MODELS, load_backbone, save_backbone
from facecore.models.dlib_resnet import DLIB_GEOMETRY


@pytest.fixture(scope="module")
def exported(real_data: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    assert BUNDLED_MODELS["mobilefacenet"].is_file(), "the package must bundle its MobileFaceNet"
    # two folds (the fewest that choose thresholds on held-out folds) keep CI fast; `fedface export` scores all five
    return export_model("mobilefacenet", tmp_path_factory.mktemp("export"), real_data, int8=True, lfw_folds=(9, 10))


@pytest.fixture(scope="module")
def exported_mobile(real_data: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    # the compact model: a cut of the dlib ResNet, shipped as int8 weights (pretrain/TEACHER_CUT.md)
    return export_model("mobile", tmp_path_factory.mktemp("export_mobile"), real_data, int8=True, lfw_folds=(9, 10))


@pytest.fixture(scope="module")
def exported_dlib(real_data: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    # the default model: the dlib ResNet with the weights `make` fetched from the npm registry
    return export_model("default", tmp_path_factory.mktemp("export_dlib"), real_data, int8=True, lfw_folds=(9, 10))


def _assert_parity(metrics: dict, int8_bytes: float) -> None:  # type: ignore[type-arg]
    """The bars every bundled model's export meets: fp32 as torch, int8 close, its LFW drop small, its file at most `int8_bytes`."""
    assert metrics["parity_faces"] >= 200
    assert metrics["fp32_min_cos"] >= 0.9999
    assert metrics["int8_mean_cos"] >= 0.99
    assert metrics["int8_lfw_drop"] <= 0.5
    assert metrics["int8_bytes"] <= int8_bytes


def test_fp32_and_int8_meet_parity_on_real_faces(exported) -> None:  # type: ignore[no-untyped-def]
    # Assert
    _assert_parity(exported.metrics, 1.5e6)


def test_the_profile_accounts_for_each_kernel_and_finds_the_prelu_nodes(exported) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    x = np.random.default_rng(0).standard_normal((1, 3, 112, 112)).astype(np.float32)
    # Execute
    fp32, int8 = (op_profile(exported.out_dir / name, x, runs=10) for name in ("model.onnx", "model.int8.onnx"))
    # Assert: kernel times add up, each engine has its own kernels, PReLU nodes are a real part of both
    for profile in (fp32, int8):
        assert profile["ms_per_run"] == pytest.approx(sum(profile["ms_by_op"].values()))
        assert 0 < profile["prelu_ms"] < profile["ms_per_run"]
    assert "Conv" in fp32["ms_by_op"] and not any(op.startswith("QLinear") for op in fp32["ms_by_op"])
    assert "QLinearConv" in int8["ms_by_op"] and "Conv" not in int8["ms_by_op"]


def test_manifest_describes_the_files_exactly(exported) -> None:  # type: ignore[no-untyped-def]
    # Execute
    manifest = json.loads((exported.out_dir / "manifest.json").read_text())
    # Assert
    for entry in manifest["files"].values():
        assert sha256(exported.out_dir / entry["path"]) == entry["sha256"]
    assert manifest["input"]["shape"] == ["batch", 3, 112, 112] and manifest["input"]["mean"] == 127.5
    assert manifest["embedding_dim"] == 128 and manifest["opset"] >= 17
    assert _geometry(manifest) == ARCFACE_112 and manifest["backbone"] == "mobilefacenet"
    assert not [p for p in exported.out_dir.iterdir() if p.name.startswith(".")], "staging files left behind"


def _geometry(manifest: dict) -> FaceGeometry:  # type: ignore[type-arg]
    return FaceGeometry.from_json(manifest["geometry"])


def test_dlib_resnet_meets_parity_on_its_own_150px_crops(exported_dlib) -> None:  # type: ignore[no-untyped-def]
    # Assert: the same bars as MobileFaceNet's (its int8 file is 4x smaller than fp32, not 1.5 MB)
    metrics = exported_dlib.metrics
    assert metrics["calibration_faces"] >= 200
    _assert_parity(metrics, 0.3 * metrics["fp32_bytes"])


def test_the_compact_model_meets_parity_on_the_teachers_crops(exported_mobile) -> None:  # type: ignore[no-untyped-def]
    # Assert: the bars of the other two; its weights were already rounded to int8 before export
    metrics = exported_mobile.metrics
    manifest = json.loads((exported_mobile.out_dir / "manifest.json").read_text())
    assert manifest["backbone"] == "dlib-resnet-w0.875-i0.625-short-last" and manifest["input"]["shape"] == ["batch", 3, 150, 150]
    _assert_parity(metrics, 0.3 * metrics["fp32_bytes"])


def test_dlib_resnet_manifest_carries_its_geometry(exported_dlib) -> None:  # type: ignore[no-untyped-def]
    # Execute
    manifest = json.loads((exported_dlib.out_dir / "manifest.json").read_text())
    # Assert: a device can rebuild the exact crop from the manifest alone
    assert manifest["backbone"] == "dlib-resnet" and manifest["embedding_dim"] == 128
    assert manifest["input"]["shape"] == ["batch", 3, 150, 150]
    assert manifest["input"]["mean"] == 127.5 and manifest["input"]["std"] == 127.5  # dlib's own normalisation is inside the graph
    assert manifest["geometry"]["key"] == DLIB_GEOMETRY.key and manifest["geometry"]["size"] == 150
    assert len(manifest["geometry"]["template"]) == len(manifest["geometry"]["landmarks"]) == 5
    assert _geometry(manifest) == DLIB_GEOMETRY
    assert DLIB_GEOMETRY.key in manifest["geometry"]["aligner"] and DLIB_GEOMETRY.key in manifest["input"]["alignment"]
    for entry in manifest["files"].values():
        assert sha256(exported_dlib.out_dir / entry["path"]) == entry["sha256"]


def test_dlib_resnet_graph_stays_in_the_fast_layouts(exported_dlib) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    import onnx

    fp32_file, int8_file = (exported_dlib.out_dir / name for name in ("model.onnx", "model.int8.onnx"))
    x = np.random.default_rng(0).standard_normal((1, 3, 150, 150)).astype(np.float32)
    # Execute
    written = {n.op_type for n in onnx.load(str(fp32_file)).graph.node}
    fp32, int8 = (op_profile(path, x, runs=3) for path in (fp32_file, int8_file))
    # Assert: no PReLU rewrite (plain ReLUs), no run-time shape arithmetic, zero padding written as convolutions
    assert not {"PRelu", "Pad", "Shape", "Gather", "Slice"} & written and "Relu" in written
    assert fp32["prelu_ms"] == 0 and int8["prelu_ms"] == 0
    # as run: float stays in the blocked layout from the first convolution to the global mean (one exit)
    assert "ReorderInput" not in fp32["nodes_by_op"] and fp32["nodes_by_op"].get("ReorderOutput", 0) <= 1
    assert fp32["nodes_by_op"]["Conv"] == 34 and "Pad" not in fp32["nodes_by_op"]
    # int8 stays uint8: every convolution quantized, each Add and pool too
    assert int8["nodes_by_op"]["QLinearConv"] == 34 and "Conv" not in int8["nodes_by_op"] and "Pad" not in int8["nodes_by_op"]
    assert int8["nodes_by_op"].get("DequantizeLinear", 0) <= 2


def test_the_device_embedder_takes_the_manifest_size(exported_dlib) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    from device_sdk.inference import OnnxEmbedder
    from facecore.models.preprocess import embed_faces

    faces = np.random.default_rng(0).integers(0, 256, (3, 150, 150, 3), dtype=np.uint8)
    embedder = OnnxEmbedder(exported_dlib.out_dir / "model.onnx")
    # Execute
    embeddings = embedder.embed(faces)
    # Assert
    assert embedder.size == exported_dlib.manifest["geometry"]["size"] == 150
    np.testing.assert_allclose((embeddings * embed_faces(load_backbone("default"), faces)).sum(1), 1.0, atol=1e-5)
    with pytest.raises(FaceCoreError, match=r"embeds \(150,150,3\) aligned faces"):
        embedder.embed(np.zeros((1, 112, 112, 3), np.uint8))
    assert embedder.embed(np.zeros((0, 150, 150, 3), np.uint8)).shape == (0, 128)


def test_mismatched_architecture_is_one_clear_error(tmp_path: Path, real_data: Path) -> None:
    # Prepare: a file that claims mobilefacenet but holds iresnet18 weights
    model = get_backbone("iresnet18")
    model.name = "mobilefacenet"  # type: ignore[assignment]  # Module types unknown attributes as Tensor | Module
    save_backbone(model, tmp_path / "wrong.pt")
    # Execute / Assert
    with pytest.raises(CheckpointError, match="weights do not fit backbone 'mobilefacenet'"):
        export_model(str(tmp_path / "wrong.pt"), tmp_path / "out", real_data)
    with pytest.raises(CheckpointError, match="does not exist"):
        export_model(str(tmp_path / "missing.pt"), tmp_path / "out", real_data)


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_output_directory_is_refused(tmp_path: Path, real_data: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(ExportError, match="not writable"):
        export_model("default", locked / "sub", real_data)


def test_output_directory_under_a_file_is_refused(tmp_path: Path, real_data: Path) -> None:
    # Prepare
    (tmp_path / "a_file").write_text("x")
    # Execute / Assert
    with pytest.raises(ExportError, match="cannot create output directory"):
        export_model("default", tmp_path / "a_file" / "out", real_data)


def test_a_failed_export_leaves_nothing_behind(tmp_path: Path, real_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: quantization blows up after model.onnx was already produced in staging
    import export.pipeline as pipeline

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("calibration crashed")

    monkeypatch.setattr(pipeline, "quantize_int8", broken)
    # Execute
    with pytest.raises(RuntimeError, match="^calibration crashed$"):
        export_model("default", tmp_path / "out", real_data, int8=True)
    # Assert
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize(
    ("slopes", "ops", "float_count"),
    [
        ([-0.3, 0.5], ["Conv", "Conv", "Relu", "Add"], 0),  # as mobilefacenet's: every slope <= 1
        ([-0.3, 1.5], ["Relu", "Sub", "Mul", "Add"], 4),  # a slope above 1 has no convolution form
    ],
)
def test_prelu_rewrite_computes_the_same_function(slopes: list[float], ops: list[str], float_count: int) -> None:
    # Prepare: a PRelu with per-channel slopes
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from export.onnx_model import FLOAT_PRELU_TAG, float_nodes, rewrite_prelu

    slope = numpy_helper.from_array(np.array(slopes, np.float32).reshape(2, 1, 1), "slope")
    graph = helper.make_graph(
        [helper.make_node("PRelu", ["x", "slope"], ["y"], name="act")], "prelu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 3])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 3, 3])],
        [slope],
    )
    original = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 3)).astype(np.float32)

    def run(model) -> np.ndarray:  # type: ignore[no-untyped-def]
        return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]

    expected = run(original)
    # Execute
    rewritten = rewrite_prelu(original)
    # Assert
    np.testing.assert_allclose(run(rewritten), expected, rtol=0, atol=1e-6)
    assert [n.op_type for n in rewritten.graph.node] == ops
    assert len(float_nodes(rewritten)) == float_count and all(FLOAT_PRELU_TAG in name for name in float_nodes(rewritten))


def test_zero_pad_rewrite_computes_the_same_function() -> None:
    # Prepare: zero channels added at the end and a row and column at the bottom right, as the dlib ResNet pads
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from export.onnx_model import rewrite_zero_pad

    graph = helper.make_graph(
        [helper.make_node("Pad", ["x", "widen"], ["w"], name="widen"), helper.make_node("Pad", ["w", "grow"], ["y"], name="grow")], "pads",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5, 4, 4])],
        [numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 3, 0, 0], np.int64), "widen"),
         numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64), "grow")],
    )
    original = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(0).standard_normal((2, 2, 3, 3)).astype(np.float32)

    def run(model) -> np.ndarray:  # type: ignore[no-untyped-def]
        return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]

    expected = run(original)
    # Execute
    rewritten = rewrite_zero_pad(original)
    # Assert: exact, two 1x1 convolutions (dense for the new channels, depthwise for the spatial padding)
    np.testing.assert_array_equal(run(rewritten), expected)
    assert [(n.op_type, next(a.i for a in n.attribute if a.name == "group")) for n in rewritten.graph.node] == [("Conv", 1), ("Conv", 5)]
