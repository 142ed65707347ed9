"""Token buckets and upload slots, on a fake clock."""
from __future__ import annotations

import asyncio

import pytest

from server_api.core.limits import KeyedRateLimiter, UploadSlots
from server_api.errors import RateLimited, Unavailable


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_serves_its_burst_then_refills_at_its_rate() -> None:
    # Prepare
    clock = Clock()
    limiter = KeyedRateLimiter(rate_per_s=0.5, burst=3, what="device", clock=clock)
    # Execute
    served = [limiter.take("a") for _ in range(4)]
    with pytest.raises(RateLimited, match="^too many requests from this device; retry in 2 s$") as refused:
        limiter.charge("a")
    other_key = limiter.take("b")
    clock.now = 2.0  # one token back at 0.5/s
    after_refill = [limiter.take("a") for _ in range(2)]
    # Assert
    assert served == [True, True, True, False] and other_key
    assert refused.value.retry_after_s == 2 and "device" in str(refused.value)
    assert after_refill == [True, False]


def test_check_refuses_an_empty_bucket_without_spending() -> None:
    # Prepare
    clock = Clock()
    limiter = KeyedRateLimiter(rate_per_s=1.0, burst=1, what="address", clock=clock)
    limiter.check("x")
    limiter.take("x")
    # Execute / Assert
    with pytest.raises(RateLimited, match="^too many requests from this address; retry in 1 s$"):
        limiter.check("x")
    clock.now = 1.0
    limiter.check("x")
    assert limiter.take("x")


def test_rate_zero_is_off_and_keys_are_bounded() -> None:
    # Prepare
    off = KeyedRateLimiter(rate_per_s=0, burst=1, what="device")
    bounded = KeyedRateLimiter(rate_per_s=1.0, burst=1, what="device", max_keys=10, clock=Clock())
    # Execute
    always = all(off.take("k") for _ in range(100))
    for index in range(50):
        bounded.take(f"key-{index}")
    # Assert
    assert always and len(bounded._buckets) == 10


def test_upload_slots_refuse_past_capacity_and_free_on_exit() -> None:
    # Prepare
    slots = UploadSlots(capacity=1)

    async def scenario() -> tuple[int, int]:
        async with slots.hold():
            with pytest.raises(Unavailable, match="1 uploads are already in progress"):
                async with slots.hold():
                    pass
        async with slots.hold():
            held = slots.in_use
        return held, slots.in_use

    # Execute
    held, after = asyncio.run(scenario())
    # Assert
    assert (held, after) == (1, 0)
