"""The load of `fedface bench server`: N signing devices through one plain round over HTTP, and the
device, request and polling helpers that the secure round (:mod:`fedface_bench.server_secure`) shares.

Runs in the client process (:mod:`fedface_bench.server_load`), so the client's CPU work (signing,
hashing, HTTP framing) never shares an interpreter or GIL with the server or the RSS sampler. It
speaks the wire protocol (facecore.federation.protocol, documented in server_api/README.md) with
plain httpx + cryptography instead of server internals. Progress goes to stderr.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import io
import json
import re
import secrets
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from tqdm import tqdm

from facecore import tensorfile
from facecore.federation.protocol import (
    BACKBONE_PREFIX,
    DEVICE_ID_HEADER,
    EMBEDDING_KEY,
    METADATA_KEY,
    REGISTER_SUBJECT,
    signature_headers,
)
from facecore.federation.quantize import quantized_update
from facecore.federation.status import FINAL_ROUND_STATUSES, RoundStatus
from facecore.federation.wire import trained_entries

DELTA_SCALE = 1e-3  # ~1M params * (1e-3)^2 -> L2 norm ~1, far below FEDFACE_MAX_DELTA_NORM (1000)
REQUEST_TIMEOUT_S = 600.0  # generous: the bench may share a loaded machine
READY_TIMEOUT_S = 300.0
MAX_ATTEMPTS = 4
RETRIES: Counter[str] = Counter()  # transport-level resends, reported so they are never hidden


async def resend(method: str, send: Callable[[], Awaitable[httpx.Response]]) -> httpx.Response:
    """`send()` again, as a real device would, after a transport error (a keep-alive connection the
    server closed while idle fails on reuse) or a 5xx (SQLite "database is locked" after its busy
    timeout is a 500). Every request here is safe to resend: registration returns the known device,
    uploads carry an Idempotency-Key, the rest are reads. Each resend is counted in the output."""
    for attempt in range(MAX_ATTEMPTS):
        last = attempt == MAX_ATTEMPTS - 1
        try:
            response = await send()
        except httpx.TransportError as error:
            if last:
                raise
            RETRIES[f"{method} {type(error).__name__}"] += 1
        else:
            if response.status_code < 500 or last:
                return response
            RETRIES[f"{method} {response.status_code}"] += 1
        await asyncio.sleep(0.5 * 2**attempt)
    raise AssertionError("unreachable")


class BenchDevice:
    """A signing device of the bench, bound to the replica it talks to (`http`)."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http
        self.drops = False
        self.key = Ed25519PrivateKey.generate()
        self.public_key = base64.b64encode(self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
        self.id = REGISTER_SUBJECT  # until registration names it

    def headers(self, method: str, path: str, body_sha256: str) -> dict[str, str]:
        # The body hash goes in a header too: the server checks an upload's signature before it reads the body.
        signed = signature_headers(self.key, self.id, method, path, body_sha256)
        return signed if self.id == REGISTER_SUBJECT else {**signed, DEVICE_ID_HEADER: self.id}

    async def call(self, method: str, path: str, payload: Any = None, extra: dict[str, str] | None = None,
                   raw: bytes | None = None, body_sha256: str | None = None) -> httpx.Response:
        """A signed request; each attempt is signed afresh (a nonce is single use)."""
        body = raw if raw is not None else (b"" if payload is None else json.dumps(payload).encode())
        digest = body_sha256 or hashlib.sha256(body).hexdigest()
        kind = {"Content-Type": "application/json"} if payload is not None else {}
        return await resend(method, lambda: self.http.request(method, path, content=body, headers=self.headers(method, path, digest) | kind | (extra or {})))


def expect(response: httpx.Response, *codes: int) -> Any:
    """The decoded body (bytes unless JSON) of a response with one of `codes`; anything else stops the bench."""
    if response.status_code not in codes:
        raise RuntimeError(f"{response.request.method} {response.request.url.path}: {response.status_code} {response.text[:300]}")
    return response.json() if response.headers.get("content-type", "").startswith("application/json") else response.content


Item = TypeVar("Item")


async def bounded(items: Sequence[Item], concurrency: int, label: str, job: Callable[[Item], Awaitable[None]]) -> float:
    """Run job over items with at most `concurrency` in flight; returns the wall seconds."""
    queue: asyncio.Queue[Item] = asyncio.Queue()
    for item in items:
        queue.put_nowait(item)
    bar = tqdm(total=len(items), desc=label, file=sys.stderr, unit="dev", leave=False, mininterval=1.0)

    async def worker() -> None:
        while not queue.empty():
            await job(queue.get_nowait())
            bar.update(1)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(items)))))
    bar.close()
    return time.perf_counter() - started


