"""RFC 9457 problem details: one table from domain errors to HTTP, and the body guard."""

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandcell.api.schemas import Problem
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
    (e.StorageFull, 507, "storage-full"),
    (e.ImageUnavailable, 422, "image-unavailable"),
    (e.RuntimeUnavailable, 503, "runtime-unavailable"),
    (e.StaleLease, 409, "stale-lease"),
    (e.StoreUnavailable, 503, "store-unavailable"),
    (e.SessionUnavailable, 409, "session-unavailable"),
    (e.PreviewUnavailable, 502, "preview-unavailable"),
]
MEDIA_TYPE = "application/problem+json"
# How the OpenAPI document describes each problem status (and the headers that come with it).
ANSWERS: dict[int, str] = {
    401: "No valid API key (or download signature).",
    403: "The API key lacks the scope this needs, or is an admin key on a tenant route.",
    404: "No such resource for this tenant.",
    409: "The resource is not in a state that allows this.",
    413: "The body is larger than the configured limit.",
    422: "The request is invalid: `errors` names each offending field.",
    429: "A quota or rate limit refused it: retry after `Retry-After` seconds.",
    503: "The store or the runtime is unavailable for now.",
}
HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"schema": {"type": "string"}, "required": True}},
    429: {"Retry-After": {"schema": {"type": "integer"}, "required": True}},
    503: {"Retry-After": {"schema": {"type": "integer"}}},
}


def problem_response(status: int) -> dict[str, Any]:
    """The OpenAPI response object of a problem answer."""
    answer: dict[str, Any] = {
        "description": ANSWERS[status],
        "content": {MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
    }
    if status in HEADERS:
        answer["headers"] = HEADERS[status]
    return answer


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """For a route's `responses=`: the problems its own logic answers (404, 409, 429)."""
    return {status: problem_response(status) for status in statuses}


def document(app: FastAPI) -> None:
    """Complete the OpenAPI document with the problems that every route can answer: the
    key check (401, 403), the body guard (413, 422), parameter validation (422) and the
    store (503); and with problem+json, not FastAPI's own shape, for every 422."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            _with_problems(generate())
        return app.openapi_schema  # type: ignore[return-value]  # set by generate()

    app.openapi = openapi  # type: ignore[method-assign]


def _with_problems(doc: dict[str, Any]) -> None:
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    schema = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(schema.pop("$defs", {}))
    schemas["Problem"] = schema
    for path, item in doc.get("paths", {}).items():
        for method, operation in item.items():
            responses = operation.setdefault("responses", {})
            for status in _generic_statuses(path, method, operation):
                if status == 422 or str(status) not in responses:
                    responses[str(status)] = problem_response(status)


def _generic_statuses(path: str, method: str, operation: dict[str, Any]) -> list[int]:
    statuses = []
    if operation.get("security"):
        statuses += [401, 403]
    if method not in ("get", "head", "options"):
        statuses += [413, 422]  # the body guard reads every other method's body
    if operation.get("parameters") or operation.get("requestBody"):
        statuses.append(422)
    if path.startswith("/v1/"):
        statuses.append(503)
    return sorted(set(statuses))


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
    return JSONResponse(body, status, headers=headers, media_type=MEDIA_TYPE)


def _domain_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, e.SandcellError)
    for cls, status, slug in PROBLEM_TYPES:
        if isinstance(exc, cls):
            title = (cls.__doc__ or slug).strip().splitlines()[0]
            fields = getattr(exc, "errors", None)
            listed = None if fields is None else [_field(f) for f in fields]
            if isinstance(exc, e.PayloadTooLarge):  # e.g. a streamed upload past its limit
                listed = body_error(exc.detail)
            response = problem(status, slug, title, exc.detail, listed)
            if isinstance(exc, e.QuotaExceeded):
                response.headers["Retry-After"] = str(exc.retry_after_s)
            if isinstance(exc, e.StoreUnavailable):
                response.headers["Retry-After"] = "1"  # a restart or failover takes seconds
            return response
    return problem(500, "internal", "Internal error", "an internal error occurred")


def _field(error: e.FieldError) -> dict[str, str]:
    return {"field": error.field, "message": error.message}


def body_error(message: str) -> list[dict[str, str]]:
    """The `errors` entry of a problem with the request body as a whole."""
    return [{"field": "body", "in": "body", "message": message}]


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


def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400 and isinstance(exc.__cause__, e.PayloadTooLarge):
        # FastAPI turns what the body guard's counting receive raised into "cannot parse".
        return _domain_error(request, exc.__cause__)
    if exc.status_code == 400:
        # FastAPI's answer to a body it cannot decode (bad UTF-8, broken multipart): like any
        # other invalid body, a 422 that names the body.
        where = body_error(str(exc.detail))
        return problem(422, "invalid-request", "The request is invalid.", "see errors", where)
    response = problem(exc.status_code, "http", str(exc.detail), str(exc.detail))
    response.headers.update(exc.headers or {})
    if exc.status_code == 405:
        response.headers["Allow"] = ", ".join(_allowed_methods(request))
    return response


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this path (Starlette names only the first route's,
    and FastAPI makes one route per method)."""
    allowed: set[str] = set()
    for route in request.app.router.routes:
        methods = getattr(route, "methods", None)
        if methods and route.matches(request.scope)[0] is not Match.NONE:
            allowed |= methods
    return sorted(allowed)


def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    return problem(500, "internal", "Internal error", "an internal error occurred")


def install(app: FastAPI) -> None:
    app.add_exception_handler(e.SandcellError, _domain_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
    document(app)


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
    """Caps body size before anything parses it, and refuses JSON nested too deeply; on the
    paths under `prefix` only (default: all)."""

    def __init__(
        self,
        app: ASGIApp,
        max_json_bytes: int,
        max_upload_bytes: int,
        max_depth: int,
        prefix: str = "",
    ):
        self.app, self.prefix = app, prefix
        self.max_json, self.max_upload, self.max_depth = max_json_bytes, max_upload_bytes, max_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        passing = scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS")
        if passing or not scope["path"].startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        # Uploads are a multipart form (`POST /v1/files`) or a file's raw bytes (`PUT`, the
        # session workspace): held to the file limit and never parsed. Any other body is JSON.
        is_json = b"multipart" not in headers.get(b"content-type", b"") and scope["method"] != "PUT"
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
        # Like every other refusal of a body: `errors` names it, so clients need no special case.
        response = problem(status, slug, detail, detail, body_error(detail))
        await response(scope, lambda: _empty(), send)


async def _empty() -> Message:
    return {"type": "http.disconnect"}
