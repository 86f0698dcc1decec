"""The worker's one tenant-facing route: a session's cells sent straight to the worker that
holds the session, with a token the API minted (services/direct_cells.py).

Served by the worker's internal server beside its internal routes, not behind the internal
token: the direct token is the credential, and a tenant's body is capped and checked here as
the API would (the body guard, on /direct paths only).

A plain Starlette route, not a FastAPI one: this is the path whose every tenth of a
millisecond shows (a `1+1` round trip), and FastAPI's dependency solving and response-model
pass cost ~0.2 ms of the worker's CPU per cell for the same checks done here by the same
pydantic models. The internal server publishes no schema, so nothing is lost by it.
"""

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.security.utils import get_authorization_scheme_param
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sandcell.api import problems
from sandcell.api.schemas import ExecuteIn, ExecuteOut
from sandcell.api.views import rendered
from sandcell.services.direct_cells import DirectCells

PREFIX = "/direct/"


async def execute(request: Request) -> Response:
    try:
        body = ExecuteIn.model_validate_json(await request.body())
    except ValidationError as exc:
        # As FastAPI reports a body it could not validate: each error located in the body.
        raise RequestValidationError(
            [{**err, "loc": ("body", *err["loc"])} for err in exc.errors()]
        ) from exc
    cells: DirectCells = request.app.state.direct_cells
    scheme, token = get_authorization_scheme_param(request.headers.get("authorization"))
    token = token if scheme.lower() == "bearer" else ""
    session_id = request.path_params["session_id"]
    result = await run_in_threadpool(cells.execute, token, session_id, body.code, body.timeout_s)
    return rendered(ExecuteOut.model_validate(result))


def install_direct(app: FastAPI, cells: DirectCells, max_json_bytes: int, max_depth: int) -> None:
    """Serve direct cells from `app` (the worker's internal server)."""
    app.state.direct_cells = cells
    app.router.routes.append(
        Route(PREFIX + "sessions/{session_id}/execute", execute, methods=["POST"])
    )
    app.add_middleware(
        problems.BodyGuard,
        max_json_bytes=max_json_bytes,
        max_upload_bytes=max_json_bytes,
        max_depth=max_depth,
        prefix=PREFIX,
    )
