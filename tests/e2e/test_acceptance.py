"""`sandcell acceptance` as a subprocess against real deployments (runsc, real sockets):

- a fresh embedded `sandcell serve` (SQLite, its worker a child process that serve starts
  again after the acceptance test stopped it);
- a scale-out deployment: an API process and two workers on PostgreSQL;
- a deployment whose operator did not allow loopback egress: step 2 must fail, and say why.
"""

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.fernet import Fernet

from sandcell.runtime.images import build_image
from tests.e2e.cluster import ADMIN_KEY as CLUSTER_ADMIN_KEY
from tests.e2e.cluster import Cluster, egress_env, fresh_schema
from tests.e2e.conftest import ADMIN_KEY, IMAGE_DIR, running_server
from tests.integration.egress_servers import TestPKI

pytestmark = pytest.mark.gvisor


def _acceptance(url: str, admin_key: str, report: Path, *args: str) -> tuple[int, dict[str, Any]]:
    command = [sys.executable, "-m", "sandcell.cli.main", "acceptance", "--url", url]
    command += ["--admin-key", admin_key, "--report", str(report), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    print(done.stdout[-6000:], done.stderr[-3000:])  # the tables, for whoever reads the log
    return done.returncode, json.loads(report.read_text())


def _assert_passed(report: dict[str, Any]) -> None:
    failures = report["failures"]
    assert report["passed"] and not failures, json.dumps(failures, indent=1)
    assert [s["step"] for s in report["steps"]] == [1, 2, 3, 4, 5]
    assert all(s["passed"] and s["checks"] for s in report["steps"])
    load = report["load"]
    assert load["submitted"] >= 15 and load["terminal"] == load["submitted"], load
    assert load["by_outcome"]["failed/timeout"] == 1 and load["by_outcome"]["failed/memory"] == 1
    assert load["by_outcome"]["cancelled/cancelled"] == 1
    for figure in ("ack_ms", "ready_ms", "done_ms"):
        latency = report["latency_ms"][figure]
        assert latency["count"] >= 15 and 0 < latency["p50"] <= latency["p90"] <= latency["p99"]
    recovery = report["recovery"]
    assert recovery["passed"] and recovery["once_actions"] == 1
    assert recovery["resumed_on"] != recovery["stopped_worker"]
    assert recovery["stages"] == ["clean", "summary"]
    cleanup = report["cleanup"]
    assert cleanup["keys_revoked"] == len(cleanup["tenants_left"]) and not cleanup["problems"]
    assert cleanup["jobs_retired"] == load["submitted"]


def _tenant_keys_revoked(url: str, report: dict[str, Any]) -> None:
    """What the run made is gone: its keys no longer authenticate (checked via the audit)."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        revoked = admin.get("/v1/admin/audit", params={"action": "key.revoke"}).json()["items"]
    assert len(revoked) >= len(report["cleanup"]["tenants_left"])


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A fresh data dir with a short path (unix socket paths under it fit in 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="sc-acc-", dir="/var/tmp"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_acceptance_passes_against_a_fresh_embedded_serve(
    tmp_path: Path, data_dir: Path, pki: TestPKI
) -> None:
    build_image("python", IMAGE_DIR)
    with running_server(data_dir, pki) as server:
        code, report = _acceptance(server.url, ADMIN_KEY, tmp_path / "report.json")
        _assert_passed(report)
        assert code == 0
        _tenant_keys_revoked(server.url, report)
        with httpx.Client(base_url=server.url, headers=server.admin) as admin:
            workers = admin.get("/v1/admin/workers", params={"include_stopped": True}).json()
            ready = admin.get("/readyz")
    states = {w["id"]: w["state"] for w in workers["items"]}
    assert states[report["recovery"]["stopped_worker"]] == "stopped"
    assert states[report["recovery"]["resumed_on"]] == "running"  # serve's next incarnation
    assert ready.status_code == 200, ready.text


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    build_image("python", IMAGE_DIR)
    base = Path(tempfile.mkdtemp(prefix="sc-acc-", dir="/var/tmp"))  # short socket paths
    base.chmod(0o711)
    with fresh_schema() as schema:
        # Every process must decrypt what the API stored: one secrets key for all of them.
        shared_key = {"SANDCELL_SECRETS_KEY": Fernet.generate_key().decode()}
        deployment = Cluster(base, schema, egress_env({}) | shared_key)
        try:
            deployment.start_api()
            deployment.start_worker("wa")
            deployment.start_worker("wb")
            yield deployment
        finally:
            deployment.close()
            shutil.rmtree(base, ignore_errors=True)


def test_acceptance_passes_against_postgresql_with_two_workers(
    cluster: Cluster, tmp_path: Path
) -> None:
    assert cluster.api is not None
    code, report = _acceptance(cluster.api.url, CLUSTER_ADMIN_KEY, tmp_path / "report.json")
    _assert_passed(report)
    assert code == 0
    stopped = next(p for p in cluster.procs if p.worker_id == report["recovery"]["stopped_worker"])
    assert stopped.popen.wait(30) == 75  # the stopped worker exited: stopped on request
    survivor = next(p for p in cluster.procs if p.worker_id == report["recovery"]["resumed_on"])
    assert survivor.popen.poll() is None


def test_a_deployment_without_loopback_egress_fails_step_2_and_the_report_says_so(
    tmp_path: Path, data_dir: Path, pki: TestPKI
) -> None:
    build_image("python", IMAGE_DIR)
    no_loopback = {"SANDCELL_EGRESS_ALLOWED_NETWORKS": "[]"}
    with running_server(data_dir, pki, no_loopback) as server:
        code, report = _acceptance(
            server.url, ADMIN_KEY, tmp_path / "report.json", "--step", "2", "--json"
        )
    assert code == 1 and not report["passed"]
    steps = {s["step"]: s for s in report["steps"]}
    assert sorted(steps) == [1, 2]  # step 2 needs step 1's tenant and artifact
    assert steps[1]["passed"] and not steps[2]["passed"]
    failures = {f["check"]: f["evidence"] for f in report["failures"] if f["step"] == 2}
    assert sorted(failures) == [
        "approved endpoint reached through the proxy",
        "every attempt is on the job record's egress log",
    ]
    # The evidence says why: the proxy refused loopback (403), nothing reached the endpoint.
    assert failures["approved endpoint reached through the proxy"] == (
        "job saw 403; endpoint counted 0"
    )
    assert "('127.0.0.1', 'denied')" in failures["every attempt is on the job record's egress log"]
    checks = {c["name"]: c["passed"] for c in steps[2]["checks"]}
    assert checks["unapproved endpoint blocked"] and checks["no secret value in any log or record"]