async def plain(http: httpx.AsyncClient, method: str, path: str, **kwargs: Any) -> httpx.Response:
    return await resend(method, lambda: http.request(method, path, **kwargs))


def update_template(state: dict[str, np.ndarray], embedding_dim: int, base_version: str, local: Mapping[str, Any] | None = None) -> bytes:
    """One valid update file (fp16 deltas, integer buffers zero; with `local`'s trainable_blocks the trained
    entries only, and with its upload_bits quantised as a device sends them) with `class_embedding` stored
    last, so each device only swaps the final embedding bytes: 1,000 x 2 MB never sits in memory."""
    local = local or {}
    rng = np.random.default_rng(0)
    deltas = {
        k: (rng.standard_normal(state[k].shape) * DELTA_SCALE).astype("<f4") if state[k].dtype.kind == "f" else np.zeros(state[k].shape, state[k].dtype)
        for k in trained_entries(list(state), local.get("trainable_blocks"))
    }
    if local.get("upload_bits") is None:
        tensors = {BACKBONE_PREFIX + k: v.astype("<f2") if v.dtype.kind == "f" else v for k, v in deltas.items()}
    else:
        tensors = quantized_update(deltas, local["upload_bits"])[0]
    tensors[EMBEDDING_KEY] = np.zeros(embedding_dim, "<f4")
    meta = {"base_version": base_version, "n_samples": 32, "metrics": {"loss": 0.5}}
    data = tensorfile.dumps(tensors, {METADATA_KEY: json.dumps(meta)})
    header = tensorfile.read_header(io.BytesIO(data), len(data))
    embedding_at = header.data_start + header.tensors[EMBEDDING_KEY].begin
    assert embedding_at == len(data) - embedding_dim * 4, "class_embedding must be the last tensor"
    return data[:embedding_at]


def unit(rng: np.random.Generator, dim: int) -> np.ndarray:
    v = rng.standard_normal(dim).astype("<f4")
    return v / np.linalg.norm(v)


async def wait_ready(http: httpx.AsyncClient, timeout: float) -> None:
    """This process starts with the server, so its own imports (torch) overlap the server's startup."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if (await http.get("/readyz", timeout=5)).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.3)
    raise RuntimeError(f"server at {http.base_url} not ready after {timeout} s")


async def aggregation_metrics(clients: Sequence[httpx.AsyncClient], completed: bool, timeout: float = 30.0) -> str:
    """The /metrics of the server process that aggregated, once it holds the round's aggregation time (any
    of several replicas may have). The round reads `completed` as soon as its commit lands; the worker
    observes the histogram right after, so a fast client can be first."""
    deadline = time.monotonic() + timeout
    while True:
        texts = [(await plain(http, "GET", "/metrics")).text for http in clients]
        for text in texts:
            count = re.search(r"^fedface_aggregation_seconds_count ([0-9.eE+-]+)$", text, re.M)
            if count and float(count.group(1)) >= 1:
                return text
        if not completed or time.monotonic() > deadline:
            return texts[0]
        await asyncio.sleep(0.1)


class DroppedMidUpload(Exception):
    """A device lost its connection halfway through its upload body (and never retried)."""


async def half_then_drop(body: bytes, chunk: int = 65536) -> AsyncIterator[bytes]:
    for start in range(0, len(body) // 2, chunk):
        yield body[start : min(start + chunk, len(body) // 2)]
        await asyncio.sleep(0)
    raise DroppedMidUpload()


async def connect(urls: Sequence[str], data_dir: Path, concurrency: int) -> tuple[dict[str, str], httpx.Limits]:
    """Wait for the server (every replica); the admin header and the connection limits of the bench's client."""
    for url in urls:
        async with httpx.AsyncClient(base_url=url) as probe_http:
            await wait_ready(probe_http, READY_TIMEOUT_S)
    admin = {"Authorization": f"Bearer {(data_dir / 'admin_token').read_text().strip()}"}
    return admin, httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)


