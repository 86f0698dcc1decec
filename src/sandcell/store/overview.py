"""SqlOverview: the Overview port (cross-tenant reads for operators) over SQLAlchemy Core."""

from sqlalchemy import Engine, select

from sandcell.domain.records import ApiKey, Job, Tenant
from sandcell.domain.states import JobState
from sandcell.store.schema import api_keys, jobs, tenants
from sandcell.store.sql import _job_from_row, _reachable, _tenant_from_row


class SqlOverview:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def tenants(self) -> list[Tenant]:
        query = select(tenants).order_by(tenants.c.created_at, tenants.c.id)
        with _reachable(), self.engine.connect() as conn:
            return [_tenant_from_row(row) for row in conn.execute(query)]

    def api_keys(self) -> list[ApiKey]:
        columns = [api_keys.c[name] for name in ("id", "tenant_id", "scopes", "created_at")]
        query = select(*columns, api_keys.c.revoked_at).order_by(api_keys.c.created_at.desc())
        with _reachable(), self.engine.connect() as conn:
            return [ApiKey(**dict(row._mapping)) for row in conn.execute(query)]

    def jobs(self, tenant_id: str | None, state: JobState | None, limit: int) -> list[Job]:
        query = select(jobs)
        if tenant_id is not None:
            query = query.where(jobs.c.tenant_id == tenant_id)
        if state is not None:
            query = query.where(jobs.c.state == state.value)
        query = query.order_by(jobs.c.accepted_at.desc(), jobs.c.id.desc()).limit(limit)
        with _reachable(), self.engine.connect() as conn:
            return [_job_from_row(row) for row in conn.execute(query)]

    def job(self, job_id: str) -> Job | None:
        with _reachable(), self.engine.connect() as conn:
            row = conn.execute(select(jobs).where(jobs.c.id == job_id)).first()
        return _job_from_row(row) if row else None
