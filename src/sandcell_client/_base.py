"""What `Client` and `AsyncClient` share: configuration, request building, retries, response
and error mapping, and the event-stream decoder. The two clients only do the I/O."""

import hashlib
import json
import os
import random
import socket
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any, Generic, TypeVar

import httpx
from pydantic import BaseModel

from sandcell_client._exceptions import (
    ChecksumMismatch,
    Conflict,
    SandcellError,
    SessionUnavailable,
    Unauthorized,
    api_error,
    stream_error,
)
from sandcell_client._models import Cell, CellEvent, LogEvent

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT = 30.0
LONG_POLL_S = 30.0
SLOW_TIMEOUT = 120.0  # starting, pausing and resuming a session's sandbox
# TCP_NODELAY: a request's headers and body are separate writes, and Nagle would hold the body
# back for the server's delayed ACK (~40 ms) on every POST.
NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
# An idle pooled connection is dropped after this long, before the server closes its side
# (sandcell's: 30 s; uvicorn's default: 5 s): else a request sent as the server closes fails
# with "Server disconnected" (httpx's own default, 5 s, equals uvicorn's), and a session's cell
# is not resent.
POOL = httpx.Limits(keepalive_expiry=4.0)
# These errors mean the request never left this machine: resending is safe for any request.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# Any body a file can be uploaded from.
Content = bytes | str | os.PathLike[str] | IO[bytes]
Progress = Callable[[int, int | None], None]


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API request: how to build it, whether resending it is safe, how to read the answer.

    `idempotent` means the server treats a repeat as the same request (a GET, a PUT, a DELETE,
    a submit with an Idempotency-Key), so it may be resent after the connection broke mid-way.
    """

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: dict[str, Any] | None = None
    json: Any = None
    content: bytes | None = None
    files: Callable[[], dict[str, Any]] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float | None = None
    idempotent: bool = False


@dataclass(frozen=True)
class RetryPolicy:
    """Resend a request after a network error when that is safe, and after a 429/503 that
    says when to come back (for idempotent requests). Exponential backoff with jitter."""

    max_retries: int = 3
    backoff_s: float = 0.2
    max_delay_s: float = 10.0

    def after_error(self, call: Call[Any], exc: httpx.TransportError, attempt: int) -> float | None:
        safe = call.idempotent or isinstance(exc, NOT_SENT)
        return self.backoff(attempt) if safe and attempt <= self.max_retries else None

    def after_response(
        self, call: Call[Any], response: httpx.Response, attempt: int
    ) -> float | None:
        if response.status_code not in (429, 503) or not call.idempotent:
            return None
        if attempt > self.max_retries:
            return None
        after = response.headers.get("retry-after", "")
        wait = float(after) if after.replace(".", "", 1).isdigit() else self.backoff(attempt)
        return wait if wait <= self.max_delay_s else None

    def backoff(self, attempt: int) -> float:
        delay = min(self.max_delay_s, self.backoff_s * 2 ** (attempt - 1))
        return float(delay * (0.5 + random.random() / 2))


class BaseClient:
    """Configuration and request building of both clients."""

    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        timeout: float,
        max_retries: int,
        headers: Mapping[str, str] | None,
    ) -> None:
        self.base_url = (base_url or os.environ.get("SANDCELL_URL") or DEFAULT_URL).rstrip("/")
        key = api_key if api_key is not None else os.environ.get("SANDCELL_API_KEY", "")
        self._headers = {"User-Agent": "sandcell-client", **(headers or {})}
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
        self._timeout = timeout
        self.retry = RetryPolicy(max_retries=max_retries)

    def _build(self, http: httpx.Client | httpx.AsyncClient, call: Call[Any]) -> httpx.Request:
        timeout = httpx.Timeout(call.timeout) if call.timeout is not None else None
        return http.build_request(
            call.method,
            call.path,
            params=call.params,
            json=call.json,
            content=call.content,
            files=call.files() if call.files else None,
            headers=call.headers,
            timeout=timeout or httpx.USE_CLIENT_DEFAULT,
        )


# reading answers


def check(response: httpx.Response) -> httpx.Response:
    if response.status_code >= 400:
        raise api_error(response)
    return response


def model(cls: type[M]) -> Callable[[httpx.Response], M]:
    return lambda response: cls.model_validate(response.json())


def items(cls: type[M]) -> Callable[[httpx.Response], list[M]]:
    return lambda response: [cls.model_validate(item) for item in response.json()["items"]]


def nothing(_: httpx.Response) -> None:
    return None


def raw(response: httpx.Response) -> bytes:
    return response.content


# server-sent events


@dataclass
class ServerEvent:
    event: str
    data: str
    id: str | None


class SSEDecoder:
    """Lines in, events out (the WHATWG event-stream format, enough of it for sandcell)."""

    def __init__(self) -> None:
        self._event: str = "message"
        self._id: str | None = None
        self._data: list[str] = []

    def feed(self, line: str) -> ServerEvent | None:
        if not line:
            return self._dispatch()
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            self._id = value
        return None

    def _dispatch(self) -> ServerEvent | None:
        event = ServerEvent(self._event, "\n".join(self._data), self._id) if self._data else None
        self._event, self._data, self._id = "message", [], None
        return event


def log_event(event: ServerEvent) -> LogEvent:
    data = json.loads(event.data)
    seq = int(event.id) if event.id and event.id.isdigit() else None
    if event.event == "end":
        return LogEvent(kind="end", state=data.get("state"), reason=data.get("reason"))
    return LogEvent(kind=event.event, text=str(data), seq=seq)


def cell_event(event: ServerEvent) -> CellEvent:
    """A session stream event; a failure to run the cell at all raises its typed error."""
    data = json.loads(event.data)
    if event.event == "error":
        raise stream_error(data)
    if event.event == "result":
        return CellEvent(type="result", cell=Cell.model_validate(data))
    return CellEvent.model_validate({**data, "type": data.get("type", event.event)})


def refused_before_running(exc: SandcellError) -> bool:
    """Whether a direct cell was refused before any of it ran, so that asking the API for
    fresh access and sending it again is safe: its token lapsed (401), or the session is no
    longer on that worker (409). A sandbox that died under the cell (also a 409) is not."""
    return isinstance(exc, Unauthorized | Conflict) and not isinstance(exc, SessionUnavailable)


# request bodies


def job_body(
    code: str | None = None,
    *,
    command: Sequence[str] | None = None,
    inputs: Sequence[Mapping[str, str]] = (),
    image: str | None = None,
    allow: Sequence[str] | None = None,
    secrets: Sequence[Mapping[str, Any]] | None = None,
    env: Mapping[str, str] | None = None,
    limits: Mapping[str, float | None] | None = None,
    retry: int | None = None,
    expires_in_s: float | None = None,
) -> dict[str, Any]:
    """The body of `POST /v1/jobs`, without the fields left to the server's defaults."""
    body: dict[str, Any] = {"code": code} if command is None else {"command": list(command)}
    optional = {
        "inputs": [dict(i) for i in inputs],
        "image": image,
        "network": {"allow": list(allow)} if allow else None,
        "secrets": [dict(s) for s in secrets or []],
        "env": dict(env or {}),
        "limits": {k: v for k, v in (limits or {}).items() if v is not None},
        "retry": {"max_attempts": retry} if retry else None,
        "expires_in_s": expires_in_s,
    }
    body.update({k: v for k, v in optional.items() if v})
    return body


