"""`sandcell mcp` as a subprocess over stdio and streamable HTTP, driven by the official `mcp`
client library, against a real `sandcell serve`."""

import base64
import json
import os
import socket
import struct
import subprocess
import sys
import time
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp_types import CallToolResult, ImageContent, TextContent

from tests.e2e.conftest import Server

pytestmark = pytest.mark.gvisor

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CSV = "day,sales\n" + "".join(f"{d},{d * 3 % 7 + 1}\n" for d in range(12))

# The `python` image has the standard library only: a bar chart drawn pixel by pixel.
CHART_STDLIB = """
import csv, struct, zlib
rows = list(csv.DictReader(open('/input/data.csv')))
sales = [int(r['sales']) for r in rows]
w, h = 10 * len(sales), 80
px = [[255] * w for _ in range(h)]
for i, s in enumerate(sales):
    for y in range(h - s * 10, h):
        for x in range(i * 10 + 1, i * 10 + 9):
            px[y][x] = 40
raw = b''.join(b'\\x00' + bytes(row) for row in px)
def chunk(kind, data):
    body = kind + data
    return struct.pack('>I', len(data)) + body + struct.pack('>I', zlib.crc32(body))
png = (b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', w, h, 8, 0, 0, 0, 0))
       + chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b''))
open('/output/chart.png', 'wb').write(png)
print('rows', len(rows), 'total', sum(sales))
"""


def _params(server: Server, key: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "sandcell.cli.main", "mcp"],
        env={"SANDCELL_URL": server.url, "SANDCELL_API_KEY": key},
    )


