"""The web dashboard: its static single-page app at /ui/, and the few JSON reads it needs
beyond the v1 API.

The page holds the API key in the browser's sessionStorage and sends it as a Bearer header,
never in a URL or a cookie, so there is nothing for another site to ride on (no CSRF). The
reads added here follow the API's rules: `whoami` is any caller's own view; everything across
tenants is under /v1/admin/ and needs the admin scope.
"""

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import RedirectResponse
from prometheus_client.core import Metric
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from sandcell import __version__
from sandcell.api.deps import Admin, Caller, Services, Svc
from sandcell.api.metrics import StoreCollector
from sandcell.api.problems import problem_responses
from sandcell.api.schemas import LogsOut
from sandcell.api.ui_schemas import (
    GaugeOut,
    HistogramOut,
    ImageOut,
    KeyPage,
    KeySummary,
    OverviewHealth,
    TenantJobOut,
    TenantJobPage,
    TenantPage,
    TenantSummary,
    WhoAmI,
    WorkerOut,
)
from sandcell.api.views import iso, jobs_out, log_text
from sandcell.domain.errors import NotFound, RuntimeUnavailable
from sandcell.domain.records import LIVE_WORKER_S, Job
from sandcell.domain.states import JobState
from sandcell.ports.overview import Overview

WEB_ROOT = Path(__file__).resolve().parent.parent / "web"
# Everything the page loads comes from this origin, as files: no inline script or style, no
# eval, no plugins, never framed. Session charts are PNGs that arrive as base64 (data: URLs).
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "font-src 'self'",
        "object-src 'none'",
        "frame-src 'none'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
        "form-action 'self'",
    ]
)
UI_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
    "Cross-Origin-Opener-Policy": "same-origin",
}

router = APIRouter(prefix="/v1")


def overview(request: Request) -> Overview:
    found: Overview | None = getattr(request.app.state, "overview", None)
    if found is None:
        raise RuntimeUnavailable("this server was built without the operator overview")
    return found


@router.get("/ui/whoami", response_model=WhoAmI, tags=["dashboard"])
def whoami(svc: Svc, who: Caller) -> WhoAmI:
    """Who this key is: the dashboard signs in with it and picks the tenant or admin view."""
    tenant = svc.store.get_tenant(who.tenant_id) if who.tenant_id else None
    return WhoAmI(
        key_id=who.key_id,
        tenant_id=who.tenant_id,
        tenant_name=tenant.name if tenant else None,
        scopes=sorted(who.scopes),
        admin=who.is_admin,
    )


@router.get("/admin/overview/health", response_model=OverviewHealth, tags=["admin"])
def health(svc: Svc, _: Admin, request: Request) -> OverviewHealth:
    """Runtime and version, images and digests, queue, sandboxes, pools and latencies: the
    figures /metrics exposes, as JSON."""
    figures = _figures(StoreCollector(svc.store).collect())
    figures.update(_figures(request.app.state.ack_histogram.collect()))
    jobs_by_state: dict[str, int] = {}
    for labels, value in figures.get("sandcell_jobs", []):
        state = labels["state"]
        jobs_by_state[state] = jobs_by_state.get(state, 0) + int(value)
    return OverviewHealth(
        version=__version__,
        store_up=_gauge(figures, "sandcell_store_up") == 1,
        workers=_workers(svc),
        images=_images(svc),
        queue_depth=jobs_by_state.get(JobState.ACCEPTED.value, 0),
        sandboxes_running=int(_gauge(figures, "sandcell_sandboxes_running")),
        jobs_by_state=jobs_by_state,
        pools=[
            GaugeOut(name=name, labels=labels, value=value)
            for name, samples in figures.items()
            if "pool" in name
            for labels, value in samples
        ],
        latency=_histograms(figures),
    )


Samples = dict[str, list[tuple[dict[str, str], float]]]


def _figures(metrics: Iterable[Metric]) -> Samples:
    found: Samples = {}
    for metric in metrics:
        for sample in metric.samples:
            found.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return found


def _gauge(figures: Samples, name: str) -> float:
    samples = figures.get(name) or [({}, 0.0)]
    return samples[0][1]


def _histograms(figures: Samples) -> list[HistogramOut]:
    found = []
    for name in sorted(figures):
        if not name.endswith("_seconds_bucket"):
            continue
        base = name.removesuffix("_bucket")
        finite = [(float(lb["le"]), v) for lb, v in figures[name] if lb.get("le") != "+Inf"]
        found.append(
            HistogramOut(
                name=base,
                bounds_s=[bound for bound, _ in finite],
                cumulative=[int(count) for _, count in finite],
                count=int(_gauge(figures, f"{base}_count")),
                sum_s=_gauge(figures, f"{base}_sum"),
            )
        )
    return found


