"""Every endpoint of the API as a `Call`: built once here, sent by either client."""

from typing import IO, Any
from urllib.parse import quote

from sandcell_client._base import (
    LONG_POLL_S,
    SLOW_TIMEOUT,
    Call,
    Progress,
    file_part,
    items,
    model,
    nothing,
    raw,
)
from sandcell_client._models import (
    ApiKey,
    Artifact,
    Cell,
    CellRecord,
    DeletionReport,
    DirectAccess,
    FileEntry,
    FileInfo,
    FileWritten,
    Job,
    JobPage,
    Logs,
    Secret,
    SessionInfo,
    SignedUrl,
    Tenant,
    TenantQuotas,
)


def _id(value: str) -> str:
    return quote(value, safe="")


def _workspace(path: str) -> str:
    return quote(path.lstrip("/"), safe="/")


# files and jobs


def upload_file(name: str, body: bytes | IO[bytes], progress: Progress | None) -> Call[FileInfo]:
    return Call("POST", "/v1/files", model(FileInfo), files=file_part(name, body, progress))


def get_file(file_id: str) -> Call[FileInfo]:
    return Call("GET", f"/v1/files/{_id(file_id)}", model(FileInfo), idempotent=True)


def delete_file(file_id: str) -> Call[None]:
    return Call("DELETE", f"/v1/files/{_id(file_id)}", nothing, idempotent=True)


def submit(body: dict[str, Any], idempotency_key: str, wait: float = 0) -> Call[Job]:
    """With its Idempotency-Key a resent submit is the same job, never a second one. With
    `wait`, the answer comes once the job is terminal (or `wait` runs out)."""
    headers = {"Idempotency-Key": idempotency_key}
    params = {"wait": min(wait, 60)} if wait else None
    timeout = wait + LONG_POLL_S if wait else None
    return Call(
        "POST",
        "/v1/jobs",
        model(Job),
        params,
        json=body,
        headers=headers,
        timeout=timeout,
        idempotent=True,
    )


def get_job(job_id: str, wait: float = 0) -> Call[Job]:
    params = {"wait": min(wait, 60)} if wait else None
    timeout = wait + LONG_POLL_S if wait else None
    return Call(
        "GET", f"/v1/jobs/{_id(job_id)}", model(Job), params, timeout=timeout, idempotent=True
    )


def list_jobs(state: str | None, cursor: str | None, limit: int) -> Call[JobPage]:
    params: dict[str, Any] = {"limit": limit}
    params |= {k: v for k, v in (("state", state), ("cursor", cursor)) if v}
    return Call("GET", "/v1/jobs", model(JobPage), params, idempotent=True)


def job_logs(job_id: str) -> Call[Logs]:
    return Call("GET", f"/v1/jobs/{_id(job_id)}/logs", model(Logs), idempotent=True)


def log_stream(job_id: str) -> Call[None]:
    headers = {"Accept": "text/event-stream"}
    return Call("GET", f"/v1/jobs/{_id(job_id)}/logs", nothing, headers=headers, idempotent=True)


def cancel(job_id: str) -> Call[Job]:
    # Cancelling twice is cancelling once: a terminal job answers its state.
    return Call("POST", f"/v1/jobs/{_id(job_id)}/cancel", model(Job), idempotent=True)


def retire(job_id: str) -> Call[DeletionReport]:
    return Call("DELETE", f"/v1/jobs/{_id(job_id)}", model(DeletionReport), idempotent=True)


# artifacts


def get_artifact(artifact_id: str) -> Call[Artifact]:
    return Call("GET", f"/v1/artifacts/{_id(artifact_id)}", model(Artifact), idempotent=True)


def artifact_content(artifact_id: str) -> Call[bytes]:
    path = f"/v1/artifacts/{_id(artifact_id)}/content"
    return Call("GET", path, raw, idempotent=True)


def sign_artifact(artifact_id: str) -> Call[SignedUrl]:
    return Call("POST", f"/v1/artifacts/{_id(artifact_id)}/url", model(SignedUrl))


# secrets


def put_secret(name: str, value: str) -> Call[Secret]:
    body = {"name": name, "value": value}
    return Call("POST", "/v1/secrets", model(Secret), json=body, idempotent=True)


def list_secrets() -> Call[list[Secret]]:
    return Call("GET", "/v1/secrets", items(Secret), idempotent=True)


def delete_secret(name: str) -> Call[None]:
    return Call("DELETE", f"/v1/secrets/{_id(name)}", nothing, idempotent=True)


# admin


def create_tenant(body: dict[str, Any]) -> Call[Tenant]:
    return Call("POST", "/v1/admin/tenants", model(Tenant), json=body)


