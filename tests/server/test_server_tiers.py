"""Aggregation in tiers on the server: a round's updates summed in shards by worker processes, or by the replicas
that share them, publish the same bits as the aggregating process summing the same shards itself; one shard is the
single pass over the round."""
from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from server_api.crud import shards as shard_crud
from server_api.launcher import scratch_database
from server_api.main import create_app
from server_api.services import aggregation_shards, aggregation_tiers
from server_api.services.aggregation import help_aggregate
from server_api.services.context import ServerContext
from server_api.tables import utcnow
from server_helpers import enrolled_devices, make_settings, open_round
from server_testkit import load_backbone_bytes, make_delta, unit_vector, update_file

DEVICES = 7


@contextmanager
def _fresh_database(db_url: str, folder: Path) -> Iterator[str]:
    """A database of its own on the backend of `db_url`."""
    if db_url.startswith("sqlite"):
        yield f"sqlite:///{folder / 'fedface.db'}"
        return
    with scratch_database(os.environ["FEDFACE_TEST_POSTGRES_URL"], prefix="t_") as url:
        assert url is not None
        yield url


def _published(folder: Path, db_url: str, **settings: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """One round of 7 devices with the same seeded deltas and photo counts; the new version's backbone and the summary."""
    folder.mkdir()
    rng = np.random.default_rng(11)
    with _fresh_database(db_url, folder) as url, TestClient(create_app(make_settings(folder / "data", url, **settings), run_scheduler=False)) as client:
        admin = {"Authorization": f"Bearer {client.app.state.ctx.admin_token}"}
        devices = enrolled_devices(client, DEVICES, rng)
        round_ = open_round(client, admin, target_participants=DEVICES, min_participants=DEVICES)
        for device in devices:
            assert device.checkin().json()["status"] == "selected"
        base = load_backbone_bytes(devices[0].backbone(round_["base_version"]).content)
        for index, device in enumerate(devices):
            body = update_file(make_delta(base, rng, scale=0.01), unit_vector(rng), round_["base_version"], 3 + index, {"loss": 0.1 * index})
            assert device.upload(round_["id"], body).status_code == 201
        status = client.get("/v1/admin/rounds/current", headers=admin).json()
        assert status["status"] == "completed", status
        return load_backbone_bytes(devices[0].backbone(status["result_version"]).content), status["summary"]


def test_worker_processes_sum_the_shards_to_the_same_bits(tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: shards of 2 updates (4 shards); the workers read the blobs themselves (from the database on PostgreSQL)
    blob_store = "database" if db_url.startswith("postgresql") else "local"
    pools: list[int] = []

    class CountedPool(ProcessPoolExecutor):
        def __init__(self, max_workers: int, **kwargs: Any) -> None:
            pools.append(max_workers)
            super().__init__(max_workers, **kwargs)

    monkeypatch.setattr(aggregation_tiers, "ProcessPoolExecutor", CountedPool)
    # Execute
    here, here_summary = _published(tmp_path / "here", db_url, aggregation_shard_updates=2, blob_store=blob_store)
    pooled, pooled_summary = _published(tmp_path / "pooled", db_url, aggregation_shard_updates=2, aggregation_processes=3, blob_store=blob_store)
    one_pass, one_pass_summary = _published(tmp_path / "one_pass", db_url, blob_store=blob_store)
    # Assert: the same bits whoever summed the shards; within float64 rounding of one pass over the round
    assert here.keys() == pooled.keys() == one_pass.keys()
    for key in here:
        assert here[key].tobytes() == pooled[key].tobytes(), key
        np.testing.assert_allclose(here[key], one_pass[key], rtol=1e-6, atol=1e-7, err_msg=key)
    assert here_summary == pooled_summary
    assert here_summary["n_updates"] == one_pass_summary["n_updates"] == DEVICES
    assert here_summary["metrics"]["loss"] == one_pass_summary["metrics"]["loss"] and here_summary["change_norm"] > 0
    assert pools == [3]  # only the pooled round started workers


def test_replicas_sharing_the_shards_publish_the_same_bits_and_leave_nothing(tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: shards of 2 (4 shards), shared through the database. When the aggregator starts on shard 0, another
    # replica's scheduler (`help_aggregate` under a holder of its own) sums every shard that is still free.
    partials: list[str] = []
    helped: list[int] = []
    real_sum = aggregation_shards.Shards.sum

    def sum_and_let_another_help(self: aggregation_shards.Shards, ctx: ServerContext, shard: int) -> str:
        if not helped:
            helped.append(-1)
            helped.append(help_aggregate(ctx, self.round_id, holder="replica-b"))
        partials.append(real_sum(self, ctx, shard))
        return partials[-1]

    monkeypatch.setattr(aggregation_shards.Shards, "sum", sum_and_let_another_help)
    # Execute
    here, here_summary = _published(tmp_path / "here", db_url, aggregation_shard_updates=2, blob_store="database")
    shared, shared_summary = _published(
        tmp_path / "shared", db_url, aggregation_shard_updates=2, blob_store="database", aggregation_shared_shards=True,
    )
    # Assert: the other replica summed shards 1-3, the aggregator shard 0; the same bits as one process summing them
    assert helped == [-1, 3] and len(partials) == 4 and len(set(partials)) == 4
    assert shared_summary.pop("shards") == {"count": 4, "processes": 2}
    assert shared_summary == here_summary
    for key in here:
        assert here[key].tobytes() == shared[key].tobytes(), key


def test_a_shard_is_held_by_one_process_until_its_lease_runs_out(tmp_path: Path, db_url: str) -> None:
    # Prepare: a round with three shards of 4 updates
    with _fresh_database(db_url, tmp_path) as url, TestClient(create_app(make_settings(tmp_path / "data", url), run_scheduler=False)) as client:
        admin = {"Authorization": f"Bearer {client.app.state.ctx.admin_token}"}
        round_id = open_round(client, admin)["id"]
        sessions, now = client.app.state.ctx.sessions, utcnow()
        later = now + timedelta(seconds=60)

        def claim(holder: str, at: datetime) -> int | None:
            with sessions() as session, session.begin():
                return shard_crud.claim_shard(session, round_id, holder, at, at + timedelta(seconds=30))

        with sessions() as session, session.begin():
            shard_crud.add_shards(session, round_id, 3, 4)
        # Execute: a claims 0 and 1, b claims 2; nothing is free until a's leases run out
        first = [claim("a", now), claim("a", now), claim("b", now), claim("b", now)]
        with sessions() as session, session.begin():
            recorded = shard_crud.record_partial(session, round_id, 0, "a", "0" * 64)
            free_later = shard_crud.free_shard_size(session, round_id, later)
        retaken = [claim("b", later), claim("b", later)]
        with sessions() as session, session.begin():
            again = shard_crud.record_partial(session, round_id, 0, "b", "f" * 64)
            states = shard_crud.shard_states(session, round_id)
            dropped = shard_crud.drop_shards(session, round_id)
            gone = shard_crud.record_partial(session, round_id, 1, "b", "1" * 64)
            left = shard_crud.shard_states(session, round_id)
    # Assert: a summed shard is never claimed again and keeps its first partial; an expired lease is retaken
    assert first == [0, 1, 2, None] and recorded and free_later == 4
    assert retaken == [1, 2] and again
    assert [(s.shard, s.holder, s.partial_sha256) for s in states] == [(0, "a", "0" * 64), (1, "b", None), (2, "b", None)]
    assert dropped == ["0" * 64] and not gone and left == []