def session_body(
    image: str | None,
    allow: Sequence[str] | None,
    secrets: Sequence[Mapping[str, Any]] | None,
    env: Mapping[str, str] | None,
    limits: Mapping[str, float | None] | None,
    idle_timeout_s: float | None,
    ttl_s: float | None,
) -> dict[str, Any]:
    optional = {
        "image": image,
        "network": {"allow": list(allow)} if allow else None,
        "secrets": [dict(s) for s in secrets or []],
        "env": dict(env or {}),
        "limits": {k: v for k, v in (limits or {}).items() if v is not None},
        "idle_timeout_s": idle_timeout_s,
        "ttl_s": ttl_s,
    }
    return {k: v for k, v in optional.items() if v}


def new_idempotency_key() -> str:
    return f"sdk-{uuid.uuid4()}"


# files


def input_files(files: Mapping[str, Content] | Sequence[Content] | None) -> dict[str, Content]:
    """`{path under /input: content}` from a mapping, or from a list of local files."""
    if files is None:
        return {}
    if isinstance(files, Mapping):
        return dict(files)
    named: dict[str, Content] = {}
    for item in files:
        if not isinstance(item, str | os.PathLike):
            raise TypeError("a list of input files holds local paths; use a dict for contents")
        named[Path(item).name] = item
    return named


