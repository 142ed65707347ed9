"""A round's update on its way to the server: sent once accepted, resent after an outage, discarded when refused.

Invariants:
- An update is sealed in the state folder (`DeviceState.save_pending`) before it is first sent, so a crash or
  an outage after training resends the same bytes under the same Idempotency-Key, and the server counts it once.
- It is cleared once the server accepted it, or refused it for good (a refusal does not change on a resend);
  an outage keeps it for the next train.
- A refusal says which round's update was discarded and why: a 409 after the round's deadline says the
  deadline passed; a 404 or another 409, that the round no longer takes it.
- Imports httpx and the state's modules only: no numpy, no torch.
"""
from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from device_sdk.errors import RoundClosed, ServerRefused, ServerUnavailable
from device_sdk.link import ServerLink, read_deadline

Accepted = Callable[[int], None]  # told the round of each update the server accepted


def post_update(link: ServerLink, meta: dict[str, Any], body: bytes, accepted: Accepted) -> None:
    """Upload a saved update; clear it once the server took it or refused it for good."""
    headers = {"Idempotency-Key": meta["key"], "Content-Type": "application/octet-stream"}
    round_id = meta["round_id"]
    try:
        link.request("POST", meta["url"], body=body, headers=headers, expect=(200, 201))
    except ServerRefused as refused:
        link.state.clear_pending()  # a refusal does not change on a resend
        deadline = read_deadline(meta.get("deadline_at"))
        if isinstance(refused, RoundClosed) or (refused.status == 409 and deadline and datetime.now(UTC) >= deadline):
            when = f" ({deadline:%H:%M:%S} UTC)" if deadline else ""
            raise RoundClosed(f"round {round_id}'s upload deadline{when} passed before this device's update "
                              "arrived: the update is discarded; run train again to join the next round") from None
        if refused.status in (404, 409):
            raise RoundClosed(f"round {round_id} no longer accepts this device's update ({refused.detail}): the "
                              "update is discarded; run train again to join the next round") from None
        raise ServerRefused(refused.status, f"the update for round {round_id} was refused and discarded: "
                            f"{refused.detail}", refused.code) from None
    accepted(round_id)
    link.state.clear_pending()


def resend_pending(link: ServerLink, notices: list[str], accepted: Accepted) -> tuple[dict[str, Any], int] | None:
    """Send the update an earlier train saved (an outage or a crash after training): its saved metadata and
    size once sent; None when there was none, or the server no longer takes it (then said in `notices`)."""
    pending = link.state.pending()
    if pending is None:
        return None
    meta, body = pending
    try:
        post_update(link, meta, body, accepted)
    except RoundClosed as late:
        notices.append(str(late))
        return None
    except ServerUnavailable:
        raise ServerUnavailable(f"the server is still unreachable: the update saved for round {meta['round_id']} "
                                "stays saved and will be resent by the next train") from None
    return meta, len(body)


__all__ = ["Accepted", "post_update", "resend_pending"]
