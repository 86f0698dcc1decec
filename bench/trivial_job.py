"""Submit → completed for `print(1)` over HTTP, against bare python3.11 and a cold `runsc run`.

    .venv/bin/python -m bench.trivial_job [--runs 20]

Starts its own `sandcell serve` (SQLite, gVisor) on a free port with a scratch data dir.
"""

import argparse
import json
import os
import signal
import tempfile
from pathlib import Path

import httpx

from bench._baselines import bare_python, cold_runsc, summary, timed
from bench._server import IMAGE_DIR, start_server, tenant_client


def _submit_and_wait(client: httpx.Client) -> None:
    job = client.post("/v1/jobs", json={"code": "print(1)"}).json()
    while job["state"] not in ("completed", "failed", "cancelled"):
        job = client.get(f"/v1/jobs/{job['id']}", params={"wait": 30}).json()
    assert job["state"] == "completed", job


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        proc, url = start_server(Path(scratch))
        try:
            client = tenant_client(url)
            _submit_and_wait(client)  # warm the server's own caches, not a sandbox
            job = summary(timed(lambda: _submit_and_wait(client), args.runs))
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)
    python = summary(bare_python(args.runs))
    runsc = summary(cold_runsc(IMAGE_DIR / "python" / _version() / "rootfs", args.runs))
    report = {
        "trivial_job_http": job,
        "bare_python3.11": python,
        "cold_runsc_run": runsc,
        "job_vs_python": round(job["median_ms"] / python["median_ms"], 1),
        "job_vs_runsc": round(job["median_ms"] / runsc["median_ms"], 2),
    }
    print(json.dumps(report, indent=2))


def _version() -> str:
    manifest = json.loads(next((IMAGE_DIR / "python").glob("*/manifest.json")).read_text())
    return str(manifest["version"])


if __name__ == "__main__":
    main()
