"""A scratch `sandcell serve` for benchmarks: SQLite, gVisor, a free port, its own data dir."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ADMIN = "bench-admin-key-0123456789abcdef"
IMAGE_DIR = Path(os.environ.get("SANDCELL_IMAGE_DIR", "/var/lib/sandcell/images"))


def start_server(data_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
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


def tenant_client(url: str) -> httpx.Client:
    admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"})
    tenant = admin.post("/v1/admin/tenants", json={"name": "bench"}).json()
    key = admin.post(f"/v1/admin/tenants/{tenant['id']}/keys").json()["key"]
    nodelay = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.Client(base_url=url, headers=headers, timeout=60, transport=nodelay)
