"""Model downloads, health/metrics/docs, ONNX export, and migrations vs. models."""
from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from device_sdk.backbone_check import check_backbone_payload
from facecore.models.checkpoint import FIGURES, dequantized_state, load_backbone, meta_of, shipped_verification
from facecore.models.verification import FAR_10_KEY, LEGACY_KEY, SHIPPED_KEY, Verification
from server_api.main import create_app
from server_api.tables import AuditEvent, Base, utcnow
from server_api.ui.view import build as build_operator_view
from server_helpers import enrolled_devices, make_settings, open_round, tick
from server_testkit import load_backbone_bytes, make_delta, unit_vector, update_file


def test_backbone_download_etag_dtype_and_pinning(client: TestClient, admin: dict, rng: np.random.Generator) -> None:
    # Prepare: one finished round, so there are two versions.
    (device,) = enrolled_devices(client, 1, rng)
    round_ = open_round(client, admin, target_participants=1)
    device.checkin()
    v1 = round_["base_version"]
    fp32 = device.backbone(v1)
    device.upload(round_["id"], update_file(make_delta(load_backbone_bytes(fp32.content), rng), unit_vector(rng), v1, 5))
    v2 = device.request("GET", "/v1/models/current").json()["version"]
    # Execute
    cached = device.backbone(v1, etag=fp32.headers["etag"])
    fp16 = device.backbone(v1, dtype="fp16")
    fp16_cached = device.backbone(v1, dtype="fp16", etag=fp16.headers["etag"])
    int8 = device.backbone(v1, dtype="int8")
    stale_etag = device.backbone(v2, etag=fp32.headers["etag"])
    bad_dtype = device.backbone(v1, dtype="int4")
    unknown = device.backbone("f" * 64)
    unsigned = client.get(f"/v1/models/{v1}/backbone")
    # Assert
    assert fp32.status_code == 200 and fp32.headers["etag"] == f'"{v1}"' and "immutable" in fp32.headers["cache-control"]
    assert cached.status_code == 304 and cached.content == b""
    assert fp16.status_code == 200 and fp16.headers["etag"] == f'"{v1}.fp16"'
    assert {v.dtype for v in load_backbone_bytes(fp16.content).values() if v.dtype.kind == "f"} == {np.dtype(np.float16)}
    assert len(fp16.content) < 0.6 * len(fp32.content)
    assert fp16_cached.status_code == 304
    # int8: what a round with local.download_bits 8 downloads, checked and loaded as a device does, within half a step of fp32
    assert int8.status_code == 200 and int8.headers["etag"] == f'"{v1}.int8"' and len(int8.content) < 0.7 * len(fp16.content)
    payload = torch.load(io.BytesIO(int8.content), map_location="cpu", weights_only=True)
    check_backbone_payload(payload, "int8 file")
    exact = load_backbone_bytes(fp32.content)
    for key, value in dequantized_state(payload).items():
        if key in payload["int8_scales"]:  # within half a step of its output channel's scale
            rows, error = exact[key].reshape(len(exact[key]), -1), (value.numpy() - exact[key]).reshape(len(exact[key]), -1)
            assert (np.abs(error).max(1) <= np.abs(rows).max(1) / 254 + 1e-7).all(), key
        else:  # the rest rides in fp16
            np.testing.assert_array_equal(value.numpy(), exact[key].astype(np.float16).astype(exact[key].dtype), err_msg=key)
    assert v2 != v1 and stale_etag.status_code == 200 and stale_etag.headers["etag"] == f'"{v2}"'
    assert bad_dtype.status_code == 422 and unknown.status_code == 404 and unsigned.status_code == 401


def test_a_round_downloading_int8_writes_the_int8_file_of_a_version_published_before_them(
    client: TestClient, admin: dict, rng: np.random.Generator,
) -> None:
    # Prepare: the current version as if published before int8 files existed
    from server_api.tables import ModelVersion

    (device,) = enrolled_devices(client, 1, rng)
    with client.app.state.ctx.sessions() as session:
        version = session.query(ModelVersion).order_by(ModelVersion.id.desc()).first()
        published, version_hash = version.int8_blob, version.version_hash
        version.int8_blob = None
        session.commit()
    missing = device.backbone(version_hash, dtype="int8")
    # Execute: an fp16 round leaves it alone; an int8 round writes it
    fp16_round = open_round(client, admin, target_participants=1)
    assert client.post(f"/v1/admin/rounds/{fp16_round['id']}/close", headers=admin).status_code == 200
    assert tick(client) == "failed"  # closed with no update
    with client.app.state.ctx.sessions() as session:
        after_fp16_round = session.query(ModelVersion).filter_by(version_hash=version_hash).one().int8_blob
    round_ = open_round(client, admin, target_participants=1, local={"download_bits": 8})
    asked = device.checkin().json()["local"]
    written = device.backbone(version_hash, dtype="int8")
    # Assert: the device is told int8 and gets the very file the version would have been published with
    assert missing.status_code == 404 and "published before int8 downloads" in missing.json()["detail"]
    assert after_fp16_round is None and round_["base_version"] == version_hash and asked["download_bits"] == 8
    assert written.status_code == 200 and written.headers["etag"] == f'"{version_hash}.int8"'
    assert hashlib.sha256(written.content).hexdigest() == published


