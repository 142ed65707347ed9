"""Prometheus metrics, one registry per app (tests build many apps in one process).

Round and participant gauges are read from the database at scrape time, so every
worker of a ``--workers N`` server reports the same numbers. Counters and the
aggregation histogram are per process: scrape each worker, or sum them.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from facecore.federation.status import ParticipationStatus, RoundStatus


class Metrics:
    def __init__(self, db_counts: Callable[[], tuple[dict[str, int], dict[str, int]]]) -> None:
        self.registry = CollectorRegistry()
        self.upload_bytes = Counter("fedface_upload_bytes", "Bytes of accepted update uploads", registry=self.registry)
        self.updates = Counter("fedface_updates_accepted", "Accepted update uploads", registry=self.registry)
        self.rounds_finished = Counter("fedface_rounds_finished", "Rounds closed by this process", ["outcome"], registry=self.registry)
        self.aggregation_seconds = Histogram(
            "fedface_aggregation_seconds", "Wall time of one round's aggregation",
            buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600), registry=self.registry,
        )
        self.registry.register(_DatabaseCollector(db_counts))


class _DatabaseCollector(Collector):
    def __init__(self, db_counts: Callable[[], tuple[dict[str, int], dict[str, int]]]) -> None:
        self._db_counts = db_counts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        rounds, participants = self._db_counts()
        by_status = GaugeMetricFamily("fedface_rounds", "Rounds by status", labels=["status"])
        for status in (RoundStatus.OPEN, RoundStatus.AGGREGATING, RoundStatus.COMPLETED, RoundStatus.FAILED):
            by_status.add_metric([status], rounds.get(status, 0))
        yield by_status
        active = GaugeMetricFamily("fedface_round_participants", "Devices in the active round by state", labels=["state"])
        for state in ("checked_in", ParticipationStatus.SELECTED, ParticipationStatus.UPLOADED):
            active.add_metric([state], participants.get(state, 0))
        yield active
