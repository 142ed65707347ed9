"""The secure-aggregation round for `fedface bench server --secure`, run by the bench client process.

N signing devices go through every step of a secure round against the real server: advertise,
share keys, take their shares, upload masked updates, answer the unmasking. A fraction drops after
sharing keys (never uploads), so the server must rebuild their masks. Each device's bytes on the
wire are counted, and each step is timed. Masked updates are computed before the timed upload
step, since on one machine the devices' masking would otherwise serialise with the server's work;
the masking time is reported per device instead.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from facecore import tensorfile
from facecore.federation.protocol import EMBEDDING_KEY, MASKED_KEY, METADATA_KEY
from facecore.federation.secagg import Advert, SecAggClient, quantize, weighted_update
from facecore.federation.status import FINAL_ROUND_STATUSES, RoundStatus
from fedface_bench.server_client import (
    DELTA_SCALE,
    REQUEST_TIMEOUT_S,
    BenchDevice,
    aggregation_metrics,
    bounded,
    connect,
    current_model,
    expect,
    plain,
    unit,
)

N_SAMPLES = 32


class SecureBenchDevice(BenchDevice):
    def __init__(self, http: httpx.AsyncClient) -> None:
        super().__init__(http)
        self.secagg = SecAggClient(0, 0)
        self.bytes_up = self.bytes_down = 0
        self.body = b""
        self.sharers: list[int] = []  # from the masked-input step: who shared keys, and the fixed point
        self.bound = self.scale = 0.0

    async def counted(self, method: str, path: str, payload: Any = None, **kwargs: Any) -> httpx.Response:
        response = await self.call(method, path, payload, **kwargs)
        raw = kwargs.get("raw")
        self.bytes_up += len(raw) if raw is not None else len(json.dumps(payload).encode()) if payload is not None else 0
        self.bytes_down += len(response.content)
        return response


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


async def run_secure(url: str, data_dir: Path, n_devices: int, concurrency: int, drop_fraction: float) -> dict[str, Any]:
    admin, limits = await connect([url], data_dir, concurrency)
    rng = np.random.default_rng(1)
    dropping = set(rng.choice(n_devices, int(drop_fraction * n_devices), replace=False).tolist())
    timings: dict[str, float] = {}
    async with httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT_S, limits=limits) as http:
        devices = [SecureBenchDevice(http) for _ in range(n_devices)]
        dim, version, state = await current_model(http)
        delta = {k: (rng.standard_normal(v.shape) * DELTA_SCALE).astype(np.float32) for k, v in state.items() if v.dtype.kind == "f"}
        vector = weighted_update(delta, N_SAMPLES)

        async def enroll(device: SecureBenchDevice) -> None:
            device.id = expect(await device.call("POST", "/v1/devices", {"public_key": device.public_key}), 201, 200)["device_id"]
            expect(await device.call("PUT", f"/v1/devices/{device.id}/embedding", {"embedding": [float(x) for x in unit(rng, dim)]}), 201)

        await bounded(devices, concurrency, "register+enroll", enroll)
        config = {
            "target_participants": n_devices, "min_participants": 2, "deadline_s": 7200, "selection_window_s": 0,
            "secure_aggregation": {"enabled": True, "key_phase_s": 3000, "unmask_phase_s": 3000},
        }
        round_id = int(expect(await plain(http, "POST", "/v1/admin/rounds", json=config, headers=admin), 201)["id"])
        url_ = f"/v1/rounds/{round_id}/secagg"
        started = time.perf_counter()

        async def step(label: str, job: Any, who: list[SecureBenchDevice] = devices) -> None:
            timings[label] = round(await bounded(who, concurrency, label, job), 3)

        async def checkin(device: SecureBenchDevice) -> None:
            expect(await device.counted("POST", "/v1/rounds/current/checkin"), 200)

        async def advertise(device: SecureBenchDevice) -> None:
            advert = device.secagg.advertise()
            body = {"c_public": _b64(advert.c_public), "s_public": _b64(advert.s_public)}
            device.secagg.index = expect(await device.counted("POST", f"{url_}/advert", body), 201)["index"]

        async def share(device: SecureBenchDevice) -> None:
            got = expect(await device.counted("GET", url_), 200)
            device.secagg.threshold = got["threshold"]
            adverts = {m["index"]: Advert(m["index"], base64.b64decode(m["c_public"]), base64.b64decode(m["s_public"])) for m in got["members"]}
            shares = {str(v): _b64(blob) for v, blob in device.secagg.share_keys(adverts).items()}
            expect(await device.counted("POST", f"{url_}/shares", {"shares": shares}), 200)

        async def receive(device: SecureBenchDevice) -> None:
            got = expect(await device.counted("GET", url_), 200)
            device.secagg.receive_shares({int(k): base64.b64decode(v) for k, v in got["shares"].items()})
            device.sharers, device.bound, device.scale = got["key_sharers"], got["bound"], got["scale"]

        await step("checkin_s", checkin)
        await step("advertise_s", advertise)
        await step("share_keys_s", share)
        await step("receive_shares_s", receive)
        senders = [d for i, d in enumerate(devices) if i not in dropping]
        mask_s = []
        for device in senders:  # the devices' own CPU work, outside the server's timed steps
            t0 = time.perf_counter()
            masked = device.secagg.masked_input(quantize(vector, device.bound, device.scale), device.sharers)
            mask_s.append(time.perf_counter() - t0)
            meta = {"base_version": version, "n_samples": N_SAMPLES, "metrics": {"loss": 0.5}}
            device.body = tensorfile.dumps({MASKED_KEY: masked.view(np.int32), EMBEDDING_KEY: unit(rng, dim)}, {METADATA_KEY: json.dumps(meta)})
        pause = sum(mask_s)

        async def upload(device: SecureBenchDevice) -> None:
            extra = {"Content-Type": "application/octet-stream", "Idempotency-Key": hashlib.sha256(device.id.encode()).hexdigest()[:32]}
            expect(await device.counted("POST", f"/v1/rounds/{round_id}/updates", extra=extra, raw=device.body), 201)
            device.body = b""

        await step("upload_s", upload, senders)
        if dropping:  # the dropped devices will never upload: the operator ends the upload step
            expect(await plain(http, "POST", f"/v1/admin/rounds/{round_id}/close", headers=admin), 200)
        while expect(await plain(http, "GET", f"/v1/admin/rounds/{round_id}", headers=admin), 200)["status"] == RoundStatus.OPEN:
            await asyncio.sleep(0.1)

        async def answer(device: SecureBenchDevice) -> None:
            got = expect(await device.counted("GET", url_), 200)
            shares = device.secagg.unmask_shares(got["dropped"], got["survived"])
            body = {part: {str(v): str(s[1]) for v, s in shares[part].items()} for part in ("s", "b")}
            expect(await device.counted("POST", f"{url_}/unmask", body), 200)

        await step("unmask_answers_s", answer, senders)
        final: dict[str, Any] = {}
        while True:
            final = expect(await plain(http, "GET", f"/v1/admin/rounds/{round_id}", headers=admin), 200)
            if final["status"] in FINAL_ROUND_STATUSES:
                break
            await asyncio.sleep(0.1)
        round_s = time.perf_counter() - started - pause
        metrics = await aggregation_metrics([http], final["status"] == RoundStatus.COMPLETED)
    agg = re.search(r"^fedface_aggregation_seconds_sum ([0-9.eE+-]+)$", metrics, re.M)
    up = np.asarray([d.bytes_up for d in senders])
    down = np.asarray([d.bytes_down for d in senders])
    return {
        "mode": "secure", "devices": n_devices, "dropped_after_sharing": len(dropping), "concurrency": concurrency,
        "round_status": final["status"], "failure_reason": final.get("failure_reason"), "round_summary": final.get("summary"),
        "steps_s": timings, "round_seconds_without_device_masking": round(round_s, 3),
        "aggregate_seconds": round(float(agg.group(1)), 3) if agg else None,
        "device_mask_s_median": round(float(np.median(mask_s)), 4),
        "masked_update_bytes": len(tensorfile.dumps({MASKED_KEY: np.zeros(vector.size, np.int32)}, {})),
        "bytes_up_per_device_median": int(np.median(up)), "bytes_down_per_device_median": int(np.median(down)),
        "lost": len(senders) - int((final.get("summary") or {}).get("n_updates", 0)),
    }
