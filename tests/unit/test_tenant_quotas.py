"""An admin changes a tenant's quotas: validated like at creation, applied to the next request,
audited; tenants cannot, and an unknown tenant is 404."""

import time

import pytest

from sandcell.domain.errors import InvalidRequest
from sandcell.services.jobs import TENANT_FRESH_S
from tests.conftest import ADMIN_KEY, Api

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def _tenant(api: Api, name: str) -> tuple[str, dict[str, str]]:
    tenant = api.http.post("/v1/admin/tenants", json={"name": name}, headers=ADMIN).json()
    key = api.http.post(f"/v1/admin/tenants/{tenant['id']}/keys", headers=ADMIN).json()
    return tenant["id"], {"Authorization": f"Bearer {key['key']}"}


def _patch(api: Api, tenant_id: str, body: object, headers: dict[str, str] = ADMIN) -> dict:
    answer = api.http.patch(f"/v1/admin/tenants/{tenant_id}", json=body, headers=headers)
    return {"status": answer.status_code, **answer.json()}


def test_changed_quotas_apply_to_the_next_request_and_null_resets_one(api: Api) -> None:
    tenant_id, alice = _tenant(api, "alice")
    assert api.http.post("/v1/sessions", json={}, headers=alice).status_code == 201
    changed = _patch(api, tenant_id, {"quotas": {"sessions": 1, "jobs_per_minute": 30}})
    assert changed["status"] == 200 and changed["name"] == "alice"
    assert changed["quota_overrides"] == {"sessions": 1, "jobs_per_minute": 30}
    assert changed["quotas"]["sessions"] == 1 and changed["quotas"]["concurrent_jobs"] == 16
    refused = api.http.post("/v1/sessions", json={}, headers=alice)
    assert refused.status_code == 429 and "Retry-After" in refused.headers
    listed = api.http.get("/v1/admin/overview/tenants", headers=ADMIN).json()["items"]
    assert next(t for t in listed if t["id"] == tenant_id)["quotas"]["sessions"] == 1

    reset = _patch(api, tenant_id, {"quotas": {"sessions": None}})
    assert reset["quota_overrides"] == {"jobs_per_minute": 30}
    assert reset["quotas"]["sessions"] == 4  # the server's default again
    assert api.http.post("/v1/sessions", json={}, headers=alice).status_code == 201
    unchanged = _patch(api, tenant_id, {})
    assert unchanged["status"] == 200 and unchanged["quota_overrides"] == {"jobs_per_minute": 30}


def test_bad_quotas_are_refused_naming_the_field(api: Api) -> None:
    tenant_id, _ = _tenant(api, "alice")
    for body, field in [
        ({"quotas": {"sessions": -1}}, "quotas.sessions"),
        ({"quotas": {"sessions": "3"}}, "quotas.sessions"),
        ({"quotas": {"concurrent_jobs": 1.5}}, "quotas.concurrent_jobs"),
        ({"quotas": {"jobs_per_minute": 0}}, "quotas.jobs_per_minute"),
        ({"quotas": {"burst": True}}, "quotas.burst"),
        ({"quotas": {"cpus": 4}}, "quotas.cpus"),
        ({"name": "renamed"}, "name"),
    ]:
        answer = api.http.patch(f"/v1/admin/tenants/{tenant_id}", json=body, headers=ADMIN)
        assert answer.status_code == 422, body
        assert answer.headers["content-type"] == "application/problem+json"
        assert field in [e["field"] for e in answer.json()["errors"]], answer.json()
    assert _patch(api, tenant_id, {"quotas": {"burst": 3}})["quota_overrides"] == {"burst": 3}


def test_only_an_admin_changes_quotas_of_a_tenant_that_exists_and_it_is_audited(
    api: Api,
) -> None:
    tenant_id, alice = _tenant(api, "alice")
    assert _patch(api, "ten_nope", {"quotas": {"sessions": 1}})["status"] == 404
    assert _patch(api, tenant_id, {"quotas": {"sessions": 99}}, alice)["status"] == 403
    no_key = api.http.patch(f"/v1/admin/tenants/{tenant_id}", json={"quotas": {}})
    assert no_key.status_code == 401
    _patch(api, tenant_id, {"quotas": {"storage_mb": 5, "burst": None}})
    trail = api.http.get("/v1/admin/audit", params={"action": "tenant.quotas"}, headers=ADMIN)
    [event] = trail.json()["items"]
    assert event["target"] == tenant_id and event["actor"] == "env-admin"
    assert event["detail"] == {"changes": {"storage_mb": 5, "burst": None}}


def test_the_service_refuses_names_that_are_not_quotas(api: Api) -> None:
    tenant_id, _ = _tenant(api, "alice")
    with pytest.raises(InvalidRequest) as refused:
        api.services.auth.set_quotas(tenant_id, {"gpus": 1})
    assert [e.field for e in refused.value.errors] == ["quotas.gpus"]


def test_a_job_submit_is_held_to_changed_quotas_at_once_and_to_unheard_ones_within_a_second(
    api: Api,
) -> None:
    tenant_id, alice = _tenant(api, "carol")
    job = {"code": "print(1)"}
    assert api.http.post("/v1/jobs", json=job, headers=alice).status_code == 202  # tenant kept
    assert _patch(api, tenant_id, {"quotas": {"concurrent_jobs": 1}})["status"] == 200
    refused = api.http.post("/v1/jobs", json=job, headers=alice)  # the change was heard
    assert refused.status_code == 429, refused.text
    # Another process's change whose notification was lost: seen within TENANT_FRESH_S.
    api.services.store.patch_tenant_quotas(tenant_id, {"concurrent_jobs": 16})
    changed_at = time.monotonic()
    while api.http.post("/v1/jobs", json=job, headers=alice).status_code == 429:
        assert time.monotonic() - changed_at < TENANT_FRESH_S + 0.5
        time.sleep(0.05)
