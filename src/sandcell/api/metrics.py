"""Prometheus metrics: job states and latencies read from the store at scrape time.

Reading the store (rather than counting in-process) keeps the numbers right when the API,
the scheduler and workers are separate processes or hosts.
"""

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from sandcell.domain.records import LIVE_WORKER_S
from sandcell.ports.store import Store

BOUNDS_S = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600]


class StoreCollector(Collector):
    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        try:
            yield from self._job_metrics()
            yield from self._worker_metrics()
            up = 1.0
        except Exception:
            up = 0.0  # a store outage shows as a metric, not as a failed scrape
        yield GaugeMetricFamily("sandcell_store_up", "1 if the store answered this scrape", up)

    def _job_metrics(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily(
            "sandcell_jobs", "Jobs by state and reason", labels=["state", "reason"]
        )
        running = 0
        for (state, reason), count in sorted(self.store.job_counts().items()):
            jobs.add_metric([state, reason], count)
            running += count if state == "running" else 0
        yield jobs
        yield GaugeMetricFamily("sandcell_sandboxes_running", "Jobs in a sandbox now", running)
        for phase in ("queue", "start", "run"):
            buckets, total, count = self.store.phase_histogram(phase, BOUNDS_S)
            family = HistogramMetricFamily(
                f"sandcell_job_{phase}_seconds", f"Time jobs spent in the {phase} phase"
            )
            pairs = [(str(b), c) for b, c in zip(BOUNDS_S, buckets, strict=True)]
            family.add_metric([], [*pairs, ("+Inf", count)], total)
            yield family

    def _worker_metrics(self) -> Iterator[Metric]:
        live = self.store.live_workers(time.time() - LIVE_WORKER_S)
        yield GaugeMetricFamily("sandcell_workers_live", "Workers seen recently", len(live))


def registry_for(store: Store) -> tuple[CollectorRegistry, Histogram]:
    registry = CollectorRegistry()
    registry.register(StoreCollector(store))
    ack = Histogram(
        "sandcell_submit_ack_seconds",
        "Time to acknowledge a job submission",
        buckets=BOUNDS_S,
        registry=registry,
    )
    return registry, ack
