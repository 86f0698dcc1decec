"""sandcell_client: the Python SDK of the sandcell API (httpx + pydantic only).

    from sandcell_client import Client

    with Client("http://127.0.0.1:8080", "sc_…") as client:
        result = client.run(code, files={"data.csv": Path("data.csv")})
        client.download_outputs(result, "out")
        with client.sessions.create(image="python-data") as session:
            cell = session.execute("1 + 1")

`AsyncClient` is the same API with `await`. Every error is a `SandcellError` (the tree is at the
top of `sandcell_client._exceptions`).
"""

from sandcell_client._async_client import AsyncClient, AsyncSession, AsyncSessions
from sandcell_client._base import RetryPolicy
from sandcell_client._client import Client, Session, Sessions
from sandcell_client._exceptions import (
    ApiError,
    ChecksumMismatch,
    Conflict,
    FieldError,
    Forbidden,
    IdempotencyKeyReused,
    ImageUnavailable,
    InternalError,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    PreviewUnavailable,
    QuotaExceeded,
    RuntimeUnavailable,
    SandcellError,
    ServiceUnavailable,
    SessionUnavailable,
    StaleLease,
    StorageFull,
    StoreUnavailable,
    StreamError,
    Timeout,
    TransportError,
    Unauthorized,
)
from sandcell_client._models import (
    ApiKey,
    Artifact,
    Cell,
    CellError,
    CellEvent,
    CellRecord,
    DeletionReport,
    Display,
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

__all__ = [
    "ApiError",
    "ApiKey",
    "Artifact",
    "AsyncClient",
    "AsyncSession",
    "AsyncSessions",
    "Cell",
    "CellError",
    "CellEvent",
    "CellRecord",
    "ChecksumMismatch",
    "Client",
    "Conflict",
    "DeletionReport",
    "Display",
    "FieldError",
    "FileEntry",
    "FileInfo",
    "FileWritten",
    "Forbidden",
    "IdempotencyKeyReused",
    "ImageUnavailable",
    "InternalError",
    "InvalidRequest",
    "Job",
    "JobPage",
    "LogEvent",
    "Logs",
    "NotFound",
    "Output",
    "PayloadTooLarge",
    "PreviewUnavailable",
    "QuotaExceeded",
    "RetryPolicy",
    "RunResult",
    "RuntimeUnavailable",
    "SandcellError",
    "Secret",
    "ServiceUnavailable",
    "Session",
    "SessionInfo",
    "SessionUnavailable",
    "Sessions",
    "SignedUrl",
    "StaleLease",
    "StorageFull",
    "StoreUnavailable",
    "StreamError",
    "Tenant",
    "TenantQuotas",
    "Timeout",
    "TransportError",
    "Unauthorized",
]