def test_health_metrics_and_docs(client: TestClient, admin: dict, rng: np.random.Generator) -> None:
    # Prepare
    (device,) = enrolled_devices(client, 1, rng)
    round_ = open_round(client, admin, target_participants=1)
    device.checkin()
    base = load_backbone_bytes(device.backbone(round_["base_version"]).content)
    body = update_file(make_delta(base, rng), unit_vector(rng), round_["base_version"], 5)
    device.upload(round_["id"], body)
    # Execute
    health, ready = client.get("/healthz"), client.get("/readyz")
    metrics = client.get("/metrics").text
    values = {sample.name: sample.value for family in text_string_to_metric_families(metrics) for sample in family.samples}
    docs, spec = client.get("/docs"), client.get("/openapi.json").json()
    # Assert
    assert health.json() == {"status": "ok"} and ready.json() == {"status": "ready"}
    assert 'fedface_rounds{status="completed"} 1.0' in metrics
    assert values["fedface_upload_bytes_total"] == len(body) and values["fedface_updates_accepted_total"] == 1
    assert values["fedface_aggregation_seconds_count"] == 1
    assert docs.status_code == 200
    assert {"/v1/devices", "/v1/rounds/{round_id}/updates", "/v1/admin/rounds", "/v1/models/{version}/backbone"} <= set(spec["paths"])


def test_readyz_reports_an_unreachable_database(tmp_path: Path) -> None:
    # Prepare: a working server whose database then disappears.
    settings = make_settings(tmp_path / "data", f"sqlite:///{tmp_path / 'db.sqlite'}")
    with TestClient(create_app(settings, run_scheduler=False)) as client:
        client.app.state.ctx.engine.dispose()
        (tmp_path / "db.sqlite").unlink()
        (tmp_path / "db.sqlite").mkdir()  # a directory cannot be opened as a database
        # Execute
        response = client.get("/readyz")
    # Assert
    assert response.status_code == 503 and response.json()["status"] == "unavailable"


def test_migrations_match_the_models(client: TestClient) -> None:
    # Prepare: the app ran `alembic upgrade head` at startup.
    engine = client.app.state.ctx.engine
    # Execute
    with engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection, opts={"compare_type": True}), Base.metadata)
    # Assert
    assert diff == []


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_onnx_export_is_served_and_runs(tmp_path: Path, db_url: str, rng: np.random.Generator) -> None:
    # Prepare
    import onnxruntime as ort

    settings = make_settings(tmp_path / "data", db_url, export_onnx=True)
    with TestClient(create_app(settings, run_scheduler=False)) as client:
        (device,) = enrolled_devices(client, 1, rng)
        current = device.request("GET", "/v1/models/current").json()
        # Execute
        onnx = device.request("GET", current["onnx_url"])
        again = device.request("GET", current["onnx_url"], headers={"If-None-Match": onnx.headers["etag"]})
    session = ort.InferenceSession(onnx.content, providers=["CPUExecutionProvider"])
    (embedding,) = session.run(None, {"faces": np.zeros((2, 3, 112, 112), np.float32)})
    # Assert
    assert onnx.status_code == 200 and again.status_code == 304
    assert embedding.shape == (2, 128)


