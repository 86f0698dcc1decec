"""The MCP tools, over `sandcell_client` (URL and tenant key from SANDCELL_URL / SANDCELL_API_KEY),
served over stdio or streamable HTTP.

Every tool is a short translation: arguments to an API call, the answer to MCP content. An API
error becomes a tool error carrying the API's detail and field errors, with the key scrubbed; a
job that does not complete is a tool error too, with its logs and egress denials.
"""

import base64
import binascii
import json
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import CallToolResult, ImageContent, TextContent

from sandcell_client import Client, Job, Output, SandcellError, Session

Content = TextContent | ImageContent
INLINE_TEXT_BYTES = 64 * 1024
INLINE_IMAGE_BYTES = 4 * 1024 * 1024
TEXT_SUFFIXES = (".txt", ".csv", ".json", ".md", ".log", ".tsv", ".html", ".xml", ".yaml", ".yml")

SANDBOX = (
    "Code runs in an isolated gVisor sandbox on a sandcell server, never on the user's machine. "
    "It has no network access at all unless hosts are explicitly allowed: no internet, no DNS, "
    "no cloud metadata, nothing on the user's machine or private network (localhost inside the "
    "sandbox is the sandbox itself). There are no secrets, no host files and no other jobs' "
    "data inside, and nothing can be pip-installed. "
)
RUN_PYTHON = (
    SANDBOX + "Runs `code` once as a fresh Python 3 job and returns its stdout/stderr, final "
    "state, and the files it wrote; a job that fails comes back as an error with its logs. "
    "`image`: 'python-data' (default: numpy, pandas, matplotlib, seaborn, scipy, scikit-learn, "
    "openpyxl, requests, bs4) or 'python' (standard library only, starts faster). "
    "Paths: `files` are placed read-only under /input (e.g. files={'data.csv': 'a,b\\n1,2'} "
    "becomes /input/data.csv; a value is the file's text, or 'base64:' followed by base64 for "
    "binary); /workspace is the writable working directory (discarded after the run); "
    "anything written to /output is "
    "returned: small text files inline, PNG images as images (save matplotlib charts with "
    "plt.savefig('/output/chart.png')), other files as artifact ids for download_artifact. "
    "`allow_hosts` lists hostnames the code may reach over HTTP(S) through the egress proxy "
    "(e.g. ['api.example.com']); every other host is refused, and private or loopback "
    "addresses are refused even if listed. "
    "Limits by default: 60 s wall clock (`timeout_s` to change, within the tenant's quota), "
    "1 CPU, 512 MB memory. For stateful, iterative analysis use session_execute instead."
)
SESSION_EXECUTE = (
    SANDBOX + "Executes `code` in a stateful Jupyter-like Python session (the python-data image: "
    "pandas, numpy, matplotlib, seaborn, scipy, scikit-learn, openpyxl). Variables persist "
    "between calls with the same `session_id`; omit it to start a new session, whose id is "
    "returned first — pass it back on later calls and call session_stop when done. The last "
    "expression's value is returned as `result`; plt.show() or displayed figures come back as "
    "PNG images. The working directory is /workspace, where upload_to_session puts files. The "
    "session has no network access."
)


