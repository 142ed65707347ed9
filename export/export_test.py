"""Export of the bundled default model on real faces: parity, manifest, bad input, atomicity."""
import json
import os
from pathlib import Path

import numpy as np
import pytest

from export.bench import op_profile
from export.pipeline import ExportError, export_model, sha256
from facecore.errors import CheckpointError
from facecore.models import get_backbone
from facecore.models.checkpoint import MOBILE_MODEL, save_backbone


@pytest.fixture(scope="module")
def exported(real_data: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    assert MOBILE_MODEL.is_file(), "the package must bundle its default model"
    # two folds keep CI fast; `fedface export` itself scores all five evaluation folds
    return export_model("default", tmp_path_factory.mktemp("export"), real_data, int8=True, lfw_folds=(9, 10))


def test_fp32_and_int8_meet_parity_on_real_faces(exported) -> None:  # type: ignore[no-untyped-def]
    # Assert
    metrics = exported.metrics
    assert metrics["parity_faces"] >= 200
    assert metrics["fp32_min_cos"] >= 0.9999
    assert metrics["int8_mean_cos"] >= 0.99
    assert metrics["int8_lfw_drop"] <= 0.5
    assert metrics["int8_bytes"] <= 1.5e6


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
    assert not [p for p in exported.out_dir.iterdir() if p.name.startswith(".")], "staging files left behind"


def test_mismatched_architecture_is_one_clear_error(tmp_path: Path, real_data: Path) -> None:
    # Prepare: a file that claims mobilefacenet but holds iresnet18 weights
    model = get_backbone("iresnet18")
    model.name = "mobilefacenet"
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
    with pytest.raises(RuntimeError):
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
