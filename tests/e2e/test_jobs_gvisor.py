"""The job service end to end: real `sandcell serve`, real HTTP, real runsc sandboxes."""

import hashlib
import io
import json
import re
import socket
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import loopback_dns
from tests.e2e.conftest import Server, host_processes_mentioning, once_released, run_job
from tests.e2e.pool_metrics import pool_figure, wait_for_pool
from tests.loopback_dns import LoopbackDns

pytestmark = pytest.mark.gvisor

CHART = """
import struct, zlib
def chunk(kind, data):
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))
rows = b''.join(b'\\x00' + bytes([x % 256, (x * 3) % 256, 200] * 64) for x in range(64))
png = (b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 64, 64, 8, 2, 0, 0, 0))
       + chunk(b'IDAT', zlib.compress(rows)) + chunk(b'IEND', b''))
open('/output/chart.png', 'wb').write(png)
print(len(png))
"""


def _expected_chart() -> bytes:
    scope: dict = {}
    exec(
        CHART.replace("open('/output/chart.png', 'wb').write(png)", "").replace(
            "print(len(png))", ""
        ),
        scope,
    )
    return scope["png"]


def test_a_job_writing_a_chart_completes_with_the_right_sha256(server: Server) -> None:
    alice = server.tenant("chart")
    job = run_job(server, alice, {"code": CHART})
    assert job["state"] == "completed", job
    assert job["runtime"] == "gvisor" and job["runtime_version"].startswith("runsc")
    assert job["image_digest"].startswith("sha256:")
    [output] = job["outputs"]
    expected = _expected_chart()
    assert output["path"] == "chart.png"
    assert output["sha256"] == hashlib.sha256(expected).hexdigest()
    with httpx.Client(base_url=server.url, headers=alice) as http:
        body = http.get(f"/v1/artifacts/{output['artifact_id']}/content").content
        logs = http.get(f"/v1/jobs/{job['id']}/logs").json()
    assert body == expected
    assert logs["stdout"] == f"{len(expected)}\n"
    assert job["queue_ms"] is not None and job["start_ms"] > 0 and job["run_ms"] > 0


REASONS = {
    "exit_code": ({"code": "import sys; sys.exit(7)"}, {}),
    "timeout": ({"code": "import time; time.sleep(60)"}, {"timeout_s": 2}),
    "memory": (
        {"code": "chunks = []\nwhile True: chunks.append(bytearray(16 * 2**20))"},
        {"memory_mb": 128},
    ),
    "pids": (
        {"code": "import os, time\nfor _ in range(200):\n    if os.fork() == 0: time.sleep(30)"},
        {"pids": 32},
    ),
    "disk": (
        {"code": "f = open('/workspace/big', 'wb')\nwhile True: f.write(b'x' * 2**20); f.flush()"},
        {"disk_mb": 16},
    ),
    "output_limit": ({"code": "while True: print('y' * 1000)"}, {"output_mb": 0.1}),
}


@pytest.mark.parametrize("reason", list(REASONS))
def test_each_limit_that_trips_gives_its_own_reason(server: Server, reason: str) -> None:
    body, limits = REASONS[reason]
    tenant = server.tenant(f"reason-{reason}")
    job = run_job(server, tenant, body | {"limits": limits})
    assert (job["state"], job["reason"]) == ("failed", reason), job
    if reason == "exit_code":
        assert job["exit_code"] == 7
        job = once_released(server, tenant, job)  # reported before the release, if pooled
    else:  # a limit's end is reported only once the sandbox is released
        assert job["usage"]["released"] == 1, job
    assert job["attempts"][-1]["sandbox_id"] == job["sandbox_id"]
    assert host_processes_mentioning(job["sandbox_id"]) == []


STUBBORN = """
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True: time.sleep(1)
    os._exit(0)
print('ready', flush=True)
while True: time.sleep(1)
"""