class SandcellTools:
    """The tool bodies; `register` puts them on an MCPServer."""

    def __init__(self, client: Client, api_key: str) -> None:
        self._client, self._secret = client, api_key
        self._sessions: dict[str, Session] = {}

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except SandcellError as exc:
            raise ToolError(self._scrub(f"sandcell: {type(exc).__name__}: {exc}")) from exc

    def _scrub(self, text: str) -> str:
        return text.replace(self._secret, "***") if self._secret else text

    # jobs

    def run_python(
        self,
        code: str,
        files: dict[str, str] | None = None,
        allow_hosts: list[str] | None = None,
        timeout_s: float | None = None,
        image: Literal["python-data", "python"] = "python-data",
    ) -> CallToolResult:
        with self._errors():
            files_in = {name: _decode(value) for name, value in (files or {}).items()}
            result = self._client.run(
                code,
                files=files_in,
                image=image,
                allow=allow_hosts,
                timeout_s=timeout_s,
                wait_timeout=(timeout_s or 60) + 600,
            )
            blocks: list[Content] = [_job_summary(result.job, result.stdout, result.stderr)]
            blocks += self._outputs(result.job)
        return CallToolResult(content=blocks, is_error=not result.ok)

    def _outputs(self, job: Job) -> list[Content]:
        return [self._output(output) for output in job.outputs]

    def _output(self, output: Output) -> Content:
        path, size = output.path, output.size
        if path.lower().endswith(".png") and size <= INLINE_IMAGE_BYTES:
            return _image(self._client.read(output))
        if path.lower().endswith(TEXT_SUFFIXES) and size <= INLINE_TEXT_BYTES:
            text = self._client.read(output).decode("utf-8", "replace")
            return _text(f"--- /output/{path} ---\n{text}")
        return _text(f"/output/{path}: {size} bytes, artifact {output.artifact_id}")

    def get_job(self, job_id: str) -> list[Content]:
        with self._errors():
            job = self._client.job(job_id)
            logs = self._client.logs(job_id)
        return [_job_summary(job, logs.stdout, logs.stderr)]

    def download_artifact(self, artifact_id: str) -> list[Content]:
        with self._errors():
            meta = self._client.artifact(artifact_id)
            raw = self._client.read(artifact_id)
        return [_file_content(meta.path, raw)]

    def list_jobs(self, state: str | None = None) -> list[Content]:
        with self._errors():
            page = self._client.jobs(state=state)
        keep = ("id", "state", "reason", "exit_code", "image", "accepted_at", "finished_at")
        listed = [{k: job.get(k) for k in keep} for job in page.items]
        return [_text(json.dumps(listed, indent=1))]

    def cancel_job(self, job_id: str) -> list[Content]:
        with self._errors():
            job = self._client.cancel(job_id)
        return [_text(f"job {job.id}: state {job.state}, cancel requested")]

    # sessions

    def _session(self, session_id: str) -> Session:
        if session_id not in self._sessions:
            with self._errors():
                self._sessions[session_id] = self._client.sessions.get(session_id)
        return self._sessions[session_id]

    def session_execute(
        self, code: str, session_id: str | None = None, timeout_s: float = 60
    ) -> list[Content]:
        with self._errors():
            blocks: list[Content] = []
            if session_id is None:
                session = self._client.sessions.create(image="python-data")
                self._sessions[session.id] = session
                blocks.append(_text(f"session_id: {session.id} (new session; pass it back)"))
            else:
                session = self._session(session_id)
            cell = session.execute(code, timeout=timeout_s)
        return blocks + _cell_content(cell.model_dump())

    def session_stop(self, session_id: str) -> list[Content]:
        with self._errors():
            info = self._session(session_id).stop()
        self._sessions.pop(session_id, None)
        return [_text(f"session {session_id}: {info.state}")]

    def session_history(self, session_id: str, limit: int = 10) -> list[Content]:
        with self._errors():
            cells = self._session(session_id).cells(limit=max(1, min(limit, 100)))
        blocks: list[Content] = [_text(f"session {session_id}: {len(cells)} recent cells")]
        for cell in cells:
            blocks.append(_text(f"[{cell.seq}] >>> {cell.code}"))
            blocks += _cell_content(cell.model_dump())
        return blocks

    def upload_to_session(self, session_id: str, path: str, content_base64: str) -> list[Content]:
        raw = _decode_base64(content_base64)
        with self._errors():
            stored = self._session(session_id).upload(path, raw)
        return [_text(f"uploaded /workspace/{stored.path}: {stored.size} bytes")]

    def download_from_session(self, session_id: str, path: str) -> list[Content]:
        with self._errors():
            raw = self._session(session_id).download(path)
        return [_file_content(path, raw)]


def _text(text: str) -> TextContent:
    return TextContent(type="text", text=text)


def _image(raw: bytes) -> ImageContent:
    return ImageContent(type="image", data=base64.b64encode(raw).decode(), mime_type="image/png")