class ProgressReader:
    """A file object that reports how much of it has been read (for upload progress)."""

    def __init__(self, inner: IO[bytes], total: int | None, report: Progress) -> None:
        self._inner, self._total, self._report, self._done = inner, total, report, 0

    def read(self, size: int = -1) -> bytes:
        chunk = self._inner.read(size)
        self._done += len(chunk)
        self._report(self._done, self._total)
        return chunk

    def fileno(self) -> int:
        return self._inner.fileno()

    def tell(self) -> int:
        return self._inner.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._inner.seek(offset, whence)


@contextmanager
def opened(content: Content) -> Iterator[bytes | IO[bytes]]:
    """The content as bytes or an open file (a path is opened, and closed afterwards)."""
    if isinstance(content, str):
        yield content.encode()
    elif isinstance(content, os.PathLike):
        with open(content, "rb") as stream:
            yield stream
    else:
        yield content


def file_part(
    name: str, body: bytes | IO[bytes], progress: Progress | None
) -> Callable[[], dict[str, Any]]:
    """A multipart `file` field, built afresh for every attempt (a file is rewound)."""
    start = body.tell() if not isinstance(body, bytes) and body.seekable() else None

    def build() -> dict[str, Any]:
        if isinstance(body, bytes):
            if progress:
                progress(len(body), len(body))
            return {"file": (name, body)}
        if start is not None:
            body.seek(start)
        stream = ProgressReader(body, _size(body), progress) if progress else body
        return {"file": (name, stream)}

    return build


def raw_content(content: Content) -> bytes:
    if isinstance(content, str):
        return content.encode()
    if isinstance(content, bytes):
        return content
    if isinstance(content, os.PathLike):
        return Path(content).read_bytes()
    return content.read()


def _size(stream: IO[bytes]) -> int | None:
    try:
        return os.fstat(stream.fileno()).st_size
    except (AttributeError, OSError, ValueError):
        return None


def safe_destination(root: Path, relative: str) -> Path:
    """`root/relative` for a server-named file, refusing names that would leave `root`."""
    parts = PurePosixPath(relative).parts
    if not parts or relative.startswith("/") or any(p in ("..", "") for p in parts):
        raise SandcellError(f"refusing to write outside {root}: {relative!r}")
    return root.joinpath(*parts)


class Sha256Writer:
    """Writes a download to a temporary file beside `dest`, hashing it; `commit` checks the
    sha256 and moves the file into place atomically (a mismatch leaves nothing behind)."""

    def __init__(
        self, dest: Path, expected: str | None, progress: Progress | None, total: int | None
    ):
        dest.parent.mkdir(parents=True, exist_ok=True)
        self.dest, self.expected, self._progress, self._total = dest, expected, progress, total
        self._tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.part")
        self._file = self._tmp.open("wb")
        self._hash, self._done = hashlib.sha256(), 0

    def write(self, chunk: bytes) -> None:
        self._file.write(chunk)
        self._hash.update(chunk)
        self._done += len(chunk)
        if self._progress:
            self._progress(self._done, self._total)

    def commit(self) -> Path:
        self._file.close()
        actual = self._hash.hexdigest()
        if self.expected and actual != self.expected:
            self._tmp.unlink(missing_ok=True)
            raise ChecksumMismatch(str(self.dest), self.expected, actual)
        os.replace(self._tmp, self.dest)
        return self.dest

    def abort(self) -> None:
        self._file.close()
        self._tmp.unlink(missing_ok=True)


def verify(what: str, content: bytes, expected: str | None) -> bytes:
    actual = hashlib.sha256(content).hexdigest()
    if expected and actual != expected:
        raise ChecksumMismatch(what, expected, actual)
    return content


def expected_sha256(response: httpx.Response, recorded: str | None) -> str | None:
    """The sha256 the bytes must have: the record's, which the server's header must match."""
    header = response.headers.get("x-content-sha256")
    if recorded and header and header != recorded:
        raise ChecksumMismatch("artifact header", recorded, header)
    return recorded or header


def content_length(response: httpx.Response) -> int | None:
    length = response.headers.get("content-length", "")
    return int(length) if length.isdigit() else None
