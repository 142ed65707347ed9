"""A server refusal becomes the SDK exception its `code` names, whatever its `detail` says; without a
known code, only the HTTP status types it."""
from __future__ import annotations

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from device_sdk.errors import NotEnrolled, RoundClosed, ServerRefused
from device_sdk.transport import Transport
from facecore.federation.protocol import ErrorCode

# Says the opposite of the codes below: a mapping that read the text would get these wrong.
MISLEADING = "round 3 is not accepting this request; device is not enrolled"


def _refused(body: dict[str, str]) -> ServerRefused:
    transport = Transport("http://fedface.invalid", retries=0)
    transport.http = httpx.Client(base_url="http://fedface.invalid",
                                  transport=httpx.MockTransport(lambda request: httpx.Response(409, json=body)))
    with pytest.raises(ServerRefused) as refused:
        transport.request("POST", "/v1/rounds/current/checkin", Ed25519PrivateKey.generate(), "d" * 32)
    return refused.value


@pytest.mark.parametrize(("code", "kind", "other"), [
    (ErrorCode.NOT_ENROLLED, NotEnrolled, RoundClosed),
    (ErrorCode.STALE_ROUND, RoundClosed, NotEnrolled),
])
def test_a_refusal_is_typed_by_its_code_not_its_text(code: ErrorCode, kind: type[Exception], other: type[Exception]) -> None:
    # Execute
    refused = _refused({"detail": MISLEADING, "code": code})
    # Assert
    assert isinstance(refused, kind) and not isinstance(refused, other)
    assert refused.status == 409 and refused.code == code and refused.detail == MISLEADING


@pytest.mark.parametrize("body", [{"detail": MISLEADING}, {"detail": MISLEADING, "code": "a_code_from_a_newer_server"}])
def test_without_a_known_code_only_the_status_types_a_refusal(body: dict[str, str]) -> None:
    # Execute
    refused = _refused(body)
    # Assert
    assert type(refused) is ServerRefused and refused.status == 409
