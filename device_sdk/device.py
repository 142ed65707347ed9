"""`FaceDevice`: what a phone app embeds to enroll its owner, join rounds and verify faces."""
from __future__ import annotations

import base64
import io
import json
import secrets
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from device_sdk.errors import NoFaceFound, NotEnrolled, NotRegistered, RoundClosed
from device_sdk.inference import OnnxEmbedder
from device_sdk.personal import PersonalConfig, PersonalVerifier, load_verifier, save_verifier, saved_model_version, train_personal_verifier
from device_sdk.secure_round import SecureRound
from device_sdk.state import DeviceState, write_atomic
from device_sdk.template_noise import noisy_template, sigma_for_cosine
from device_sdk.training import LocalTrainingConfig, mean_feature_embedding, train_local
from device_sdk.transport import Transport
from facecore import tensorfile
from facecore.align.geometry import FaceGeometry, geometry_of
from facecore.align.pipeline import FaceAligner, load_rgb
from facecore.data.folders import list_photos
from facecore.models.registry import get_backbone


@dataclass(frozen=True)
class EnrollResult:
    faces: int
    skipped: tuple[str, ...]  # photos with no detectable face
    model_version: str


@dataclass(frozen=True)
class RoundSummary:
    round_id: int
    loss_before: float
    loss_after: float
    seconds: float
    bytes_up: int
    bytes_down: int
    steps: int


@dataclass(frozen=True)
class VerifyResult:
    score: float
    match: bool
    threshold: float
    personal: bool = False


@dataclass(frozen=True)
class PersonalizeResult:
    fusion: str
    faces: int
    loss_before: float
    loss_after: float
    seconds: float
    model_version: str
    fusion_summary: dict[str, float]


