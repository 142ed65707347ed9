"""1,000 devices against the real server process, 10% of them dropping mid-upload."""
from __future__ import annotations

import pytest

from fedface_bench.server import bench_round


@pytest.mark.slow
def test_a_thousand_devices_with_ten_percent_dropping_mid_upload_lose_nothing() -> None:
    # Execute: real uvicorn process, SQLite, signed uploads; 100 devices send half a body and vanish,
    # then the operator closes the round
    result = bench_round(1000, 16, "mobilefacenet_s", drop_fraction=0.1)
    # Assert: the round completes with exactly the 900 accepted updates, no server error
    assert result["dropped_mid_upload"] == 100
    assert result["accepted"] == 900 and result["status_codes"] == {"201": 900, "0": 100}
    assert result["round_status"] == "completed"
    assert result["round_summary"]["n_updates"] == 900 and result["lost"] == 0
    assert result["server_errors"] == []
