"""What the API answers, as pydantic models.

Unknown fields are kept (`extra="allow"`), so a newer server never breaks an older SDK. Records
also answer `record["field"]` and `record.get("field")`, for scripts written against the
dict-returning 0.1 client.
"""

import base64
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

TERMINAL_STATES = frozenset({"completed", "failed", "cancelled"})


class Record(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    def __getitem__(self, name: str) -> Any:
        try:
            return getattr(self, name)
        except AttributeError:
            raise KeyError(name) from None

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name, default)


class FileInfo(Record):
    """An uploaded input file (`POST /v1/files`)."""

    id: str
    name: str
    size: int
    sha256: str
    created_at: str | None = None


class Output(Record):
    """A file the job left in /output, stored as an artifact."""

    artifact_id: str
    path: str
    size: int
    sha256: str


class Job(Record):
    """A job record: state, reason, timings, usage, outputs, stages, attempts, egress."""

    id: str
    state: str
    reason: str | None = None
    exit_code: int | None = None
    detail: str = ""
    image: str = ""
    image_digest: str | None = None
    runtime: str | None = None
    runtime_version: str | None = None
    accepted_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    queue_ms: float | None = None
    start_ms: float | None = None
    run_ms: float | None = None
    limits: dict[str, float] = Field(default_factory=dict)
    usage: dict[str, float] = Field(default_factory=dict)
    outputs: list[Output] = Field(default_factory=list)
    stages: list[dict[str, Any]] = Field(default_factory=list)
    attempts: list[dict[str, Any]] = Field(default_factory=list)
    egress: list[dict[str, Any]] = Field(default_factory=list)
    cancel_requested: bool = False

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    def output(self, path: str) -> Output:
        """The output at `path` (relative to /output); KeyError if the job left none there."""
        for item in self.outputs:
            if item.path == path:
                return item
        raise KeyError(path)


class JobPage(Record):
    items: list[Job]
    next_cursor: str | None = None


class Logs(Record):
    stdout: str
    stderr: str


class LogEvent(Record):
    """One event of a job's log stream: a `stdout`/`stderr` chunk, or the final `end`."""

    kind: str
    text: str = ""
    seq: int | None = None
    state: str | None = None
    reason: str | None = None


class Artifact(Record):
    id: str
    job_id: str
    path: str
    size: int
    sha256: str
    created_at: str | None = None


class SignedUrl(Record):
    url: str
    expires_at: str


class DirectAccess(Record):
    """Where to send one session's cells straight to the worker holding it, and the token
    that opens them (and nothing else) until `expires_at` or the session stops."""

    execute_url: str
    token: str
    expires_at: str


class DeletionReport(Record):
    """What retiring a job removed, kept, and left for the caller to remove."""

    job_id: str
    already_retired: bool
    removed: dict[str, Any]
    kept: dict[str, Any]
    caller_must_remove: list[str]


class Tenant(Record):
    id: str
    name: str


class TenantQuotas(Record):
    """A tenant's quotas after a change: in effect, and what was set for it."""

    id: str
    name: str
    quotas: dict[str, Any] = Field(default_factory=dict)
    quota_overrides: dict[str, Any] = Field(default_factory=dict)


class ApiKey(Record):
    """A new API key; `key` is shown this once."""

    id: str
    key: str
    tenant_id: str | None = None


class Secret(Record):
    name: str
    created_at: str
    updated_at: str


class SessionInfo(Record):
    """A session record; `pause_mode` says whether memory ('memory') or files were kept."""

    id: str
    state: str
    image: str = ""
    limits: dict[str, float] = Field(default_factory=dict)
    network: dict[str, Any] = Field(default_factory=dict)
    created_at: str | None = None
    last_used_at: str | None = None
    expires_at: str | None = None
    idle_timeout_s: float | None = None
    paused_at: str | None = None
    memory_kept: bool | None = None
    pause_mode: str | None = None
    stopped_at: str | None = None
    reason: str | None = None
    detail: str = ""
    executions: int = 0


class Display(Record):
    """A rich output of a cell: `data` is text, or base64 for binary types (image/png)."""

    mime: str
    data: str

    def content(self) -> bytes:
        """The output's bytes (base64-decoded for images)."""
        if self.mime.startswith("image/") and not self.mime.endswith("svg+xml"):
            return base64.b64decode(self.data)
        return self.data.encode()


class CellError(Record):
    ename: str
    evalue: str
    traceback: list[str] = Field(default_factory=list)


class Cell(Record):
    """The answer to one executed cell."""

    stdout: str = ""
    stderr: str = ""
    result: str | None = None
    display: list[Display] = Field(default_factory=list)
    error: CellError | None = None
    execution_count: int | None = None
    duration_ms: float | None = None
    timed_out: bool = False
    interrupted: bool = False
    truncated: bool = False

    def images(self, mime: str = "image/png") -> list[bytes]:
        """The cell's images of that type (a matplotlib figure is one PNG)."""
        return [item.content() for item in self.display if item.mime == mime]


class CellRecord(Cell):
    """A cell of a session's history (`Session.cells`): its code, number and times too."""

    seq: int
    code: str = ""
    started_at: str | None = None
    finished_at: str | None = None


class CellEvent(Record):
    """One event of a streamed cell: `stdout`/`stderr` text, a `display`, then `result`
    (whose `cell` is the whole answer)."""

    type: str
    text: str = ""
    mime: str | None = None
    data: str | None = None
    cell: Cell | None = None


class FileEntry(Record):
    name: str
    type: str
    size: int


class FileWritten(Record):
    path: str
    size: int


class RunResult(Record):
    """A finished job with its logs: what `Client.run` returns."""

    job: Job
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.job.state == "completed"

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def state(self) -> str:
        return self.job.state

    @property
    def reason(self) -> str | None:
        return self.job.reason

    @property
    def outputs(self) -> list[Output]:
        return self.job.outputs