class FaceDevice:
    def __init__(
        self, server_url: str, state_dir: str | Path, min_photos: int = 3, timeout: float = 30.0, retries: int = 4,
        aligner: FaceAligner | None = None, verify_tls: bool | str = True, upload_fp16: bool = True,
        template_noise_cos: float | None = None, training_slot: AbstractContextManager[Any] | None = None,
    ) -> None:
        """`template_noise_cos`: blur every template sent to the server so that it keeps about this
        cosine with the true one (device_sdk.template_noise); the device keeps the clean one.
        `training_slot`: entered around local training. Only for many devices in one process (a
        simulation), e.g. a shared Semaphore, so their trainings do not all hold memory at once."""
        self.state = DeviceState(state_dir)
        self.transport = Transport(server_url, timeout=timeout, retries=retries, verify=verify_tls)
        self.min_photos = min_photos
        self.upload_fp16 = upload_fp16
        if template_noise_cos is not None:
            sigma_for_cosine(template_noise_cos, 1)  # refuse a bad setting now, not at the first upload
        self.template_noise_cos = template_noise_cos
        self._aligner = aligner
        self._training_slot = training_slot if training_slot is not None else nullcontext()
        self._embedders: dict[str, OnnxEmbedder] = {}  # by model version: a session takes ~0.1 s to build

    # ---- plumbing --------------------------------------------------------------------------
    @property
    def device_id(self) -> str | None:
        return self.state.info().get("device_id")

    def _request(self, method: str, path: str, **kwargs: Any):  # type: ignore[no-untyped-def]
        key = self.state.signing_key()
        if key is None or self.device_id is None:
            raise NotRegistered()
        return self.transport.request(method, path, key, self.device_id, **kwargs)

    def _align(self, photos: Sequence[str | Path], geometry: FaceGeometry) -> tuple[np.ndarray, list[str]]:
        """Align in memory only, to the crop the server's model declares: the owner's faces never
        enter a shared, unencrypted cache."""
        if self._aligner is None:
            self._aligner = FaceAligner(geometry=geometry)
        self._aligner = aligner = self._aligner.with_geometry(geometry)
        faces, missing = [], []
        for path in list_photos(list(photos)):
            image = load_rgb(path)
            found = aligner.align_image(image) if image is not None else None
            if found is None:
                missing.append(str(path))
            else:
                faces.append(found[0])
        return (np.stack(faces) if faces else np.zeros((0, *geometry.row_shape), np.uint8)), missing

    def _model(self) -> dict[str, Any]:
        return self._request("GET", "/v1/models/current").json()

    @staticmethod
    def _geometry(model: dict[str, Any]) -> FaceGeometry:
        return FaceGeometry.from_json(model["face_geometry"])

    def _download(self, url: str, name: str) -> Path:
        """Version-pinned URLs never change content: keep one file per URL, revalidated by ETag."""
        folder = self.state.models_dir()
        path = folder / name
        etag_path = folder / f"{name}.etag"
        headers = {"If-None-Match": etag_path.read_text()} if path.exists() and etag_path.exists() else {}
        response = self._request("GET", url, headers=headers, expect=(200, 304))
        if response.status_code == 200:
            write_atomic(path, response.content, mode=0o644)
            if response.headers.get("ETag"):
                write_atomic(etag_path, response.headers["ETag"].encode(), mode=0o644)
        return path

    def _embedder(self, model: dict[str, Any]) -> OnnxEmbedder:
        if not model.get("onnx_url"):
            raise RoundClosed("the server publishes no ONNX model for this version")
        if model["version"] not in self._embedders:
            self._embedders = {model["version"]: OnnxEmbedder(self._download(model["onnx_url"], f"{model['version']}.onnx"))}
        return self._embedders[model["version"]]

    # ---- API -----------------------------------------------------------------------------
    def register(self) -> str:
        if self.device_id:
            return self.device_id
        key = self.state.signing_key(create=True)
        assert key is not None
        public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        response = self.transport.request("POST", "/v1/devices", key, None, body={"public_key": base64.b64encode(public).decode()}, expect=(200, 201))
        return self.state.update_info(device_id=response.json()["device_id"])["device_id"]

    def enroll(self, photos: Sequence[str | Path]) -> EnrollResult:
        model = self._model()
        faces, missing = self._align(photos, self._geometry(model))
        if len(faces) < self.min_photos:
            raise NoFaceFound(missing or [f"(only {len(faces)} usable photos, {self.min_photos} needed)"])
        embedding = mean_feature_embedding(self._embedder(model).embed(faces))
        self._request("PUT", f"/v1/devices/{self.device_id}/embedding", body={"embedding": self._shared_template(embedding).tolist()}, expect=(200, 201))
        self.state.save_faces(faces)
        self.state.save_template(embedding)
        self.state.update_info(enrolled=True, model_version=model["version"])
        return EnrollResult(len(faces), tuple(missing), model["version"])

    def train_round(self, wait: float = 0.0, poll: float = 2.0) -> RoundSummary:
        """Check in (waiting up to `wait` seconds for a round and a slot), train, upload once."""
        faces = self.state.faces()
        if faces is None or not self.state.info().get("enrolled"):
            raise NotEnrolled()
        up0, down0 = self.transport.bytes_up, self.transport.bytes_down
        deadline = time.monotonic() + wait
        checkin = self._checkin_until_selected(deadline, poll)
        pending = self._resend_pending(checkin)
        if pending is not None:
            return pending
        started = time.perf_counter()
        secure = None
        if checkin.get("secagg_url"):
            secure = SecureRound(self._request, checkin["secagg_url"], poll=min(poll, 1.0))
            secure.join()  # before training: the key steps have short deadlines
        backbone = self._load_backbone(checkin["backbone_url"], checkin["base_version"])
        if faces.shape[1:] != geometry_of(backbone).row_shape:
            raise NotEnrolled(f"the server's model crops faces as {geometry_of(backbone).key}, this device's faces were cropped "
                              f"for another model: enroll again")
        embedding = np.asarray(self._request("GET", checkin["embedding_url"]).json()["embedding"], np.float32)
        local = checkin["local"]
        config = LocalTrainingConfig(epochs=local.get("epochs", 1), steps=local.get("steps"), lr=local.get("lr", 0.01), margin=local.get("margin", 0.9), batch=local.get("batch_size", 32))
        with self._training_slot:
            update = train_local(backbone, embedding, faces, config, seed=int(checkin["round_id"]))
        body = self._update_file(backbone, update, checkin["base_version"], secure)
        key = f"{self.device_id}-{checkin['round_id']}-{secrets.token_hex(8)}"
        # Persist before sending: a crash after this point resends the same bytes under the same key.
        write_atomic(self.state.dir / "pending_upload.bin", body)
        write_atomic(self.state.dir / "pending_upload.json", json.dumps({"round_id": checkin["round_id"], "key": key, "url": checkin["upload_url"], "loss_before": update.loss_before, "loss_after": update.loss_after, "steps": update.steps}).encode())
        self._send_pending()
        self.state.save_template(update.embedding.numpy())
        if secure is not None:
            secure.unmask()
        return RoundSummary(checkin["round_id"], update.loss_before, update.loss_after, time.perf_counter() - started,
                            self.transport.bytes_up - up0, self.transport.bytes_down - down0, update.steps)

    def personalize(self, config: PersonalConfig | None = None, cohort: np.ndarray | None = None) -> PersonalizeResult:
        """Opt-in: train the fused personal verifier (FedFusion) on the owner's faces, on the
        current global model. `cohort`: aligned public impostor faces to train against. Nothing
        is sent to the server; the result is stored encrypted and used by verify(personal=True)."""
        faces = self.state.faces()
        if faces is None or not self.state.info().get("enrolled"):
            raise NotEnrolled()
        model = self._model()
        backbone = self._load_backbone(model["backbone_url"], model["version"])
        verifier, report = train_personal_verifier(backbone, faces, config, cohort=cohort)
        self.state.save_personal(save_verifier(verifier, model["version"]))
        return PersonalizeResult(report.fusion, report.faces, report.loss_before, report.loss_after, report.seconds, model["version"], report.fusion_summary)

    def verify(self, photo: str | Path, personal: bool = False, threshold: float | None = None) -> VerifyResult:
        """Score a photo against the owner. `personal`: with the fused verifier of personalize().
        `threshold` defaults to the server's, which is calibrated for the global model: fused
        scores of owners and of impostors both run higher (simulator/FEDFUSION.md), so calibrate
        your own for an operating point you need."""
        template = self.state.template()
        if template is None:
            raise NotEnrolled()
        model = self._model()
        faces, missing = self._align([photo], self._geometry(model))
        if len(faces) == 0:
            raise NoFaceFound(missing)
        if threshold is None:
            threshold = model.get("verify_threshold")
        if threshold is None:
            raise RoundClosed("the server publishes no verification threshold for the current model")
        if personal:
            score = float(self._personal_verifier().score(faces)[0])
        else:
            score = float(self._embedder(model).embed(faces)[0] @ (template / np.linalg.norm(template)))
        return VerifyResult(score, score >= threshold, float(threshold), personal)

    def _personal_verifier(self) -> PersonalVerifier:
        payload = self.state.personal()
        if payload is None:
            raise NotEnrolled("this device has no personalised verifier: run personalize first")
        version = saved_model_version(payload)
        backbone = self._load_backbone(f"/v1/models/{version}/backbone", version)
        return load_verifier(payload, backbone)

    def unenroll(self) -> None:
        self._request("DELETE", f"/v1/devices/{self.device_id}", expect=(204,))
        self.state.forget_owner()
        self.state.update_info(enrolled=False)

    # ---- rounds ----------------------------------------------------------------------------
    def _checkin_until_selected(self, deadline: float, poll: float) -> dict[str, Any]:
        while True:
            try:
                checkin = self._request("POST", "/v1/rounds/current/checkin").json()
            except RoundClosed:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(poll)
                continue
            if checkin["status"] in ("selected", "uploaded"):
                return checkin
            if time.monotonic() >= deadline:
                raise RoundClosed(f"round {checkin['round_id']}: this device is {checkin['status'].replace('_', ' ')}")
            time.sleep(min(poll, max(checkin.get("retry_after_s") or poll, 0.1)))

    def _resend_pending(self, checkin: dict[str, Any]) -> RoundSummary | None:
        """After a crash: resend the saved upload of this round, or drop one of a past round."""
        meta_path = self.state.dir / "pending_upload.json"
        if not meta_path.exists():
            return None
        meta = json.loads(meta_path.read_text())
        if meta["round_id"] != checkin["round_id"]:
            self._clear_pending()
            return None
        sent = self._send_pending()
        return RoundSummary(meta["round_id"], meta["loss_before"], meta["loss_after"], 0.0, sent, 0, meta["steps"])

    def _send_pending(self) -> int:
        meta = json.loads((self.state.dir / "pending_upload.json").read_text())
        body = (self.state.dir / "pending_upload.bin").read_bytes()
        self._request("POST", meta["url"], body=body, headers={"Idempotency-Key": meta["key"], "Content-Type": "application/octet-stream"}, expect=(200, 201))
        self._clear_pending()
        return len(body)

    def _clear_pending(self) -> None:
        for name in ("pending_upload.json", "pending_upload.bin"):
            (self.state.dir / name).unlink(missing_ok=True)

    def _load_backbone(self, url: str, version: str) -> torch.nn.Module:
        dtype = "fp16" if self.upload_fp16 else "fp32"
        path = self._download(f"{url}?dtype={dtype}", f"{version}.{dtype}.pt")
        payload = torch.load(path, map_location="cpu", weights_only=True)
        model = get_backbone(payload["backbone"], embedding_dim=payload["embedding_dim"])
        model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in payload["state_dict"].items()})
        return model.eval()

    def _shared_template(self, embedding: np.ndarray) -> np.ndarray:
        """The template as the server may see it: blurred when the owner asked for template noise."""
        if self.template_noise_cos is None:
            return np.asarray(embedding, np.float32)
        return noisy_template(embedding, self.template_noise_cos, np.random.default_rng(secrets.randbits(128)))

    def _update_file(self, backbone: torch.nn.Module, update: Any, base_version: str, secure: SecureRound | None = None) -> bytes:
        base = backbone.state_dict()
        wire = np.float16 if self.upload_fp16 else np.float32
        # an entry training left out (a frozen prefix) did not move: its delta is zero
        deltas = {name: (update.state_dict[name] - value if name in update.state_dict else torch.zeros_like(value)).numpy() for name, value in base.items()}
        if secure is not None:
            tensors = {"secagg.masked": secure.masked(deltas, update.n_samples).view(np.int32)}
        else:
            tensors = {f"backbone.{k}": d.astype(wire) if np.issubdtype(d.dtype, np.floating) else d for k, d in deltas.items()}
        tensors["class_embedding"] = self._shared_template(update.embedding.numpy())
        meta = {"base_version": base_version, "n_samples": update.n_samples, "metrics": {"loss": update.loss_after, "loss_before": update.loss_before}}
        buffer = io.BytesIO()
        tensorfile.write(buffer, tensors, {"fedface": json.dumps(meta)})
        return buffer.getvalue()


__all__ = ["EnrollResult", "FaceDevice", "PersonalizeResult", "RoundSummary", "VerifyResult"]