def _cancel_stubborn(http: httpx.Client, limits: dict[str, float]) -> tuple[str, dict[str, Any]]:
    """Start STUBBORN, cancel it once ready; the sandbox it ran in (as its record said while
    it ran) and its final record."""
    job = http.post("/v1/jobs", json={"code": STUBBORN, "limits": limits}).json()
    deadline = time.monotonic() + 30
    while "ready" not in http.get(f"/v1/jobs/{job['id']}/logs").json()["stdout"]:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    sandbox_id = http.get(f"/v1/jobs/{job['id']}").json()["sandbox_id"]
    assert host_processes_mentioning(sandbox_id), "the sandbox should be running"
    answer = http.post(f"/v1/jobs/{job['id']}/cancel")
    assert answer.status_code == 202
    record = http.get(f"/v1/jobs/{job['id']}", params={"wait": 30}).json()
    assert (record["state"], record["reason"]) == ("cancelled", "cancelled"), record
    assert [a["sandbox_id"] for a in record["attempts"]] == [sandbox_id]
    assert host_processes_mentioning(sandbox_id) == []
    return sandbox_id, record


def test_cancel_really_kills_a_stubborn_double_forked_program(server: Server) -> None:
    alice = server.tenant("cancel")
    with httpx.Client(base_url=server.url, headers=alice, timeout=60) as http:
        # pids differs from the pool's profile: a cold sandbox, named after the job
        sandbox_id, record = _cancel_stubborn(http, {"pids": 48})
    assert (
        not record["pooled"] and sandbox_id == f"{record['id']}-{record['attempts'][0]['number']}"
    )


def test_cancel_kills_a_pooled_job_and_metrics_count_the_hit(server: Server) -> None:
    alice = server.tenant("cancel-pooled")
    with httpx.Client(base_url=server.url, headers=alice, timeout=60) as http:
        wait_for_pool(http, "python")
        hits = pool_figure(http, "sandcell_pool_hits", "python")
        assert pool_figure(http, "sandcell_pool_target", "python") == 1
        budget = pool_figure(http, "sandcell_pool_memory_limit_bytes", None)
        assert 0 < pool_figure(http, "sandcell_pool_memory_bytes", None) <= budget
        sandbox_id, record = _cancel_stubborn(http, {})
        assert record["pooled"] and sandbox_id.startswith("pool-python-"), record
        deadline = time.monotonic() + 10  # the worker reports every second
        while pool_figure(http, "sandcell_pool_hits", "python") < hits + 1:
            assert time.monotonic() < deadline, "the hit never showed in /metrics"
            time.sleep(0.2)
        text = http.get("/metrics/").text
    assert "sandcell_pool_misses_total" in text and "sandcell_pool_refusals_total" in text


DNS_NAME = "dns-probe.sandcell.test"
ISOLATION = """
import ctypes, json, os, socket
facts = {"uid": os.getuid(), "gid": os.getgid()}
status = dict(line.split(":\\t", 1) for line in open('/proc/self/status').read().splitlines())
facts["caps"] = [status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd", "CapInh")]
facts["canary"] = os.path.exists(CANARY)
facts["pids"] = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
lines = open('/proc/net/dev').readlines()[2:]
facts["interfaces"] = sorted(line.split(':')[0].strip() for line in lines)
try:
    open('/usr/evil', 'w'); facts["root_writable"] = True
except OSError:
    facts["root_writable"] = False
try:
    facts["nameservers"] = [line.split()[1:] for line in open('/etc/resolv.conf')
                            if line.split()[:1] == ['nameserver']]
except FileNotFoundError:
    facts["nameservers"] = None
facts["localhost"] = sorted({a[4][0] for a in socket.getaddrinfo('localhost', 80)})
try:  # a name only DNS could answer; EAI_AGAIN: no resolver answered, EAI_NONAME: one said no
    facts["dns"] = socket.getaddrinfo(DNS_NAME, 80)[0][4][0]
except socket.gaierror as exc:
    facts["dns"] = exc.errno
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(2)
try:  # the host's loopback DNS server answers anyone who reaches it
    u.sendto(DNS_QUERY, ('127.0.0.1', DNS_PORT)); facts["host_dns"] = u.recv(512).hex()
except OSError:
    facts["host_dns"] = None
s = socket.socket(); s.settimeout(2)
try:
    s.connect(('127.0.0.1', PORT)); facts["host_loopback"] = True
except OSError:
    facts["host_loopback"] = False
libc = ctypes.CDLL(None, use_errno=True)
facts["io_uring"] = libc.syscall(425, 8, ctypes.create_string_buffer(120)) >= 0
facts["no_new_privs"] = libc.prctl(39, 0, 0, 0, 0)  # PR_GET_NO_NEW_PRIVS
facts["env"] = sorted(os.environ)
print(json.dumps(facts))
"""


