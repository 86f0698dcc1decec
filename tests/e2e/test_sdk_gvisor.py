"""The SDK over a socket against a real `sandcell serve` (real runsc, python-data image)."""

import base64
import hashlib
import socket
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandcell_client import (
    AsyncClient,
    CellEvent,
    Client,
    InvalidRequest,
    LogEvent,
    NotFound,
)
from tests.e2e.conftest import Server

pytestmark = pytest.mark.gvisor

CSV = "day,sales\n" + "".join(f"{d % 12},{d % 7}\n" for d in range(500)) + "13,\n"
CSV_TO_CHART = """
import time, pandas as pd, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
print("loaded", flush=True)
time.sleep(2)
df = pd.read_csv("/input/sales.csv")
clean = df.dropna().groupby("day", as_index=False)["sales"].sum()
clean.to_csv("/output/clean.csv", index=False)
clean.plot(x="day", y="sales")
plt.savefig("/output/chart.png")
print(len(df), len(clean))
"""


def _key(server: Server, name: str) -> str:
    return server.tenant(name)["Authorization"].removeprefix("Bearer ")


def test_csv_to_chart_through_the_sync_sdk_streams_logs_live(
    server: Server, tmp_path: Path
) -> None:
    (tmp_path / "sales.csv").write_text(CSV)
    with Client(server.url, _key(server, "sdk-chart")) as client:
        live: list[tuple[LogEvent, str]] = []

        def on_log(event: LogEvent) -> None:
            # The job's state when its first line arrives: still running (it sleeps after).
            [job] = client.jobs().items if not live else [None]
            live.append((event, job.state if job else ""))

        result = client.run(
            CSV_TO_CHART, files=[tmp_path / "sales.csv"], image="python-data", on_log=on_log
        )
        assert result.ok, (result.job, result.stderr)
        assert live[0][0].text == "loaded\n" and live[0][1] == "running"
        assert result.stdout.split() == ["loaded", "501", "12"]
        paths = client.download_outputs(result, tmp_path / "out")
        assert {p.name for p in paths} == {"clean.csv", "chart.png"}
        chart = result.job.output("chart.png")
        png = (tmp_path / "out" / "chart.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        assert (
            hashlib.sha256(png).hexdigest() == chart.sha256 == result.job.output("chart.png").sha256
        )
        assert client.read(result.job.output("clean.csv")).startswith(b"day,sales\n")
        assert result.job.runtime == "gvisor"


def test_errors_over_the_socket_are_typed(server: Server) -> None:
    with (
        Client(server.url, _key(server, "sdk-err-a")) as alice,
        Client(server.url, _key(server, "sdk-err-b")) as bob,
    ):
        job = alice.submit({"code": "print(1)"})
        with pytest.raises(NotFound):
            bob.job(job.id)  # another tenant's id is not found, exactly like a missing one
        with pytest.raises(NotFound):
            bob.cancel(job.id)
        with pytest.raises(InvalidRequest) as bad_host:
            alice.run("print(1)", allow=["bad host!"])
        assert bad_host.value.errors[0].field.startswith("network.allow")
        with pytest.raises(InvalidRequest) as bad_image:
            alice.run("print(1)", image="no-such-image")
        assert [e.field for e in bad_image.value.errors] == ["image"]
        assert alice.wait(job.id, timeout=60).state == "completed"


SESSION_CHART = """
import pandas as pd, matplotlib.pyplot as plt
df = pd.read_csv('sales.csv')
print('rows', len(df))
df.plot(x='day', y='sales', figsize=(4, 3))
plt.show()
"""


def test_sdk_cells_go_straight_to_the_worker_and_on_after_a_pause(server: Server) -> None:
    """`go_direct`: cells skip the API (one HTTP hop), share the kernel with the API's and are
    in the history; after pause and resume (same worker) the same token goes on working."""
    with (
        Client(server.url, _key(server, "sdk-direct"), timeout=120) as client,
        client.sessions.create(image="python-data") as session,
    ):
        session.execute("x = 41")
        access = session.go_direct()
        assert not access.execute_url.startswith(server.url)  # the worker's own server
        assert session.execute("x + 1").result == "42"
        session.pause()
        session.resume()
        chart = "import matplotlib.pyplot as plt; plt.plot([1, 2]); x + 2"
        cell = session.execute(chart)
        assert cell.result == "43" and cell.images()[0][:4] == b"\x89PNG"
        assert [c.code for c in session.cells()][-2:] == ["x + 1", chart]


