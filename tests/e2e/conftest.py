"""A real `sandcell serve` (API + worker + runsc) on a free port, with its own data dir."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.egress_servers import TestPKI

ADMIN_KEY = "e2e-admin-key-" + "x" * 20
IMAGE_DIR = Path(os.environ.get("SANDCELL_IMAGE_DIR", "/var/lib/sandcell/images"))


@dataclass
class Server:
    url: str
    data_dir: Path
    admin: dict[str, str]

    def tenant(self, name: str) -> dict[str, str]:
        with httpx.Client(base_url=self.url, headers=self.admin) as http:
            tenant = http.post("/v1/admin/tenants", json={"name": name}).raise_for_status().json()
            key = http.post(f"/v1/admin/tenants/{tenant['id']}/keys").raise_for_status().json()
        return {"Authorization": f"Bearer {key['key']}"}

    def env(self) -> dict[str, str]:
        return os.environ | {
            "SANDCELL_DATA_DIR": str(self.data_dir),
            "SANDCELL_IMAGE_DIR": str(IMAGE_DIR),
            "SANDCELL_URL": self.url,
        }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sandcell serve exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"sandcell serve not ready: {log.read_text()[-2000:]}")


# Names the egress proxy resolves for the tests: all on loopback, where the test servers are.
TEST_HOSTS = {
    "api.allowed.test": "127.0.0.1",
    "secure.allowed.test": "127.0.0.1",
    "other.test": "127.0.0.1",
}


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPKI:
    return TestPKI(tmp_path_factory.mktemp("pki"))


@contextmanager
def running_server(
    data_dir: Path, pki: TestPKI, extra_env: dict[str, str] | None = None
) -> Iterator[Server]:
    """`sandcell serve` on `data_dir` until the block ends (SIGTERM: a graceful stop)."""
    port = _free_port()
    env = (
        os.environ
        | {
            # The operator lets the proxy reach this machine's loopback test servers, by name.
            "SANDCELL_EGRESS_ALLOWED_NETWORKS": json.dumps(["127.0.0.0/8"]),
            "SANDCELL_EGRESS_ANY_PORT": "1",
            "SANDCELL_EGRESS_HOSTS": json.dumps(TEST_HOSTS),
            "SANDCELL_EGRESS_UPSTREAM_CA_FILE": str(pki.ca_file),
            "SANDCELL_DATA_DIR": str(data_dir),
            "SANDCELL_IMAGE_DIR": str(IMAGE_DIR),
            "SANDCELL_PORT": str(port),
            "SANDCELL_ADMIN_KEY": ADMIN_KEY,
            "SANDCELL_WORKER_SLOTS": "2",
        }
        | (extra_env or {})
    )
    log = data_dir / "serve.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sandcell.cli.main", "serve"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc, log)
        yield Server(url, data_dir, {"Authorization": f"Bearer {ADMIN_KEY}"})
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory, pki: TestPKI) -> Iterator[Server]:
    if os.geteuid() != 0:
        pytest.skip("the gVisor worker needs root")
    for image in ("python", "python-data"):
        build = [sys.executable, "-m", "sandcell.cli.main", "image", "build", image]
        subprocess.run(build, env=os.environ | {"SANDCELL_IMAGE_DIR": str(IMAGE_DIR)}, check=True)
    with running_server(tmp_path_factory.mktemp("sandcell-data"), pki) as running:
        yield running


def run_job(
    server: Server, headers: dict[str, str], body: dict[str, Any], timeout: float = 60
) -> dict[str, Any]:
    """Submit over HTTP and wait for the terminal record with one long-poll request at a time."""
    with httpx.Client(base_url=server.url, headers=headers, timeout=timeout + 30) as http:
        job: dict[str, Any] = http.post("/v1/jobs", json=body).raise_for_status().json()
        deadline = time.monotonic() + timeout
        while job["state"] not in ("completed", "failed", "cancelled"):
            assert time.monotonic() < deadline, job
            job = http.get(f"/v1/jobs/{job['id']}", params={"wait": 10}).json()
        return job


def once_released(
    server: Server, headers: dict[str, str], job: dict[str, Any], timeout: float = 10
) -> dict[str, Any]:
    """The terminal record once it says the sandbox's release was verified (`usage.released`
    1): a pooled job that exits cleanly is reported a few ms before that."""
    with httpx.Client(base_url=server.url, headers=headers) as http:
        deadline = time.monotonic() + timeout
        while job["usage"].get("released") != 1:
            assert time.monotonic() < deadline, job
            time.sleep(0.02)
            job = http.get(f"/v1/jobs/{job['id']}").raise_for_status().json()
        return job


def host_processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{pid}: {cmdline}")
    return found