def test_the_sandbox_sees_no_host_files_processes_capabilities_or_network(
    server: Server, tmp_path: Path
) -> None:
    canary = Path("/root/sandcell-canary-e2e")
    canary.write_text("secret")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    headers = server.tenant("isolation")
    try:
        with LoopbackDns() as dns:
            assert dns.ask(DNS_NAME) == "127.0.0.1"  # it answers whoever reaches it
            code = (
                ISOLATION.replace("CANARY", repr(str(canary)))
                .replace("DNS_NAME", repr(DNS_NAME))
                .replace("DNS_QUERY", repr(loopback_dns.query(DNS_NAME)))
                .replace("DNS_PORT", str(dns.port))
                .replace("PORT", str(port))
            )
            job = run_job(server, headers, {"code": code, "env": {"MINE": "1"}})
            time.sleep(0.2)  # a query that had left the sandbox would have arrived by now
        asked = len(dns.queries)
    finally:
        canary.unlink()
        listener.close()
    assert job["state"] == "completed", job
    with httpx.Client(base_url=server.url, headers=headers) as http:
        facts = json.loads(http.get(f"/v1/jobs/{job['id']}/logs").json()["stdout"])
    assert (facts["uid"], facts["gid"]) == (65534, 65534)
    assert facts["caps"] == ["0000000000000000"] * 4
    assert facts["no_new_privs"] == 1
    assert facts["canary"] is False and facts["root_writable"] is False
    assert len(facts["pids"]) <= 3, facts["pids"]  # sh exec'd into python: only the sandbox's own
    assert facts["interfaces"] == ["lo"]
    # No DNS: no resolver configured, a resolvable name finds no one to ask (while /etc/hosts
    # works), and the host's loopback DNS server is out of reach and never heard a query.
    assert facts["nameservers"] in (None, []), facts["nameservers"]
    assert "127.0.0.1" in facts["localhost"]
    assert facts["dns"] == socket.EAI_AGAIN, facts["dns"]
    assert facts["host_dns"] is None and asked == 1  # only the host's own check above
    assert facts["host_loopback"] is False
    assert facts["io_uring"] is False
    assert "SANDCELL_ADMIN_KEY" not in facts["env"] and "MINE" in facts["env"]
    assert not any(name.startswith(("PYENV", "SSH", "PG")) for name in facts["env"])