async def current_model(http: httpx.AsyncClient) -> tuple[int, str, dict[str, np.ndarray]]:
    """(embedding dim, version, state dict) of the server's model, read by a probe device that
    registers but never enrolls, so it is not in W."""
    import torch  # only to read the backbone file (torch.load, weights_only=True) for the tensor spec

    probe = BenchDevice(http)
    probe.id = expect(await probe.call("POST", "/v1/devices", {"public_key": probe.public_key}), 201)["device_id"]
    model = expect(await probe.call("GET", "/v1/models/current"), 200)
    dim, version = int(model["embedding_dim"]), str(model["version"])
    raw = await probe.call("GET", f"/v1/models/{version}/backbone?dtype=fp16")
    state = {k: v.numpy() for k, v in torch.load(io.BytesIO(expect(raw, 200)), map_location="cpu", weights_only=True)["state_dict"].items()}
    return dim, version, state


async def run(
    urls: Sequence[str], data_dir: Path, n_devices: int, concurrency: int, drop_fraction: float = 0.0,
    local: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One plain round. Several `urls` are replicas behind one address: device i talks to replica i mod n,
    as a load balancer would spread them; the operator's calls go to the first."""
    admin, limits = await connect(urls, data_dir, concurrency)
    rng = np.random.default_rng(1)
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT_S, limits=limits)) for url in urls]
        http = clients[0]
        devices = [BenchDevice(clients[index % len(clients)]) for index in range(n_devices)]
        dim, version, state = await current_model(http)
        prefix = update_template(state, dim, version, local)
        prefix_hash = hashlib.sha256(prefix)  # copied per device: hash 2 MB once, not 1,000 times

        # Setup, untimed for the goals: register and enroll every device.
        async def enroll(device: BenchDevice) -> None:
            device.id = expect(await device.call("POST", "/v1/devices", {"public_key": device.public_key}), 201, 200)["device_id"]
            vector = [float(x) for x in unit(rng, dim)]
            expect(await device.call("PUT", f"/v1/devices/{device.id}/embedding", {"embedding": vector}), 201)

        setup_s = await bounded(devices, concurrency, "register+enroll", enroll)
        # Devices that drop mid-upload: selected, they start sending and vanish. The round then
        # cannot reach its target; the operator closes it once every other device is done.
        dropping = set(rng.choice(n_devices, int(drop_fraction * n_devices), replace=False).tolist()) if drop_fraction else set()
        for index in dropping:
            devices[index].drops = True
        config = {"target_participants": n_devices, "min_participants": n_devices - len(dropping), "deadline_s": 3600, "selection_window_s": 0,
                  **({"local": dict(local)} if local else {})}
        round_id = int(expect(await plain(http, "POST", "/v1/admin/rounds", json=config, headers=admin), 201)["id"])
        statuses: Counter[str] = Counter()

        async def checkin(device: BenchDevice) -> None:
            statuses[expect(await device.call("POST", "/v1/rounds/current/checkin"), 200)["status"]] += 1

        checkin_s = await bounded(devices, concurrency, "check-in", checkin)

        latencies: list[float] = []
        codes: Counter[int] = Counter()
        errors: list[str] = []
        first_sent: list[float] = []
        last_accepted = [0.0, 0.0]  # perf_counter, wall clock (compared with the server's closed_at)
        path = f"/v1/rounds/{round_id}/updates"

        async def upload(device: BenchDevice) -> None:
            embedding = unit(rng, dim).tobytes()
            digest = prefix_hash.copy()
            digest.update(embedding)
            extra = {"Content-Type": "application/octet-stream", "Idempotency-Key": secrets.token_hex(16)}
            body = prefix + embedding
            sent = time.perf_counter()
            first_sent.append(sent)
            if device.drops:
                headers = device.headers("POST", path, digest.hexdigest()) | extra | {"Content-Length": str(len(body))}
                try:
                    await device.http.request("POST", path, content=half_then_drop(body), headers=headers)
                except (DroppedMidUpload, httpx.HTTPError):
                    codes[0] += 1  # 0: no response, the device is gone
                    return
                raise RuntimeError("a dropped upload got a response")
            response = await device.call("POST", path, extra=extra, raw=body, body_sha256=digest.hexdigest())
            done = time.perf_counter()
            latencies.append(done - sent)
            codes[response.status_code] += 1
            if response.status_code == 201:
                if done > last_accepted[0]:
                    last_accepted[:] = [done, time.time()]
            elif len(errors) < 5:
                errors.append(f"{response.status_code} {response.text[:200]}")

        await bounded(devices, concurrency, "upload", upload)
        ingest_s = last_accepted[0] - min(first_sent) if codes[201] else float("nan")
        if dropping:
            expect(await plain(http, "POST", f"/v1/admin/rounds/{round_id}/close", headers=admin), 200)

        # Aggregation starts in the server once the target-th update is in; wait for the round's end.
        deadline, final = time.monotonic() + REQUEST_TIMEOUT_S, {}
        while time.monotonic() < deadline:
            final = expect(await plain(http, "GET", f"/v1/admin/rounds/{round_id}", headers=admin), 200)
            if final["status"] in FINAL_ROUND_STATUSES:
                break
            await asyncio.sleep(0.1)
        metrics = await aggregation_metrics(clients, final.get("status") == RoundStatus.COMPLETED)

    closed = final.get("closed_at")
    after_last = datetime.fromisoformat(closed).timestamp() - last_accepted[1] if closed and codes[201] else float("nan")
    agg = re.search(r"^fedface_aggregation_seconds_sum ([0-9.eE+-]+)$", metrics, re.M)
    ms = np.asarray(latencies or [float("nan")]) * 1000
    result = {
        "devices": n_devices, "concurrency": concurrency, "replicas": len(urls), "update_bytes": len(prefix) + dim * 4,
        "setup_seconds": round(setup_s, 3), "checkin_seconds": round(checkin_s, 3), "checkin_statuses": dict(statuses),
        "accepted": codes[201], "transport_retries": dict(RETRIES), "status_codes": {str(k): v for k, v in codes.items()}, "errors": errors,
        # Wall-clock ends of the ingest, for the server's CPU time over it (fedface_bench.server).
        "ingest_window": [last_accepted[1] - ingest_s, last_accepted[1]] if codes[201] else None,
        "ingest_seconds": round(ingest_s, 3), "uploads_per_s": round(codes[201] / ingest_s, 2) if codes[201] else 0.0,
        "p50_upload_ms": round(float(np.percentile(ms, 50)), 1), "p99_upload_ms": round(float(np.percentile(ms, 99)), 1),
        # The server times compute + finalize itself (Prometheus histogram; one round per fresh server).
        "aggregate_seconds": round(float(agg.group(1)), 3) if agg else float("nan"),
        "completed_after_last_upload_s": round(after_last, 3),
        "round_status": final.get("status"), "round_uploaded": final.get("n_uploaded"), "round_summary": final.get("summary"),
        "dropped_mid_upload": codes[0],
        # Accepted (201) but missing from the aggregate: must be 0.
        "lost": codes[201] - int((final.get("summary") or {}).get("n_updates", 0)),
    }
    # Strict JSON: a quantity that could not be measured (nothing accepted, no aggregation) is null, not NaN.
    return {k: None if isinstance(v, float) and v != v else v for k, v in result.items()}

