"""Rate buckets and upload slots in PostgreSQL: two engines stand for two server processes."""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from server_api.core.db import make_engine
from server_api.core.shared_limits import SharedRateLimiter, SharedUploadSlots
from server_api.errors import RateLimited, Unavailable


@pytest.fixture
def second_engine(postgres_engine: Engine) -> Iterator[Engine]:
    """Another connection pool on the same schema: a second server process."""
    engine = make_engine(postgres_engine.url.render_as_string(hide_password=False))
    yield engine
    engine.dispose()


def test_two_processes_spend_one_bucket(postgres_engine: Engine, second_engine: Engine) -> None:
    # Prepare
    first = SharedRateLimiter(postgres_engine, rate_per_s=0.01, burst=3, what="device")
    second = SharedRateLimiter(second_engine, rate_per_s=0.01, burst=3, what="device")
    # Execute
    served = [first.take("a"), second.take("a"), first.take("a"), second.take("a")]
    with pytest.raises(RateLimited, match=r"^too many requests from this device; retry in \d+ s$") as refused:
        first.charge("a")
    with pytest.raises(RateLimited, match="^too many requests from this device"):
        second.check("a")
    other_key, other_scope = first.take("b"), SharedRateLimiter(second_engine, 0.01, 3, "address").take("a")
    # Assert
    assert served == [True, True, True, False] and other_key and other_scope
    assert 1 <= refused.value.retry_after_s <= 100


def test_concurrent_requests_get_exactly_the_burst(postgres_engine: Engine, second_engine: Engine) -> None:
    # Prepare
    limiters = [SharedRateLimiter(engine, rate_per_s=0.001, burst=5, what="device") for engine in (postgres_engine, second_engine)]
    outcomes: list[bool] = []
    lock = threading.Lock()

    def spend(limiter: SharedRateLimiter) -> None:
        for _ in range(5):
            taken = limiter.take("busy")
            with lock:
                outcomes.append(taken)

    # Execute
    threads = [threading.Thread(target=spend, args=(limiters[index % 2],)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Assert
    assert len(outcomes) == 20 and sum(outcomes) == 5


def test_a_bucket_refills_at_its_rate_and_refilled_buckets_are_pruned(postgres_engine: Engine) -> None:
    # Prepare
    # 2/s: a token takes 0.5 s to come back, far longer than three takes last even on a loaded machine
    limiter = SharedRateLimiter(postgres_engine, rate_per_s=2.0, burst=2, what="device")
    spent = [limiter.take("a"), limiter.take("a"), limiter.take("a")]
    limiter.take("b")
    # Execute
    time.sleep(1.1)  # both tokens back
    refilled = [limiter.take("a"), limiter.take("a")]
    time.sleep(1.1)
    pruned = limiter.prune()
    with postgres_engine.connect() as connection:
        left = connection.scalar(text("SELECT count(*) FROM rate_buckets"))
    # Assert
    assert spent == [True, True, False] and refilled == [True, True]
    assert pruned == 2 and left == 0


def test_a_rate_of_zero_never_refuses_nor_writes(postgres_engine: Engine) -> None:
    # Prepare
    limiter = SharedRateLimiter(postgres_engine, rate_per_s=0.0, burst=1, what="device")
    # Execute
    served = [limiter.take("a") for _ in range(5)]
    limiter.charge("a")
    limiter.check("a")
    # Assert
    with postgres_engine.connect() as connection:
        assert all(served) and connection.scalar(text("SELECT count(*) FROM rate_buckets")) == 0


def test_upload_slots_are_one_pool_across_processes(postgres_engine: Engine, second_engine: Engine) -> None:
    # Prepare
    first = SharedUploadSlots(postgres_engine, capacity=2, lease_s=60)
    second = SharedUploadSlots(second_engine, capacity=2, lease_s=60)

    async def scenario() -> tuple[int, int]:
        async with first.hold(), second.hold():
            held = first.in_use()
            with pytest.raises(Unavailable, match="^2 uploads are already in progress; retry$"):
                async with second.hold():
                    pass
        return held, second.in_use()

    # Execute
    held, after = asyncio.run(scenario())
    # Assert
    assert (held, after) == (2, 0)


def test_a_slot_whose_holder_died_frees_when_its_lease_ends(postgres_engine: Engine, second_engine: Engine) -> None:
    # Prepare: a holder that takes the only slot and never frees it (its process was killed).
    dead = SharedUploadSlots(postgres_engine, capacity=1, lease_s=0.5)
    assert dead._take("killed-process") is not None
    alive = SharedUploadSlots(second_engine, capacity=1, lease_s=0.5)

    async def attempt() -> bool:
        try:
            async with alive.hold():
                return True
        except Unavailable:
            return False

    # Execute
    during = asyncio.run(attempt())
    time.sleep(0.6)
    after = asyncio.run(attempt())
    # Assert
    assert (during, after) == (False, True)
