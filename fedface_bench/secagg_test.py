"""The SecAgg benchmark's byte counts and both timing modes, at toy sizes."""
from fedface_bench.secagg import (
    ADVERT_BYTES,
    SHARE_CIPHERTEXT_BYTES,
    UNMASK_SHARE_BYTES,
    bytes_per_device,
    run_secagg_bench,
)


def test_byte_counts_follow_the_messages() -> None:
    # Execute
    sizes = bytes_per_device(10, 1000, 0.1)
    # Assert: keys + 9 encrypted share pairs + 4-byte masked words + 9 unmasking shares
    assert sizes["secagg_up"] == ADVERT_BYTES + 9 * SHARE_CIPHERTEXT_BYTES + 4000 + 9 * UNMASK_SHARE_BYTES
    assert sizes["plain_up_fp16"] == 2000 and sizes["plain_up_fp32"] == 4000


def test_the_full_protocol_row_checks_its_sum_and_larger_rows_are_marked_extrapolated() -> None:
    # Execute
    rows = run_secagg_bench((12, 30), dim=2000, drop=0.25, full_protocol_max=12)["rows"]
    # Assert
    assert rows[0]["mode"] == "full protocol" and rows[0]["max_abs_error"] <= rows[0]["error_bound"]
    assert rows[1]["mode"] == "extrapolated from timed units" and rows[1]["server_unmask_s"] > 0
    assert rows[1]["up_ratio_vs_fp32"] > rows[0]["up_ratio_vs_fp32"] > 1
