"""Property-based fuzzing of the real server process from its own OpenAPI document: no request
the schema allows, with or without the operator's token, may produce a 5xx. These requests are
unsigned, so device routes stop at 401; test_server_fuzz_auth.py fuzzes them signed."""
from __future__ import annotations

from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from server_process import ServerProcess

EXAMPLES_PER_OPERATION = 30


@pytest.mark.slow
def test_no_request_the_schema_allows_makes_the_server_fail(tmp_path: Path) -> None:
    # Prepare: a real server process and the schema it publishes
    # No per-address limit: otherwise after its burst of failed signatures every answer is the same 429.
    server = ServerProcess(tmp_path / "data", FEDFACE_ADDRESS_RATE_PER_S="0").start()
    try:
        schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
        admin = {"Authorization": f"Bearer {server.admin_token()}"}
        operations = [result.ok() for result in schema.get_all_operations()]
        calls: list[int] = []

        # Execute: every operation, fuzzed; admin operations carry the token so bodies get past auth
        for operation in operations:
            @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, suppress_health_check=list(HealthCheck), database=None)
            @given(case=operation.as_strategy())
            def call(case) -> None:  # type: ignore[no-untyped-def]
                headers = admin if case.path.startswith("/v1/admin") else None
                response = case.call(base_url=server.url, headers=headers, timeout=30)
                calls.append(response.status_code)
                # Assert
                assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:300]}"

            call()
    finally:
        server.stop()
    assert len(operations) >= 12 and len(calls) >= 10 * len(operations)
    assert "ERROR" not in server.log.read_text()
