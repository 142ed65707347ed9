"""Round lifecycle through the API: aggregation maths, selection, deadlines, admin."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from device_sdk.device import FaceDevice
from device_sdk.errors import NotEnrolled, RoundClosed
from facecore import tensorfile
from facecore.federation.protocol import EMBEDDING_KEY, METADATA_KEY, ErrorCode
from facecore.federation.quantize import quantized_update
from facecore.federation.wire import trained_entries
from facecore.losses import spreadout_optimize
from server_helpers import enrolled_devices, open_round, shift_round, tick
from server_testkit import load_backbone_bytes, make_delta, unit_vector, update_file


def test_round_aggregates_fedavg_and_spreadout_without_unenrolled(client: TestClient, admin: dict, rng: np.random.Generator) -> None:
    # Prepare: a, b train; c stays enrolled but idle; d unenrolls before aggregation.
    a, b, c, d = enrolled_devices(client, 4, rng)
    round_ = open_round(client, admin, target_participants=2, min_participants=2)
    assert a.checkin().json()["status"] == "selected" and b.checkin().json()["status"] == "selected"
    base_version = round_["base_version"]
    base = load_backbone_bytes(a.backbone(base_version).content)
    deltas = {a.id: make_delta(base, rng), b.id: make_delta(base, rng)}
    uploaded = {a.id: unit_vector(rng), b.id: unit_vector(rng)}
    samples = {a.id: 30, b.id: 10}
    c_enrolled = np.asarray(c.embedding().json()["embedding"], dtype=np.float32)
    assert d.request("DELETE", f"/v1/devices/{d.id}").status_code == 204
    # Execute: the second upload reaches the target and triggers aggregation.
    for device in (a, b):
        body = update_file(deltas[device.id], uploaded[device.id], base_version, samples[device.id], {"loss": 0.1 * samples[device.id]})
        assert device.upload(round_["id"], body).status_code == 201
    status = client.get("/v1/admin/rounds/current", headers=admin).json()
    # Assert: backbone = base + sample-weighted mean delta.
    assert status["status"] == "completed" and status["summary"]["n_updates"] == 2 and status["summary"]["n_samples"] == 40
    assert status["summary"]["metrics"]["loss"] == (0.1 * 30 * 30 + 0.1 * 10 * 10) / 40
    new = load_backbone_bytes(a.backbone(status["result_version"]).content)
    for key, value in base.items():
        expected = value + (30 * deltas[a.id][key] + 10 * deltas[b.id][key]) / 40 if value.dtype.kind == "f" else value
        np.testing.assert_allclose(new[key], expected, rtol=0, atol=1e-6, err_msg=key)
    # Assert: W holds a's and b's uploads and c's enrollment (sorted by device id), not d.
    rows = {a.id: uploaded[a.id], b.id: uploaded[b.id], c.id: c_enrolled}
    order = sorted(rows)
    W_new = spreadout_optimize(torch.from_numpy(np.stack([rows[i] for i in order])), steps=10, lr=0.01, momentum=0.9, nu=0.3).numpy()
    for index, device in sorted((order.index(x.id), x) for x in (a, b, c)):
        got = device.embedding().json()
        assert got["round_id"] == round_["id"]
        np.testing.assert_allclose(got["embedding"], W_new[index], atol=1e-6)
    assert d.embedding().status_code == 404
    assert status["summary"]["n_embeddings"] == 3


def test_a_frozen_prefix_round_reads_the_trained_entries_whether_a_device_sent_them_alone_or_every_entry(
    client: TestClient, admin: dict, rng: np.random.Generator,
) -> None:
    # Prepare: 2 trainable blocks; a sends the trained entries only, b (an older device) every entry, its frozen ones non-zero
    a, b = enrolled_devices(client, 2, rng)
    round_ = open_round(client, admin, target_participants=2, min_participants=2, local={"trainable_blocks": 2})
    assert a.checkin().json()["status"] == "selected" and b.checkin().json()["status"] == "selected"
    base = load_backbone_bytes(a.backbone(round_["base_version"]).content)
    trained = trained_entries(list(base), 2)
    every = {a.id: make_delta(base, rng), b.id: make_delta(base, rng)}
    sent = {a.id: {k: every[a.id][k] for k in trained}, b.id: every[b.id]}
    bodies = {d: update_file(sent[d], unit_vector(rng), round_["base_version"], 10) for d in sent}
    # Execute
    for device in (a, b):
        assert device.upload(round_["id"], bodies[device.id]).status_code == 201
    status = client.get("/v1/admin/rounds/current", headers=admin).json()
    # Assert: the trained entries moved by the mean delta, the frozen prefix is the base's to the bit, and a's file is the smaller
    assert status["status"] == "completed" and status["summary"]["n_updates"] == 2
    new = load_backbone_bytes(a.backbone(status["result_version"]).content)
    assert 0 < len(trained) < len(base) and len(bodies[a.id]) < 0.8 * len(bodies[b.id])
    for key, value in base.items():
        if key in trained and value.dtype.kind == "f":
            np.testing.assert_allclose(new[key], value + (every[a.id][key] + every[b.id][key]) / 2, rtol=0, atol=1e-6, err_msg=key)
        else:
            np.testing.assert_array_equal(new[key], value, err_msg=key)


@pytest.mark.parametrize("bits", [8, 4])
def test_a_round_of_quantised_uploads_publishes_the_mean_of_what_the_codes_say(
    client: TestClient, admin: dict, rng: np.random.Generator, bits: int,
) -> None:
    # Prepare: the last 2 blocks train and cross in `bits` bits; b sends every entry (its frozen ones non-zero),
    # and first a file that names a scale for an entry it did not send
    a, b = enrolled_devices(client, 2, rng)
    round_ = open_round(client, admin, target_participants=2, min_participants=2, local={"trainable_blocks": 2, "upload_bits": bits})
    assert a.checkin().json()["status"] == "selected" and b.checkin().json()["status"] == "selected"
    base = load_backbone_bytes(a.backbone(round_["base_version"]).content)
    trained = trained_entries(list(base), 2)
    quantized = {a.id: quantized_update({k: v for k, v in make_delta(base, rng).items() if k in trained}, bits),
                 b.id: quantized_update(make_delta(base, rng), bits)}
    floats = [k for k in trained if base[k].dtype.kind == "f"]
    meta = {METADATA_KEY: json.dumps({"base_version": round_["base_version"], "n_samples": 10, "metrics": {}})}

    def body(device_id: str, **extra: np.ndarray) -> bytes:
        return tensorfile.dumps(quantized[device_id][0] | {EMBEDDING_KEY: unit_vector(rng)} | extra, meta)

    # Execute
    stray = b.upload(round_["id"], body(b.id, **{"scale.stem.weight": np.ones(1, np.float32)}))
    codes = [device.upload(round_["id"], body(device.id)).status_code for device in (a, b)]
    status = client.get("/v1/admin/rounds/current", headers=admin).json()
    # Assert: a quarter (8 bits) or an eighth (4 bits) of the fp32 bytes, and base + the mean of the dequantised deltas
    assert stray.status_code == 422 and "scales of no sent entry" in stray.json()["detail"] and codes == [201, 201]
    sent_bytes = sum(quantized[a.id][0]["backbone." + k].nbytes for k in floats)
    assert sent_bytes <= sum(base[k].nbytes for k in floats) * bits / 32 + len(floats)
    new = load_backbone_bytes(a.backbone(status["result_version"]).content)
    for key, value in base.items():
        if key in floats:
            expected = value + (quantized[a.id][1][key] + quantized[b.id][1][key]) / 2
            np.testing.assert_allclose(new[key], expected, rtol=0, atol=1e-6, err_msg=key)
        else:
            np.testing.assert_array_equal(new[key], value, err_msg=key)


def test_stale_round_upload_is_409_naming_current_round(client: TestClient, admin: dict, rng: np.random.Generator) -> None:
    # Prepare: round 1 completes with one update, round 2 opens.
    (device,) = enrolled_devices(client, 1, rng)
    first = open_round(client, admin, target_participants=1)
    device.checkin()
    base = load_backbone_bytes(device.backbone(first["base_version"]).content)
    body = update_file(make_delta(base, rng), unit_vector(rng), first["base_version"], 5)
    assert device.upload(first["id"], body).status_code == 201
    second = open_round(client, admin, target_participants=1)
    # Execute
    late = device.upload(first["id"], update_file(make_delta(base, rng), unit_vector(rng), first["base_version"], 5))
    # Assert
    assert late.status_code == 409
    assert f"current round is {second['id']}" in late.json()["detail"]
    assert second["base_version"] != first["base_version"]


def test_too_few_by_deadline_fails_then_a_new_round_opens(client: TestClient, admin: dict, rng: np.random.Generator) -> None:
    # Prepare
    devices = enrolled_devices(client, 3, rng)
    round_ = open_round(client, admin, target_participants=3, min_participants=2, deadline_s=60)
    for device in devices:
        device.checkin()
    base = load_backbone_bytes(devices[0].backbone(round_["base_version"]).content)
    devices[0].upload(round_["id"], update_file(make_delta(base, rng), unit_vector(rng), round_["base_version"], 5))
    # Execute
    before = tick(client)
    shift_round(client, round_["id"], deadline_at=1)
    after = tick(client)
    status = client.get(f"/v1/admin/rounds/{round_['id']}", headers=admin).json()
    reopened = client.post("/v1/admin/rounds", json={"target_participants": 2, "min_participants": 1}, headers=admin)
    # Assert
    assert (before, after) == ("not_due", "failed")
    assert status["status"] == "failed" and "1 update(s), 2 required" in status["failure_reason"]
    assert reopened.status_code == 201 and reopened.json()["id"] == round_["id"] + 1


def test_dropouts_are_fine_while_min_is_met(client: TestClient, admin: dict, rng: np.random.Generator) -> None:
    # Prepare: three selected, one never uploads.
    devices = enrolled_devices(client, 3, rng)
    round_ = open_round(client, admin, target_participants=3, min_participants=2)
    for device in devices:
        device.checkin()
    base = load_backbone_bytes(devices[0].backbone(round_["base_version"]).content)
    for device in devices[:2]:
        assert device.upload(round_["id"], update_file(make_delta(base, rng), unit_vector(rng), round_["base_version"], 5)).status_code == 201
    # Execute
    shift_round(client, round_["id"], deadline_at=1)
    outcome = tick(client)
    # Assert
    status = client.get(f"/v1/admin/rounds/{round_['id']}", headers=admin).json()
    assert outcome == "completed" and status["status"] == "completed" and status["summary"]["n_updates"] == 2


def test_selection_is_fair_and_rotates(client: TestClient, admin: dict, rng: np.random.Generator) -> None:
    # Prepare
    devices = enrolled_devices(client, 4, rng)
    chosen: list[set[str]] = []
    for _ in range(2):
        round_ = open_round(client, admin, target_participants=2, min_participants=2, selection_window_s=60)
        waiting = [device.checkin().json() for device in devices]
        # Execute: the window closes; the scheduler picks.
        shift_round(client, round_["id"], selection_at=1)
        tick(client)
        answers = {device.id: device.checkin().json()["status"] for device in devices}
        selected = [device for device in devices if answers[device.id] == "selected"]
        base = load_backbone_bytes(selected[0].backbone(round_["base_version"]).content)
        for device in selected:
            device.upload(round_["id"], update_file(make_delta(base, rng), unit_vector(rng), round_["base_version"], 5))
        chosen.append({device.id for device in selected})
        # Assert (per round)
        assert {w["status"] for w in waiting} == {"waiting"} and all(w["retry_after_s"] > 0 for w in waiting)
        assert sorted(answers.values()) == ["not_selected", "not_selected", "selected", "selected"]
    # Assert: round 2 prefers the devices round 1 left out.
    assert chosen[0].isdisjoint(chosen[1])


def test_checkin_needs_open_round_and_enrollment(client: TestClient, admin: dict, rng: np.random.Generator) -> None:
    # Prepare
    (enrolled,) = enrolled_devices(client, 1, rng)
    from server_testkit import Device

    bare = Device(client)
    bare.register()
    # Execute
    no_round = enrolled.checkin()
    open_round(client, admin)
    not_enrolled = bare.checkin()
    # Assert
    assert no_round.status_code == 409 and "no round is open" in no_round.json()["detail"]
    assert not_enrolled.status_code == 409 and "not enrolled" in not_enrolled.json()["detail"]
    # the machine-readable reason a device branches on, beside the unchanged text
    assert no_round.json()["code"] == ErrorCode.STALE_ROUND and not_enrolled.json()["code"] == ErrorCode.NOT_ENROLLED


def test_the_device_sdk_reads_check_in_refusals_by_code(
    client: TestClient, admin: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prepare: an SDK device that believes it is enrolled, which the app (in-process) never enrolled
    monkeypatch.delenv("FEDFACE_DEVICE_KEY", raising=False)
    device = FaceDevice("http://testserver", tmp_path / "device", retries=0)
    device.transport.http = client
    device.register()
    device.state.save_faces(np.zeros((3, 8, 8, 3), np.uint8))
    device.state.update_info(enrolled=True)
    asked: list[str] = []  # what the device asked; the operator's calls share this client
    client.event_hooks["request"].append(
        lambda request: None if "/admin/" in request.url.path else asked.append(f"{request.method} {request.url.path}")
    )
    # Execute / Assert: no round, then a round this device cannot join
    with pytest.raises(RoundClosed, match="no round is open"):
        device.train_round(wait=0)
    open_round(client, admin)
    with pytest.raises(NotEnrolled, match="holds no enrollment"):
        device.train_round(wait=0)
    # Assert: the codes decided; an old server's fallback (asking for the template) never ran
    assert asked == ["POST /v1/rounds/current/checkin"] * 2


def test_admin_auth_and_round_config_validation(client: TestClient, admin: dict) -> None:
    # Prepare
    url = "/v1/admin/rounds"
    # Execute
    no_token = client.post(url, json={})
    bad_token = client.post(url, json={}, headers={"Authorization": "Bearer " + "x" * 43})
    unknown = client.post(url, json={"target_participants": 2, "surprise": 1}, headers=admin)
    nested_unknown = client.post(url, json={"spreadout": {"nu": 0.3, "temperature": 2}}, headers=admin)
    inverted = client.post(url, json={"target_participants": 2, "min_participants": 3}, headers=admin)
    out_of_bounds = client.post(url, json={"deadline_s": -5, "local": {"lr": 0}}, headers=admin)
    first = client.post(url, json={}, headers=admin)
    second = client.post(url, json={}, headers=admin)
    # Assert
    assert no_token.status_code == 401 and bad_token.status_code == 401
    assert no_token.json() == {"detail": "missing or wrong admin token", "code": ErrorCode.AUTHENTICATION_FAILED}
    assert [r.status_code for r in (unknown, nested_unknown, inverted, out_of_bounds)] == [422] * 4
    assert {r.json()["code"] for r in (unknown, nested_unknown, inverted, out_of_bounds)} == {ErrorCode.INVALID_INPUT}
    assert first.status_code == 201 and first.json()["config"]["spreadout"] == {"nu": 0.3, "steps": 10, "lr": 0.01, "momentum": 0.9, "center": False}
    assert first.json()["config"]["local"]["margin"] == 0.9
    assert second.status_code == 409 and f"round {first.json()['id']} is still open" in second.json()["detail"]
    assert second.json()["code"] == ErrorCode.CONFLICT


def test_round_with_median_aggregation_ignores_one_wild_update(client: TestClient, admin: dict, rng: np.random.Generator) -> None:
    # Prepare: three participants; c's delta is 100x the others' scale.
    a, b, c = enrolled_devices(client, 3, rng)
    round_ = open_round(client, admin, target_participants=3, min_participants=3, aggregation={"method": "median"})
    for device in (a, b, c):
        assert device.checkin().json()["status"] == "selected"
    base = load_backbone_bytes(a.backbone(round_["base_version"]).content)
    deltas = {a.id: make_delta(base, rng), b.id: make_delta(base, rng), c.id: make_delta(base, rng, scale=0.1)}
    # Execute
    for device in (a, b, c):
        body = update_file(deltas[device.id], unit_vector(rng), round_["base_version"], 10, {"loss": 0.1})
        assert device.upload(round_["id"], body).status_code == 201
    status = client.get("/v1/admin/rounds/current", headers=admin).json()
    # Assert: every float coordinate moved by the median of the three deltas, not by their mean.
    assert status["status"] == "completed" and status["config"]["aggregation"]["method"] == "median"
    new = load_backbone_bytes(a.backbone(status["result_version"]).content)
    for key, value in base.items():
        if value.dtype.kind == "f":
            median = np.median(np.stack([deltas[d][key] for d in deltas]).astype(np.float32), axis=0)
            np.testing.assert_allclose(new[key], value + median, rtol=0, atol=1e-6, err_msg=key)


def test_dp_fedavg_rounds_poisson_sample_use_a_fixed_denominator_and_account_epsilon(
    client: TestClient, admin: dict, rng: np.random.Generator,
) -> None:
    # Prepare: 16 enrolled devices, target 8, so each is drawn independently with q = 1/2; deltas far above the clip bound
    clip, z, target = 0.5, 2.0, 8
    aggregation = {"method": "dp_fedavg", "max_update_norm": clip, "dp_noise_multiplier": z, "dp_delta": 1e-5}
    devices = enrolled_devices(client, 16, rng)
    summaries, moved, drawn = [], [], []
    for _ in range(2):
        round_ = open_round(client, admin, target_participants=target, min_participants=1, aggregation=aggregation)
        selected = [d for d in devices if d.checkin().json()["status"] == "selected"]
        drawn.append(len(selected))
        base = load_backbone_bytes(devices[0].backbone(round_["base_version"]).content)
        # Execute
        for device in selected:
            body = update_file(make_delta(base, rng, scale=0.05), unit_vector(rng), round_["base_version"], 10)
            assert device.upload(round_["id"], body).status_code == 201
        if len(selected) < target:  # fewer drawn than expected: the round waits for its deadline
            assert client.post(f"/v1/admin/rounds/{round_['id']}/close", headers=admin).status_code == 200
            tick(client)
        status = client.get(f"/v1/admin/rounds/{round_['id']}", headers=admin).json()
        assert status["status"] == "completed", status
        summaries.append(status["summary"])
        new = load_backbone_bytes(devices[0].backbone(status["result_version"]).content)
        moved.append({k: new[k].astype(np.float64) - base[k] for k in base if base[k].dtype.kind == "f"})
    # Assert: the noise std is z*C/target whatever the number drawn; BatchNorm statistics untouched
    weights = np.concatenate([d.ravel() for k, d in moved[0].items() if not k.endswith(("running_mean", "running_var"))])
    # the clipped sum / target has norm <= C over ~1M coordinates: tiny next to the noise
    assert np.std(weights) == pytest.approx(z * clip / target, rel=0.05)
    assert all(not np.any(d) for k, d in moved[0].items() if k.endswith(("running_mean", "running_var")))
    first, second = summaries[0]["privacy"], summaries[1]["privacy"]
    assert (first["sample_rate"], first["population"], first["expected_clients"], first["selection"]) == (0.5, 16, target, "poisson")
    assert first["dp_rounds"] == 1 and second["dp_rounds"] == 2
    assert summaries[0]["n_updates"] == drawn[0] and summaries[0]["metrics"]["dp_clipped_fraction"] == 1.0
    # ε recomputed from the logged z, q and rounds by an accountant written independently of Opacus
    independent = sampled_gaussian_epsilon(second["noise_multiplier"], second["sample_rate"], second["dp_rounds"], second["delta"])
    assert second["epsilon"] <= independent <= second["epsilon"] * 1.05


def sampled_gaussian_epsilon(z: float, q: float, rounds: int, delta: float) -> float:
    """ε of `rounds` Poisson-sampled Gaussian mechanisms: the RDP of Mironov, Talwar and Zhang (2019)
    at integer orders, A_α = Σ_k C(α,k) (1-q)^(α-k) q^k exp((k²-k) / 2z²), converted to (ε, δ)
    as in Balle et al. (2020). Integer orders only, so it can only be as tight as Opacus or looser."""
    best = math.inf
    for alpha in range(2, 257):
        terms = [
            math.lgamma(alpha + 1) - math.lgamma(k + 1) - math.lgamma(alpha - k + 1)
            + (alpha - k) * math.log1p(-q) + (k * math.log(q) if k else 0.0) + (k * k - k) / (2 * z * z)
            for k in range(alpha + 1)
        ] if q < 1 else [(alpha * alpha - alpha) / (2 * z * z)]
        top = max(terms)
        rdp = rounds * (top + math.log(sum(math.exp(t - top) for t in terms))) / (alpha - 1)
        best = min(best, rdp + math.log((alpha - 1) / alpha) - (math.log(delta) + math.log(alpha)) / (alpha - 1))
    return best


def test_closing_a_round_early_aggregates_what_it_has_or_fails_below_the_minimum(client: TestClient, admin: dict, rng: np.random.Generator) -> None:
    for uploads, minimum, expected in ((2, 2, "completed"), (1, 2, "failed")):
        # Prepare: 3 selected devices, only `uploads` of them upload
        devices = enrolled_devices(client, 3, rng)
        round_ = open_round(client, admin, target_participants=3, min_participants=minimum)
        for device in devices:
            assert device.checkin().json()["status"] == "selected"
        base = load_backbone_bytes(devices[0].backbone(round_["base_version"]).content)
        for device in devices[:uploads]:
            assert device.upload(round_["id"], update_file(make_delta(base, rng), unit_vector(rng), round_["base_version"], 10)).status_code == 201
        # Execute
        closed = client.post(f"/v1/admin/rounds/{round_['id']}/close", headers=admin)
        late = devices[-1].upload(round_["id"], update_file(make_delta(base, rng), unit_vector(rng), round_["base_version"], 10))
        tick(client)
        # Assert
        assert closed.status_code == 200
        assert late.status_code == 409
        status = client.get(f"/v1/admin/rounds/{round_['id']}", headers=admin).json()
        assert status["status"] == expected
        if expected == "completed":
            assert status["summary"]["n_updates"] == uploads
        again = client.post(f"/v1/admin/rounds/{round_['id']}/close", headers=admin)
        assert again.status_code == 409 and expected in again.json()["detail"]
    assert client.post("/v1/admin/rounds/99999/close", headers=admin).status_code == 404
    assert client.post("/v1/admin/rounds/1/close").status_code == 401


def test_individual_deltas_are_deleted_once_their_round_ends(client: TestClient, admin: dict, rng: np.random.Generator) -> None:
    # Prepare
    from server_api.tables import Update

    devices = enrolled_devices(client, 2, rng)
    round_ = open_round(client, admin, target_participants=2, min_participants=2)
    for device in devices:
        assert device.checkin().json()["status"] == "selected"
    base = load_backbone_bytes(devices[0].backbone(round_["base_version"]).content)
    # Execute
    for device in devices:
        assert device.upload(round_["id"], update_file(make_delta(base, rng), unit_vector(rng), round_["base_version"], 10)).status_code == 201
    # Assert: the round completed, its rows keep their digests, the delta files are gone, the model is there
    status = client.get(f"/v1/admin/rounds/{round_['id']}", headers=admin).json()
    assert status["status"] == "completed"
    store = client.app.state.ctx.store
    with client.app.state.ctx.sessions() as session:
        digests = [u.blob_sha256 for u in session.query(Update).filter(Update.round_id == round_["id"])]
    assert len(digests) == 2 and not any(store.exists(d) for d in digests)
    assert devices[0].backbone(status["result_version"]).status_code == 200


def test_server_momentum_steps_on_from_the_step_that_made_the_base(client: TestClient, admin: dict, rng: np.random.Generator) -> None:
    # Prepare: two rounds in a row, each with one device's delta; the second round's base is the first's result
    (a,) = enrolled_devices(client, 1, rng)
    models, deltas = [], []
    # Execute
    for _ in range(2):
        round_ = open_round(client, admin, target_participants=1, min_participants=1, aggregation={"server_momentum": 0.5})
        assert a.checkin().json()["status"] == "selected"
        base = load_backbone_bytes(a.backbone(round_["base_version"]).content)
        deltas.append(make_delta(base, rng))
        assert a.upload(round_["id"], update_file(deltas[-1], unit_vector(rng), round_["base_version"], 10, {})).status_code == 201
        status = client.get("/v1/admin/rounds/current", headers=admin).json()
        assert status["status"] == "completed"
        models.append((base, load_backbone_bytes(a.backbone(status["result_version"]).content)))
    # Assert: round 1 (an imported base, no step before it) takes its delta; round 2 adds half of round 1's step
    (base1, new1), (base2, new2) = models
    for key, value in base1.items():
        if value.dtype.kind == "f":
            np.testing.assert_allclose(new1[key], value + deltas[0][key], atol=1e-6, err_msg=key)
            np.testing.assert_allclose(new2[key], base2[key] + deltas[1][key] + 0.5 * (base2[key] - value), atol=1e-6, err_msg=key)
