"""Request and response bodies of the HTTP API (the OpenAPI document comes from these)."""

import re
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    model_validator,
)

from sandcell.domain.paths import safe_relative_path

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL")
    return value


def _relative_path(value: str) -> str:
    return safe_relative_path(value)


def _env(value: dict[str, str]) -> dict[str, str]:
    for name, item in value.items():
        if not ENV_NAME.match(name):
            raise ValueError(f"{name!r} is not a valid environment variable name")
        if name.upper().startswith("SANDCELL_"):
            raise ValueError(f"{name!r}: the SANDCELL_ prefix is reserved")
        _no_nul(item)
    return value


def _whole_number(value: object) -> object:
    """JSON Schema's integer is any number without a fraction: 3.0 as well as 3."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Text = Annotated[str, AfterValidator(_no_nul)]
# In a strict model: 3 and 3.0, never true or "3". (The validator wraps the whole union, so
# that pydantic still writes a field's bounds into the JSON schema.)
Int = Annotated[int, BeforeValidator(_whole_number)]
OptionalInt = Annotated[int | None, BeforeValidator(_whole_number)]
RelativePath = Annotated[str, AfterValidator(_relative_path)]


class Strict(BaseModel):
    """A request body: unknown fields and loosely typed values (`false` for a number,
    `"1"` for an integer) are refused, as the OpenAPI document says."""

    model_config = ConfigDict(extra="forbid", strict=True)


class InputIn(Strict):
    file_id: str = Field(max_length=64)
    path: RelativePath = Field(description="where the file appears, relative to /input")


class LimitsIn(Strict):
    timeout_s: float | None = Field(None, description="wall clock seconds")
    cpu: float | None = Field(None, description="cores")
    memory_mb: OptionalInt = None
    pids: OptionalInt = None
    disk_mb: OptionalInt = Field(None, description="/workspace and /output together")
    output_mb: float | None = Field(None, description="stdout and stderr together")


class NetworkIn(Strict):
    allow: list[Annotated[str, Field(max_length=253)]] = Field(default_factory=list, max_length=64)


class SecretIn(Strict):
    name: str = Field(max_length=128)
    hosts: list[str] = Field(max_length=16)
    header: str = Field(max_length=128)
    format: str = Field("{value}", max_length=256)


class RetryIn(Strict):
    max_attempts: Int = Field(1, ge=1, le=5)


# `code` or `command`, exactly one of them.
CODE_XOR_COMMAND: dict[str, JsonValue] = {
    "oneOf": [
        {
            "required": ["code"],
            "properties": {"code": {"type": "string"}, "command": {"type": "null"}},
        },
        {
            "required": ["command"],
            "properties": {"command": {"type": "array"}, "code": {"type": "null"}},
        },
    ]
}


class JobIn(Strict):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=CODE_XOR_COMMAND)

    image: str | None = Field(None, max_length=64, pattern=r"^[a-z0-9][a-z0-9.-]*$")
    code: Text | None = Field(None, max_length=1_000_000, description="Python source")
    command: list[Annotated[Text, Field(max_length=8192)]] | None = Field(
        None, min_length=1, max_length=256, description="argv, instead of code"
    )
    inputs: list[InputIn] = Field(default_factory=list, max_length=256)
    limits: LimitsIn = Field(default_factory=LimitsIn)
    network: NetworkIn = Field(default_factory=NetworkIn)
    secrets: list[SecretIn] = Field(default_factory=list, max_length=16)
    env: Annotated[dict[str, str], AfterValidator(_env)] = Field(
        default_factory=dict, max_length=128
    )
    retry: RetryIn | None = None
    expires_in_s: float | None = Field(None, gt=0, le=7 * 86400)

    @model_validator(mode="after")
    def _code_or_command(self) -> "JobIn":
        if (self.code is None) == (self.command is None):
            raise ValueError("give exactly one of code or command")
        return self


class OutputOut(BaseModel):
    artifact_id: str
    path: str
    size: int
    sha256: str


class JobOut(BaseModel):
    id: str
    state: str
    reason: str | None
    exit_code: int | None
    detail: str
    image: str
    image_digest: str | None
    runtime: str | None
    runtime_version: str | None
    pooled: bool
    sandbox_id: str | None  # the current or last attempt's sandbox (runsc container id)
    accepted_at: str
    started_at: str | None
    finished_at: str | None
    expires_at: str | None
    queue_ms: float | None
    start_ms: float | None
    run_ms: float | None
    limits: dict[str, float]
    usage: dict[str, float]
    outputs: list[OutputOut]
    stages: list[dict[str, Any]]
    attempts: list[dict[str, Any]]
    egress: list[dict[str, Any]]
    cancel_requested: bool
    retired_at: str | None


class RemovedOut(BaseModel):
    artifacts: list[OutputOut]
    artifact_bytes: int
    log_bytes: int
    code_and_env: bool
    inputs: str
    workspace: str
    secrets_material: str


class KeptInputOut(BaseModel):
    file_id: str
    remove_with: str


class KeptOut(BaseModel):
    job_record: str
    input_files: list[KeptInputOut]


class DeletionReport(BaseModel):
    """What retiring a job removed, what it kept, and what the caller must remove."""

    job_id: str
    already_retired: bool
    removed: RemovedOut
    kept: KeptOut
    caller_must_remove: list[str]


class JobPage(BaseModel):
    items: list[JobOut]
    next_cursor: str | None


class LogsOut(BaseModel):
    stdout: str
    stderr: str


class FileOut(BaseModel):
    id: str
    name: str
    size: int
    sha256: str
    created_at: str


class ArtifactOut(BaseModel):
    id: str
    job_id: str
    path: str
    size: int
    sha256: str
    created_at: str


class SignedUrlOut(BaseModel):
    url: str
    expires_at: str


class QuotasIn(Strict):
    concurrent_jobs: OptionalInt = Field(None, ge=0, le=100_000)
    sessions: OptionalInt = Field(None, ge=0, le=10_000)
    storage_mb: OptionalInt = Field(None, ge=0, le=10**9)
    jobs_per_minute: float | None = Field(None, gt=0, le=10**6)
    burst: OptionalInt = Field(None, ge=1, le=10**6)


class TenantIn(Strict):
    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._-]*$")
    limits: LimitsIn = Field(default_factory=LimitsIn)
    quotas: QuotasIn = Field(default_factory=QuotasIn)
    images: list[str] | None = Field(None, max_length=64)


class TenantOut(BaseModel):
    id: str
    name: str


class TenantPatch(Strict):
    quotas: QuotasIn = Field(
        default_factory=QuotasIn,
        description="the quotas to change; null resets one to the server's default",
    )


class TenantQuotasOut(BaseModel):
    id: str
    name: str
    quotas: dict[str, Any] = Field(description="in effect: the defaults with the overrides")
    quota_overrides: dict[str, Any] = Field(description="what was set for this tenant")


class KeyIn(Strict):
    scopes: list[str] | None = Field(None, max_length=8)


class KeyOut(BaseModel):
    id: str
    key: str
    tenant_id: str | None


class AuditEventOut(BaseModel):
    id: str
    at: str
    tenant_id: str | None
    actor: str | None
    action: str
    target: str | None
    outcome: str
    detail: dict[str, Any]


class AuditPage(BaseModel):
    items: list[AuditEventOut]


class SecretPut(Strict):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    value: str = Field(
        min_length=1,
        max_length=8192,
        pattern=r"^[^\x00-\x1f]*$",
        description="write-only; never returned",
    )


class SecretOut(BaseModel):
    name: str
    created_at: str
    updated_at: str


class SecretPage(BaseModel):
    items: list[SecretOut]


class SessionIn(Strict):
    image: str | None = Field(None, max_length=64, pattern=r"^[a-z0-9][a-z0-9.-]*$")
    limits: LimitsIn = Field(default_factory=LimitsIn)
    network: NetworkIn = Field(default_factory=NetworkIn)
    secrets: list[SecretIn] = Field(default_factory=list, max_length=16)
    env: Annotated[dict[str, str], AfterValidator(_env)] = Field(
        default_factory=dict, max_length=128
    )
    idle_timeout_s: float | None = Field(None, gt=0, description="stop after this long unused")
    ttl_s: float | None = Field(None, gt=0, description="hard limit on the session's life")


class SessionOut(BaseModel):
    id: str
    state: str
    image: str
    limits: dict[str, float]
    network: dict[str, Any]
    created_at: str
    last_used_at: str
    expires_at: str
    idle_timeout_s: float
    paused_at: str | None
    memory_kept: bool | None = Field(description="after pause: was process memory kept?")
    pause_mode: str | None = Field(description="'memory' (checkpoint) or 'workspace' (files)")
    stopped_at: str | None
    reason: str | None
    detail: str
    executions: int
    pooled: bool = Field(description="its kernel was pre-started by a session pool")
    sandbox_id: str | None = Field(description="the sandbox it runs in now, or ran in last")


class SessionPage(BaseModel):
    items: list[SessionOut]


class ExecuteIn(Strict):
    code: Text = Field(max_length=1_000_000)
    timeout_s: float = Field(60.0, gt=0, le=3600, description="the cell is interrupted after")


class DisplayOut(BaseModel):
    model_config = ConfigDict(extra="allow")
    mime: str
    data: str = Field(description="text, or base64 for binary types such as image/png")


class CellError(BaseModel):
    model_config = ConfigDict(extra="allow")
    ename: str
    evalue: str
    traceback: list[str]


class ExecuteOut(BaseModel):
    model_config = ConfigDict(extra="allow")
    stdout: str
    stderr: str
    result: str | None
    display: list[DisplayOut]
    error: CellError | None
    execution_count: int | None = None
    duration_ms: float | None = None
    timed_out: bool = False
    interrupted: bool = False


class SessionCellOut(BaseModel):
    """One recorded cell of a session: its code and what it answered. A cell that failed
    outside the kernel (its sandbox died, its worker went) has that failure as its error."""

    seq: int = Field(description="1, 2, … in the order the session ran them")
    code: str
    stdout: str
    stderr: str
    result: str | None
    display: list[DisplayOut]
    error: CellError | None
    execution_count: int | None
    timed_out: bool
    interrupted: bool
    truncated: bool = Field(description="output was cut, by the kernel or the history's cap")
    started_at: str
    finished_at: str
    duration_ms: float


class SessionCellPage(BaseModel):
    items: list[SessionCellOut] = Field(description="oldest first")
    next_after: int | None = Field(description="pass as `after` to get only later cells")


class FileEntry(BaseModel):
    name: str
    type: str
    size: int


class FileList(BaseModel):
    items: list[FileEntry]


class FileWritten(BaseModel):
    path: str
    size: int


class InterruptOut(BaseModel):
    interrupted: bool


class HealthOut(BaseModel):
    status: str


class ReadyOut(BaseModel):
    ready: bool
    checks: dict[str, bool]


class PreviewUrlOut(BaseModel):
    url: str
    expires_at: str


class DirectOut(BaseModel):
    execute_url: str = Field(
        description="POST a cell here (as to /execute) with `Authorization: Bearer <token>`:"
        " it goes straight to the worker holding the session, one HTTP hop instead of two"
    )
    token: str = Field(description="opens this session's cells only, until it expires")
    expires_at: str


class FieldProblem(BaseModel):
    field: str = Field(description="the offending field, dotted (`limits.memory_mb`)")
    message: str
    where: str | None = Field(None, alias="in", description="body, query, path or header")


class Problem(BaseModel):
    """RFC 9457 problem details: every error answer of the API has this body."""

    type: str = Field(description="a relative URI naming the kind of problem")
    title: str
    status: int
    detail: str
    errors: list[FieldProblem] | None = Field(None, description="validation: one per field")
