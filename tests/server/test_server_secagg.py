"""Secure aggregation through the API: the round's steps, dropouts on both sides of the upload,
the abort below the threshold, and every out-of-step request refused."""
from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from facecore import tensorfile
from facecore.federation.secagg import Advert, SecAggClient, quantize, weighted_update
from server_helpers import enrolled_devices, open_round, shift_round, tick
from server_testkit import Device, load_backbone_bytes, make_delta, unit_vector, update_file

SECURE = {"enabled": True, "key_phase_s": 30, "unmask_phase_s": 60, "scale_bits": 14}


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


class Member:
    """A test device that speaks the secure-aggregation steps with facecore.federation.secagg."""

    def __init__(self, device: Device, round_id: int) -> None:
        self.device, self.url, self.client = device, f"/v1/rounds/{round_id}/secagg", SecAggClient(0, 0)
        self.round_id = round_id

    def state(self) -> dict[str, Any]:
        response = self.device.request("GET", self.url)
        assert response.status_code == 200, response.text
        return response.json()

    def advertise(self) -> None:
        advert = self.client.advertise()
        response = self.device.request("POST", f"{self.url}/advert", {"c_public": _b64(advert.c_public), "s_public": _b64(advert.s_public)})
        assert response.status_code == 201, response.text
        self.client.index = response.json()["index"]

    def share(self) -> None:
        state = self.state()
        assert state["phase"] == "share_keys", state
        self.client.threshold = state["threshold"]
        adverts = {m["index"]: Advert(m["index"], base64.b64decode(m["c_public"]), base64.b64decode(m["s_public"])) for m in state["members"]}
        shares = {str(v): _b64(blob) for v, blob in self.client.share_keys(adverts).items()}
        response = self.device.request("POST", f"{self.url}/shares", {"shares": shares})
        assert response.status_code == 200, response.text

    def receive(self) -> dict[str, Any]:
        state = self.state()
        assert state["phase"] == "masked_input", state
        self.client.receive_shares({int(k): base64.b64decode(v) for k, v in state["shares"].items()})
        return state

    def upload(self, delta: dict[str, np.ndarray], n_samples: int, base_version: str, state: dict[str, Any]) -> int:
        masked = self.client.masked_input(quantize(weighted_update(delta, n_samples), state["bound"], state["scale"]), state["key_sharers"])
        body = tensorfile.dumps(
            {"secagg.masked": masked.view(np.int32), "class_embedding": unit_vector(np.random.default_rng(n_samples))},
            {"fedface": f'{{"base_version": "{base_version}", "n_samples": {n_samples}, "metrics": {{"loss": 0.5}}}}'},
        )
        return self.device.upload(self.round_id, body).status_code

    def answer(self) -> int:
        state = self.state()
        assert state["phase"] == "unmask", state
        answer = self.client.unmask_shares(state["dropped"], state["survived"])
        body = {part: {str(v): str(share[1]) for v, share in answer[part].items()} for part in ("s", "b")}
        return self.device.request("POST", f"{self.url}/unmask", body).status_code


def _keyed_round(client: TestClient, admin: dict, rng: np.random.Generator, n: int, **secure: Any) -> tuple[dict, list[Member]]:
    devices = enrolled_devices(client, n, rng)
    round_ = open_round(client, admin, target_participants=n, min_participants=2, secure_aggregation=SECURE | secure)
    for device in devices:
        checkin = device.checkin().json()
        assert checkin["status"] == "selected" and checkin["secagg_url"] == f"/v1/rounds/{round_['id']}/secagg"
    members = [Member(d, round_["id"]) for d in devices]
    for member in members:
        member.advertise()
    for member in members:
        member.share()
    return round_, members


