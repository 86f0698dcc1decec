"""What the suite does over HTTP: jobs submitted and waited for, sessions, the chart input."""

import io
import json
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.client import HTTPConnection
from typing import Any
from urllib.parse import urlsplit

import httpx

from bench._server import client_for
from sandcell.remote.session_client import NODELAY

TERMINAL = ("completed", "failed", "cancelled")

CHART_CODE = """\
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

df = pd.read_csv("/input/data.csv", parse_dates=["day"])
totals = df.groupby("category")["amount"].sum().sort_values()
ax = totals.plot.barh(figsize=(6, 4), title="amount by category")
plt.tight_layout()
plt.savefig("/output/chart.png", dpi=80)
print(len(df), round(totals.sum(), 2))
"""


def run_job(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    """Submit and wait in one request (`POST /v1/jobs?wait=30`), long-polling on if need be."""
    answer = http.post("/v1/jobs", json=body, params={"wait": 30}).raise_for_status()
    job: dict[str, Any] = answer.json()
    while job["state"] not in TERMINAL:
        job = http.get(f"/v1/jobs/{job['id']}", params={"wait": 30}).raise_for_status().json()
    return job


def completed(record: dict[str, Any]) -> dict[str, Any]:
    if record["state"] != "completed":
        raise SystemExit(f"bench job did not complete: {record['reason']}: {record['detail']}")
    return record


def chart_csv(rows: int = 10_000) -> bytes:
    rnd = random.Random(6)
    out = io.StringIO()
    out.write("day,category,amount\n")
    categories = [f"cat{i:02d}" for i in range(12)]
    for n in range(rows):
        out.write(f"2024-{1 + n % 12:02d}-{1 + n % 28:02d},{rnd.choice(categories)},")
        out.write(f"{rnd.uniform(1, 500):.2f}\n")
    return out.getvalue().encode()


def upload(http: httpx.Client, name: str, content: bytes) -> str:
    answer = http.post("/v1/files", files={"file": (name, content)}).raise_for_status()
    file_id: str = answer.json()["id"]
    return file_id


def session_first_result(http: httpx.Client, image: str) -> tuple[str, float, float]:
    """Create a session and run `1+1`: its id, ms to created, ms to the first result."""
    started = time.perf_counter()
    sid: str = http.post("/v1/sessions", json={"image": image}).raise_for_status().json()["id"]
    created = (time.perf_counter() - started) * 1000
    answer = execute(http, sid, "1+1")
    if answer["result"] != "2":
        raise SystemExit(f"session answered {answer}")
    return sid, created, (time.perf_counter() - started) * 1000


def execute(http: httpx.Client, sid: str, code: str) -> dict[str, Any]:
    answer: dict[str, Any] = (
        http.post(f"/v1/sessions/{sid}/execute", json={"code": code}).raise_for_status().json()
    )
    return answer


@contextmanager
def direct_client(
    http: httpx.Client, sid: str
) -> Iterator[tuple[Callable[[], None], Callable[[], None]]]:
    """Two functions that run `1+1` in session `sid` straight on its worker, with a token from
    `POST /v1/sessions/{sid}/direct` (one HTTP hop, not two): through httpx, as the SDK sends
    it, and through the standard library's `http.client`, as a lean client (curl, wrk) would.
    Both keep their connection open, with Nagle off; httpx spends ~0.5 ms more of the client's
    CPU on each call, which the second leaves out of the service's round trip."""
    access = http.post(f"/v1/sessions/{sid}/direct").raise_for_status().json()
    url = urlsplit(access["execute_url"])
    headers = {"Authorization": f"Bearer {access['token']}", "Content-Type": "application/json"}
    body = json.dumps({"code": "1+1"})
    lean = HTTPConnection(url.hostname or "", url.port)

    def checked(status: int, text: bytes) -> None:
        if status != 200 or json.loads(text)["result"] != "2":
            raise SystemExit(f"direct cell answered {status} {text[:500]!r}")

    def with_stdlib() -> None:
        lean.request("POST", url.path, body, headers)
        answer = lean.getresponse()
        checked(answer.status, answer.read())

    try:
        lean.connect()
        assert lean.sock is not None
        lean.sock.setsockopt(*NODELAY)
        with client_for(access["execute_url"], access["token"]) as direct:  # token as the key

            def with_httpx() -> None:
                answer = direct.post(access["execute_url"], json={"code": "1+1"})
                checked(answer.status_code, answer.content)

            yield with_httpx, with_stdlib
    finally:
        lean.close()
