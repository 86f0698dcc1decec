"""`sandcell admin set-quotas`: change a tenant's quotas on this host's store, audited.

Values are checked by the same model as the API's (`QuotasIn`), so the command accepts
exactly what `PATCH /v1/admin/tenants/{id}` accepts.
"""

import json
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from sandcell.domain.quotas import Quotas
from sandcell.settings import Settings

console = Console()
err = Console(stderr=True)
QUOTA_NAMES = sorted(Quotas().as_dict())


def set_quotas(
    tenant_id: str,
    concurrent_jobs: Annotated[int | None, typer.Option(help="jobs queued or running")] = None,
    sessions: Annotated[int | None, typer.Option(help="live sessions")] = None,
    storage_mb: Annotated[int | None, typer.Option(help="files and artifacts, MiB")] = None,
    jobs_per_minute: Annotated[float | None, typer.Option(help="sustained submissions")] = None,
    burst: Annotated[int | None, typer.Option(help="submissions at once above the rate")] = None,
    reset: Annotated[
        list[str] | None,
        typer.Option(help=f"put a quota back to the default: {', '.join(QUOTA_NAMES)}"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Change a tenant's quotas; the next submission or session is held to them."""
    given = {
        "concurrent_jobs": concurrent_jobs,
        "sessions": sessions,
        "storage_mb": storage_mb,
        "jobs_per_minute": jobs_per_minute,
        "burst": burst,
    }
    changes = _validated({k: v for k, v in given.items() if v is not None}) | _resets(reset)
    from sandcell.app import build_services  # lazily: other commands start without it

    services = build_services(Settings())
    tenant = services.auth.set_quotas(tenant_id, changes, actor="cli")
    effective = services.jobs.policy.quotas_for(tenant).as_dict()
    if as_json:
        answer = {"id": tenant.id, "name": tenant.name, "quotas": effective}
        print(json.dumps(answer | {"quota_overrides": tenant.quotas}))
        return
    table = Table("quota", "in effect", "from", title=f"{tenant.name} ({tenant.id})")
    for name, value in effective.items():
        table.add_row(name, str(value), "tenant" if name in tenant.quotas else "default")
    console.print(table)


def _validated(values: dict[str, Any]) -> dict[str, Any]:
    from sandcell.api.schemas import QuotasIn  # lazily: the API's schemas cost every command 0.2 s

    try:
        return QuotasIn.model_validate(values).model_dump(exclude_unset=True)
    except ValidationError as exc:
        problems = "; ".join(
            f"--{str(e['loc'][0]).replace('_', '-')}: {e['msg']}" for e in exc.errors()
        )
        err.print(f"[red]error:[/red] {problems}", highlight=False)
        raise typer.Exit(2) from exc


def _resets(names: list[str] | None) -> dict[str, None]:
    unknown = sorted(set(names or []) - set(QUOTA_NAMES))
    if unknown:
        raise typer.BadParameter(f"not a quota: {', '.join(unknown)}", param_hint="--reset")
    return dict.fromkeys(names or [])
