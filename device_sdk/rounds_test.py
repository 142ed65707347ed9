"""What a round's check-in may ask of the upload and the download: a bit width this device sends or
downloads, or a one-line refusal."""
from __future__ import annotations

import pytest

from device_sdk.errors import BadServerResponse
from device_sdk.model_cache import download_precision
from device_sdk.rounds import upload_bits


def test_a_round_asks_for_fp16_8_or_4_bits_and_nothing_else() -> None:
    assert [upload_bits(local) for local in ({}, {"upload_bits": None}, {"upload_bits": 8}, {"upload_bits": 4})] == [None, None, 8, 4]
    for hostile in (3, 16, True, "4", 4.0 + 1e-9):
        with pytest.raises(BadServerResponse, match="bits"):
            upload_bits({"upload_bits": hostile})


def test_a_round_downloads_int8_where_it_asks_for_8_bits_and_the_devices_own_precision_otherwise() -> None:
    # Execute
    chosen = [download_precision(fp16, local) for fp16, local in ((True, {}), (False, {"download_bits": None}), (True, {"download_bits": 8}),
                                                                 (False, {"download_bits": 8}), (True, None))]
    # Assert
    assert chosen == ["fp16", "fp32", "int8", "int8", "fp16"]
    for hostile in (4, 16, True, "8", 8.5):
        with pytest.raises(BadServerResponse, match="^the round asks for a download of .* bits; this device downloads 8 or fp16$"):
            download_precision(True, {"download_bits": hostile})
