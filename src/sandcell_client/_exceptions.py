"""Every error the SDK raises, in one tree.

SandcellError                        anything that went wrong talking to sandcell
├── TransportError                   the server could not be reached, or the connection broke
│   └── Timeout                      no answer within the timeout
├── ChecksumMismatch                 downloaded bytes differ from the recorded sha256
├── StreamError                      an event stream broke off before its final event
└── ApiError                         the server answered with RFC 9457 problem+json
    ├── Unauthorized                 401 unauthorized: no valid API key (or signature)
    ├── Forbidden                    403 forbidden: the key lacks the scope
    ├── NotFound                     404 not-found: no such id — or another tenant's
    ├── PayloadTooLarge              413 payload-too-large
    ├── InvalidRequest               422 invalid-request: `errors` names each field
    │   ├── IdempotencyKeyReused     422 idempotency-key-reused: same key, other body
    │   └── ImageUnavailable         422 image-unavailable
    ├── Conflict                     409 conflict: not in a state that allows this
    │   ├── SessionUnavailable       409 session-unavailable: the sandbox ended (files kept)
    │   └── StaleLease               409 stale-lease (worker fencing)
    ├── QuotaExceeded                429 quota-exceeded: see `retry_after`
    ├── InternalError                500 internal
    ├── PreviewUnavailable           502 preview-unavailable
    ├── ServiceUnavailable           503: try again shortly
    │   ├── RuntimeUnavailable       503 runtime-unavailable
    │   └── StoreUnavailable         503 store-unavailable
    └── StorageFull                  507 storage-full

An answer is mapped by its problem `type` first and its status second, so a problem type this
SDK does not know yet still lands on the class for its status. httpx's own errors never leak:
they become `TransportError`/`Timeout` (`raise … from` the original).
"""

from dataclasses import dataclass
from typing import Any

import httpx


class SandcellError(Exception):
    """Something went wrong talking to sandcell."""

    retryable = False

    def __init__(self, message: str | None = None) -> None:
        self.message = message or (self.__doc__ or "").strip()
        super().__init__(self.message)


class TransportError(SandcellError):
    """The sandcell server could not be reached, or the connection broke."""

    retryable = True


class Timeout(TransportError):
    """The sandcell server did not answer in time."""


class ChecksumMismatch(SandcellError):
    """The downloaded bytes do not match the recorded sha256."""

    def __init__(self, what: str, expected: str, actual: str) -> None:
        super().__init__(f"{what}: sha256 {actual} does not match the recorded {expected}")
        self.expected, self.actual = expected, actual


class StreamError(SandcellError):
    """The event stream ended before its final event."""


@dataclass(frozen=True)
class FieldError:
    """One offending field of a 422 answer (`where`: body, query, path or header)."""

    field: str
    message: str
    where: str | None = None


class ApiError(SandcellError):
    """The sandcell API refused the request."""

    status_code = 0

    def __init__(self, status: int, problem: dict[str, Any], headers: httpx.Headers) -> None:
        self.status = status
        self.problem = problem
        self.type = str(problem.get("type", ""))
        self.title = str(problem.get("title", ""))
        self.detail = str(problem.get("detail", "") or self.title)
        self.errors = [_field(item) for item in problem.get("errors") or [] if _is_dict(item)]
        self.request_id = headers.get("x-request-id")
        self.retry_after = _seconds(headers.get("retry-after"))
        fields = "; ".join(f"{e.field}: {e.message}" for e in self.errors)
        super().__init__(f"{status} {self.detail}" + (f" ({fields})" if fields else ""))


class Unauthorized(ApiError):
    """No valid API key (or download signature)."""

    status_code = 401


class Forbidden(ApiError):
    """This API key may not do that."""

    status_code = 403


class NotFound(ApiError):
    """No such resource for this tenant."""

    status_code = 404


class PayloadTooLarge(ApiError):
    """The body or file is over its size limit."""

    status_code = 413


class InvalidRequest(ApiError):
    """The request is invalid: `errors` names each offending field."""

    status_code = 422


class IdempotencyKeyReused(InvalidRequest):
    """This Idempotency-Key was already used with a different request body."""


