"""The one exception tree of sandcell.

SandcellError
├── NotFound               the thing does not exist, or belongs to another tenant (always 404)
├── Unauthorized           no valid credential
├── Forbidden              a valid credential without the needed scope
├── InvalidRequest         a request that can never succeed as sent (fields carry details)
│   └── IdempotencyMismatch  same Idempotency-Key, different body
├── PayloadTooLarge        a body or file over its size limit
├── Conflict               valid, but not in the object's current state
├── QuotaExceeded          a tenant quota or rate limit; carries retry_after_s
├── ImageUnavailable       an image that is not built or whose digest no longer matches
├── RuntimeUnavailable     the isolation runtime cannot be applied: fail closed
├── StorageFull            the artifact store has no space: the job fails, nothing half-written
├── CorruptArtifact        a stored artifact is missing or no longer matches its sha256
├── StaleLease             a worker wrote with a fencing token that is no longer current
├── StoreUnavailable       the database cannot be reached right now (restart, failover): retry
├── SessionUnavailable     a session's sandbox ended or stopped answering (workspace kept)
└── PreviewUnavailable     a session's preview server did not answer (502 at the edge)
"""

from dataclasses import dataclass


@dataclass
class FieldError:
    field: str
    message: str


class SandcellError(Exception):
    """Something went wrong in sandcell."""

    def __init__(self, detail: str | None = None) -> None:
        self.detail = detail or (self.__doc__ or "").strip()
        super().__init__(self.detail)


class NotFound(SandcellError):
    """Not found."""


class Unauthorized(SandcellError):
    """A valid API key is required."""


class Forbidden(SandcellError):
    """This API key may not do that."""


class InvalidRequest(SandcellError):
    """The request is invalid."""

    def __init__(self, detail: str | None = None, errors: list[FieldError] | None = None) -> None:
        super().__init__(detail)
        self.errors = errors or []


class IdempotencyMismatch(InvalidRequest):
    """This Idempotency-Key was already used with a different request body."""


class PayloadTooLarge(SandcellError):
    """The request body is too large."""


class Conflict(SandcellError):
    """The request conflicts with the current state of the resource."""


class QuotaExceeded(SandcellError):
    """A quota or rate limit of this tenant was reached."""

    def __init__(self, detail: str | None = None, retry_after_s: int = 1) -> None:
        super().__init__(detail)
        self.retry_after_s = retry_after_s


class ImageUnavailable(SandcellError):
    """The image is not available."""


class RuntimeUnavailable(SandcellError):
    """The isolation runtime cannot be applied."""


class StorageFull(SandcellError):
    """The artifact storage is full."""


class CorruptArtifact(SandcellError):
    """A stored artifact is missing or no longer matches its sha256."""


class StaleLease(SandcellError):
    """This worker's lease on the job is no longer current."""


class StoreUnavailable(SandcellError):
    """The job store cannot be reached right now; try again shortly."""


class SessionUnavailable(SandcellError):
    """The session's sandbox is not running; its workspace is kept."""


class PreviewUnavailable(SandcellError):
    """The session's server on that port did not answer."""