def create_key(tenant_id: str, scopes: list[str] | None) -> Call[ApiKey]:
    body = {"scopes": scopes} if scopes else {}
    return Call("POST", f"/v1/admin/tenants/{_id(tenant_id)}/keys", model(ApiKey), json=body)


def set_quotas(tenant_id: str, quotas: dict[str, Any]) -> Call[TenantQuotas]:
    path = f"/v1/admin/tenants/{_id(tenant_id)}"
    body = {"quotas": quotas}
    return Call("PATCH", path, model(TenantQuotas), json=body, idempotent=True)


def revoke_key(key_id: str) -> Call[None]:
    return Call("DELETE", f"/v1/admin/keys/{_id(key_id)}", nothing, idempotent=True)


def audit(params: dict[str, Any]) -> Call[list[dict[str, Any]]]:
    def parse(response: Any) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = response.json()["items"]
        return events

    return Call("GET", "/v1/admin/audit", parse, params, idempotent=True)


# health


def health(path: str) -> Call[dict[str, Any]]:
    def parse(response: Any) -> dict[str, Any]:
        answer: dict[str, Any] = response.json()
        return answer

    return Call("GET", path, parse, idempotent=True)


# sessions


def _session(session_id: str, suffix: str = "") -> str:
    return f"/v1/sessions/{_id(session_id)}{suffix}"


def create_session(body: dict[str, Any]) -> Call[SessionInfo]:
    return Call("POST", "/v1/sessions", model(SessionInfo), json=body, timeout=SLOW_TIMEOUT)


def get_session(session_id: str) -> Call[SessionInfo]:
    return Call("GET", _session(session_id), model(SessionInfo), idempotent=True)


def list_sessions(live: bool) -> Call[list[SessionInfo]]:
    params = {"live": "true"} if live else None
    return Call("GET", "/v1/sessions", items(SessionInfo), params, idempotent=True)


def stop_session(session_id: str) -> Call[SessionInfo]:
    path = _session(session_id)
    return Call("DELETE", path, model(SessionInfo), timeout=SLOW_TIMEOUT, idempotent=True)


def execute(session_id: str, code: str, timeout_s: float, stream: bool = False) -> Call[Cell]:
    headers = {"Accept": "text/event-stream"} if stream else {}
    body = {"code": code, "timeout_s": timeout_s}
    path = _session(session_id, "/execute")
    return Call("POST", path, model(Cell), json=body, headers=headers, timeout=timeout_s + 30)


def direct_access(session_id: str) -> Call[DirectAccess]:
    return Call("POST", _session(session_id, "/direct"), model(DirectAccess), idempotent=True)


def direct_execute(access: DirectAccess, code: str, timeout_s: float) -> Call[Cell]:
    """A cell sent to the worker's URL (absolute), with the session's token, not the key."""
    headers = {"Authorization": f"Bearer {access.token}"}
    body = {"code": code, "timeout_s": timeout_s}
    url, parse = access.execute_url, model(Cell)
    return Call("POST", url, parse, json=body, headers=headers, timeout=timeout_s + 30)


def session_cells(session_id: str, after: int | None, limit: int) -> Call[list[CellRecord]]:
    params: dict[str, Any] = {"limit": limit} | ({"after": after} if after is not None else {})
    return Call("GET", _session(session_id, "/cells"), items(CellRecord), params, idempotent=True)


def interrupt(session_id: str) -> Call[None]:
    return Call("POST", _session(session_id, "/interrupt"), nothing, idempotent=True)


def pause(session_id: str) -> Call[SessionInfo]:
    path = _session(session_id, "/pause")
    return Call("POST", path, model(SessionInfo), timeout=SLOW_TIMEOUT)


def resume(session_id: str) -> Call[SessionInfo]:
    path = _session(session_id, "/resume")
    return Call("POST", path, model(SessionInfo), timeout=SLOW_TIMEOUT)


def put_workspace_file(session_id: str, path: str, content: bytes) -> Call[FileWritten]:
    url = _session(session_id, f"/files/{_workspace(path)}")
    return Call("PUT", url, model(FileWritten), content=content, idempotent=True)


def get_workspace_file(session_id: str, path: str) -> Call[bytes]:
    url = _session(session_id, f"/files/{_workspace(path)}")
    return Call("GET", url, raw, idempotent=True)


def list_workspace(session_id: str, path: str) -> Call[list[FileEntry]]:
    url = _session(session_id, "/files")
    return Call("GET", url, items(FileEntry), {"path": path}, idempotent=True)


def preview_url(session_id: str, port: int) -> Call[str]:
    def parse(response: Any) -> str:
        url: str = response.json()["url"]
        return url

    return Call("POST", _session(session_id, f"/ports/{port}/url"), parse)
