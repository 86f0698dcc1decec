"""The overview port: read-only views across tenants, for an operator (the admin dashboard).

Tenant-facing reads go through the Store and always name a tenant; these deliberately do not,
so only admin routes may use them.
"""

from typing import Protocol

from sandcell.domain.records import ApiKey, Job, Tenant
from sandcell.domain.states import JobState


class Overview(Protocol):
    def tenants(self) -> list[Tenant]:
        """Every tenant, oldest first."""

    def api_keys(self) -> list[ApiKey]:
        """Every stored key (admin and tenant keys, revoked ones too), newest first."""

    def jobs(self, tenant_id: str | None, state: JobState | None, limit: int) -> list[Job]:
        """The newest jobs of one tenant, or of all of them."""

    def job(self, job_id: str) -> Job | None:
        """Any tenant's job."""
