"""What a round's check-in may ask of the upload: a bit width this device sends, or a one-line refusal."""
from __future__ import annotations

import pytest

from device_sdk.errors import BadServerResponse
from device_sdk.rounds import upload_bits


def test_a_round_asks_for_fp16_8_or_4_bits_and_nothing_else() -> None:
    assert [upload_bits(local) for local in ({}, {"upload_bits": None}, {"upload_bits": 8}, {"upload_bits": 4})] == [None, None, 8, 4]
    for hostile in (3, 16, True, "4", 4.0 + 1e-9):
        with pytest.raises(BadServerResponse, match="bits"):
            upload_bits({"upload_bits": hostile})
