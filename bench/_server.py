"""A scratch `sandcell serve` for benchmarks: SQLite, a free port, its own data dir."""

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from sandcell.remote.session_client import IDLE_POOL, NODELAY, TOKEN_HEADER, worker_transport

ADMIN = "bench-admin-key-0123456789abcdef"
READY_TIMEOUT_S = 180
IMAGE_DIR = Path(os.environ.get("SANDCELL_IMAGE_DIR", "/var/lib/sandcell/images"))
# A benchmark tenant submits whole batches at once: its quotas must not be what is measured.
UNLIMITED = {
    "SANDCELL_QUOTA_CONCURRENT_JOBS": "1000",
    "SANDCELL_QUOTA_BURST": "100000",
    "SANDCELL_QUOTA_JOBS_PER_MINUTE": "1000000",
    "SANDCELL_QUOTA_SESSIONS": "64",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def start_server(
    data_dir: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    full_env = (
        os.environ
        | {
            "SANDCELL_DATA_DIR": str(data_dir),
            "SANDCELL_IMAGE_DIR": str(IMAGE_DIR),
            "SANDCELL_PORT": str(port),
            "SANDCELL_ADMIN_KEY": ADMIN,
        }
        | (env or {})
    )
    log = (data_dir / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandcell.cli.main", "serve"],
        env=full_env,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    if proc.poll() is None:
        stop_server(proc)
    lines = (data_dir / "serve.log").read_text(errors="replace").splitlines()
    tail = "\n".join(line for line in lines if "/readyz" not in line)[-3000:]
    raise SystemExit(f"server did not become ready; its log ends:\n{tail}")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(60)


@contextmanager
def server(data_dir: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """A running server's URL; stopped (and its sandboxes with it) on exit."""
    data_dir.mkdir(mode=0o711, parents=True, exist_ok=True)
    data_dir.chmod(0o711)  # bwrap runs as the sandbox's uid and must reach its bind sources
    proc, url = start_server(data_dir, env)
    try:
        yield url
    finally:
        stop_server(proc)


def tenant_client(url: str) -> httpx.Client:
    admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"})
    tenant = admin.post("/v1/admin/tenants", json={"name": "bench"}).json()
    key = admin.post(f"/v1/admin/tenants/{tenant['id']}/keys").json()["key"]
    return client_for(url, key)


def client_for(url: str, key: str) -> httpx.Client:
    # IDLE_POOL: a round of another launcher may leave these idle longer than the server keeps them.
    nodelay = httpx.HTTPTransport(socket_options=[NODELAY], limits=IDLE_POOL)
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.Client(base_url=url, headers=headers, timeout=120, transport=nodelay)


def worker_client(data_dir: Path) -> httpx.Client:
    """The worker's internal endpoint, as the API reaches it (its URL is in the store)."""
    with sqlite3.connect(data_dir / "sandcell.db") as db:
        [(url,)] = db.execute("SELECT url FROM workers WHERE url IS NOT NULL").fetchall()
    token = (data_dir / "internal.token").read_text().strip()
    return httpx.Client(base_url=url, headers={TOKEN_HEADER: token}, transport=worker_transport())
