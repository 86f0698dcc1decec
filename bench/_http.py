"""What the suite does over HTTP: jobs submitted and waited for, sessions, the chart input."""

import io
import json
import random
import threading
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


@contextmanager
def lean_job_runner(http: httpx.Client, body: dict[str, Any]) -> Iterator[Callable[[], None]]:
    """A function that runs `body` to completion as `run_job` does, through the standard
    library's `http.client` with a connection per thread, as a lean load generator (wrk, hey)
    would. The throughput rounds use it: on the same two cores as the service, httpx spent
    1.3-1.8 ms of the machine's CPU a job against 0.45-0.6 ms for this (session 32)."""
    url = urlsplit(str(http.base_url))
    headers = {"Authorization": http.headers["Authorization"], "Content-Type": "application/json"}
    payload = json.dumps(body).encode()
    mine, opened = threading.local(), list[HTTPConnection]()

    def connection() -> HTTPConnection:
        conn: HTTPConnection | None = getattr(mine, "conn", None)
        if conn is None:
            conn = mine.conn = HTTPConnection(url.hostname or "", url.port, timeout=120)
            opened.append(conn)
            conn.connect()
            assert conn.sock is not None
            conn.sock.setsockopt(*NODELAY)
        return conn

    def call(method: str, path: str, data: bytes | None) -> dict[str, Any]:
        conn = connection()
        conn.request(method, path, data, headers)
        answer = conn.getresponse()
        text = answer.read()
        if answer.status >= 400:
            raise SystemExit(f"{method} {path} answered {answer.status} {text[:500]!r}")
        record: dict[str, Any] = json.loads(text)
        return record

    def run() -> None:
        job = call("POST", "/v1/jobs?wait=30", payload)
        while job["state"] not in TERMINAL:
            job = call("GET", f"/v1/jobs/{job['id']}?wait=30", None)
        completed(job)

    try:
        yield run
    finally:
        for conn in opened:
            conn.close()


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
