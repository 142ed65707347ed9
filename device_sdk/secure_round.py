"""A device's steps in a secure-aggregation round (facecore.federation.secagg over the server's /secagg API).

The secrets (two X25519 keys, the self-mask seed, the shares received) live in memory only: a
device that restarts mid-round has dropped out, which the protocol tolerates, and nothing it
held can leak from disk. Key steps come before local training because their deadlines are short.

The device does not take the server's word for the round's safety: it refuses a threshold below
2 or at most half of the members, a member list in which a key appears twice or its own keys
appear under another index, one longer than the count of selected devices the server publishes
beside it, and one shorter than its owner's floor (`min_members`); it unmasks only for at least max(2, t) survivors, and treats a
member whose public key is not a usable X25519 point as dropped (no shares, no pairwise mask).
"""
from __future__ import annotations

import base64
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from device_sdk.errors import RoundClosed
from facecore.federation.secagg import (
    Advert,
    SecAggAborted,
    SecAggClient,
    check_member_count,
    check_members,
    check_threshold,
    is_valid_public_key,
    quantize,
    weighted_update,
)

Request = Callable[..., Any]  # FaceDevice._request: (method, path, body=..., expect=...) -> httpx.Response
AFTER_KEYS = ("masked_input", "unmask", "aggregating", "completed", "failed")


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


class SecureRound:
    def __init__(self, request: Request, url: str, poll: float = 1.0, timeout: float = 600.0, min_members: int = 2) -> None:
        self.request, self.url, self.poll, self.timeout = request, url, poll, timeout
        self.min_members = min_members
        self.client = SecAggClient(0, 0)
        self.key_sharers: list[int] = []
        self.members = 0  # how many the server listed, which this device accepted with the threshold
        self.bound = self.scale = 0.0
        self.max_update_norm = math.inf

    def _state(self) -> dict[str, Any]:
        return self.request("GET", self.url).json()

    def _until(self, done: Callable[[dict[str, Any]], bool], state: dict[str, Any], what: str) -> dict[str, Any]:
        give_up = time.monotonic() + self.timeout
        while not done(state):
            if state["phase"] in ("completed", "failed"):
                raise RoundClosed(f"round {state['round_id']} ended ({state['phase']}) while this device waited for {what}")
            if time.monotonic() > give_up:
                raise RoundClosed(f"round {state['round_id']}: gave up waiting for {what} after {self.timeout:.0f} s")
            time.sleep(min(self.poll, state.get("retry_after_s") or self.poll))
            state = self._state()
        return state

    def join(self) -> None:
        """Advertise keys, share them with every member, and take the shares addressed to this
        device. Returns once masked uploads are open and this device is a key sharer."""
        mine = self.client.advertise()
        state = self.request("POST", f"{self.url}/advert", body={"c_public": _b64(mine.c_public), "s_public": _b64(mine.s_public)}, expect=(201,)).json()
        self.client.index = state["index"]
        state = self._until(lambda s: s["phase"] != "advertise", state, "the other devices' keys")
        if state["phase"] != "share_keys":
            raise RoundClosed(f"round {state['round_id']}: the key-sharing step closed before this device could share ({state['phase']})")
        listed = [Advert(int(m["index"]), base64.b64decode(m["c_public"]), base64.b64decode(m["s_public"])) for m in state["members"]]
        check_members(listed, Advert(self.client.index, mine.c_public, mine.s_public))
        check_member_count(len(listed), state.get("selected"), self.min_members)
        check_threshold(int(state["threshold"]), len(listed))
        self.client.threshold, self.members = int(state["threshold"]), len(listed)
        adverts = {a.index: a for a in listed if is_valid_public_key(a.c_public) and is_valid_public_key(a.s_public)}
        ciphertexts = self.client.share_keys(adverts)
        state = self.request("POST", f"{self.url}/shares", body={"shares": {str(v): _b64(blob) for v, blob in ciphertexts.items()}}).json()
        state = self._until(lambda s: s["phase"] in AFTER_KEYS, state, "the other devices' shares")
        if state["phase"] != "masked_input" or self.client.index not in (state.get("key_sharers") or []):
            raise RoundClosed(f"round {state['round_id']}: this device is not among the key sharers ({state['phase']})")
        self.key_sharers = [int(v) for v in state["key_sharers"] if int(v) in adverts]
        self.bound, self.scale = float(state["bound"]), float(state["scale"])
        self.max_update_norm = float(state.get("max_update_norm") or math.inf)
        self.client.receive_shares({int(k): base64.b64decode(v) for k, v in state["shares"].items()})

    def masked(self, delta: Mapping[str, np.ndarray], n_samples: int) -> np.ndarray:
        """The uint32 masked vector of n_samples x delta: the delta clipped to the round's L2 bound, the
        weighted vector to its per-coordinate bound."""
        vector = weighted_update(delta, n_samples, self.max_update_norm)
        return self.client.masked_input(quantize(vector, self.bound, self.scale), self.key_sharers)

    def unmask(self) -> str:
        """Wait for the unmasking step and send this device's shares; returns the round's phase."""
        state = self._until(lambda s: s["phase"] != "masked_input", self._state(), "the unmasking step")
        if state["phase"] != "unmask" or state.get("answered"):
            return str(state["phase"])
        survived, dropped = [int(i) for i in state["survived"]], [int(i) for i in state["dropped"]]
        if sorted(survived + dropped) != sorted(self.key_sharers):
            raise RoundClosed(f"round {state['round_id']}: the server's survivor list does not match the key sharers; not answering")
        if len(survived) < max(2, self.client.threshold):
            raise SecAggAborted(f"round {state['round_id']}: {len(survived)} survivor(s), threshold {self.client.threshold}: "
                                "refusing to unmask what would be one device's update")
        answer = self.client.unmask_shares(dropped, survived)
        body = {part: {str(v): str(share[1]) for v, share in answer[part].items()} for part in ("s", "b")}
        return str(self.request("POST", f"{self.url}/unmask", body=body).json()["phase"])
