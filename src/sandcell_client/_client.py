"""The synchronous client: `Client`, `client.sessions`, `Session`."""

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

import httpx

from sandcell_client import _calls as calls
from sandcell_client._base import (
    DEFAULT_TIMEOUT,
    LONG_POLL_S,
    NODELAY,
    POOL,
    BaseClient,
    Call,
    Content,
    Progress,
    ServerEvent,
    Sha256Writer,
    SSEDecoder,
    cell_event,
    check,
    content_length,
    expected_sha256,
    input_files,
    job_body,
    log_event,
    new_idempotency_key,
    opened,
    raw_content,
    refused_before_running,
    safe_destination,
    session_body,
    verify,
)
from sandcell_client._exceptions import (
    SandcellError,
    StreamError,
    TransportError,
    transport_error,
)
from sandcell_client._models import (
    ApiKey,
    Artifact,
    Cell,
    CellEvent,
    CellRecord,
    DeletionReport,
    DirectAccess,
    FileEntry,
    FileInfo,
    FileWritten,
    Job,
    JobPage,
    LogEvent,
    Logs,
    Output,
    RunResult,
    Secret,
    SessionInfo,
    SignedUrl,
    Tenant,
    TenantQuotas,
)

T = TypeVar("T")
LogHandler = Callable[[LogEvent], None]


