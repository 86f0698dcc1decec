"""A scale-out deployment on one host, as real processes, for fault injection.

`sandcell serve --no-worker` API processes and `sandcell worker` processes share one
PostgreSQL schema (made fresh per run) and one blob directory. Each worker has its own data dir
(its runsc root, cgroups and scratch are reaped by whoever starts on that dir next), as one
worker per host would in production.
"""

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text

from sandcell.runtime.gvisor import GVisorRuntime
from sandcell.store.sql import SqlStore
from tests.e2e.conftest import IMAGE_DIR, _free_port

PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
ADMIN_KEY = "recovery-admin-key-" + "x" * 20
LEASE_S = 3  # short: a killed worker's job is noticed within seconds
START_TIMEOUT_S = 60


def wait_for(check: Callable[[], Any], explain: Callable[[], object], timeout_s: float) -> Any:
    """Poll `check` until it returns something truthy; fail with `explain()` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, explain()
        time.sleep(0.1)
    return value


@contextmanager
def fresh_schema() -> Iterator[str]:
    """A PostgreSQL schema of our own for one run; dropped afterwards."""
    name = f"sc_e2e_{secrets.token_hex(4)}"
    admin = create_engine(PG_ADMIN_URL, pool_pre_ping=True)  # a test may restart the server
    with admin.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {name}"))
    try:
        yield name
    finally:
        with admin.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {name} CASCADE"))
        admin.dispose()


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    data_dir: Path
    log: Path
    worker_id: str = ""
    url: str = ""

    def kill9(self) -> None:
        self.popen.send_signal(signal.SIGKILL)  # the process only: its sandboxes outlive it
        self.popen.wait(10)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                self.kill9()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


@dataclass
class Cluster:
    base: Path
    schema: str
    extra_env: dict[str, str]
    procs: list[Proc] = field(default_factory=list)
    api: Proc | None = None

    def __post_init__(self) -> None:
        url = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
        options = {"options": f"-csearch_path={self.schema}"}
        engine = create_engine(url, connect_args=options, pool_pre_ping=True)
        self.store = SqlStore(engine)
        (self.base / "blobs").mkdir(parents=True, exist_ok=True)

    @property
    def database_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:5432/test?options=-csearch_path%3D{self.schema}"

    def env(self, data_dir: Path) -> dict[str, str]:
        return (
            os.environ
            | self.extra_env
            | {
                "SANDCELL_DATABASE_URL": self.database_url,
                "SANDCELL_DATA_DIR": str(data_dir),
                "SANDCELL_BLOB_DIR": str(self.base / "blobs"),
                "SANDCELL_IMAGE_DIR": str(IMAGE_DIR),
                "SANDCELL_ADMIN_KEY": ADMIN_KEY,
                "SANDCELL_SIGNING_KEY": "recovery-signing-key-" + "y" * 20,  # one for every replica
                "SANDCELL_WORKER_SLOTS": "1",
                "SANDCELL_LEASE_S": str(LEASE_S),
                "SANDCELL_HEARTBEAT_S": "0.5",
                "SANDCELL_DRAIN_S": "2",
                "SANDCELL_QUOTA_CONCURRENT_JOBS": "1000",  # a whole run may be queued at once
                "SANDCELL_QUOTA_BURST": "1000",
            }
        )

    def _spawn(self, name: str, data_dir: Path, args: list[str], env: dict[str, str]) -> Proc:
        data_dir.mkdir(mode=0o711, parents=True, exist_ok=True)
        log = self.base / f"{name}.log"
        with log.open("ab") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "sandcell.cli.main", *args],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # our signals only, never the test's terminal's
            )
        proc = Proc(name, popen, data_dir, log)
        self.procs.append(proc)
        return proc

    def start_api(self, name: str = "api") -> Proc:
        port = _free_port()
        env = self.env(self.base / "api") | {"SANDCELL_PORT": str(port)}
        proc = self._spawn(name, self.base / "api", ["serve", "--no-worker"], env)
        proc.url = f"http://127.0.0.1:{port}"
        wait_for(lambda: self._answers(proc), proc.tail, START_TIMEOUT_S)
        self.api = proc
        return proc

    def _answers(self, proc: Proc) -> bool:
        assert proc.popen.poll() is None, proc.tail()
        try:
            return httpx.get(f"{proc.url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def start_worker(self, name: str) -> Proc:
        """Start `sandcell worker` on data dir <base>/<name>; return once it reported in."""
        known = {w.id for w in self.store.live_workers(0)}
        data_dir = self.base / name
        proc = self._spawn(name, data_dir, ["worker"], self.env(data_dir))

        def reported() -> list[str]:
            assert proc.popen.poll() is None, proc.tail()
            return [w.id for w in self.store.live_workers(time.time() - 5) if w.id not in known]

        [proc.worker_id] = wait_for(reported, proc.tail, START_TIMEOUT_S)
        return proc

    def worker_of(self, job_id: str) -> Proc:
        job = self.store.get_job(None, job_id)
        assert job is not None and job.worker_id, job
        [proc] = [p for p in self.procs if p.worker_id == job.worker_id]
        return proc

    def http(self, headers: dict[str, str] | None = None) -> httpx.Client:
        assert self.api is not None
        auth = headers or {"Authorization": f"Bearer {ADMIN_KEY}"}
        return httpx.Client(base_url=self.api.url, headers=auth, timeout=60)

    def tenant(self, name: str) -> dict[str, str]:
        with self.http() as admin:
            tenant = admin.post("/v1/admin/tenants", json={"name": name}).raise_for_status()
            tenant_id = tenant.json()["id"]
            key = admin.post(f"/v1/admin/tenants/{tenant_id}/keys").raise_for_status().json()
        return {"Authorization": f"Bearer {key['key']}"}

    def close(self) -> None:
        for proc in self.procs:
            proc.stop()
        for proc in self.procs:  # whatever a killed worker's sandboxes left, if not yet reaped
            if proc.worker_id:
                for state_dir in ("sandboxes", "session-sandboxes"):  # jobs', sessions'
                    GVisorRuntime(proc.data_dir / state_dir).reap()
        self.store.engine.dispose()


def runtime_of(proc: Proc) -> GVisorRuntime:
    """The job runtime a worker process on this data dir uses (paths only: never run)."""
    return GVisorRuntime(proc.data_dir / "sandboxes")


class CountingServer:
    """A loopback HTTP server that counts POSTs per path: the 'external' side effect."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        lock = threading.Lock()
        counts = self.counts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    counts[self.path] = counts.get(self.path, 0) + 1
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def egress_env(hosts: dict[str, str]) -> dict[str, str]:
    """Operator settings that let jobs reach loopback test servers, by name, via the proxy."""
    return {
        "SANDCELL_EGRESS_ALLOWED_NETWORKS": json.dumps(["127.0.0.0/8"]),
        "SANDCELL_EGRESS_ANY_PORT": "1",
        "SANDCELL_EGRESS_HOSTS": json.dumps(hosts),
    }