def test_async_sdk_session_streams_a_chart_and_keeps_state_across_pause(server: Server) -> None:
    key = _key(server, "sdk-async-session")

    async def main() -> dict[str, Any]:
        async with AsyncClient(server.url, key, timeout=120) as client:
            async with await client.sessions.create(image="python-data") as session:
                await session.upload("sales.csv", CSV)
                events: list[CellEvent] = [
                    e async for e in session.execute_stream(SESSION_CHART, timeout=120)
                ]
                await session.execute("kept = 41")
                paused = await session.pause()
                resumed = await session.resume()
                after = await session.execute("kept + 1")
                back = await session.download("sales.csv")
            return {"events": events, "paused": paused, "resumed": resumed, "after": after,
                    "back": back, "final": session.info}  # fmt: skip

    seen = anyio.run(main)
    kinds = [e.type for e in seen["events"]]
    assert kinds[0] == "stdout" and kinds[-1] == "result" and "display" in kinds
    [png] = [e for e in seen["events"] if e.type == "display" and e.mime == "image/png"]
    cell = seen["events"][-1].cell
    assert cell is not None and cell.stdout == "rows 501\n"
    [image] = cell.images()
    assert image[:8] == b"\x89PNG\r\n\x1a\n" and png.data == base64.b64encode(image).decode()
    assert seen["paused"].state == "paused" and seen["resumed"].state == "running"
    assert seen["paused"].pause_mode == "memory"  # gVisor checkpoints the kernel's memory
    assert seen["after"].result == "42"
    assert seen["back"] == CSV.encode()
    assert seen["final"].state == "stopped"


class DroppingProxy:
    """An HTTP/1.1 proxy on loopback that forwards each request to the real server and reads
    the whole answer — then, for the first `POST /v1/jobs`, cuts the client's connection
    instead of answering. The job exists; the client never heard about it."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.submits: list[tuple[bytes, bytes]] = []  # (request head, status line)
        self.cut = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            reader = conn.makefile("rb")
            while (request := _read_message(reader, is_request=True)) is not None:
                answer = self._forward(request)
                if request.startswith(b"POST /v1/jobs "):
                    self.submits.append((request.split(b"\r\n\r\n")[0], answer.split(b"\r\n")[0]))
                    if self.cut == 0:
                        self.cut += 1
                        conn.shutdown(socket.SHUT_RDWR)
                        return
                conn.sendall(answer)

    def _forward(self, request: bytes) -> bytes:
        head, _, body = request.partition(b"\r\n\r\n")
        lines = [ln for ln in head.split(b"\r\n") if not ln.lower().startswith(b"connection:")]
        with socket.create_connection(self.upstream) as upstream:
            upstream.sendall(b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + body)
            answer = _read_message(upstream.makefile("rb"), is_request=False)
        assert answer is not None
        return answer

    def close(self) -> None:
        self.listener.close()


def _read_message(reader: Any, is_request: bool) -> bytes | None:
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        line = reader.readline()
        if not line:
            return None
        head += line
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    return head + reader.read(length) if length else head


def test_a_submit_cut_off_before_its_answer_is_retried_into_exactly_one_job(
    server: Server,
) -> None:
    key = _key(server, "sdk-proxy")
    proxy = DroppingProxy(server.url)
    try:
        with Client(proxy.url, key) as client:
            job = client.submit({"code": "print('exactly once')"})
            record = client.wait(job.id, timeout=60)
    finally:
        proxy.close()
    assert proxy.cut == 1 and len(proxy.submits) == 2
    keys = {
        line
        for head, _ in proxy.submits
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"idempotency-key:")
    }
    assert len(keys) == 1  # the retry carried the same key…
    assert [status.split()[1] for _, status in proxy.submits] == [b"202", b"200"]  # …and replayed
    with Client(server.url, key) as direct:
        assert [j.id for j in direct.jobs().items] == [job.id]
        assert direct.logs(job.id).stdout == "exactly once\n"
    assert record.state == "completed"
