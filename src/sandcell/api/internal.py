"""The worker's internal HTTP face: API replicas drive session sandboxes through it.

Only API replicas call it, with the shared internal token; tenants never reach it. Every
session it serves is looked up in the store, so a request cannot name a session into being.
"""

import base64
import hmac
import json
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, FastAPI, Header, Query, Request
from fastapi.responses import Response, StreamingResponse

from sandcell.api import problems
from sandcell.api.warm import warmed
from sandcell.domain.errors import NotFound, Unauthorized
from sandcell.domain.sessions import Session
from sandcell.ports.store import Store
from sandcell.services.session_host import LocalSessionHost

TOKEN_HEADER = "X-Sandcell-Internal"


router = APIRouter(prefix="/internal/sessions")


# The dependencies below are async because they never block: FastAPI runs a sync dependency
# in a worker thread, one thread hop per dependency per call on the execute path.


async def _authorised(
    request: Request, given: Annotated[str | None, Header(alias=TOKEN_HEADER)] = None
) -> None:
    if not given or not hmac.compare_digest(given, request.app.state.token):
        raise Unauthorized("internal endpoint")


async def _host(request: Request) -> LocalSessionHost:
    host: LocalSessionHost = request.app.state.host
    return host


def _session(request: Request, session_id: str) -> Session:
    store: Store = request.app.state.store
    found = store.get_session(None, session_id)
    if found is None:
        raise NotFound("no such session")
    return found


Host = Annotated[LocalSessionHost, Depends(_host)]


def create_internal_app(host: LocalSessionHost, store: Store, token: str) -> FastAPI:
    app = FastAPI(
        title="sandcell worker (internal)", openapi_url=None, docs_url=None, lifespan=warmed
    )
    app.state.host, app.state.store, app.state.token = host, store, token
    problems.install(app)
    app.include_router(router, dependencies=[Depends(_authorised)])
    return app


@router.post("/{session_id}/start")
def start(host: Host, request: Request, session_id: str) -> dict[str, str]:
    host.start(_session(request, session_id))
    return {"state": "running"}


@router.post("/{session_id}/resume")
def resume(host: Host, request: Request, session_id: str) -> dict[str, str]:
    host.resume(_session(request, session_id))
    return {"state": "running"}


@router.post("/{session_id}/execute")
def execute(host: Host, session_id: str, body: Annotated[dict[str, Any], Body()]) -> Any:
    code, timeout_s = str(body["code"]), float(body["timeout_s"])
    if not body.get("stream"):
        return host.execute(session_id, code, timeout_s)
    lines = (
        json.dumps({kind: item}) + "\n"
        for kind, item in host.execute_stream(session_id, code, timeout_s)
    )
    return StreamingResponse(lines, media_type="application/x-ndjson")


@router.post("/{session_id}/interrupt")
def interrupt(host: Host, session_id: str) -> dict[str, bool]:
    host.interrupt(session_id)
    return {"ok": True}


@router.post("/{session_id}/pause")
def pause(host: Host, session_id: str) -> dict[str, bool]:
    return {"memory_kept": host.pause(session_id)}


@router.post("/{session_id}/stop")
def stop(host: Host, session_id: str, reason: str = "stopped") -> dict[str, bool]:
    host.stop(session_id, reason)
    return {"ok": True}


@router.put("/{session_id}/files")
async def put_file(host: Host, session_id: str, path: str, request: Request) -> dict[str, int]:
    content = await request.body()
    return {"size": host.put_file(session_id, path, content)}


@router.get("/{session_id}/files")
def get_file(host: Host, session_id: str, path: str) -> Response:
    return Response(host.get_file(session_id, path), media_type="application/octet-stream")


@router.get("/{session_id}/list")
def list_files(
    host: Host, session_id: str, path: Annotated[str, Query()] = ""
) -> list[dict[str, Any]]:
    return host.list_files(session_id, path)


@router.post("/{session_id}/http")
def relay(host: Host, session_id: str, body: Annotated[dict[str, Any], Body()]) -> dict[str, Any]:
    status, headers, content = host.http(
        session_id,
        int(body["port"]),
        str(body["method"]),
        str(body["target"]),
        [(str(k), str(v)) for k, v in body["headers"]],
        base64.b64decode(body["body"]),
    )
    return {"status": status, "headers": headers, "body": base64.b64encode(content).decode()}