class ImageUnavailable(InvalidRequest):
    """The image is not built, not approved for this tenant, or its digest changed."""


class Conflict(ApiError):
    """The resource is not in a state that allows this."""

    status_code = 409


class SessionUnavailable(Conflict):
    """The session's sandbox is not running; its workspace is kept."""


class StaleLease(Conflict):
    """A worker's lease on the job is no longer current."""


class QuotaExceeded(ApiError):
    """A quota or rate limit of this tenant was reached: retry after `retry_after` seconds."""

    status_code = 429

    retryable = True


class InternalError(ApiError):
    """The server failed unexpectedly."""

    status_code = 500


class PreviewUnavailable(ApiError):
    """The session's server on that port did not answer."""

    status_code = 502


class ServiceUnavailable(ApiError):
    """The service is unavailable for now; try again shortly."""

    status_code = 503

    retryable = True


class RuntimeUnavailable(ServiceUnavailable):
    """The isolation runtime cannot be applied (the server fails closed)."""


class StoreUnavailable(ServiceUnavailable):
    """The job store cannot be reached right now."""


class StorageFull(ApiError):
    """The server's artifact storage is full."""

    status_code = 507


# The server's problem types (`/problems/<slug>`), one class each.
BY_TYPE: dict[str, type[ApiError]] = {
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "not-found": NotFound,
    "payload-too-large": PayloadTooLarge,
    "invalid-request": InvalidRequest,
    "idempotency-key-reused": IdempotencyKeyReused,
    "image-unavailable": ImageUnavailable,
    "conflict": Conflict,
    "session-unavailable": SessionUnavailable,
    "stale-lease": StaleLease,
    "quota-exceeded": QuotaExceeded,
    "internal": InternalError,
    "preview-unavailable": PreviewUnavailable,
    "runtime-unavailable": RuntimeUnavailable,
    "store-unavailable": StoreUnavailable,
    "storage-full": StorageFull,
}
BY_STATUS: dict[int, type[ApiError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: InvalidRequest,
    429: QuotaExceeded,
    500: InternalError,
    502: PreviewUnavailable,
    503: ServiceUnavailable,
    507: StorageFull,
}
# A session stream reports a failure mid-answer by the server's exception name.
BY_NAME: dict[str, type[ApiError]] = {
    "SessionUnavailable": SessionUnavailable,
    "NotFound": NotFound,
    "Conflict": Conflict,
    "InvalidRequest": InvalidRequest,
    "QuotaExceeded": QuotaExceeded,
}


def error_class(status: int, problem_type: str) -> type[ApiError]:
    slug = problem_type.rsplit("/", 1)[-1]
    found = BY_TYPE.get(slug)
    if found is not None and status in (found.status_code, 0):
        return found
    return BY_STATUS.get(status, ApiError)


def api_error(response: httpx.Response) -> ApiError:
    """The typed error of a problem answer (or of any other error answer)."""
    try:
        problem = response.json()
    except ValueError:
        problem = {"detail": response.text[:500]}
    if not isinstance(problem, dict):
        problem = {"detail": str(problem)[:500]}
    cls = error_class(response.status_code, str(problem.get("type", "")))
    return cls(response.status_code, problem, response.headers)


def stream_error(item: dict[str, Any]) -> ApiError:
    """The typed error of a session stream's `error` event."""
    cls = BY_NAME.get(str(item.get("type")), ApiError)
    status = cls.status_code or 500
    return cls(status, {"detail": str(item.get("detail", "the cell failed"))}, httpx.Headers())


def transport_error(exc: httpx.TransportError) -> TransportError:
    cls = Timeout if isinstance(exc, httpx.TimeoutException) else TransportError
    return cls(f"{cls.__doc__ and cls.__doc__.strip()} ({type(exc).__name__}: {exc})")


def _field(item: dict[str, Any]) -> FieldError:
    where = item.get("in")
    return FieldError(str(item.get("field", "")), str(item.get("message", "")), where)


def _is_dict(item: object) -> bool:
    return isinstance(item, dict)


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