@pytest.mark.parametrize(
    ("fraction", "drop_before", "drop_after", "threshold"),
    [(2 / 3, [9], [8], 7), (0.5, [], [7, 8, 9], 5)],
    ids=["one-before-one-after-upload", "a-third-after-upload"],
)
def test_the_unmasked_sum_is_fedavg_of_every_uploader_despite_dropouts(
    client: TestClient, admin: dict, rng: np.random.Generator, fraction: float, drop_before: list[int], drop_after: list[int], threshold: int,
) -> None:
    # Prepare: 9 devices share keys; some never upload, some upload and never answer
    round_, members = _keyed_round(client, admin, rng, 9, threshold_fraction=fraction)
    base = load_backbone_bytes(members[0].device.backbone(round_["base_version"]).content)
    deltas = [make_delta(base, rng, scale=1e-2) for _ in members]
    samples = [5 + 3 * i for i in range(len(members))]
    states = [m.receive() for m in members]
    assert states[0]["threshold"] == threshold and states[0]["key_sharers"] == list(range(1, 10))
    uploaders = [i for i in range(9) if i + 1 not in drop_before]
    # Execute
    for i in uploaders:
        assert members[i].upload(deltas[i], samples[i], round_["base_version"], states[i]) == 201
    if drop_before:  # the round waits for them until the operator (or the deadline) ends the upload step
        assert client.post(f"/v1/admin/rounds/{round_['id']}/close", headers=admin).status_code == 200
        assert tick(client) == "unmasking"
    assert members[0].state()["phase"] == "unmask" and members[0].state()["dropped"] == drop_before
    for i in uploaders:
        if i + 1 not in drop_after:
            assert members[i].answer() == 200
    shift_round(client, round_["id"], unmask_deadline_at=1)
    assert tick(client) == "completed"
    # Assert: base + every uploader's sample-weighted mean delta, to fixed-point precision
    status = client.get("/v1/admin/rounds/current", headers=admin).json()
    total = sum(samples[i] for i in uploaders)
    assert status["status"] == "completed" and status["summary"]["n_updates"] == len(uploaders) and status["summary"]["n_samples"] == total
    assert status["summary"]["secure_aggregation"]["answers"] == len(uploaders) - len(drop_after)
    new = load_backbone_bytes(members[0].device.backbone(status["result_version"]).content)
    for key, value in base.items():
        if value.dtype.kind != "f":
            np.testing.assert_array_equal(new[key], value, err_msg=key)
            continue
        expected = value + sum(samples[i] * deltas[i][key] for i in uploaders) / total
        np.testing.assert_allclose(new[key], expected, rtol=0, atol=len(uploaders) * 0.5 / 2**14 / total + 1e-6, err_msg=key)
    # the routed ciphertexts and the answers are gone with the round
    from server_api.tables import SecAggMember, SecAggShare

    with client.app.state.ctx.sessions() as session:
        assert session.query(SecAggShare).count() == 0
        assert all(m.unmask_answer is None for m in session.query(SecAggMember))


def test_too_few_unmasking_answers_fail_the_round_and_a_new_one_opens(client: TestClient, admin: dict, rng: np.random.Generator) -> None:
    # Prepare: 3 devices (t = 3) all upload; only one answers
    round_, members = _keyed_round(client, admin, rng, 3)
    base = load_backbone_bytes(members[0].device.backbone(round_["base_version"]).content)
    for member in members:
        assert member.upload(make_delta(base, rng), 4, round_["base_version"], member.receive()) == 201
    assert members[0].state()["phase"] == "unmask"  # the last upload moved the round on
    assert members[0].answer() == 200
    # Execute
    shift_round(client, round_["id"], unmask_deadline_at=1)
    outcome = tick(client)
    # Assert
    status = client.get(f"/v1/admin/rounds/{round_['id']}", headers=admin).json()
    assert outcome == "failed" and status["status"] == "failed"
    assert status["failure_reason"] == "secure aggregation aborted: 1 unmasking answer(s), threshold 3"
    assert open_round(client, admin, target_participants=3)["status"] == "open"


def test_out_of_step_requests_are_refused(client: TestClient, admin: dict, rng: np.random.Generator) -> None:
    # Prepare: 4 devices selected; three advertise and the fourth is late
    devices = enrolled_devices(client, 5, rng)  # t = 2 of the 3 that will advertise: two key sharers are enough
    round_ = open_round(client, admin, target_participants=4, min_participants=2, secure_aggregation=SECURE | {"threshold_fraction": 0.5})
    for device in devices[:4]:
        assert device.checkin().json()["status"] == "selected"
    assert devices[4].checkin().json()["status"] == "not_selected"  # no late seats once keys are being agreed
    members = [Member(d, round_["id"]) for d in devices[:4]]
    outsider = Member(devices[4], round_["id"])
    base = load_backbone_bytes(devices[0].backbone(round_["base_version"]).content)
    plain = update_file(make_delta(base, rng), unit_vector(rng), round_["base_version"], 3)
    bad_key = {"c_public": _b64(bytes(31)) + "A", "s_public": _b64(bytes(32))}
    # Execute / Assert, step by step
    robust = client.post("/v1/admin/rounds", headers=admin, json={"secure_aggregation": SECURE, "aggregation": {"method": "median"}})
    assert robust.status_code == 422 and "only fedavg" in robust.text
    assert devices[0].request("POST", f"{members[0].url}/advert", bad_key).status_code == 422
    assert outsider.device.request("GET", outsider.url).status_code == 403
    for member in members[:3]:
        member.advertise()
    again = {"c_public": _b64(bytes(range(32))), "s_public": _b64(bytes(range(1, 33)))}
    assert members[0].device.request("POST", f"{members[0].url}/advert", again).status_code == 409
    assert members[0].device.upload(round_["id"], plain).status_code == 409  # keys not shared yet
    assert members[0].state()["phase"] == "advertise"
    shift_round(client, round_["id"], selection_at=31)  # the advertise step times out without device 4
    late = members[3].device.request("POST", f"{members[3].url}/advert", {"c_public": _b64(bytes(range(32))), "s_public": _b64(bytes(range(1, 33)))})
    assert late.status_code == 409 and "past the advertise step" in late.json()["detail"]
    members[0].share()
    members[1].share()
    wrong = members[2].device.request("POST", f"{members[2].url}/shares", {"shares": {"1": _b64(bytes(172))}})
    assert wrong.status_code == 422 and "exactly the other 2" in wrong.json()["detail"]
    shift_round(client, round_["id"], selection_at=61)  # share step times out: device 3 is not a key sharer
    assert members[0].receive()["key_sharers"] == [1, 2]
    assert members[2].device.upload(round_["id"], update_file(make_delta(base, rng), unit_vector(rng), round_["base_version"], 3)).status_code == 403
    assert members[0].device.upload(round_["id"], plain).status_code == 422  # a plain update into a secure round
    early = members[0].device.request("POST", f"{members[0].url}/unmask", {"s": {}, "b": {"1": "5"}})
    assert early.status_code == 409


