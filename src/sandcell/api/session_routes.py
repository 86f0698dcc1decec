"""Session routes: a stateful interpreter, cell by cell; files; pause/resume; previews."""

import json
from collections.abc import Iterator
from typing import Annotated, Any

from anyio import to_thread
from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import StreamingResponse

from sandcell.api.deps import Caller, Svc
from sandcell.api.problems import problem_responses
from sandcell.api.schemas import (
    DirectOut,
    ExecuteIn,
    ExecuteOut,
    FileEntry,
    FileList,
    FileWritten,
    InterruptOut,
    PreviewUrlOut,
    SessionCellOut,
    SessionCellPage,
    SessionIn,
    SessionOut,
    SessionPage,
)
from sandcell.api.views import iso, rendered
from sandcell.domain.cells import KEEP_CELLS, SessionCell
from sandcell.domain.errors import PayloadTooLarge
from sandcell.domain.sessions import Session
from sandcell.services.sessions import SessionRequest

router = APIRouter(prefix="/v1", tags=["sessions"])
# A route that acts on a session: it may not be the caller's (404), or not be running, or its
# worker may be gone (409).
SESSION_PROBLEMS = problem_responses(404, 409)
WORKSPACE_PATH: dict[str, Any] = {
    "max_length": 1024,
    "pattern": r"^[^\x00-\x1f\x7f]*$",
    "description": "relative to /workspace, normalised: no '..', '.' or empty segments",
}
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "host",
}
# A preview is the guest's content on our origin: run it in an opaque origin so its scripts
# cannot read anything the API's pages keep (for example a key in sessionStorage).
PREVIEW_CSP = "sandbox allow-scripts allow-forms allow-popups allow-modals"


def session_out(session: Session) -> SessionOut:
    kept = session.memory_kept
    return SessionOut(
        id=session.id,
        state=session.state.value,
        image=session.spec["image"],
        limits=session.spec["limits"],
        network=session.spec.get("network", {}),
        created_at=iso(session.created_at) or "",
        last_used_at=iso(session.last_used_at) or "",
        expires_at=iso(session.expires_at) or "",
        idle_timeout_s=session.idle_timeout_s,
        paused_at=iso(session.paused_at),
        memory_kept=kept,
        pause_mode=None if kept is None else ("memory" if kept else "workspace"),
        stopped_at=iso(session.stopped_at),
        reason=session.reason,
        detail=session.detail,
        executions=session.executions,
        pooled=session.pooled,
        sandbox_id=session.sandbox_id,
    )


@router.post(
    "/sessions", status_code=201, response_model=SessionOut, responses=problem_responses(404, 429)
)
def create_session(svc: Svc, who: Caller, body: SessionIn) -> Response:
    request = SessionRequest(
        image=body.image,
        limits=body.limits.model_dump(exclude_none=True),
        env=body.env,
        network=body.network.model_dump(),
        secrets=[s.model_dump() for s in body.secrets],
        idle_timeout_s=body.idle_timeout_s,
        ttl_s=body.ttl_s,
    )
    return rendered(session_out(svc.sessions.create(who, request)), 201)


@router.get("/sessions", response_model=SessionPage)
def list_sessions(svc: Svc, who: Caller, live: bool = False) -> SessionPage:
    return SessionPage(items=[session_out(s) for s in svc.sessions.list_sessions(who, live)])


@router.get("/sessions/{session_id}", response_model=SessionOut, responses=problem_responses(404))
def get_session(svc: Svc, who: Caller, session_id: str) -> SessionOut:
    return session_out(svc.sessions.get(who, session_id))


@router.delete("/sessions/{session_id}", response_model=SessionOut, responses=SESSION_PROBLEMS)
def stop_session(svc: Svc, who: Caller, session_id: str) -> SessionOut:
    return session_out(svc.sessions.stop(who, session_id))


@router.post(
    "/sessions/{session_id}/execute",
    response_model=ExecuteOut,
    responses={200: {"content": {"text/event-stream": {}}}, **SESSION_PROBLEMS},
)
def execute(svc: Svc, who: Caller, session_id: str, body: ExecuteIn, request: Request) -> Any:
    """Run one cell. With `Accept: text/event-stream`, output streams as it is produced:
    `stdout`/`stderr`/`display` events, then one `result` (or `error`) event."""
    if "text/event-stream" in request.headers.get("accept", ""):
        items = svc.sessions.execute_stream(who, session_id, body.code, body.timeout_s)
        return StreamingResponse(_sse(items), media_type="text/event-stream")
    return rendered(
        ExecuteOut.model_validate(svc.sessions.execute(who, session_id, body.code, body.timeout_s))
    )


def _sse(items: Iterator[tuple[str, dict[str, Any]]]) -> Iterator[str]:
    for kind, item in items:
        name = str(item.get("type", "output")) if kind == "event" else kind
        yield f"event: {name}\ndata: {json.dumps(item)}\n\n"


