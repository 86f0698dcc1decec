"""RFC 9457 problem details: one table from domain errors to HTTP, and the body guard."""

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandcell.domain import errors as e

PROBLEM_TYPES: list[tuple[type[e.SandcellError], int, str]] = [
    (e.IdempotencyMismatch, 422, "idempotency-key-reused"),
    (e.InvalidRequest, 422, "invalid-request"),
    (e.NotFound, 404, "not-found"),
    (e.Unauthorized, 401, "unauthorized"),
    (e.Forbidden, 403, "forbidden"),
    (e.PayloadTooLarge, 413, "payload-too-large"),
    (e.Conflict, 409, "conflict"),
    (e.QuotaExceeded, 429, "quota-exceeded"),
    (e.ImageUnavailable, 422, "image-unavailable"),
    (e.RuntimeUnavailable, 503, "runtime-unavailable"),
    (e.StaleLease, 409, "stale-lease"),
    (e.StoreUnavailable, 503, "store-unavailable"),
    (e.SessionUnavailable, 409, "session-unavailable"),
    (e.PreviewUnavailable, 502, "preview-unavailable"),
]


def problem(
    status: int, slug: str, title: str, detail: str, errors: list[dict[str, str]] | None = None
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": f"/problems/{slug}",
        "title": title,
        "status": status,
        "detail": detail,
    }
    if errors is not None:
        body["errors"] = errors
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status, headers=headers, media_type="application/problem+json")


def _domain_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, e.SandcellError)
    for cls, status, slug in PROBLEM_TYPES:
        if isinstance(exc, cls):
            title = (cls.__doc__ or slug).strip().splitlines()[0]
            fields = getattr(exc, "errors", None)
            listed = [{"field": f.field, "message": f.message} for f in fields or []]
            response = problem(
                status, slug, title, exc.detail, listed if fields is not None else None
            )
            if isinstance(exc, e.QuotaExceeded):
                response.headers["Retry-After"] = str(exc.retry_after_s)
            if isinstance(exc, e.StoreUnavailable):
                response.headers["Retry-After"] = "1"  # a restart or failover takes seconds
            return response
    return problem(500, "internal", "Internal error", "an internal error occurred")


def _field_name(loc: tuple[Any, ...]) -> tuple[str, str]:
    where = str(loc[0]) if loc else "body"
    return ".".join(str(part) for part in loc[1:]) or where, where


def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    listed = []
    for err in exc.errors():
        name, where = _field_name(tuple(err.get("loc", ())))
        listed.append({"field": name, "in": where, "message": str(err.get("msg", "invalid"))})
    return problem(422, "invalid-request", "The request is invalid.", "see errors", listed)


def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return problem(exc.status_code, "http", str(exc.detail), str(exc.detail))


def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    return problem(500, "internal", "Internal error", "an internal error occurred")


def install(app: FastAPI) -> None:
    app.add_exception_handler(e.SandcellError, _domain_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)


def json_depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return deepest


class BodyGuard:
    """Caps body size before anything parses it, and refuses JSON nested too deeply."""

    def __init__(self, app: ASGIApp, max_json_bytes: int, max_upload_bytes: int, max_depth: int):
        self.app = app
        self.max_json, self.max_upload, self.max_depth = max_json_bytes, max_upload_bytes, max_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        is_json = b"json" in headers.get(b"content-type", b"") or b"multipart" not in headers.get(
            b"content-type", b""
        )
        limit = self.max_json if is_json else self.max_upload
        declared = headers.get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > limit:
            await self._refuse(scope, send, 413, f"the body is larger than {limit} bytes")
            return
        if not is_json:
            await self.app(scope, self._counting(receive, limit), send)
            return
        body, too_big = await self._read(receive, limit)
        if too_big:
            await self._refuse(scope, send, 413, f"the body is larger than {limit} bytes")
            return
        if body and self._too_deep(body):
            await self._refuse(scope, send, 422, f"JSON nested deeper than {self.max_depth}")
            return
        await self.app(scope, self._replay(body, receive), send)

    def _too_deep(self, body: bytes) -> bool:
        try:
            return json_depth(json.loads(body)) > self.max_depth
        except RecursionError:
            return True
        except ValueError:
            return False  # not JSON: the route's own parser answers that

    async def _read(self, receive: Receive, limit: int) -> tuple[bytes, bool]:
        chunks, size = [], 0
        while True:
            message = await receive()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return b"", True
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), False

    @staticmethod
    def _replay(body: bytes, receive: Receive) -> Receive:
        """The buffered body once; after that the real channel, so a streaming response
        still learns when the client goes away (and only then)."""
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        return replay

    @staticmethod
    def _counting(receive: Receive, limit: int) -> Receive:
        size = 0

        async def counted() -> Message:
            nonlocal size
            message = await receive()
            size += len(message.get("body", b""))
            if size > limit:
                raise e.PayloadTooLarge(f"the upload is larger than {limit} bytes")
            return message

        return counted

    @staticmethod
    async def _refuse(scope: Scope, send: Send, status: int, detail: str) -> None:
        slug = "payload-too-large" if status == 413 else "invalid-request"
        response = problem(status, slug, detail, detail)
        await response(scope, lambda: _empty(), send)


async def _empty() -> Message:
    return {"type": "http.disconnect"}