class Client(BaseClient):
    """A sandcell API client. `base_url` and `api_key` default to SANDCELL_URL and
    SANDCELL_API_KEY; `transport` is any httpx transport (e.g. a mock, or the app in-process).

    Network errors are retried when that is safe (the request never left, or the request is
    idempotent: a job submit carries an Idempotency-Key, so a retry is the same job)."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_retries: int = 3,
        transport: httpx.BaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(base_url, api_key, timeout, max_retries, headers)
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=self._headers,
            timeout=timeout,
            transport=transport or httpx.HTTPTransport(socket_options=NODELAY, limits=POOL),
        )
        self.sessions = Sessions(self)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # I/O: the only part that differs from AsyncClient

    def _open(self, call: Call[Any], stream: bool = False) -> httpx.Response:
        attempt = 0
        while True:
            attempt += 1
            request = self._build(self._http, call)
            try:
                response = self._http.send(request, stream=stream)
            except httpx.TransportError as exc:
                delay = self.retry.after_error(call, exc, attempt)
                if delay is None:
                    raise transport_error(exc) from exc
                time.sleep(delay)
                continue
            delay = self.retry.after_response(call, response, attempt)
            if delay is None:
                if stream and response.status_code >= 400:
                    response.read()
                return check(response)
            response.close()
            time.sleep(delay)

    def _send(self, call: Call[T]) -> T:
        return call.parse(self._open(call))

    def _events(self, call: Call[Any]) -> Iterator[ServerEvent]:
        response = self._open(call, stream=True)
        try:
            decoder = SSEDecoder()
            for line in response.iter_lines():
                if (event := decoder.feed(line)) is not None:
                    yield event
        except httpx.TransportError as exc:
            raise transport_error(exc) from exc
        finally:
            response.close()

    # files and jobs

    def upload(
        self, name: str, content: Content, *, on_progress: Progress | None = None
    ) -> FileInfo:
        """Upload an input file (bytes, text, a path, or an open binary file)."""
        with opened(content) as body:
            return self._send(calls.upload_file(name, body, on_progress))

    def file(self, file_id: str) -> FileInfo:
        return self._send(calls.get_file(file_id))

    def delete_file(self, file_id: str) -> None:
        self._send(calls.delete_file(file_id))

    def submit(
        self, body: dict[str, Any], idempotency_key: str | None = None, wait: float = 0
    ) -> Job:
        """Submit a job body as the API takes it. The Idempotency-Key defaults to a fresh one;
        every retry of this call sends the same key, so it never makes a second job. With
        `wait` (seconds, at most 60), the record comes back once the job is terminal, in the
        same request, or as it is when `wait` runs out."""
        key = idempotency_key or new_idempotency_key()
        return self._send(calls.submit(body, key, wait))

    def run(
        self,
        code: str,
        *,
        files: Mapping[str, Content] | Sequence[Content] | None = None,
        image: str | None = None,
        allow: Sequence[str] | None = None,
        secrets: Sequence[Mapping[str, Any]] | None = None,
        env: Mapping[str, str] | None = None,
        limits: Mapping[str, float] | None = None,
        timeout_s: float | None = None,
        memory_mb: int | None = None,
        cpu: float | None = None,
        retry: int | None = None,
        idempotency_key: str | None = None,
        on_log: LogHandler | None = None,
        wait_timeout: float | None = None,
    ) -> RunResult:
        """Run `code` as a job and wait for it: upload `files` (to /input), submit, follow the
        logs (`on_log` gets each chunk live), and return the record with stdout and stderr.
        Download its outputs with `download`, `read` or `download_outputs`."""
        inputs = [
            {"file_id": self.upload(PurePosixPath(path).name, content).id, "path": path}
            for path, content in input_files(files).items()
        ]
        budget = {**(limits or {}), "timeout_s": timeout_s, "memory_mb": memory_mb, "cpu": cpu}
        body = job_body(
            code, inputs=inputs, image=image, allow=allow, secrets=secrets, env=env,
            limits=budget, retry=retry,
        )  # fmt: skip
        job = self.submit(body, idempotency_key)
        if on_log is not None:
            for event in self.stream_logs(job.id):
                if event.kind != "end":
                    on_log(event)
        job = self.wait(job.id, timeout=wait_timeout)
        logs = self.logs(job.id)
        return RunResult(job=job, stdout=logs.stdout, stderr=logs.stderr)

    def job(self, job_id: str, wait: float = 0) -> Job:
        """The job record; with `wait` (≤ 60 s), answered as soon as the job ends."""
        return self._send(calls.get_job(job_id, wait))

    def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """Long-poll until the job is terminal (or `timeout` passes: the record as it is)."""
        deadline = time.monotonic() + timeout if timeout is not None else None
        job = self.job(job_id)
        while not job.terminal:
            left = LONG_POLL_S if deadline is None else deadline - time.monotonic()
            if left <= 0:
                break
            job = self.job(job_id, wait=max(1.0, min(LONG_POLL_S, left)))
        return job

    def jobs(self, state: str | None = None, cursor: str | None = None, limit: int = 50) -> JobPage:
        return self._send(calls.list_jobs(state, cursor, limit))

    def iter_jobs(self, state: str | None = None) -> Iterator[Job]:
        """Every job of this tenant, newest first, page by page."""
        cursor = None
        while True:
            page = self.jobs(state, cursor)
            yield from page.items
            if not (cursor := page.next_cursor):
                return

    def logs(self, job_id: str) -> Logs:
        return self._send(calls.job_logs(job_id))

    def stream_logs(self, job_id: str) -> Iterator[LogEvent]:
        """The job's output as it is printed, ending with an `end` event (state, reason).
        A broken stream is reopened; chunks seen before are skipped by sequence number."""
        seen, reconnects = -1, 0
        while True:
            try:
                for item in map(log_event, self._events(calls.log_stream(job_id))):
                    if item.seq is not None and item.seq <= seen:
                        continue
                    seen = item.seq if item.seq is not None else seen
                    yield item
                    if item.kind == "end":
                        return
                raise StreamError(f"the log stream of {job_id} ended before its end event")
            except (TransportError, StreamError):
                reconnects += 1
                if reconnects > self.retry.max_retries:
                    raise
                time.sleep(self.retry.backoff(reconnects))

    def cancel(self, job_id: str) -> Job:
        """Ask for cancellation (202); the job is `cancelled` once its sandbox is gone."""
        return self._send(calls.cancel(job_id))

    def retire(self, job_id: str) -> DeletionReport:
        return self._send(calls.retire(job_id))

    # artifacts

    def artifact(self, artifact_id: str) -> Artifact:
        return self._send(calls.get_artifact(artifact_id))

    def read(self, artifact: str | Output) -> bytes:
        """An artifact's bytes, checked against its recorded sha256."""
        artifact_id, recorded = _ref(artifact)
        response = self._open(calls.artifact_content(artifact_id))
        return verify(artifact_id, response.content, expected_sha256(response, recorded))

    def download(
        self, artifact: str | Output, dest: str | Path, *, on_progress: Progress | None = None
    ) -> Path:
        """Stream an artifact to `dest`; the file appears only if its sha256 matches."""
        artifact_id, recorded = _ref(artifact)
        response = self._open(calls.artifact_content(artifact_id), stream=True)
        try:
            expected = expected_sha256(response, recorded)
            writer = Sha256Writer(Path(dest), expected, on_progress, content_length(response))
            try:
                for chunk in response.iter_bytes():
                    writer.write(chunk)
            except httpx.TransportError as exc:
                writer.abort()
                raise transport_error(exc) from exc
            except BaseException:
                writer.abort()
                raise
            return writer.commit()
        finally:
            response.close()

    def download_outputs(
        self,
        job: Job | RunResult,
        dest: str | Path,
        *,
        on_progress: Callable[[Output, int, int | None], None] | None = None,
    ) -> list[Path]:
        """Every output of the job under `dest` (its /output layout kept), sha256-checked."""
        record = job.job if isinstance(job, RunResult) else job
        paths = []
        for output in record.outputs:
            report = _for_output(on_progress, output)
            target = safe_destination(Path(dest), output.path)
            paths.append(self.download(output, target, on_progress=report))
        return paths

    def signed_url(self, artifact_id: str) -> SignedUrl:
        """A signed, expiring download URL (absolute) that needs no API key."""
        signed = self._send(calls.sign_artifact(artifact_id))
        return signed.model_copy(update={"url": self.base_url + signed.url})

    # secrets

    def put_secret(self, name: str, value: str) -> Secret:
        return self._send(calls.put_secret(name, value))

    def secrets(self) -> list[Secret]:
        return self._send(calls.list_secrets())

    def delete_secret(self, name: str) -> None:
        self._send(calls.delete_secret(name))

    # admin (an admin key)

    def create_tenant(self, name: str, **extra: Any) -> Tenant:
        return self._send(calls.create_tenant({"name": name, **extra}))

    def create_key(self, tenant_id: str, scopes: list[str] | None = None) -> ApiKey:
        return self._send(calls.create_key(tenant_id, scopes))

    def set_quotas(self, tenant_id: str, **quotas: float | None) -> TenantQuotas:
        """Change a tenant's quotas (`sessions=8`); None puts one back to the default."""
        return self._send(calls.set_quotas(tenant_id, quotas))

    def revoke_key(self, key_id: str) -> None:
        self._send(calls.revoke_key(key_id))

    def audit(self, **params: Any) -> list[dict[str, Any]]:
        return self._send(calls.audit(params))

    # health

    def health(self) -> dict[str, Any]:
        return self._send(calls.health("/healthz"))

    def ready(self) -> dict[str, Any]:
        return self._send(calls.health("/readyz"))

    # sessions

    def session(self, **body: Any) -> "Session":
        """Start a session (the API's body fields); same as `sessions.create`."""
        return Session(self, self._send(calls.create_session(body)))


