"""Throughput of `print(1)` jobs with 1 worker and with 3, on PostgreSQL, in the same run.

    .venv/bin/python -m bench.scaleout [--jobs 40] [--rounds 1]

One `sandcell serve --no-worker` API and `sandcell worker` processes (slots=1 each, own data
dirs, one shared blob dir) on a fresh PostgreSQL schema, as in tests/e2e/test_recovery.py.
Each batch is submitted at once, then the clock is the store's own: first accepted_at to last
finished_at, so the client's polling does not count.
"""

import argparse
import json
import shutil
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from tests.e2e.cluster import Cluster, fresh_schema, wait_for
from tests.e2e.conftest import IMAGE_DIR

from sandcell.runtime.images import build_image

# One tenant submits whole batches at once: its queue and rate limits must not be the bottleneck.
QUOTAS = {"SANDCELL_QUOTA_CONCURRENT_JOBS": "1000", "SANDCELL_QUOTA_BURST": "1000"}
TERMINAL = ("completed", "failed", "cancelled")


def _batch(http: httpx.Client, jobs: int) -> dict[str, Any]:
    """Submit `jobs` at once; wait for all; jobs/s between first accept and last finish."""
    submitted = [http.post("/v1/jobs", json={"code": "print(1)"}) for _ in range(jobs)]
    ids = [response.raise_for_status().json()["id"] for response in submitted]
    records = wait_for(lambda: _all_terminal(http, ids), lambda: "batch stuck", 600)
    assert all(r["state"] == "completed" for r in records), [r["reason"] for r in records]
    accepted = min(_at(r["accepted_at"]) for r in records)
    finished = max(_at(r["finished_at"]) for r in records)
    return {
        "jobs": jobs,
        "seconds": round(finished - accepted, 2),
        "jobs_per_s": round(jobs / (finished - accepted), 2),
        "workers_used": len({r["attempts"][-1]["worker_id"] for r in records}),
    }


def _all_terminal(http: httpx.Client, ids: list[str]) -> list[dict[str, Any]] | None:
    time.sleep(0.5)  # a cheap poll: the API shares the two cores with the workers
    records = [http.get(f"/v1/jobs/{job_id}").raise_for_status().json() for job_id in ids]
    return records if all(r["state"] in TERMINAL for r in records) else None


def _at(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def _measure(cluster: Cluster, jobs: int, rounds: int) -> dict[str, Any]:
    with cluster.http(cluster.tenant("bench")) as http:
        _batch(http, 2)  # warm-up: the first sandbox of a worker pays for cold caches
        one, three = [], []
        for _ in range(rounds):
            one.append(_batch(http, jobs))
            extra = [cluster.start_worker(f"w{i}") for i in (2, 3)]
            _batch(http, 2)
            three.append(_batch(http, jobs))
            for proc in extra:
                proc.stop()
    best_one = max(r["jobs_per_s"] for r in one)
    best_three = max(r["jobs_per_s"] for r in three)
    return {
        "one_worker": one,
        "three_workers": three,
        "speedup_3_vs_1": round(best_three / best_one, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    build_image("python", IMAGE_DIR)
    base = Path(tempfile.mkdtemp(prefix="sc-bench-", dir="/var/tmp"))
    base.chmod(0o711)
    try:
        with fresh_schema() as schema:
            cluster = Cluster(base, schema, QUOTAS)
            try:
                cluster.start_api()
                cluster.start_worker("w1")
                report = _measure(cluster, args.jobs, args.rounds)
            finally:
                cluster.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
