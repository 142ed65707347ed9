"""parse_update's one-pass norm and NaN/Inf check against a float64 reference."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest

from facecore import tensorfile
from server_api.errors import InvalidInput
from server_api.services.validation import parse_update

BASE = "ab" * 32
SPEC = {"a.weight": ("float32", [64, 3]), "a.num_batches_tracked": ("int64", []), "b.weight": ("float32", [500]), "c.bias": ("float32", [7])}


def _update(tensors: dict[str, np.ndarray]) -> bytes:
    entries = {f"backbone.{k}": v for k, v in tensors.items()}
    entries["class_embedding"] = np.full(4, 0.5, "<f4")
    return tensorfile.dumps(entries, {"fedface": json.dumps({"base_version": BASE, "n_samples": 3, "metrics": {}})})


def _parse(body: bytes, bound: float = 1e30):  # type: ignore[no-untyped-def]
    return parse_update(io.BytesIO(body), len(body), SPEC, 4, BASE, bound)


@pytest.mark.parametrize("wire", ["<f2", "<f4"])
def test_delta_norm_matches_float64(wire: str) -> None:
    # Prepare: float runs split by an integer buffer, as BatchNorm's step count splits a real model's
    rng = np.random.default_rng(0)
    tensors = {k: (rng.standard_normal(shape) * 0.01).astype(wire) if dtype.startswith("float") else np.zeros(shape, "<i8")
               for k, (dtype, shape) in SPEC.items()}
    expected = np.sqrt(sum(np.square(v.astype(np.float64)).sum() for v in tensors.values()))
    # Execute
    parsed = _parse(_update(tensors))
    # Assert
    assert parsed.delta_norm == pytest.approx(expected, rel=1e-6)


def test_nan_is_refused_naming_its_tensor() -> None:
    # Prepare: NaN in the last tensor of a run of three
    tensors = {k: np.zeros(shape, "<f4") if dtype.startswith("float") else np.zeros(shape, "<i8") for k, (dtype, shape) in SPEC.items()}
    tensors["c.bias"][5] = np.nan
    # Execute / Assert
    with pytest.raises(InvalidInput, match=r"backbone\.c\.bias contains NaN or Inf"):
        _parse(_update(tensors))


def test_finite_values_whose_squares_overflow_float32_are_not_called_infinite() -> None:
    # Prepare: 1e20 is a valid float32, its square is not
    tensors = {k: np.zeros(shape, "<f4") if dtype.startswith("float") else np.zeros(shape, "<i8") for k, (dtype, shape) in SPEC.items()}
    tensors["b.weight"][0] = 1e20
    # Execute / Assert: measured in float64, then refused by the bound, not as NaN
    assert _parse(_update(tensors)).delta_norm == pytest.approx(1e20, rel=1e-6)
    with pytest.raises(InvalidInput, match="exceeds the bound"):
        _parse(_update(tensors), bound=1e3)


@pytest.mark.parametrize(
    "fedface_meta",
    [
        '{"base_version": ' + "[" * 100_000 + "}",
        '{"base_version": "' + BASE + '", "n_samples": ' + "7" * 5000 + "}",
        json.dumps({"base_version": BASE, "n_samples": 3, "metrics": {"m" * 100_000: 1.0}}),
    ],
    ids=["100k nested brackets", "5000-digit integer", "100k-character metric name"],
)
def test_hostile_metadata_is_one_short_invalid_input(fedface_meta: str) -> None:
    # Prepare: a well-formed tensor file whose metadata string is hostile
    tensors = {f"backbone.{k}": np.zeros(shape, "<f4" if dtype.startswith("float") else "<i8")
               for k, (dtype, shape) in SPEC.items()}
    body = tensorfile.dumps(tensors | {"class_embedding": np.full(4, 0.5, "<f4")}, {"fedface": fedface_meta})
    # Execute
    with pytest.raises(InvalidInput, match="^update metadata invalid at ") as caught:
        _parse(body)
    # Assert
    assert "metadata" in str(caught.value) and len(str(caught.value)) < 400


def test_a_frozen_prefix_round_takes_its_trained_entries_alone_or_every_entry_and_nothing_between() -> None:
    # Prepare: a backbone of two blocks and a head; with one trainable block the trained entries are blocks.1 and the head
    spec = {"stem.weight": ("float32", [8]), "blocks.0.weight": ("float32", [8]), "blocks.0.bn.num_batches_tracked": ("int64", []),
            "blocks.1.weight": ("float32", [8]), "head.weight": ("float32", [4])}
    every = {k: np.full(shape, 0.1, "<f4") if dtype.startswith("float") else np.zeros(shape, "<i8") for k, (dtype, shape) in spec.items()}
    trained = {k: every[k] for k in ("blocks.1.weight", "head.weight")}

    def parse(tensors: dict[str, np.ndarray], blocks: int | None) -> float:
        body = _update(tensors)
        return parse_update(io.BytesIO(body), len(body), spec, 4, BASE, 1e30, blocks).delta_norm

    # Execute / Assert
    assert parse(trained, 1) == pytest.approx(np.sqrt(12 * 0.01), rel=1e-6)  # the frozen prefix sends nothing
    assert parse(every, 1) == pytest.approx(np.sqrt(28 * 0.01), rel=1e-6)  # an older device's whole file still parses
    with pytest.raises(InvalidInput, match=r"missing \['backbone.blocks.1.weight'\]"):
        parse({"head.weight": trained["head.weight"]}, 1)
    with pytest.raises(InvalidInput, match="missing"):
        parse(trained, None)  # a round that trains everything wants every entry
    with pytest.raises(InvalidInput, match="unexpected"):
        parse({**trained, "blocks.1.extra": np.zeros(2, "<f4")}, 1)


@pytest.mark.parametrize("bits", [8, 4])
def test_a_quantised_update_is_measured_as_aggregation_reads_it_and_a_bad_scale_is_refused(bits: int) -> None:
    # Prepare
    from facecore.federation.quantize import quantized_update

    rng = np.random.default_rng(bits)
    deltas = {k: (rng.standard_normal(shape) * 0.01).astype("<f4") if dtype.startswith("float") else np.zeros(shape, "<i8")
              for k, (dtype, shape) in SPEC.items()}
    tensors, received, _ = quantized_update(deltas, bits)
    expected = np.sqrt(sum(np.square(v.astype(np.float64)).sum() for v in received.values()))

    def parse(entries: dict[str, np.ndarray]) -> float:
        body = tensorfile.dumps(entries | {"class_embedding": np.full(4, 0.5, "<f4")},
                                {"fedface": json.dumps({"base_version": BASE, "n_samples": 3, "metrics": {}})})
        return parse_update(io.BytesIO(body), len(body), SPEC, 4, BASE, 1e30).delta_norm

    # Execute / Assert
    assert parse(tensors) == pytest.approx(expected, rel=1e-6)
    with pytest.raises(InvalidInput, match="negative, NaN or Inf scale"):
        parse(tensors | {"scale.b.weight": -tensors["scale.b.weight"]})
    with pytest.raises(InvalidInput, match="I8 or U8"):
        parse(tensors | {"backbone.b.weight": deltas["b.weight"]})


@pytest.mark.parametrize("bits", [8, 4])
def test_the_largest_codes_in_long_rows_are_measured_exactly(bits: int) -> None:
    # Prepare: every code at its top (127 or 7) in rows of 100,000, the square sums an int16 would overflow
    from facecore.federation.quantize import quantized_update

    spec = {"w": ("float32", [3, 100_000])}
    top = 127 if bits == 8 else 7
    tensors, received, _ = quantized_update({"w": np.full((3, 100_000), -0.25, "<f4")}, bits)
    body = tensorfile.dumps(tensors | {"class_embedding": np.full(4, 0.5, "<f4")},
                            {"fedface": json.dumps({"base_version": BASE, "n_samples": 3, "metrics": {}})})

    # Execute
    norm = parse_update(io.BytesIO(body), len(body), spec, 4, BASE, 1e30).delta_norm

    # Assert: 300,000 codes of top x scale, with scale = 0.25 / top as the device chose it
    scale = float(np.float32(0.25) / np.float32(top))
    assert norm == pytest.approx(np.sqrt(300_000 * (top * scale) ** 2), rel=1e-12)
    assert norm == pytest.approx(np.sqrt(np.square(received["w"].astype(np.float64)).sum()), rel=1e-6)  # received: float32 products


@pytest.mark.parametrize("bits", [8, 4])
def test_any_codes_an_attacker_packs_are_measured_as_aggregation_dequantizes_them(bits: int) -> None:
    # Prepare: codes no device sends (-128 at 8 bits, the nibble 0 = -8 at 4), in rows of even and odd width
    # (odd: a byte holds the end of one row and the start of the next), over reused buffers of other sizes
    from facecore.federation.quantize import dequantize

    rng = np.random.default_rng(bits)
    spec = {"even": ("float32", [5, 6]), "odd": ("float32", [3, 5]), "long": ("float32", [2, 4096])}
    tensors: dict[str, np.ndarray] = {}
    reference = 0.0
    for name, (_, shape) in spec.items():
        count = int(np.prod(shape))
        sent = (rng.integers(-128, 128, count, dtype=np.int8).reshape(shape) if bits == 8
                else rng.integers(0, 256, (count + 1) // 2, dtype=np.uint8))
        scale = rng.uniform(0.5, 2.0, shape[0]).astype("<f4")
        tensors |= {f"backbone.{name}": sent, f"scale.{name}": scale}
        reference += float(np.square(dequantize(sent, scale, tuple(shape)).astype(np.float64)).sum())
    body = tensorfile.dumps(tensors | {"class_embedding": np.full(4, 0.5, "<f4")},
                            {"fedface": json.dumps({"base_version": BASE, "n_samples": 3, "metrics": {}})})

    # Execute: twice, so the second reads through buffers the first sized
    norms = [parse_update(io.BytesIO(body), len(body), spec, 4, BASE, 1e30).delta_norm for _ in range(2)]

    # Assert: float32 products of code and scale, as aggregation reads them, against exact integer sums
    assert norms[0] == norms[1] == pytest.approx(np.sqrt(reference), rel=1e-6)
