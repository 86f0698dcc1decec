"""Network policy end to end on the bwrap tier: a `sandcell serve` with SANDCELL_RUNTIME=bwrap.

The same program as test_network_gvisor.py, through the worker: HTTP and HTTPS (with a secret)
through the job's proxy, other hosts denied, direct connections going nowhere, and the job record
naming the runtime that ran it. Every endpoint is a loopback server.
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import IMAGE_DIR, Server, run_job, running_server
from tests.e2e.pool_metrics import wait_for_pool
from tests.e2e.test_network_gvisor import _facts, _program
from tests.integration.egress_servers import EchoServer, TestPKI

pytestmark = pytest.mark.bwrap

BWRAP_ENV = {"SANDCELL_RUNTIME": "bwrap", "SANDCELL_ALLOW_WEAK_ISOLATION": "1"}


@pytest.fixture(scope="module")
def bwrap_server(pki: TestPKI) -> Iterator[Server]:
    if os.geteuid() != 0:
        pytest.skip("the bwrap worker needs root")
    build = [sys.executable, "-m", "sandcell.cli.main", "image", "build", "python"]
    subprocess.run(build, env=os.environ | {"SANDCELL_IMAGE_DIR": str(IMAGE_DIR)}, check=True)
    # Not under pytest's 0700 temp dir: bwrap runs as the sandbox's uid and must get through.
    data_dir = Path(tempfile.mkdtemp(prefix="sandcell-e2e-bwrap-", dir="/var/tmp"))
    data_dir.chmod(0o711)
    try:
        with running_server(data_dir, pki, BWRAP_ENV) as running:
            yield running
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def test_a_bwrap_job_reaches_allowed_hosts_through_its_proxy_only(
    bwrap_server: Server, pki: TestPKI
) -> None:
    server = bwrap_server
    alice = server.tenant("bwrap-net")
    secret = "bwrap-token-" + hashlib.sha256(b"e2e-bwrap").hexdigest()[:16]
    with httpx.Client(base_url=server.url, headers=alice) as http:
        http.post("/v1/secrets", json={"name": "crm", "value": secret}).raise_for_status()
    tls = pki.server_context(["secure.allowed.test"])
    with EchoServer("127.0.0.1") as plain, EchoServer("127.0.0.1", tls) as secure:
        urls = {
            "allowed": f"http://api.allowed.test:{plain.port}/hello",
            "secure": f"https://secure.allowed.test:{secure.port}/echo",
            "other": f"http://other.test:{plain.port}/hello",
        }
        binding = {"name": "crm", "hosts": ["secure.allowed.test"], "header": "Authorization"}
        body = {
            "code": _program(urls, plain.port),  # direct: the same loopback server, unproxied
            "network": {"allow": ["api.allowed.test", "secure.allowed.test"]},
            "secrets": [binding | {"format": "Bearer {value}"}],
        }
        job = run_job(server, alice, body)
        assert job["state"] == "completed", job
        facts = _facts(server, alice, job)
        assert [r["path"] for r in plain.requests] == ["/hello"]  # only the allowed one arrived
        assert [dict(r["headers"])["authorization"] for r in secure.requests] == [
            f"Bearer {secret}"
        ]
    assert job["runtime"] == "bwrap" and job["runtime_version"].startswith("bubblewrap")
    assert facts["allowed"]["status"] == 200 and facts["other"]["status"] == 403
    expected = hashlib.sha256(f"Bearer {secret}".encode()).hexdigest()
    assert facts["secure"] == {"status": 200, "auth": [expected]}
    assert facts["direct"] != "connected"
    assert sorted((e["host"], e["decision"], e["reason"]) for e in job["egress"]) == [
        ("api.allowed.test", "allowed", "http"),
        ("other.test", "denied", "not_allowed"),
        ("secure.allowed.test", "allowed", "tls_intercept"),
    ]


def test_a_plain_bwrap_job_comes_from_the_tiers_own_warm_pool(bwrap_server: Server) -> None:
    headers = bwrap_server.tenant("bwrap-pool")
    with httpx.Client(base_url=bwrap_server.url, headers=headers) as http:
        wait_for_pool(http, "python")
    job = run_job(bwrap_server, headers, {"code": "import os; print('pooled', os.getuid())"})
    assert (job["state"], job["runtime"], job["pooled"]) == ("completed", "bwrap", True), job
    assert job["sandbox_id"].startswith("pool-python-")
    with httpx.Client(base_url=bwrap_server.url, headers=headers) as http:
        logs = http.get(f"/v1/jobs/{job['id']}/logs").json()
    assert logs["stdout"] == "pooled 65534\n"
