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


def wait_for_pool(http: httpx.Client, image: str, kind: str = "jobs") -> None:
    deadline = time.monotonic() + 90
    while pool_figure(http, "sandcell_pool_ready", image, kind) < 1:
        assert time.monotonic() < deadline, "the pool never showed a ready sandbox"
        time.sleep(0.2)
