"""The worker's one tenant-facing route: a session's cells sent straight to the worker that
holds the session, with a token the API minted (services/direct_cells.py).

Mounted at `/direct` on the worker's internal server, as an app of its own: it has no use for
the internal token, and a tenant's body is capped and checked here as the API would.
"""

from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from sandcell.api import problems
from sandcell.api.problems import problem_responses
from sandcell.api.schemas import ExecuteIn, ExecuteOut
from sandcell.services.direct_cells import DirectCells

router = APIRouter(prefix="/sessions")
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
    cells: DirectCells = request.app.state.cells
    token = credentials.credentials if credentials else ""
    return cells.execute(token, session_id, body.code, body.timeout_s)


def create_direct_app(cells: DirectCells, max_json_bytes: int, max_depth: int) -> FastAPI:
    app = FastAPI(title="sandcell direct cells", openapi_url=None, docs_url=None, redoc_url=None)
    app.state.cells = cells
    problems.install(app)
    app.add_middleware(
        problems.BodyGuard,
        max_json_bytes=max_json_bytes,
        max_upload_bytes=max_json_bytes,
        max_depth=max_depth,
    )
    app.include_router(router)
    return app
