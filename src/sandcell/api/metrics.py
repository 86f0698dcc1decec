"""Prometheus metrics: job states and latencies read from the store at scrape time.

Reading the store (rather than counting in-process) keeps the numbers right when the API,
the scheduler and workers are separate processes or hosts.
"""

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from sandcell.domain.records import LIVE_WORKER_S, WorkerInfo
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
        yield from pool_metrics(live)
        yield health_metric(live)


# Per image, from each live worker's last heartbeat: (figure, metric, help, kind of metric).
POOL_PER_IMAGE = [
    ("ready", "sandcell_pool_ready", "Warm sandboxes ready to be taken", "gauge"),
    ("target", "sandcell_pool_target", "Warm sandboxes the pool keeps (its size)", "gauge"),
    ("hits", "sandcell_pool_hits", "Starts served from the pool", "counter"),
    ("misses", "sandcell_pool_misses", "Cold starts the pool could have served", "counter"),
    ("refused", "sandcell_pool_refusals", "Cold starts the pool cannot serve", "counter"),
]
POOL_LABELS = ["worker", "kind", "image"]


def pool_metrics(workers: list[WorkerInfo]) -> Iterator[Metric]:
    """The warm pools of every live worker ("jobs", "sessions"), as their heartbeats said."""
    pools = [
        (worker.id, kind, figures)
        for worker in workers
        for kind, figures in sorted((worker.pools or {}).items())
    ]
    for figure, name, text, kind in POOL_PER_IMAGE:
        family: GaugeMetricFamily | CounterMetricFamily = (
            GaugeMetricFamily(name, text, labels=POOL_LABELS)
            if kind == "gauge"
            else CounterMetricFamily(name, text, labels=POOL_LABELS)
        )
        for worker_id, pool_kind, figures in pools:
            for image, value in sorted(dict(figures.get(figure) or {}).items()):
                family.add_metric([worker_id, pool_kind, image], float(value))
        yield family
    memory = GaugeMetricFamily(
        "sandcell_pool_memory_bytes", "Memory the warm sandboxes hold", labels=POOL_LABELS[:2]
    )
    budget = GaugeMetricFamily(
        "sandcell_pool_memory_limit_bytes", "The pool's memory bound", labels=POOL_LABELS[:2]
    )
    for worker_id, pool_kind, figures in pools:
        memory.add_metric([worker_id, pool_kind], float(figures.get("memory_bytes", 0)))
        budget.add_metric([worker_id, pool_kind], float(figures.get("memory_limit_bytes", 0)))
    yield memory
    yield budget


def health_metric(workers: list[WorkerInfo]) -> Metric:
    """What each live worker's runtime reported of its host (bwrap's uid quarantine)."""
    quarantined = GaugeMetricFamily(
        "sandcell_sandbox_uids_quarantined",
        "Sandbox uids a process still ran as after its sandbox's release; never used again",
        labels=["worker"],
    )
    for worker in workers:
        if worker.health and "quarantined_uids" in worker.health:
            quarantined.add_metric([worker.id], float(worker.health["quarantined_uids"]))
    return quarantined


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
