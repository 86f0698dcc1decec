"""The FastAPI application: routes, problem details, the body guard, health and metrics."""

import time

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from prometheus_client import make_asgi_app

from sandcell import __version__
from sandcell.api import admin, admin_workers, problems, routes, session_routes, ui_routes
from sandcell.api.deps import Services
from sandcell.api.metrics import registry_for
from sandcell.api.requests import RequestLog
from sandcell.api.schemas import HealthOut, ReadyOut
from sandcell.api.waiting import EndSweep
from sandcell.api.warm import warmed
from sandcell.domain.records import LIVE_WORKER_S


def create_app(
    services: Services, max_json_bytes: int, max_upload_bytes: int, max_depth: int
) -> FastAPI:
    app = FastAPI(
        title="sandcell",
        version=__version__,
        description="Secure code-interpreter jobs in gVisor sandboxes.",
        lifespan=warmed,
    )
    app.state.services = services
    app.state.end_sweep = EndSweep(services.store.ended_among)  # every `?wait=`'s fallback
    problems.install(app)
    app.include_router(routes.router)
    app.include_router(session_routes.router)
    app.include_router(admin.router)
    app.include_router(admin_workers.router)
    app.state.max_upload_bytes = max_upload_bytes
    app.add_middleware(
        problems.BodyGuard,
        max_json_bytes=max_json_bytes,
        max_upload_bytes=max_upload_bytes,
        max_depth=max_depth,
    )
    app.add_middleware(RequestLog)
    registry, app.state.ack_histogram = registry_for(services.store)
    app.mount("/metrics", make_asgi_app(registry))
    ui_routes.install(app)  # the web dashboard at /ui/ and the reads it needs

    @app.get("/healthz", tags=["health"], response_model=HealthOut)
    def healthz() -> HealthOut:
        return HealthOut(status="ok")

    @app.get(
        "/readyz",
        tags=["health"],
        response_model=ReadyOut,
        responses={503: {"model": ReadyOut, "description": "not ready: see `checks`"}},
    )
    def readyz() -> JSONResponse:
        checks = {
            "store": _ok(services.store.ping),
            "image": _ok(lambda: services.images.get(services.default_image)),
            "runtime": _ok(lambda: _a_live_worker(services)),
        }
        ready = all(checks.values())
        return JSONResponse({"ready": ready, "checks": checks}, 200 if ready else 503)

    return app


def _a_live_worker(services: Services) -> None:
    """The API never touches the runtime; a worker that checked it recently stands for it."""
    if not services.store.live_workers(time.time() - LIVE_WORKER_S):
        raise LookupError("no worker has reported in")


def _ok(check: object) -> bool:
    try:
        check()  # type: ignore[operator]
    except Exception:
        return False
    return True
