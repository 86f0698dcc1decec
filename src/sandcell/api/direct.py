"""The worker's one tenant-facing route: a session's cells sent straight to the worker that
holds the session, with a token the API minted (services/direct_cells.py).

Served by the worker's internal server beside its internal routes, not behind the internal
token: the direct token is the credential, and a tenant's body is capped and checked here as
the API would (the body guard, on /direct paths only).
"""

from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from sandcell.api import problems
from sandcell.api.problems import problem_responses
from sandcell.api.schemas import ExecuteIn, ExecuteOut
from sandcell.services.direct_cells import DirectCells

PREFIX = "/direct/"
router = APIRouter(prefix="/direct/sessions")
bearer = HTTPBearer(auto_error=False, description="a direct token: POST /v1/sessions/{id}/direct")


@router.post(
    "/{session_id}/execute", response_model=ExecuteOut, responses=problem_responses(401, 409)
)
def execute(
    request: Request,
    session_id: str,
    body: ExecuteIn,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Any:
    cells: DirectCells = request.app.state.direct_cells
    token = credentials.credentials if credentials else ""
    return cells.execute(token, session_id, body.code, body.timeout_s)


def install_direct(app: FastAPI, cells: DirectCells, max_json_bytes: int, max_depth: int) -> None:
    """Serve direct cells from `app` (the worker's internal server)."""
    app.state.direct_cells = cells
    app.include_router(router)
    app.add_middleware(
        problems.BodyGuard,
        max_json_bytes=max_json_bytes,
        max_upload_bytes=max_json_bytes,
        max_depth=max_depth,
        prefix=PREFIX,
    )