def test_a_round_inherits_the_threshold_and_the_operator_recalibrates_the_new_version(
    client: TestClient, admin: dict, rng: np.random.Generator,
) -> None:
    # Prepare: the operator publishes a threshold for the bootstrap version; one device trains a round
    (device,) = enrolled_devices(client, 1, rng)
    v1 = device.request("GET", "/v1/models/current").json()["version"]
    calibrated = {"threshold": 0.42, "far": 1e-3, "calibration": "all impostor pairs of LFW folds 1-5"}
    assert client.put(f"/v1/admin/models/{v1}/verification", json=calibrated, headers=admin).status_code == 200
    round_ = open_round(client, admin, target_participants=1)
    device.checkin()
    device.upload(round_["id"], update_file(make_delta(load_backbone_bytes(device.backbone(v1).content), rng), unit_vector(rng), v1, 5))
    # Execute: the new version as published, then the operator recalibrates it
    inherited = client.get("/v1/admin/models", headers=admin).json()
    v2 = inherited[0]["version"]
    recalibrated = client.put(f"/v1/admin/models/{v2}/verification", json={**calibrated, "threshold": 0.5}, headers=admin)
    seen_by_device = device.request("GET", "/v1/models/current").json()
    # Assert: the round's version carried v1's threshold, marked as calibrated for v1; the device now reads v2's own
    assert [v["version"] for v in inherited] == [v2, v1] and inherited[1]["calibrated_for"] == v1
    assert (inherited[0]["verify_threshold"], inherited[0]["calibrated_for"]) == (0.42, v1)
    assert recalibrated.status_code == 200 and recalibrated.json()["calibrated_for"] == v2
    assert (seen_by_device["version"], seen_by_device["verify_threshold"], seen_by_device["verify_far"]) == (v2, 0.5, 1e-3)
    # and the next round inherits the recalibrated threshold, not the one in v2's file
    round_2 = open_round(client, admin, target_participants=1)
    device.checkin()
    device.upload(round_2["id"], update_file(make_delta(load_backbone_bytes(device.backbone(v2).content), rng), unit_vector(rng), v2, 5))
    v3 = client.get("/v1/admin/models", headers=admin).json()[0]
    assert (v3["verify_threshold"], v3["calibrated_for"]) == (0.5, v2)


def test_after_a_recalibration_every_reader_sees_the_new_threshold_and_a_file_only_the_one_it_shipped_with(
    tmp_path: Path, db_url: str, rng: np.random.Generator,
) -> None:
    # Prepare: the bundled mobile model, which ships its card's threshold; one enrolled device
    card = Verification.from_json(json.loads(FIGURES["mobile"].read_text())["verification"])
    assert card is not None and card.far_10_point is not None
    recalibrated = {"threshold": card.far_10_point + 0.1, "far": 1e-2, "calibration": "the operator's public faces"}
    with TestClient(create_app(make_settings(tmp_path / "data", db_url, model="mobile"), run_scheduler=False)) as client:
        admin = {"Authorization": f"Bearer {client.app.state.ctx.admin_token}"}
        (device,) = enrolled_devices(client, 1, rng)
        v1 = device.request("GET", "/v1/models/current").json()["version"]
        shipped_before = device.request("GET", "/v1/models/current").json()["verify_threshold"]
        # Execute: the operator recalibrates v1; then every reader, and a round trained on v1
        published = client.put(f"/v1/admin/models/{v1}/verification", json=recalibrated, headers=admin)
        seen_by_device = device.request("GET", "/v1/models/current").json()
        listed = client.get("/v1/admin/models", headers=admin).json()[0]
        with client.app.state.ctx.sessions() as session:
            operator_page = next(v for v in build_operator_view(session, utcnow()).versions if v.version == v1)
        v1_file = load_backbone_from(tmp_path / "v1.pt", client.get(f"/v1/admin/models/{v1}/backbone", headers=admin).content)
        round_ = open_round(client, admin, target_participants=1)
        device.checkin()
        delta = make_delta(load_backbone_bytes(device.backbone(v1).content), rng)
        assert device.upload(round_["id"], update_file(delta, unit_vector(rng), v1, 5)).status_code == 201
        v2 = device.request("GET", "/v1/models/current").json()
        v2_file = load_backbone_from(tmp_path / "v2.pt", device.backbone(v2["version"]).content)
    # Assert: the bootstrap row started from the card; after the PUT the device, the operator's list and page read the new value
    assert shipped_before == card.threshold and published.status_code == 200
    assert (seen_by_device["verify_threshold"], seen_by_device["verify_far"]) == (recalibrated["threshold"], 1e-2)
    assert (listed["verify_threshold"], listed["calibration"], listed["calibrated_for"]) == (recalibrated["threshold"], recalibrated["calibration"], v1)
    assert (operator_page.threshold, operator_page.figures) == (recalibrated["threshold"], {FAR_10_KEY: card.far_10_point})
    # the next round's version inherits the row's value, never v1's file's, and ships with it
    assert (v2["verify_threshold"], v2["verify_far"]) == (recalibrated["threshold"], 1e-2)
    assert shipped_verification(v2_file) == Verification(recalibrated["threshold"], 1e-2, recalibrated["calibration"], card.far_10_point, v1)
    # v1's file still holds the card's value, labelled as what it shipped with: no file meta names a verification of its own
    assert shipped_verification(v1_file) == card
    assert {SHIPPED_KEY} <= set(meta_of(v1_file)) and LEGACY_KEY not in meta_of(v1_file) and LEGACY_KEY not in meta_of(v2_file)


