"""The least a bwrap job can cost with the contract kept, beside sandcell's own rate.

    .venv/bin/python -m bench.lower_bound [--rounds 3] [--jobs 160] [--concurrency 16]

Four ways to run `print(1)` at the same concurrency, a share of the jobs each in turn, in
rounds (this VM drifts by the minute); for each, the rate and the machine's CPU per job:

- `floor`: the sandbox alone, as the suite's throughput floor (isolated_bwrap_launcher);
- `floor_with_disk`: the same with the job's scratch disk (`disk_mb`), made and torn down
  as the runtimes do;
- `least_service`: `floor_with_disk` behind the least a job service can be. One HTTP request
  that submits and waits, over a kept-alive connection, to a bare ASGI app on uvicorn (no
  framework), which records the job durably (a row inserted, then updated with its result,
  on SQLite in WAL mode, as the store does) and runs the sandbox in a thread. No tenant, key,
  quota, idempotency, claim, lease, notification, log, output or usage: each of those only
  adds to it;
- `sandcell`: `sandcell serve` with the bwrap runtime, as the suite's throughput section.

If `least_service` cannot reach a rate, no job service in Python can on this machine.
Needs root and the built `python` image.
"""

import argparse
import asyncio
import json
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from bench import _http as jobs
from bench._baselines import isolated_bwrap_launcher
from bench._server import IMAGE_DIR, free_port, server, tenant_client
from bench.suite import COLD, TRIVIAL, Spent, ratio
from sandcell.domain.limits import Limits
from sandcell.runtime.images import FilesystemImageCatalog

SLOTS = 16


def least_service(db_path: Path, port: int) -> None:
    """Serve the least job service on `port` until killed (run as its own process)."""
    import uvicorn

    db = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=30000"):
        db.execute(f"PRAGMA {pragma}")
    db.execute("CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, state TEXT, body BLOB)")
    rootfs = FilesystemImageCatalog(IMAGE_DIR).get("python").rootfs
    with (
        isolated_bwrap_launcher(rootfs, Limits().disk_mb) as run_sandbox,
        ThreadPoolExecutor(SLOTS) as sandboxes,
    ):

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                return
            if scope["method"] != "POST":  # a readiness probe
                await send({"type": "http.response.start", "status": 204, "headers": []})
                await send({"type": "http.response.body", "body": b""})
                return
            body, more = b"", True
            while more:
                message = await receive()
                body, more = body + message.get("body", b""), message.get("more_body", False)
            job_id = uuid.uuid4().hex
            db.execute("INSERT INTO jobs VALUES (?, 'running', ?)", (job_id, body))
            await asyncio.get_running_loop().run_in_executor(sandboxes, run_sandbox)
            db.execute("UPDATE jobs SET state = 'completed' WHERE id = ?", (job_id,))
            answer = json.dumps({"id": job_id, "state": "completed"}).encode()
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": answer})

        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=160, help="per way and round")
    parser.add_argument("--concurrency", type=int, default=SLOTS)
    parser.add_argument("--serve", nargs=2, metavar=("DB", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        least_service(Path(args.serve[0]), int(args.serve[1]))
        return
    print(json.dumps(measure(args.rounds, args.jobs, args.concurrency), indent=2))


def measure(rounds: int, count: int, concurrency: int) -> dict[str, Any]:
    rootfs = FilesystemImageCatalog(IMAGE_DIR).get("python").rootfs
    env = COLD | {"SANDCELL_RUNTIME": "bwrap", "SANDCELL_WORKER_SLOTS": str(SLOTS)}
    env["SANDCELL_ALLOW_WEAK_ISOLATION"] = "1"
    with tempfile.TemporaryDirectory(dir="/var/tmp") as scratch:
        Path(scratch).chmod(0o711)  # bwrap opens its bind sources as the sandbox's uid
        spent = _rounds(rootfs, Path(scratch), env, rounds, count, concurrency)
    out: dict[str, Any] = {"concurrency": concurrency, "rounds": rounds, "jobs_per_round": count}
    for name, done in spent.items():
        out[name] = {"jobs_per_s": done.rate(), "cpu_ms_per_job": done.cpu_ms_per_action()}
        out[name]["vs_floor"] = ratio(done.rate(), spent["floor"].rate())
        out[name]["rate_by_round"] = done.round_rates
    return out


def _rounds(
    rootfs: Path, scratch: Path, env: dict[str, str], rounds: int, count: int, concurrency: int
) -> dict[str, Spent]:
    with (
        isolated_bwrap_launcher(rootfs) as floor,
        isolated_bwrap_launcher(rootfs, Limits().disk_mb) as floor_with_disk,
        _least_service(scratch) as least,
        server(scratch / "sandcell", env) as url,
        tenant_client(url) as http,
    ):
        ways: dict[str, Callable[[], object]] = {
            "floor": floor,
            "floor_with_disk": floor_with_disk,
            "least_service": lambda: least.post("/jobs", json=TRIVIAL).raise_for_status(),
            "sandcell": lambda: jobs.completed(jobs.run_job(http, TRIVIAL)),
        }
        spent = {name: Spent() for name in ways}
        for way in ways.values():
            way()  # warm: page cache, blank disk, connections
        for _ in range(rounds):
            for name, way in ways.items():
                spent[name].add(way, count, concurrency)
    return spent


@contextmanager
def _least_service(scratch: Path) -> Iterator[httpx.Client]:
    """The least service in its own process, and a kept-alive client to it."""
    port = free_port()
    argv = [sys.executable, "-m", "bench.lower_bound", "--serve", str(scratch / "least.db")]
    proc = subprocess.Popen([*argv, str(port)])
    limits = httpx.Limits(max_connections=SLOTS, max_keepalive_connections=SLOTS)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60, limits=limits) as http:
            for _ in range(300):  # 30 s
                try:
                    http.get("/").raise_for_status()
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
            else:
                raise SystemExit("the least service did not come up in 30 s")
            yield http
    finally:
        # SIGINT, not SIGTERM: uvicorn stops, then raises it again, and Python's KeyboardInterrupt
        # unwinds the launcher (its kept disks torn down) where SIGTERM would end the process.
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


if __name__ == "__main__":
    main()