def _text(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


def _png(result: CallToolResult) -> bytes:
    images = [c for c in result.content if isinstance(c, ImageContent)]
    assert images, _text(result)
    assert images[0].mime_type == "image/png"
    return base64.b64decode(images[0].data)


CSV_TO_CHART = """
import pandas as pd, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
df = pd.read_csv("/input/data.csv")
df.plot(x="day", y="sales", figsize=(4, 3))
plt.savefig("/output/chart.png")
print("rows", len(df), "total", df.sales.sum())
"""
# The job may reach api.allowed.test only; other.test is refused by the egress proxy.
FORBIDDEN = """
import urllib.request
urllib.request.urlopen("http://other.test/secret", timeout=10)
"""


async def _drive(server: Server, key: str) -> dict[str, Any]:
    async with Client(_params(server, key)) as client:
        listed = await client.list_tools()
        chart = await client.call_tool(
            "run_python", {"code": CSV_TO_CHART, "files": {"data.csv": CSV}}
        )
        stdlib = await client.call_tool(
            "run_python", {"code": CHART_STDLIB, "files": {"data.csv": CSV}, "image": "python"}
        )
        forbidden = await client.call_tool(
            "run_python", {"code": FORBIDDEN, "allow_hosts": ["api.allowed.test"]}
        )
        bad_host = await client.call_tool(
            "run_python", {"code": "print(1)", "allow_hosts": ["bad host!"]}
        )
        missing = await client.call_tool("cancel_job", {"job_id": "job_nope"})
        jobs = await client.call_tool("list_jobs", {})
        return {
            "tools": listed.tools,
            "chart": chart,
            "stdlib": stdlib,
            "forbidden": forbidden,
            "bad_host": bad_host,
            "missing": missing,
            "jobs": jobs,
        }


def test_mcp_tools_run_a_chart_and_report_api_errors(server: Server) -> None:
    key = server.tenant("mcp")["Authorization"].removeprefix("Bearer ")
    seen = anyio.run(_drive, server, key)

    tools = {t.name: t for t in seen["tools"]}
    expected = {"run_python", "session_execute", "session_stop", "list_jobs", "cancel_job"}
    expected |= {"upload_to_session", "download_from_session", "download_artifact", "get_job"}
    assert expected <= set(tools)
    for name in ("run_python", "session_execute"):
        description = tools[name].description or ""
        assert "gVisor sandbox" in description and "no network" in description
        assert "metadata" in description and "allowed" in description

    chart = seen["chart"]
    assert not chart.is_error, _text(chart)
    total = sum(d * 3 % 7 + 1 for d in range(12))
    assert "completed" in _text(chart) and f"rows 12 total {total}" in _text(chart)
    assert _png(chart)[:8] == PNG_SIGNATURE
    stdlib = seen["stdlib"]
    assert not stdlib.is_error, _text(stdlib)
    assert struct.unpack(">II", _png(stdlib)[16:24]) == (120, 80)

    forbidden = seen["forbidden"]
    assert forbidden.is_error, _text(forbidden)
    assert "failed" in _text(forbidden) and "HTTP Error 403" in _text(forbidden)
    assert "refused by the sandbox's egress policy: other.test:80" in _text(forbidden)

    bad_host = seen["bad_host"]
    assert bad_host.is_error
    assert "network.allow" in _text(bad_host), _text(bad_host)
    missing = seen["missing"]
    assert missing.is_error and "404" in _text(missing) and "NotFound" in _text(missing)
    assert len(json.loads(_text(seen["jobs"]))) == 3  # the chart, stdlib and forbidden jobs
    for result in seen.values():
        if isinstance(result, CallToolResult):
            assert key not in _text(result)


SESSION_CHART = """
import pandas as pd, matplotlib.pyplot as plt
df = pd.read_csv('data.csv')
df.plot(x='day', y='sales', figsize=(4, 3))
plt.show()
int(df.sales.sum())
"""


async def _drive_session(server: Server, key: str) -> dict[str, Any]:
    async with Client(_params(server, key)) as client:
        first = await client.call_tool("session_execute", {"code": "x = 41\nx + 1"})
        sid = _text(first).split("session_id: ", 1)[1].split()[0]
        content = base64.b64encode(CSV.encode()).decode()
        upload = {"session_id": sid, "path": "data.csv", "content_base64": content}
        uploaded = await client.call_tool("upload_to_session", upload)
        chart = await client.call_tool(
            "session_execute", {"code": SESSION_CHART, "session_id": sid}
        )
        back = await client.call_tool(
            "download_from_session", {"session_id": sid, "path": "data.csv"}
        )
        stopped = await client.call_tool("session_stop", {"session_id": sid})
        history = await client.call_tool("session_history", {"session_id": sid, "limit": 5})
        return {
            "history": history,
            "first": first,
            "uploaded": uploaded,
            "chart": chart,
            "back": back,
            "stopped": stopped,
        }


def test_mcp_session_keeps_state_and_returns_a_matplotlib_chart(server: Server) -> None:
    key = server.tenant("mcp-session")["Authorization"].removeprefix("Bearer ")
    seen = anyio.run(_drive_session, server, key)
    for name, result in seen.items():
        assert not result.is_error, (name, _text(result))
    assert "42" in _text(seen["first"])
    assert _png(seen["chart"])[:8] == PNG_SIGNATURE
    assert str(sum(d * 3 % 7 + 1 for d in range(12))) in _text(seen["chart"])
    assert _text(seen["back"]) == CSV
    assert "stopped" in _text(seen["stopped"])
    history = _text(seen["history"])  # outlives the sandbox: both cells, code and output
    assert "2 recent cells" in history and "[1] >>> x = 41" in history and "42" in history
    assert "[2] >>> " in history and _png(seen["history"])[:8] == PNG_SIGNATURE


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _drive_http(url: str) -> dict[str, Any]:
    async with Client(url) as client:
        listed = await client.list_tools()
        ran = await client.call_tool(
            "run_python",
            {"code": "open('/output/out.txt', 'w').write('hi'); print(6 * 7)", "image": "python"},
        )
        job_id = _text(ran).split()[1].rstrip(":")
        shown = await client.call_tool("get_job", {"job_id": job_id})
        return {"tools": listed.tools, "ran": ran, "shown": shown}


def test_mcp_over_streamable_http(server: Server) -> None:
    key = server.tenant("mcp-http")["Authorization"].removeprefix("Bearer ")
    port = _free_port()
    env = os.environ | {"SANDCELL_URL": server.url, "SANDCELL_API_KEY": key}
    command = [sys.executable, "-m", "sandcell.cli.main", "mcp", "--transport", "http"]
    proc = subprocess.Popen(
        [*command, "--port", str(port)], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "mcp did not start"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        seen = anyio.run(_drive_http, f"http://127.0.0.1:{port}/mcp")
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=30)
    assert "run_python" in {t.name for t in seen["tools"]}
    assert not seen["ran"].is_error, _text(seen["ran"])
    assert "42" in _text(seen["ran"]) and "--- /output/out.txt ---\nhi" in _text(seen["ran"])
    assert "completed" in _text(seen["shown"]) and "42" in _text(seen["shown"])
    assert key not in stderr
