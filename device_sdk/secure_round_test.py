"""A malicious server against the device's secure-aggregation steps: the device must refuse a
threshold that lets the server rebuild one update, an unmasking request with one survivor, and
must not agree keys with a low-order point."""
from __future__ import annotations

import base64
from typing import Any

import pytest

from device_sdk.secure_round import SecureRound
from facecore.federation.secagg import SecAggAborted, SecAggClient


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


class ScriptedServer:
    """Answers every request with the next scripted state and records what the device sent. A
    member list carries the device's own advert at its index, and comes with the count of selected
    devices it was drawn from (its own length unless scripted), as an honest server's does, unless
    `as_listed`."""

    def __init__(self, states: list[dict[str, Any]], as_listed: bool = False) -> None:
        self.states, self.sent, self.as_listed = list(states), list[tuple[str, str, Any]](), as_listed

    def __call__(self, method: str, path: str, body: Any = None, expect: tuple[int, ...] = (200,)) -> Any:
        self.sent.append((method, path, body))
        state = self.states.pop(0)
        advert = next((b for _, p, b in self.sent if p.endswith("/advert")), None)
        if "members" in state and advert is not None and not self.as_listed:
            state = state | {"members": [m | advert if m["index"] == state["index"] else m for m in state["members"]]}
            state = {"selected": len(state["members"])} | state
        return type("Response", (), {"json": staticmethod(lambda: state)})()


def _members(n: int, extra: dict[int, bytes] | None = None) -> list[dict[str, Any]]:
    members = []
    for index in range(1, n + 1):
        advert = SecAggClient(index, 2).advertise()
        c_public = (extra or {}).get(index, advert.c_public)
        members.append({"index": index, "c_public": _b64(c_public), "s_public": _b64(advert.s_public)})
    return members


@pytest.mark.parametrize(("threshold", "n_members"), [(1, 3), (2, 4), (4, 3)], ids=["t=1", "t=n/2", "t>n"])
def test_the_device_refuses_an_unsafe_threshold_before_sharing_anything(threshold: int, n_members: int) -> None:
    # Prepare: the server says the key-sharing step is open with a threshold it chose
    server = ScriptedServer([
        {"round_id": 7, "phase": "advertise", "index": 1},
        {"round_id": 7, "phase": "share_keys", "index": 1, "threshold": threshold, "members": _members(n_members)},
    ])
    # Execute / Assert
    with pytest.raises(SecAggAborted, match=f"refusing threshold t={threshold}"):
        SecureRound(server, "/v1/rounds/7/secagg", poll=0).join()
    assert [path for _, path, _ in server.sent] == ["/v1/rounds/7/secagg/advert", "/v1/rounds/7/secagg"]  # no shares left the device


def test_the_device_does_not_unmask_for_a_single_survivor() -> None:
    # Prepare: a device that took part with 3 key sharers, then the server claims everyone else dropped
    round_ = SecureRound(ScriptedServer([]), "/v1/rounds/7/secagg", poll=0)
    round_.client.index, round_.client.threshold, round_.key_sharers = 1, 2, [1, 2, 3]
    round_.request = ScriptedServer([{"round_id": 7, "phase": "unmask", "survived": [1], "dropped": [2, 3], "answered": False}])
    # Execute / Assert: revealing the others' s keys and its own b would publish its update alone
    with pytest.raises(SecAggAborted, match="1 survivor"):
        round_.unmask()


def test_a_member_with_a_low_order_key_is_treated_as_dropped() -> None:
    # Prepare: member 3's encryption key is the all-zero point
    server = ScriptedServer([
        {"round_id": 7, "phase": "advertise", "index": 1},
        {"round_id": 7, "phase": "share_keys", "index": 1, "threshold": 3, "members": _members(4, {3: bytes(32)})},
        {"round_id": 7, "phase": "share_keys", "index": 1},
    ])
    # Execute: the device shares keys, then waits; the scripted server has nothing more to say
    with pytest.raises(IndexError, match="^pop from empty list$"):
        SecureRound(server, "/v1/rounds/7/secagg", poll=0).join()
    # Assert: shares went to members 2 and 4 only, none to the low-order key
    shares = next(body for method, path, body in server.sent if path.endswith("/shares"))["shares"]
    assert sorted(shares) == ["2", "4"]


def test_the_device_refuses_a_member_list_with_a_repeated_key() -> None:
    # Prepare: member 3 advertised member 2's encryption key (a server that let it, or forged the list)
    members = _members(3)
    members[2]["c_public"] = members[1]["c_public"]
    server = ScriptedServer([
        {"round_id": 7, "phase": "advertise", "index": 1},
        {"round_id": 7, "phase": "share_keys", "index": 1, "threshold": 2, "members": members},
    ])
    # Execute / Assert: refused before any share leaves the device
    with pytest.raises(SecAggAborted, match="appears twice"):
        SecureRound(server, "/v1/rounds/7/secagg", poll=0).join()
    assert not any(path.endswith("/shares") for _, path, _ in server.sent)


def test_the_device_refuses_its_own_keys_under_another_index() -> None:
    # Prepare: the server lists this device's advert as member 2, and a key of its own at the device's index 1
    server = ScriptedServer([
        {"round_id": 7, "phase": "advertise", "index": 1},
        {"round_id": 7, "phase": "share_keys", "index": 1, "threshold": 2, "members": _members(3)},
    ], as_listed=True)
    round_ = SecureRound(server, "/v1/rounds/7/secagg", poll=0)
    mine = round_.client.advertise()  # the keys join() will advertise, which the server replays as member 2
    server.states[1]["members"][1] |= {"c_public": _b64(mine.c_public), "s_public": _b64(mine.s_public)}
    # Execute / Assert
    with pytest.raises(SecAggAborted, match="at its index 1 alone"):
        round_.join()
    assert not any(path.endswith("/shares") for _, path, _ in server.sent)



@pytest.mark.parametrize(("selected", "min_members", "refusal"), [
    (3, 2, "member list of 4: the server publishes 3 selected"),
    (None, 2, "member list of 4: the server publishes None selected"),
    (4, 5, "round of 4 members: this device takes part only with at least 5"),
], ids=["more-members-than-selected", "no-selected-count", "below-the-owner-floor"])
def test_the_device_refuses_a_membership_it_cannot_reconcile_before_sharing_anything(
        selected: int | None, min_members: int, refusal: str) -> None:
    # Prepare: 4 members listed beside a published count of selected devices, or none
    server = ScriptedServer([
        {"round_id": 7, "phase": "advertise", "index": 1},
        {"round_id": 7, "phase": "share_keys", "index": 1, "threshold": 3, "members": _members(4), "selected": selected},
    ])
    # Execute / Assert
    with pytest.raises(SecAggAborted, match=refusal):
        SecureRound(server, "/v1/rounds/7/secagg", poll=0, min_members=min_members).join()
    assert not any(path.endswith("/shares") for _, path, _ in server.sent)  # no shares left the device
