"""Warm-pool figures as /metrics shows them (the workers' heartbeats, read from the store)."""

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families


def pool_figure(http: httpx.Client, family: str, image: str | None, kind: str = "jobs") -> float:
    """A warm-pool figure from /metrics (what the workers' heartbeats last said), summed;
    `image` None for the per-pool figures (memory)."""
    text = http.get("/metrics/").raise_for_status().text
    return sum(
        sample.value
        for metric in text_string_to_metric_families(text)
        if metric.name == family
        for sample in metric.samples
        if sample.labels.get("image") == image and sample.labels.get("kind") == kind
    )


HEARTBEAT_S = 1.0  # how often a worker reports its pools


def wait_for_pool(http: httpx.Client, image: str, kind: str = "jobs") -> None:
    """Until the pool holds a ready one, as two reports a heartbeat apart agree: one report
    alone may predate a take that just emptied it (a refill takes longer than a heartbeat)."""
    deadline = time.monotonic() + 90
    seen_since: float | None = None
    while True:
        ready = pool_figure(http, "sandcell_pool_ready", image, kind) >= 1
        now = time.monotonic()
        if not ready:
            seen_since = None
        elif seen_since is None:
            seen_since = now
        elif now - seen_since > 1.5 * HEARTBEAT_S:
            return
        assert now < deadline, "the pool never showed a ready sandbox"
        time.sleep(0.2)