class Sessions:
    """`client.sessions`: stateful interpreters, each in its own sandbox."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def create(
        self,
        *,
        image: str | None = None,
        allow: Sequence[str] | None = None,
        secrets: Sequence[Mapping[str, Any]] | None = None,
        env: Mapping[str, str] | None = None,
        limits: Mapping[str, float] | None = None,
        idle_timeout_s: float | None = None,
        ttl_s: float | None = None,
    ) -> "Session":
        """Start a session; `with client.sessions.create() as s:` stops it at the end."""
        body = session_body(image, allow, secrets, env, limits, idle_timeout_s, ttl_s)
        return self._client.session(**body)

    def get(self, session_id: str) -> "Session":
        return Session(self._client, self._client._send(calls.get_session(session_id)))

    def attach(self, session_id: str) -> "Session":
        """A handle on a session by id, without asking the server first."""
        return Session(self._client, SessionInfo(id=session_id, state="unknown"))

    def list(self, *, live: bool = False) -> list[SessionInfo]:
        return self._client._send(calls.list_sessions(live))


class Session:
    """A stateful interpreter in its own sandbox (`info` is its last known record)."""

    def __init__(self, client: Client, info: SessionInfo) -> None:
        self._client, self.info, self.id = client, info, info.id
        self._direct: DirectAccess | None = None

    @property
    def data(self) -> SessionInfo:
        return self.info

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *_: object) -> None:
        if self.info.state not in ("stopped", "failed"):
            self.stop()

    def _send(self, call: Call[T]) -> T:
        return self._client._send(call)

    def _record(self, call: Call[SessionInfo]) -> SessionInfo:
        self.info = self._send(call)
        return self.info

    def execute(self, code: str, timeout: float = 60) -> Cell:
        """Run one cell and answer its output, result, rich displays and error."""
        if self._direct is None:
            return self._send(calls.execute(self.id, code, timeout))
        try:
            return self._send(calls.direct_execute(self._direct, code, timeout))
        except SandcellError as exc:
            if not refused_before_running(exc):
                raise
            # The API answers where the session is now, or why it cannot run.
            self._direct = self._send(calls.direct_access(self.id))
            return self._send(calls.direct_execute(self._direct, code, timeout))

    def go_direct(self) -> DirectAccess:
        """Send this session's cells (`execute`) straight to the worker that holds it from
        now on: one HTTP hop instead of two (`POST /v1/sessions/{id}/direct`). The worker must
        be reachable from here. A lapsed token, or a session resumed on another worker, is
        asked for again once; streaming cells and everything else still go through the API."""
        self._direct = self._send(calls.direct_access(self.id))
        return self._direct

    def execute_stream(self, code: str, timeout: float = 60) -> Iterator[CellEvent]:
        """Run one cell, yielding its output as produced; the last event is `result`."""
        for event in self._client._events(calls.execute(self.id, code, timeout, stream=True)):
            item = cell_event(event)
            yield item
            if item.type == "result":
                return
        raise StreamError(f"the cell stream of {self.id} ended before its result")

    def cells(self, after: int | None = None, limit: int = 20) -> list[CellRecord]:
        """The session's recorded cells, oldest first: the newest `limit`, or those after
        the cell numbered `after`. The history outlives the sandbox (paused, stopped)."""
        return self._send(calls.session_cells(self.id, after, limit))

    def interrupt(self) -> None:
        self._send(calls.interrupt(self.id))

    def upload(self, path: str, content: Content) -> FileWritten:
        """Write a file to /workspace/`path`."""
        return self._send(calls.put_workspace_file(self.id, path, raw_content(content)))

    def download(self, path: str) -> bytes:
        return self._send(calls.get_workspace_file(self.id, path))

    def download_to(self, path: str, dest: str | Path) -> Path:
        target = Path(dest)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(self.download(path))
        return target

    def files(self, path: str = "") -> list[FileEntry]:
        return self._send(calls.list_workspace(self.id, path))

    def pause(self) -> SessionInfo:
        """Checkpoint: files are kept and, where the runtime can, process memory."""
        return self._record(calls.pause(self.id))

    def resume(self) -> SessionInfo:
        return self._record(calls.resume(self.id))

    def refresh(self) -> SessionInfo:
        return self._record(calls.get_session(self.id))

    def stop(self) -> SessionInfo:
        return self._record(calls.stop_session(self.id))

    def preview_url(self, port: int) -> str:
        """An expiring URL (with its token) relaying HTTP to `port` inside the session."""
        return self._client.base_url + self._send(calls.preview_url(self.id, port))


def _ref(artifact: str | Output) -> tuple[str, str | None]:
    return (
        (artifact, None) if isinstance(artifact, str) else (artifact.artifact_id, artifact.sha256)
    )


def _for_output(
    report: Callable[[Output, int, int | None], None] | None, output: Output
) -> Progress | None:
    if report is None:
        return None
    return lambda done, total: report(output, done, total)
