"""Submit → completed for `print(1)` over HTTP, against bare python3.11 and a cold `runsc run`.

    .venv/bin/python -m bench.trivial_job [--runs 20]

Starts its own `sandcell serve` (SQLite, gVisor) on a free port with a scratch data dir.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench._baselines import bare_python, cold_runsc, summary, timed

ADMIN = "bench-admin-key-0123456789abcdef"
IMAGE_DIR = Path(os.environ.get("SANDCELL_IMAGE_DIR", "/var/lib/sandcell/images"))


def _start_server(data_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = os.environ | {
        "SANDCELL_DATA_DIR": str(data_dir),
        "SANDCELL_IMAGE_DIR": str(IMAGE_DIR),
        "SANDCELL_PORT": str(port),
        "SANDCELL_ADMIN_KEY": ADMIN,
    }
    log = (data_dir / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandcell.cli.main", "serve"],
        env=env,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit("server did not become ready")


def _tenant_client(url: str) -> httpx.Client:
    admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"})
    tenant = admin.post("/v1/admin/tenants", json={"name": "bench"}).json()
    key = admin.post(f"/v1/admin/tenants/{tenant['id']}/keys").json()["key"]
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


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
        proc, url = _start_server(Path(scratch))
        try:
            client = _tenant_client(url)
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