def test_twenty_concurrent_submissions_with_one_key_create_one_job(server: Server) -> None:
    alice = server.tenant("idem") | {"Idempotency-Key": "same-key"}
    answers: list[httpx.Response] = []
    barrier = threading.Barrier(20)

    def submit() -> None:
        with httpx.Client(base_url=server.url, headers=alice, timeout=30) as http:
            barrier.wait()
            answers.append(http.post("/v1/jobs", json={"code": "print(1)"}))

    threads = [threading.Thread(target=submit) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({a.json()["id"] for a in answers}) == 1
    assert sorted(a.status_code for a in answers) == [200] * 19 + [202]


def test_cli_run_submits_waits_prints_logs_and_downloads(server: Server, tmp_path: Path) -> None:
    headers = server.tenant("cli")
    (tmp_path / "data.csv").write_text("x,y\n1,2\n3,4\n")
    (tmp_path / "analysis.py").write_text(
        "rows = open('/input/data.csv').read().splitlines()[1:]\n"
        "total = sum(int(r.split(',')[1]) for r in rows)\n"
        "open('/output/total.txt', 'w').write(str(total))\n"
        "print('total', total)\n"
    )
    env = server.env() | {"SANDCELL_API_KEY": headers["Authorization"].split()[1]}
    # Exactly the README's command, from the project's entry point, in a fresh directory.
    sandcell = str(Path(sys.executable).parent / "sandcell")
    result = subprocess.run(
        [sandcell, "run", "analysis.py", "--input", "data.csv", "--wait"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == "total 6\n"  # the job's logs; everything else goes to stderr
    job_id = re.search(r"^job (\S+): completed in \d", result.stderr, re.M)
    assert job_id is not None, result.stderr
    downloaded = tmp_path / "sandcell-output" / job_id[1] / "total.txt"  # the default folder
    assert downloaded.read_text() == "6"
    sha256 = hashlib.sha256(b"6").hexdigest()
    line = f"downloaded total.txt → sandcell-output/{job_id[1]}/total.txt (sha256 {sha256[:12]}…"
    assert f"{line} verified)" in result.stderr.splitlines(), result.stderr


CSV_TO_CHART = """
import pandas as pd, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
df = pd.read_csv("/input/sales.csv")
clean = df.dropna().groupby("day", as_index=False)["sales"].sum()
clean.to_csv("/output/clean.csv", index=False)
ax = clean.plot(x="day", y="sales")
plt.savefig("/output/chart.png")
print(len(df), len(clean))
"""


def test_the_csv_to_chart_example_runs_as_a_job_on_python_data(server: Server) -> None:
    alice = server.tenant("csv-chart")
    rows = "day,sales\n" + "".join(f"{d % 30},{d % 7}\n" for d in range(10_000)) + "31,\n"
    with httpx.Client(base_url=server.url, headers=alice) as http:
        stored = http.post("/v1/files", files={"file": ("sales.csv", rows.encode())}).json()
    body = {
        "image": "python-data",
        "code": CSV_TO_CHART,
        "inputs": [{"file_id": stored["id"], "path": "sales.csv"}],
    }
    job = run_job(server, alice, body, timeout=120)
    assert job["state"] == "completed", job
    outputs = {o["path"]: o for o in job["outputs"]}
    assert set(outputs) == {"clean.csv", "chart.png"}
    with httpx.Client(base_url=server.url, headers=alice) as http:
        png = http.get(f"/v1/artifacts/{outputs['chart.png']['artifact_id']}/content").content
        logs = http.get(f"/v1/jobs/{job['id']}/logs").json()["stdout"]
    assert (
        png[:8] == b"\x89PNG\r\n\x1a\n"
        and hashlib.sha256(png).hexdigest() == outputs["chart.png"]["sha256"]
    )
    assert logs.split() == ["10001", "30"]


SPREADSHEET = """
import pandas as pd
sales = pd.DataFrame({"city": ["oslo", "rome"], "sales": [4, 18]})
sales.to_excel("/output/sales.xlsx", index=False)
back = pd.read_excel("/output/sales.xlsx")
print(back["city"].tolist(), int(back["sales"].sum()))
"""


def _python_data_job(server: Server, tenant: str, code: str) -> tuple[str, str, bytes]:
    """A completed `python-data` job's stdout, and the path and content of its one output."""
    headers = server.tenant(tenant)
    job = run_job(server, headers, {"image": "python-data", "code": code}, timeout=120)
    assert job["state"] == "completed", job
    [output] = job["outputs"]
    with httpx.Client(base_url=server.url, headers=headers) as http:
        logs = http.get(f"/v1/jobs/{job['id']}/logs").json()["stdout"]
        content = http.get(f"/v1/artifacts/{output['artifact_id']}/content").content
    return logs, output["path"], content


def test_a_python_data_job_writes_and_reads_a_spreadsheet(server: Server) -> None:
    """pandas' `.xlsx` reader and writer (openpyxl) are in the image, as in peers' images."""
    logs, path, xlsx = _python_data_job(server, "xlsx", SPREADSHEET)
    assert logs.strip() == "['oslo', 'rome'] 22" and path == "sales.xlsx"
    with zipfile.ZipFile(io.BytesIO(xlsx)) as book:  # an Office Open XML workbook
        assert "xl/workbook.xml" in book.namelist()


ANALYSIS = """
import matplotlib.pyplot as plt, numpy as np, seaborn as sns
from bs4 import BeautifulSoup
from sklearn.linear_model import LinearRegression
x = np.arange(20).reshape(-1, 1)
y = 3 * x.ravel() + 1
model = LinearRegression().fit(x, y)
sns.regplot(x=x.ravel(), y=y)
plt.savefig("/output/fit.png")
cell = BeautifulSoup("<table><tr><td>42</td></tr></table>", "html.parser").td.text
print(round(float(model.coef_[0]), 6), round(float(model.intercept_), 6), cell)
"""


def test_a_python_data_job_has_seaborn_scikit_learn_and_beautiful_soup(server: Server) -> None:
    """What model-written analysis code imports most, beside pandas and matplotlib."""
    logs, path, png = _python_data_job(server, "analysis", ANALYSIS)
    assert logs.split() == ["3.0", "1.0", "42"]
    assert path == "fit.png" and png[:8] == b"\x89PNG\r\n\x1a\n"