def test_a_threshold_is_refused_without_the_admin_token_out_of_range_or_for_an_unknown_version(client: TestClient, admin: dict) -> None:
    # Prepare
    version = client.get("/v1/admin/models", headers=admin).json()[0]["version"]
    good = {"threshold": 0.4, "far": 1e-3, "calibration": "LFW folds 1-5"}
    # Execute
    anonymous = client.put(f"/v1/admin/models/{version}/verification", json=good)
    out_of_range = [
        client.put(f"/v1/admin/models/{version}/verification", json={**good, **bad}, headers=admin)
        for bad in ({"threshold": 1.5}, {"far": 0.0}, {"far": 1.0}, {"calibration": ""}, {"extra": 1})
    ]
    unknown = client.put(f"/v1/admin/models/{'0' * 64}/verification", json=good, headers=admin)
    download = client.get(f"/v1/admin/models/{version}/backbone", headers=admin)
    # Assert: nothing was published; the operator's download is the version's own bytes
    assert anonymous.status_code == 401 and unknown.status_code == 404
    assert [r.status_code for r in out_of_range] == [422] * 5
    assert client.get("/v1/admin/models", headers=admin).json()[0]["verify_threshold"] is None
    assert download.status_code == 200 and hashlib.sha256(download.content).hexdigest() == version


def test_a_threshold_is_a_json_number_and_without_a_far_10_point_only_its_range_is_checked(client: TestClient, admin: dict) -> None:
    # Prepare: the random bootstrap model ships no figures, so no FAR 10% point
    version = client.get("/v1/admin/models", headers=admin).json()[0]["version"]
    url = f"/v1/admin/models/{version}/verification"
    good = {"threshold": 0.4, "far": 1e-3, "calibration": "LFW folds 1-5"}
    # Execute: numbers spelled as strings or booleans, NaN and infinity as raw JSON; then the lowest cosine there is
    loose = [
        client.put(url, json={**good, **bad}, headers=admin)
        for bad in ({"threshold": "0.3"}, {"far": "0.001"}, {"threshold": True}, {"force": "true"}, {"force": 1})
    ]
    raw = [
        client.put(url, content=f'{{"threshold": {text}, "far": 0.001, "calibration": "x"}}', headers=admin | {"Content-Type": "application/json"})
        for text in ("NaN", "Infinity", "-Infinity")
    ]
    unpublished = client.get("/v1/admin/models", headers=admin).json()[0]["verify_threshold"]
    lowest = client.put(url, json={**good, "threshold": -1.0}, headers=admin)
    # Assert: nothing loose was published; with no figure to compare with, -1 is in range
    assert [r.status_code for r in loose + raw] == [422] * 8, [r.text for r in loose + raw]
    assert {r.json()["code"] for r in loose + raw} == {"invalid_input"} and unpublished is None
    assert lowest.status_code == 200 and lowest.json()["verify_threshold"] == -1.0


