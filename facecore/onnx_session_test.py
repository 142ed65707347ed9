"""A model file's optimised graph is saved once and reloaded with the same outputs, its weights mapped from a
file of their own; a bad or unwritable cache only costs the saving."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from facecore import onnx_session
from facecore.onnx_session import GRAPH, WEIGHTS, open_session


def _conv_net(path: Path, seed: int = 0) -> Path:
    """Two 3x3 convolutions (3 -> 16 -> 32 channels, what the NCHWc pass rewrites) and a global average."""
    rng = np.random.default_rng(seed)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
               for name, shape in (("w1", (16, 3, 3, 3)), ("w2", (32, 16, 3, 3)))]
    nodes = [helper.make_node("Conv", ["image", "w1"], ["a"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Conv", ["b", "w2"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c"], ["d"]), helper.make_node("Flatten", ["d"], ["features"])]
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 24, 24])],
                              [helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, 32])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


IMAGE = np.random.default_rng(1).standard_normal((1, 3, 24, 24)).astype(np.float32)


def _features(session: ort.InferenceSession) -> np.ndarray:
    return np.asarray(session.run(None, {"image": IMAGE})[0])


def _saved(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if not p.name.startswith("."))


def test_the_second_session_loads_the_saved_graph_and_computes_the_same(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare
    model, cache = _conv_net(tmp_path / "net.onnx"), tmp_path / "cache"
    first = _features(open_session(model, cache=cache))
    (saved,) = _saved(cache)
    monkeypatch.setattr(onnx_session, "_build_and_save", lambda *_: pytest.fail("optimised again"))
    # Execute
    second = _features(open_session(model, cache=cache))
    # Assert: bit for bit, from the one saved graph, named for the source's sha256, this onnxruntime and this CPU
    assert np.array_equal(first, second)
    assert _saved(cache) == [saved] and not list(cache.glob(".*"))
    assert onnx_session.cpu_key() in saved.name and "-t1-" in saved.name


def test_another_model_file_is_not_served_the_first_ones_graph(tmp_path: Path) -> None:
    # Prepare
    cache = tmp_path / "cache"
    one, other = _conv_net(tmp_path / "one.onnx", seed=0), _conv_net(tmp_path / "other.onnx", seed=1)
    open_session(one, cache=cache)
    # Execute
    features = _features(open_session(other, cache=cache))
    # Assert
    assert np.array_equal(features, _features(open_session(other, cache=tmp_path / "fresh")))
    assert len(_saved(cache)) == 2


def test_the_saved_weights_are_a_file_of_their_own_which_the_session_maps(tmp_path: Path) -> None:
    # Prepare
    model, cache = _conv_net(tmp_path / "net.onnx"), tmp_path / "cache"
    expected = _features(open_session(model, cache=cache))
    (saved,) = _saved(cache)
    # Execute
    session = open_session(model, cache=cache)
    # Assert: the conv weights left the graph, and the session reads them from the file's pages, not a copy
    assert (saved / WEIGHTS).stat().st_size > (saved / GRAPH).stat().st_size
    assert np.array_equal(_features(session), expected)
    maps = Path("/proc/self/maps")
    if maps.exists():  # Linux: where the device runs
        assert str((saved / WEIGHTS).resolve()) in maps.read_text()


@pytest.mark.parametrize("damage", [lambda data: data[: len(data) // 2], lambda data: b"not a model", lambda data: None],
                         ids=["cut short", "overwritten", "gone"])
@pytest.mark.parametrize("part", [GRAPH, WEIGHTS])
def test_a_damaged_saved_graph_is_replaced_and_the_session_is_right(tmp_path: Path, damage: object, part: str) -> None:
    # Prepare: one of the saved files cut short, overwritten or gone
    model, cache = _conv_net(tmp_path / "net.onnx"), tmp_path / "cache"
    expected = _features(open_session(model, cache=cache))
    (saved,) = _saved(cache)
    good = (saved / part).read_bytes()
    damaged = damage(good)  # type: ignore[operator]
    if damaged is None:
        (saved / part).unlink()
    else:
        (saved / part).write_bytes(damaged)
    # Execute
    features = _features(open_session(model, cache=cache))
    # Assert
    assert np.array_equal(features, expected)
    assert (saved / part).read_bytes() == good


def test_an_unwritable_cache_only_means_no_saving(tmp_path: Path) -> None:
    # Prepare: the cache's place is taken by a file
    model, cache = _conv_net(tmp_path / "net.onnx"), tmp_path / "cache"
    cache.write_text("")
    # Execute / Assert
    assert _features(open_session(model, cache=cache)).shape == (1, 32)


def test_onnx_bytes_are_never_saved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare
    model = _conv_net(tmp_path / "net.onnx")
    monkeypatch.setenv("FEDFACE_CACHE", str(tmp_path / "cache"))
    # Execute
    features = _features(open_session(model.read_bytes()))
    # Assert
    assert features.shape == (1, 32) and not (tmp_path / "cache" / onnx_session.OPTIMIZED_DIR).exists()


def test_the_folder_keeps_the_most_recently_used_graphs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare
    monkeypatch.setattr(onnx_session, "KEEP", 2)
    cache = tmp_path / "cache"
    models = [_conv_net(tmp_path / f"net{k}.onnx", seed=k) for k in range(3)]
    # Execute
    for model in models:
        open_session(model, cache=cache)
    # Assert
    assert len(_saved(cache)) == 2


def test_a_graph_saved_in_the_earlier_one_file_format_is_deleted(tmp_path: Path) -> None:
    # Prepare: a file beside the folders, as one graph with its weights inside was saved before
    cache = tmp_path / "cache"
    cache.mkdir()
    earlier = cache / f"{'0' * 32}-ort{ort.__version__}-t1-{onnx_session.cpu_key()}.onnx"
    earlier.write_bytes(b"an earlier saved graph")
    # Execute
    open_session(_conv_net(tmp_path / "net.onnx"), cache=cache)
    # Assert
    assert not earlier.exists() and len(_saved(cache)) == 1
