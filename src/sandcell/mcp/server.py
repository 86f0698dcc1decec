"""The MCP tools, over `sandcell_client` (URL and tenant key from SANDCELL_URL / SANDCELL_API_KEY).

Every tool is a short translation: arguments to an API call, the answer to MCP content. An API
error becomes a tool error carrying the API's detail and field errors, with the key scrubbed.
"""

import base64
import binascii
import json
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ImageContent, TextContent

from sandcell_client import ApiError, Client, Session

Content = TextContent | ImageContent
INLINE_TEXT_BYTES = 64 * 1024
INLINE_IMAGE_BYTES = 4 * 1024 * 1024
TEXT_SUFFIXES = (".txt", ".csv", ".json", ".md", ".log", ".tsv", ".html", ".xml", ".yaml", ".yml")

SANDBOX = (
    "Code runs in an isolated gVisor sandbox on a sandcell server, never on the user's machine. "
    "It has no network access at all unless hosts are explicitly allowed; there are no secrets, "
    "no host files and no other jobs' data inside. "
)
RUN_PYTHON = (
    SANDBOX + "Runs `code` once as a fresh Python 3 job (standard library only; no pip installs) "
    "and returns its stdout/stderr, final state, and the files it wrote. "
    "Paths: `files` are placed read-only under /input (e.g. files={'data.csv': 'a,b\\n1,2'} "
    "becomes /input/data.csv; a value is the file's text, or 'base64:' followed by base64 for "
    "binary); /workspace is the writable working directory (discarded after the run); "
    "anything written to /output is "
    "returned: small text files inline, PNG images as images. `allow_hosts` lists hostnames the "
    "code may reach over HTTP(S) (e.g. ['api.example.com']); everything else is blocked. "
    "Limits by default: 60 s wall clock (`timeout_s` to change, within the tenant's quota), "
    "1 CPU, 512 MB memory. For stateful, iterative analysis with pandas/matplotlib use "
    "session_execute instead."
)
SESSION_EXECUTE = (
    SANDBOX + "Executes `code` in a stateful Jupyter-like Python session (the python-data image: "
    "pandas, numpy, matplotlib and friends). Variables persist between calls with the same "
    "`session_id`; omit it to start a new session, whose id is returned first — pass it back "
    "on later calls and call session_stop when done. The last expression's value is returned as "
    "`result`; plt.show() or displayed figures come back as PNG images. The working directory "
    "is /workspace, where upload_to_session puts files. The session has no network access."
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
        except ApiError as exc:
            raise ToolError(self._scrub(f"sandcell API error {exc}")) from exc
        except httpx.HTTPError as exc:
            raise ToolError(self._scrub(f"cannot reach the sandcell server: {exc}")) from exc

    def _scrub(self, text: str) -> str:
        return text.replace(self._secret, "***") if self._secret else text

    # jobs

    def run_python(
        self,
        code: str,
        files: dict[str, str] | None = None,
        allow_hosts: list[str] | None = None,
        timeout_s: float | None = None,
    ) -> list[Content]:
        with self._errors():
            body: dict[str, Any] = {"code": code, "inputs": self._upload_inputs(files or {})}
            if allow_hosts:
                body["network"] = {"allow": allow_hosts}
            if timeout_s:
                body["limits"] = {"timeout_s": timeout_s}
            job = self._client.submit(body)
            job = self._client.wait(job["id"], timeout=(timeout_s or 60) + 600)
            logs = self._client.logs(job["id"])
            return [_job_summary(job, logs), *self._outputs(job)]

    def _upload_inputs(self, files: dict[str, str]) -> list[dict[str, str]]:
        inputs = []
        for name, value in files.items():
            stored = self._client.upload(name.rsplit("/", 1)[-1], _decode(value))
            inputs.append({"file_id": stored["id"], "path": name})
        return inputs

    def _outputs(self, job: dict[str, Any]) -> list[Content]:
        blocks: list[Content] = []
        for output in job["outputs"]:
            path, size = output["path"], output["size"]
            if path.lower().endswith(".png") and size <= INLINE_IMAGE_BYTES:
                data = base64.b64encode(self._artifact(output["artifact_id"])).decode()
                blocks.append(ImageContent(type="image", data=data, mime_type="image/png"))
            elif path.lower().endswith(TEXT_SUFFIXES) and size <= INLINE_TEXT_BYTES:
                text = self._artifact(output["artifact_id"]).decode("utf-8", "replace")
                blocks.append(_text(f"--- /output/{path} ---\n{text}"))
            else:
                blocks.append(
                    _text(f"/output/{path}: {size} bytes, artifact {output['artifact_id']}")
                )
        return blocks

    def _artifact(self, artifact_id: str) -> bytes:
        return self._client.session_call("GET", f"/v1/artifacts/{artifact_id}/content").content

    def list_jobs(self, state: str | None = None) -> list[Content]:
        with self._errors():
            page = self._client.jobs(state=state)
        keep = ("id", "state", "reason", "exit_code", "image", "accepted_at", "finished_at")
        return [_text(json.dumps([{k: j.get(k) for k in keep} for j in page["items"]], indent=1))]

    def cancel_job(self, job_id: str) -> list[Content]:
        with self._errors():
            job = self._client.cancel(job_id)
        return [_text(f"job {job['id']}: state {job['state']}, cancel requested")]

    # sessions

    def _session(self, session_id: str) -> Session:
        if session_id not in self._sessions:
            with self._errors():
                data = self._client.session_call("GET", f"/v1/sessions/{session_id}").json()
            self._sessions[session_id] = Session(self._client, data)
        return self._sessions[session_id]

    def session_execute(
        self, code: str, session_id: str | None = None, timeout_s: float = 60
    ) -> list[Content]:
        with self._errors():
            blocks: list[Content] = []
            if session_id is None:
                session = self._client.session(image="python-data")
                self._sessions[session.id] = session
                blocks.append(_text(f"session_id: {session.id} (new session; pass it back)"))
            else:
                session = self._session(session_id)
            cell = session.execute(code, timeout=timeout_s)
        return blocks + _cell_content(cell)

    def session_stop(self, session_id: str) -> list[Content]:
        with self._errors():
            data = self._session(session_id).stop()
        self._sessions.pop(session_id, None)
        return [_text(f"session {session_id}: {data.get('state')}")]

    def upload_to_session(self, session_id: str, path: str, content_base64: str) -> list[Content]:
        raw = _decode_base64(content_base64)
        with self._errors():
            stored = self._session(session_id).upload(path, raw)
        return [_text(f"uploaded /workspace/{path}: {len(raw)} bytes; {json.dumps(stored)}")]

    def download_from_session(self, session_id: str, path: str) -> list[Content]:
        with self._errors():
            raw = self._session(session_id).download(path)
        if path.lower().endswith(".png"):
            data = base64.b64encode(raw).decode()
            return [ImageContent(type="image", data=data, mime_type="image/png")]
        try:
            return [_text(raw.decode("utf-8"))]
        except UnicodeDecodeError:
            return [_text(f"base64:{base64.b64encode(raw).decode()}")]


def _text(text: str) -> TextContent:
    return TextContent(type="text", text=text)


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


def _job_summary(job: dict[str, Any], logs: dict[str, str]) -> TextContent:
    lines = [f"job {job['id']}: {job['state']}"]
    if job.get("reason"):
        lines[0] += f" ({job['reason']}) {job.get('detail') or ''}".rstrip()
    if job.get("exit_code") is not None:
        lines.append(f"exit code: {job['exit_code']}")
    lines.append(f"--- stdout ---\n{logs.get('stdout', '')}")
    if logs.get("stderr"):
        lines.append(f"--- stderr ---\n{logs['stderr']}")
    return _text("\n".join(lines))


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
    "list_jobs": "List this tenant's recent run_python jobs (newest first); `state` filters, "
    "e.g. 'queued', 'running', 'completed', 'failed', 'cancelled'.",
    "cancel_job": "Cancel a queued or running job by id.",
    "upload_to_session": SANDBOX + "Write a file into a session's /workspace (`path` relative "
    "to /workspace, e.g. 'data.csv'; `content_base64` is the file's bytes in base64), so code "
    "run with session_execute can open it.",
    "download_from_session": SANDBOX + "Read a file from a session's /workspace (`path` "
    "relative to /workspace). Text comes back as text, PNG as an image, other bytes as base64.",
}


def build_server(client: Client, api_key: str) -> MCPServer:
    tools = SandcellTools(client, api_key)
    server: MCPServer = MCPServer(
        name="sandcell",
        instructions=SANDBOX + "Use run_python for one-off scripts, session_execute for "
        "stateful data analysis with charts.",
    )
    for name, description in TOOLS.items():
        fn: Callable[..., list[Content]] = getattr(tools, name)
        server.add_tool(fn, name=name, description=description, structured_output=False)
    return server


def serve() -> None:
    """Serve over stdio until the client closes the pipe."""
    url, key = os.environ.get("SANDCELL_URL"), os.environ.get("SANDCELL_API_KEY")
    if not url or not key:
        raise SystemExit("sandcell mcp needs SANDCELL_URL and SANDCELL_API_KEY in the environment")
    # The MCP server logs to stderr; a line per HTTP request would drown what matters there.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with Client(url, key, timeout=120) as client:
        build_server(client, key).run("stdio")