def test_a_threshold_below_the_models_far_10_point_needs_force_and_the_point_outlives_recalibrations_and_rounds(
    tmp_path: Path, db_url: str, rng: np.random.Generator,
) -> None:
    # Prepare: the bundled MobileFaceNet, whose shipped figures carry its FAR 10% point; one enrolled device
    floor = json.loads(FIGURES["mobilefacenet"].read_text())["verification"][FAR_10_KEY]
    good = {"threshold": 0.6, "far": 1e-3, "calibration": "all impostor pairs of LFW folds 1-5"}
    with TestClient(create_app(make_settings(tmp_path / "data", db_url, model="mobilefacenet"), run_scheduler=False)) as client:
        admin = {"Authorization": f"Bearer {client.app.state.ctx.admin_token}"}
        (device,) = enrolled_devices(client, 1, rng)
        v1 = device.request("GET", "/v1/models/current").json()["version"]

        def publish(version: str, threshold: float, **extra: object) -> httpx.Response:
            return client.put(f"/v1/admin/models/{version}/verification", json={**good, "threshold": threshold, **extra}, headers=admin)

        # Execute: -1 (every face verifies), just under the point, the same forced, -1 again, a calibrated one;
        # then a round makes v2, which inherits the threshold, and just under the point is tried on v2
        everyone = publish(v1, -1.0)
        below = publish(v1, floor - 0.01)
        forced = publish(v1, floor - 0.01, force=True)
        after_forced = publish(v1, -1.0)
        calibrated = publish(v1, 0.6)
        round_ = open_round(client, admin, target_participants=1)
        device.checkin()
        base = load_backbone_bytes(device.backbone(v1).content)
        assert device.upload(round_["id"], update_file(make_delta(base, rng), unit_vector(rng), v1, 5)).status_code == 201
        v2 = device.request("GET", "/v1/models/current").json()
        inherited_below = publish(v2["version"], floor - 0.01)
        with client.app.state.ctx.sessions() as db:
            audit = [e.details for e in db.query(AuditEvent).filter_by(action="model.calibrated").order_by(AuditEvent.id)]
    # Assert: one clear 422 naming the point and the way past it; forcing works once and is audited; the point stays
    assert 0.2 < floor < good["threshold"]
    assert everyone.status_code == 422 and everyone.json()["code"] == "invalid_input"
    assert everyone.json()["detail"] == (
        f"threshold -1 is below this model's FAR 10% point, {floor:.4f}: devices would accept more than one impostor "
        'in ten; send "force": true to publish it anyway')
    assert below.status_code == 422 and after_forced.status_code == 422 and inherited_below.status_code == 422
    assert forced.status_code == 200 and forced.json()["verify_threshold"] == floor - 0.01
    assert calibrated.status_code == 200 and (v2["verify_threshold"], v2["verify_far"]) == (0.6, 1e-3)
    assert [e["forced_below_far_10"] for e in audit] == [True, False]


def test_a_published_feature_centre_reaches_devices_and_rounds_and_the_next_version_inherits_it(
    client: TestClient, admin: dict, rng: np.random.Generator,
) -> None:
    # Prepare: one enrolled device on the bootstrap version, which publishes no centre (a random model)
    (device,) = enrolled_devices(client, 1, rng)
    v1 = device.request("GET", "/v1/models/current").json()["version"]
    center = unit_vector(rng).tolist()
    body = {"vector": center, "source": "1000 public celeba photos"}
    # Execute: refused ones first, then the operator's centre; a round on it; one device trains
    refused = [
        client.put(f"/v1/admin/models/{v1}/feature-center", json={**body, **bad}, headers=admin).status_code
        for bad in ({"vector": [2 * x for x in center]}, {"vector": (np.ones(64) / 8).tolist()}, {"source": ""})
    ]
    anonymous = client.put(f"/v1/admin/models/{v1}/feature-center", json=body).status_code
    unknown = client.put(f"/v1/admin/models/{'0' * 64}/feature-center", json=body, headers=admin).status_code
    unpublished = device.request("GET", "/v1/models/current").json()["feature_center"]
    published = client.put(f"/v1/admin/models/{v1}/feature-center", json=body, headers=admin)
    seen_by_device = device.request("GET", "/v1/models/current").json()["feature_center"]
    short_round = client.post("/v1/admin/rounds", headers=admin, json={
        "target_participants": 1, "min_participants": 1, "local": {"feature_center": (np.ones(64) / 8).tolist()}})
    round_ = open_round(client, admin, target_participants=1, local={"feature_center": seen_by_device, "train_embedding": False})
    device.checkin()
    device.upload(round_["id"], update_file(make_delta(load_backbone_bytes(device.backbone(v1).content), rng), unit_vector(rng), v1, 5))
    versions = client.get("/v1/admin/models", headers=admin).json()
    # Assert: bad centres and strangers change nothing; the device reads the published one; the round's version carries it
    assert refused == [422, 422, 422] and (anonymous, unknown) == (401, 404) and unpublished is None
    assert published.status_code == 200 and published.json()["feature_center"] == pytest.approx(center)
    assert seen_by_device == pytest.approx(center)
    assert short_round.status_code == 422 and "embeds in 128" in short_round.json()["detail"]
    assert versions[1]["version"] == v1 and versions[0]["round_id"] == round_["id"]
    assert versions[0]["feature_center"] == pytest.approx(center)


def load_backbone_from(path: Path, data: bytes) -> torch.nn.Module:
    """A downloaded backbone file, loaded as any tool loads `--model PATH`."""
    path.write_bytes(data)
    return load_backbone(path)