def _file_content(path: str, raw: bytes) -> Content:
    """PNG as an image, UTF-8 as text, anything else as base64 text."""
    if path.lower().endswith(".png"):
        return _image(raw)
    try:
        return _text(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return _text(f"base64:{base64.b64encode(raw).decode()}")


def _decode_base64(value: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ToolError(f"content_base64: not valid base64 ({exc})") from exc


def _decode(value: str) -> bytes:
    """A file value is text, or base64 behind a `base64:` prefix (guessing would misread text)."""
    if value.startswith("base64:"):
        return _decode_base64(value[7:])
    return value.encode()


def _job_summary(job: Job, stdout: str, stderr: str) -> TextContent:
    lines = [f"job {job.id}: {job.state}"]
    if job.reason:
        lines[0] += f" ({job.reason}) {job.detail or ''}".rstrip()
    if job.exit_code is not None:
        lines.append(f"exit code: {job.exit_code}")
    denied = sorted({f"{e.get('host')}:{e.get('port')}" for e in job.egress if _denied(e)})
    if denied:
        lines.append("network: refused by the sandbox's egress policy: " + ", ".join(denied))
    lines.append(f"--- stdout ---\n{stdout}")
    if stderr:
        lines.append(f"--- stderr ---\n{stderr}")
    return _text("\n".join(lines))


def _denied(event: dict[str, Any]) -> bool:
    return event.get("decision") == "denied"


def _cell_content(cell: dict[str, Any]) -> list[Content]:
    parts = []
    for key in ("stdout", "stderr", "result"):
        if cell.get(key):
            parts.append(f"--- {key} ---\n{cell[key]}")
    if cell.get("error"):
        error = cell["error"]
        trace = "\n".join(error.get("traceback") or [])
        parts.append(f"--- error ---\n{error.get('ename')}: {error.get('evalue')}\n{trace}")
    blocks: list[Content] = [_text("\n".join(parts) or "(no output)")]
    for item in cell.get("display") or []:
        if item.get("mime") == "image/png":
            blocks.append(ImageContent(type="image", data=item["data"], mime_type="image/png"))
    return blocks


TOOLS: dict[str, str] = {
    "run_python": RUN_PYTHON,
    "session_execute": SESSION_EXECUTE,
    "session_stop": "Stop a session started by session_execute and free its sandbox.",
    "session_history": "Show a session's most recent cells (up to `limit`, oldest first): "
    "each one's code and what it printed, returned or drew. Kept after the session stops.",
    "get_job": "Show a run_python job by id: its state, exit code, reason and logs.",
    "list_jobs": "List this tenant's recent run_python jobs (newest first); `state` filters: "
    "'accepted', 'running', 'completed', 'failed' or 'cancelled'.",
    "cancel_job": "Cancel an accepted or running job by id.",
    "download_artifact": "Fetch a file a job wrote to /output, by the artifact id run_python "
    "reported (checked against its sha256). Text comes back as text, PNG as an image, other "
    "bytes as base64.",
    "upload_to_session": SANDBOX + "Write a file into a session's /workspace (`path` relative "
    "to /workspace, e.g. 'data.csv'; `content_base64` is the file's bytes in base64), so code "
    "run with session_execute can open it.",
    "download_from_session": SANDBOX + "Read a file from a session's /workspace (`path` "
    "relative to /workspace). Text comes back as text, PNG as an image, other bytes as base64.",
}
Transport = Literal["stdio", "http"]


def build_server(client: Client, api_key: str) -> MCPServer:
    tools = SandcellTools(client, api_key)
    server: MCPServer = MCPServer(
        name="sandcell",
        instructions=SANDBOX + "Use run_python for one-off scripts, session_execute for "
        "stateful data analysis with charts.",
    )
    for name, description in TOOLS.items():
        fn: Callable[..., Any] = getattr(tools, name)
        server.add_tool(fn, name=name, description=description, structured_output=False)
    return server


def serve(transport: Transport = "stdio", host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve over stdio until the client closes the pipe, or over streamable HTTP at
    http://HOST:PORT/mcp. The tenant's key comes from the environment, never from a client."""
    url = os.environ.get("SANDCELL_URL", "http://127.0.0.1:8080")
    key = os.environ.get("SANDCELL_API_KEY")
    if not key:
        raise SystemExit(
            "sandcell mcp needs SANDCELL_API_KEY (and SANDCELL_URL) in the environment"
        )
    # The MCP server logs to stderr; a line per HTTP request would drown what matters there.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with Client(url, key, timeout=120) as client:
        server = build_server(client, key)
        if transport == "stdio":
            server.run("stdio")
        else:
            server.run(
                "streamable-http", host=host, port=port, transport_security=_security(host, port)
            )


def _security(host: str, port: int) -> TransportSecuritySettings:
    """Refuse requests whose Host or Origin is not this server (DNS rebinding from a browser)."""
    hosts = [f"{host}:{port}", f"127.0.0.1:{port}", f"localhost:{port}"]
    origins = [f"http://{h}" for h in hosts]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
    )