@router.get(
    "/sessions/{session_id}/cells",
    response_model=SessionCellPage,
    responses=problem_responses(404),
)
def list_cells(
    svc: Svc,
    who: Caller,
    session_id: str,
    after: Annotated[int | None, Query(ge=0, le=2**31 - 1, description="a cell's seq")] = None,
    limit: Annotated[int, Query(ge=1, le=KEEP_CELLS)] = 20,
) -> SessionCellPage:
    """The session's recent cells, oldest first: the newest `limit`, or with `after` the
    first `limit` cells run since. Kept after the session stops or pauses (the newest
    100 per session; each cell's output capped at about 2 MB, then `truncated`)."""
    cells = svc.sessions.cells(who, session_id, after, limit)
    return SessionCellPage(
        items=[cell_out(cell) for cell in cells],
        next_after=cells[-1].seq if cells else after,
    )


def cell_out(cell: SessionCell) -> SessionCellOut:
    return SessionCellOut.model_validate(
        {
            **{k: v for k, v in vars(cell).items() if k not in ("session_id", "tenant_id")},
            "started_at": iso(cell.started_at) or "",
            "finished_at": iso(cell.finished_at) or "",
        }
    )


@router.post(
    "/sessions/{session_id}/interrupt",
    status_code=202,
    response_model=InterruptOut,
    responses=SESSION_PROBLEMS,
)
def interrupt(svc: Svc, who: Caller, session_id: str) -> InterruptOut:
    svc.sessions.interrupt(who, session_id)
    return InterruptOut(interrupted=True)


@router.post("/sessions/{session_id}/pause", response_model=SessionOut, responses=SESSION_PROBLEMS)
def pause(svc: Svc, who: Caller, session_id: str) -> SessionOut:
    return session_out(svc.sessions.pause(who, session_id))


@router.post("/sessions/{session_id}/resume", response_model=SessionOut, responses=SESSION_PROBLEMS)
def resume(svc: Svc, who: Caller, session_id: str) -> SessionOut:
    return session_out(svc.sessions.resume(who, session_id))


@router.get("/sessions/{session_id}/files", response_model=FileList, responses=SESSION_PROBLEMS)
def list_files(
    svc: Svc, who: Caller, session_id: str, path: Annotated[str, Query(**WORKSPACE_PATH)] = ""
) -> FileList:
    entries = svc.sessions.list_files(who, session_id, path)
    return FileList(items=[FileEntry(**entry) for entry in entries])


@router.put(
    "/sessions/{session_id}/files/{path:path}",
    response_model=FileWritten,
    responses=SESSION_PROBLEMS,
    openapi_extra={
        "requestBody": {
            "description": "the file's bytes",
            "content": {"application/octet-stream": {"schema": {"type": "string"}}},
        }
    },
)
async def upload(
    svc: Svc,
    who: Caller,
    session_id: str,
    path: Annotated[str, Path(**WORKSPACE_PATH)],
    request: Request,
) -> FileWritten:
    """Write the request body to /workspace/{path}."""
    content = await request.body()
    if len(content) > request.app.state.max_upload_bytes:
        raise PayloadTooLarge("the file is too large")
    size = await to_thread.run_sync(svc.sessions.put_file, who, session_id, path, content)
    return FileWritten(path=path, size=size)


@router.get(
    "/sessions/{session_id}/files/{path:path}",
    responses={
        200: {"content": {"application/octet-stream": {"schema": {"type": "string"}}}},
        **SESSION_PROBLEMS,
    },
    response_class=Response,
)
def download(
    svc: Svc, who: Caller, session_id: str, path: Annotated[str, Path(**WORKSPACE_PATH)]
) -> Response:
    content = svc.sessions.get_file(who, session_id, path)
    return Response(
        content,
        media_type="application/octet-stream",
        headers={"X-Content-Type-Options": "nosniff", "Content-Disposition": "attachment"},
    )


@router.post(
    "/sessions/{session_id}/ports/{port}/url",
    response_model=PreviewUrlOut,
    responses=SESSION_PROBLEMS,
)
def preview_url(
    svc: Svc, who: Caller, session_id: str, port: Annotated[int, Path(ge=1, le=65535)]
) -> PreviewUrlOut:
    token, expires = svc.sessions.preview_token(who, session_id, port)
    return PreviewUrlOut(url=f"/v1/previews/{token}/", expires_at=iso(expires) or "")


@router.post("/sessions/{session_id}/direct", response_model=DirectOut, responses=SESSION_PROBLEMS)
def direct_access(svc: Svc, who: Caller, session_id: str) -> DirectOut:
    """Direct access to this session's cells: its worker's URL and a token for them."""
    access = svc.sessions.direct(who, session_id)
    return DirectOut(
        execute_url=access.url, token=access.token, expires_at=iso(access.expires_at) or ""
    )


@router.api_route(
    "/previews/{token}/{path:path}",
    methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"],
    include_in_schema=False,
)
async def preview(svc: Svc, token: str, path: str, request: Request) -> Response:
    """Relay to the session's port; the token in the URL is the credential."""
    target = "/" + path + (f"?{request.url.query}" if request.url.query else "")
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
    body = await request.body()
    status, reply_headers, content = await to_thread.run_sync(
        svc.sessions.preview, token, request.method, target, headers, body
    )
    kept = {k: v for k, v in reply_headers if k.lower() not in HOP_BY_HOP}
    kept |= {"Content-Security-Policy": PREVIEW_CSP, "X-Content-Type-Options": "nosniff"}
    return Response(content, status_code=status, headers=kept)
