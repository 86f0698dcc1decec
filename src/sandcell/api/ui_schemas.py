"""Bodies of the endpoints the web dashboard needs beyond the v1 API (see ui_routes)."""

from typing import Any

from pydantic import BaseModel

from sandcell.api.schemas import JobOut


class WhoAmI(BaseModel):
    """The caller, as the dashboard shows it: a tenant's key or an admin key."""

    key_id: str
    tenant_id: str | None
    tenant_name: str | None
    scopes: list[str]
    admin: bool


class WorkerOut(BaseModel):
    id: str
    host: str
    runtime: str
    runtime_version: str
    started_at: str


class ImageOut(BaseModel):
    name: str
    version: str
    digest: str


class HistogramOut(BaseModel):
    """One latency histogram of /metrics: cumulative counts per upper bound, as Prometheus."""

    name: str
    bounds_s: list[float]
    cumulative: list[int]
    count: int
    sum_s: float


class GaugeOut(BaseModel):
    name: str
    labels: dict[str, str]
    value: float


class OverviewHealth(BaseModel):
    """The health panel: what runs the jobs, and the figures /metrics exposes."""

    version: str
    store_up: bool
    workers: list[WorkerOut]
    images: list[ImageOut]
    queue_depth: int
    sandboxes_running: int
    jobs_by_state: dict[str, int]
    pools: list[GaugeOut]
    latency: list[HistogramOut]


class KeySummary(BaseModel):
    id: str
    tenant_id: str | None
    scopes: list[str]
    created_at: str
    revoked_at: str | None


class KeyPage(BaseModel):
    items: list[KeySummary]


class TenantSummary(BaseModel):
    id: str
    name: str
    created_at: str
    limits: dict[str, Any]
    images: list[str] | None
    quotas: dict[str, Any]  # in effect
    quota_overrides: dict[str, Any]  # set for this tenant (the rest are the defaults)


class TenantPage(BaseModel):
    items: list[TenantSummary]


class TenantJobOut(JobOut):
    tenant_id: str


class TenantJobPage(BaseModel):
    items: list[TenantJobOut]