def _workers(svc: Services) -> list[WorkerOut]:
    return [
        WorkerOut(
            id=w.id,
            host=w.host,
            runtime=w.runtime,
            runtime_version=w.runtime_version,
            started_at=iso(w.started_at) or "",
        )
        for w in svc.store.live_workers(time.time() - LIVE_WORKER_S)
    ]


def _images(svc: Services) -> list[ImageOut]:
    images = []
    for name in sorted(svc.images.names()):
        image = svc.images.get(name)
        images.append(ImageOut(name=image.name, version=image.version, digest=image.digest))
    return images


@router.get("/admin/overview/tenants", response_model=TenantPage, tags=["admin"])
def tenants(svc: Svc, _: Admin, request: Request) -> TenantPage:
    """Every tenant with its limits, allowed images and quotas (in effect, and set for it).
    Change them with PATCH /v1/admin/tenants/{id}."""
    return TenantPage(
        items=[
            TenantSummary(
                id=t.id,
                name=t.name,
                created_at=iso(t.created_at) or "",
                limits=t.limits,
                images=t.images,
                quotas=svc.jobs.policy.quotas_for(t).as_dict(),
                quota_overrides=t.quotas,
            )
            for t in overview(request).tenants()
        ]
    )


@router.get("/admin/overview/keys", response_model=KeyPage, tags=["admin"])
def keys(_: Admin, request: Request) -> KeyPage:
    """Every stored key by id (never its secret), revoked ones included."""
    return KeyPage(
        items=[
            KeySummary(
                id=k.id,
                tenant_id=k.tenant_id,
                scopes=k.scopes,
                created_at=iso(k.created_at) or "",
                revoked_at=iso(k.revoked_at),
            )
            for k in overview(request).api_keys()
        ]
    )


def _tenant_jobs(svc: Services, jobs: list[Job]) -> list[TenantJobOut]:
    return [
        TenantJobOut(**record.model_dump(), tenant_id=job.tenant_id)
        for job, record in zip(jobs, jobs_out(svc.store, jobs), strict=True)
    ]


@router.get("/admin/overview/jobs", response_model=TenantJobPage, tags=["admin"])
def jobs(
    svc: Svc,
    _: Admin,
    request: Request,
    tenant_id: Annotated[str | None, Query(max_length=64)] = None,
    state: JobState | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> TenantJobPage:
    """The newest jobs of every tenant (or of one), each naming its tenant."""
    found = overview(request).jobs(tenant_id, state, limit)
    return TenantJobPage(items=_tenant_jobs(svc, found))


def _any_job(request: Request, job_id: str) -> Job:
    job = overview(request).job(job_id)
    if job is None:
        raise NotFound("no such job")
    return job


@router.get(
    "/admin/overview/jobs/{job_id}",
    response_model=TenantJobOut,
    tags=["admin"],
    responses=problem_responses(404),
)
def job(svc: Svc, _: Admin, request: Request, job_id: str) -> TenantJobOut:
    [one] = _tenant_jobs(svc, [_any_job(request, job_id)])
    return one


@router.get(
    "/admin/overview/jobs/{job_id}/logs",
    response_model=LogsOut,
    tags=["admin"],
    responses=problem_responses(404),
)
def job_logs(svc: Svc, _: Admin, request: Request, job_id: str) -> LogsOut:
    found = _any_job(request, job_id)
    streams: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
    for chunk in svc.store.read_logs(found.id, -1):
        streams[chunk.stream].extend(chunk.data)
    return LogsOut(
        stdout=log_text(bytes(streams["stdout"])), stderr=log_text(bytes(streams["stderr"]))
    )


class DashboardFiles(StaticFiles):
    """The page's files, each answer with the dashboard's security headers."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(UI_HEADERS)
        return response


def install(app: FastAPI) -> None:
    """Add the dashboard's reads and serve the page at /ui/ (and send / there)."""
    app.include_router(router)
    app.mount("/ui", DashboardFiles(directory=WEB_ROOT, html=True), name="ui")

    @app.get("/", include_in_schema=False)
    def home() -> RedirectResponse:
        return RedirectResponse("/ui/", headers=UI_HEADERS)
