"""A sandbox uid that a host process runs as is never handed out, and /metrics says so.

On the bwrap tier every sandbox runs as a host uid of the worker's own range. A process left
running as one (an earlier worker's, or one that got out of its sandbox's cgroup) quarantines
that uid: the worker logs it and its heartbeat reports the count, which /metrics shows per
worker, so an operator can alert on it rather than find it in a log.
"""

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sandcell.runtime.bwrap import UID_BASE, UID_BLOCK, UID_BLOCKS
from sandcell.runtime.volatile import state_key
from tests.e2e.conftest import run_job, running_server
from tests.integration.egress_servers import TestPKI

pytestmark = pytest.mark.bwrap

COLD_BWRAP = {
    "SANDCELL_RUNTIME": "bwrap",
    "SANDCELL_ALLOW_WEAK_ISOLATION": "1",
    "SANDCELL_POOL_SIZE": "",  # the first take, and its scan, come with the first job
}
QUARANTINED = "sandcell_sandbox_uids_quarantined"


def quarantined_by_worker(http: httpx.Client) -> dict[str, float]:
    text = http.get("/metrics/").raise_for_status().text
    return {
        sample.labels["worker"]: sample.value
        for metric in text_string_to_metric_families(text)
        if metric.name == QUARANTINED
        for sample in metric.samples
    }


def test_a_uid_a_host_process_runs_as_is_skipped_and_counted_in_metrics(pki: TestPKI) -> None:
    if os.geteuid() != 0:
        pytest.skip("the bwrap worker needs root")
    data_dir = Path(tempfile.mkdtemp(prefix="sandcell-e2e-quarantine-", dir="/var/tmp"))
    data_dir.chmod(0o711)
    # The worker's uid range, as BwrapRuntime derives it from its state directory.
    first = UID_BASE + int(state_key(data_dir / "bwrap"), 16) % UID_BLOCKS * UID_BLOCK
    as_first = ("setpriv", f"--reuid={first}", f"--regid={first}", "--clear-groups")
    squatter = subprocess.Popen([*as_first, "sleep", "120"])
    try:
        with running_server(data_dir, pki, COLD_BWRAP) as server:
            headers = server.tenant("quarantine")
            job = run_job(server, headers, {"code": "import os; print(os.getuid())"})
            assert (job["state"], job["runtime"]) == ("completed", "bwrap"), job
            with httpx.Client(base_url=server.url, headers=server.admin) as http:
                deadline = time.monotonic() + 10
                while set(quarantined_by_worker(http).values()) != {1.0}:
                    assert time.monotonic() < deadline, quarantined_by_worker(http)
                    time.sleep(0.2)
            log = (data_dir / "serve.log").read_text(errors="replace")
            assert f"run as sandbox uid {first}: it is never handed out again" in log
            assert squatter.poll() is None  # left alone: it is the operator's to look into
    finally:
        squatter.kill()
        squatter.wait()
        shutil.rmtree(data_dir, ignore_errors=True)