def test_one_advertiser_fails_the_round_instead_of_publishing_its_update(client: TestClient, admin: dict, rng: np.random.Generator) -> None:
    # Prepare: the audit's setup: 3 selected, min_participants 2, and only one device advertises keys
    round_, devices = _selected_round(client, admin, rng, 3)
    Member(devices[0], round_["id"]).advertise()
    # Execute: the advertise step times out
    shift_round(client, round_["id"], selection_at=31)
    outcome = tick(client)
    # Assert: failed, nothing published, the current model is still the base
    status = client.get(f"/v1/admin/rounds/{round_['id']}", headers=admin).json()
    assert outcome == "failed" and status["result_version"] is None
    assert status["failure_reason"] == "only 1 device(s) advertised keys, threshold 2: the round cannot hide one update"
    assert devices[0].request("GET", "/v1/models/current").json()["version"] == round_["base_version"]


def test_fewer_masked_uploads_than_the_threshold_fail_at_the_deadline(client: TestClient, admin: dict, rng: np.random.Generator) -> None:
    # Prepare: 3 members share keys (t = 3), two upload, min_participants is only 2
    round_, members = _keyed_round(client, admin, rng, 3)
    base = load_backbone_bytes(members[0].device.backbone(round_["base_version"]).content)
    for member in members[:2]:
        assert member.upload(make_delta(base, rng), 4, round_["base_version"], member.receive()) == 201
    # Execute
    shift_round(client, round_["id"], deadline_at=1)
    outcome = tick(client)
    # Assert
    status = client.get(f"/v1/admin/rounds/{round_['id']}", headers=admin).json()
    assert outcome == "failed" and status["result_version"] is None
    assert status["failure_reason"].startswith("deadline passed with 2 masked update(s), 3 required")


@pytest.mark.parametrize("low_order", [bytes(32), (1).to_bytes(32, "little"), bytes.fromhex(
    "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800")], ids=["zero", "one", "order-8"])
def test_a_low_order_public_key_is_refused_at_the_advert(client: TestClient, admin: dict, rng: np.random.Generator, low_order: bytes) -> None:
    # Prepare
    round_, devices = _selected_round(client, admin, rng, 2)
    url = f"/v1/rounds/{round_['id']}/secagg/advert"
    good = SecAggClient(0, 0).advertise()
    # Execute
    c_bad = devices[0].request("POST", url, {"c_public": _b64(low_order), "s_public": _b64(good.s_public)})
    s_bad = devices[0].request("POST", url, {"c_public": _b64(good.c_public), "s_public": _b64(low_order)})
    # Assert: refused, and the device is not a member, so it cannot break the round
    assert c_bad.status_code == s_bad.status_code == 422 and "full order" in c_bad.json()["detail"]
    assert devices[0].request("GET", f"/v1/rounds/{round_['id']}/secagg").json()["index"] is None


def _selected_round(client: TestClient, admin: dict, rng: np.random.Generator, n: int) -> tuple[dict, list[Device]]:
    devices = enrolled_devices(client, n, rng)
    round_ = open_round(client, admin, target_participants=n, min_participants=2, secure_aggregation=SECURE)
    for device in devices:
        assert device.checkin().json()["status"] == "selected"
    return round_, devices


def test_a_key_another_member_advertised_is_refused(client: TestClient, admin: dict, rng: np.random.Generator) -> None:
    # Prepare: the first device advertises its two keys
    round_, devices = _selected_round(client, admin, rng, 3)
    url = f"/v1/rounds/{round_['id']}/secagg/advert"
    first, fresh = SecAggClient(0, 0).advertise(), SecAggClient(0, 0).advertise()
    assert devices[0].request("POST", url, {"c_public": _b64(first.c_public), "s_public": _b64(first.s_public)}).status_code == 201
    # Execute: the others copy the first's c key, its s key (as their c key), or both
    copies = [
        devices[1].request("POST", url, {"c_public": _b64(first.c_public), "s_public": _b64(fresh.s_public)}),
        devices[1].request("POST", url, {"c_public": _b64(first.s_public), "s_public": _b64(fresh.s_public)}),
        devices[2].request("POST", url, {"c_public": _b64(first.c_public), "s_public": _b64(first.s_public)}),
    ]
    own = devices[1].request("POST", url, {"c_public": _b64(fresh.c_public), "s_public": _b64(fresh.s_public)})
    # Assert: 409 each time, no member added, and keys of its own still let a device join
    assert [r.status_code for r in copies] == [409, 409, 409] and "its own" in copies[0].json()["detail"]
    indices = [d.request("GET", f"/v1/rounds/{round_['id']}/secagg").json()["index"] for d in devices]
    assert own.status_code == 201 and indices == [1, 2, None]


def test_a_member_that_uploads_random_words_fails_the_round_and_nothing_is_published(
    client: TestClient, admin: dict, rng: np.random.Generator,
) -> None:
    # Prepare: 3 members; two upload honest masked updates, the third random 32-bit words of the right length
    round_, members = _keyed_round(client, admin, rng, 3)
    base = load_backbone_bytes(members[0].device.backbone(round_["base_version"]).content)
    states = [m.receive() for m in members]
    for member, state in zip(members[:2], states[:2], strict=True):
        assert member.upload(make_delta(base, rng), 4, round_["base_version"], state) == 201
    length = sum(int(v.size) for v in base.values() if v.dtype.kind == "f")
    words = rng.integers(0, 2**32, length, dtype=np.uint64).astype(np.uint32)
    body = tensorfile.dumps({"secagg.masked": words.view(np.int32), "class_embedding": unit_vector(rng)},
                            {"fedface": f'{{"base_version": "{round_["base_version"]}", "n_samples": 4, "metrics": {{}}}}'})
    assert members[2].device.upload(round_["id"], body).status_code == 201  # masked: the server cannot tell it apart
    # Execute: everyone answers the unmasking request
    assert [m.answer() for m in members] == [200, 200, 200]
    tick(client)
    # Assert: the round failed on the sum's length, and the current model is still the base
    status = client.get(f"/v1/admin/rounds/{round_['id']}", headers=admin).json()
    assert status["status"] == "failed" and status["result_version"] is None, status
    assert "not a bounded update" in status["failure_reason"] and "nothing is published" in status["failure_reason"]
    assert members[0].device.request("GET", "/v1/models/current").json()["version"] == round_["base_version"]


def test_the_round_publishes_its_update_bound_and_the_device_clips_to_it() -> None:
    # Prepare: a delta 5 long, a bound of 2
    from facecore.federation.secagg import weighted_update

    delta = {"w": np.full(25, 1.0, np.float32), "steps": np.zeros(1, np.int64)}
    # Execute
    clipped, free = weighted_update(delta, 3, max_norm=2.0), weighted_update(delta, 3)
    # Assert: clipped to 2 before the weighting by 3 photos; untouched without a bound
    assert np.linalg.norm(clipped) == pytest.approx(6.0) and np.linalg.norm(free) == pytest.approx(15.0)


def test_the_member_list_comes_with_the_selected_count_the_admin_api_shows(client: TestClient, admin: dict, rng: np.random.Generator) -> None:
    # Prepare: 4 selected, 3 advertise keys
    round_, devices = _selected_round(client, admin, rng, 4)
    members = [Member(d, round_["id"]) for d in devices[:3]]
    for member in members:
        member.advertise()
    # Execute: the advertise step times out
    shift_round(client, round_["id"], selection_at=31)
    state = members[0].state()
    # Assert: the device sees 3 members of 4 selected, the same 4 the operator sees
    status = client.get(f"/v1/admin/rounds/{round_['id']}", headers=admin).json()
    assert state["phase"] == "share_keys" and len(state["members"]) == 3
    assert state["selected"] == status["n_selected"] == 4
