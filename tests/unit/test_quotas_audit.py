"""Quotas and rate limits answer 429 with Retry-After; the audit trail records what matters."""

from tests.conftest import ADMIN_KEY, Api

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def _tenant(api: Api, name: str, quotas: dict) -> dict[str, str]:
    tenant = api.http.post(
        "/v1/admin/tenants", json={"name": name, "quotas": quotas}, headers=ADMIN
    )
    assert tenant.status_code == 201, tenant.text
    key = api.http.post(f"/v1/admin/tenants/{tenant.json()['id']}/keys", headers=ADMIN).json()
    return {"Authorization": f"Bearer {key['key']}"}


def test_concurrent_job_quota_refuses_with_retry_after_but_replays_still_answer(api: Api) -> None:
    alice = _tenant(api, "alice", {"concurrent_jobs": 2})
    first = api.http.post("/v1/jobs", json={"code": "1"}, headers=alice | {"Idempotency-Key": "a"})
    api.http.post("/v1/jobs", json={"code": "2"}, headers=alice)
    refused = api.http.post("/v1/jobs", json={"code": "3"}, headers=alice)
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
    assert refused.json()["type"] == "/problems/quota-exceeded"
    replay = api.http.post("/v1/jobs", json={"code": "1"}, headers=alice | {"Idempotency-Key": "a"})
    assert replay.status_code == 200 and replay.json()["id"] == first.json()["id"]
    api.http.post(f"/v1/jobs/{first.json()['id']}/cancel", headers=alice)
    assert api.http.post("/v1/jobs", json={"code": "4"}, headers=alice).status_code == 202


def test_rate_limit_is_a_token_bucket_kept_in_the_store(api: Api) -> None:
    alice = _tenant(api, "alice", {"jobs_per_minute": 1, "burst": 2})
    codes = [
        api.http.post("/v1/jobs", json={"code": "1"}, headers=alice).status_code for _ in range(3)
    ]
    assert codes == [202, 202, 429]
    refused = api.http.post("/v1/jobs", json={"code": "1"}, headers=alice)
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    # Another tenant has its own bucket.
    bob = _tenant(api, "bob", {"jobs_per_minute": 1, "burst": 1})
    assert api.http.post("/v1/jobs", json={"code": "1"}, headers=bob).status_code == 202


def test_storage_quota_refuses_uploads(api: Api) -> None:
    alice = _tenant(api, "alice", {"storage_mb": 0})
    refused = api.http.post("/v1/files", files={"file": ("a", b"x")}, headers=alice)
    assert refused.status_code == 429 and "Retry-After" in refused.headers


def test_audit_records_admin_actions_refused_keys_cancels_and_retirements(api: Api) -> None:
    tenant = api.http.post("/v1/admin/tenants", json={"name": "t"}, headers=ADMIN).json()
    key = api.http.post(f"/v1/admin/tenants/{tenant['id']}/keys", headers=ADMIN).json()
    auth = {"Authorization": f"Bearer {key['key']}"}
    job = api.http.post("/v1/jobs", json={"code": "1"}, headers=auth).json()
    api.http.post(f"/v1/jobs/{job['id']}/cancel", headers=auth)
    api.http.delete(f"/v1/jobs/{job['id']}", headers=auth)
    api.http.delete(f"/v1/admin/keys/{key['id']}", headers=ADMIN)
    assert api.http.get("/v1/jobs", headers=auth).status_code == 401  # a revoked key, tried
    trail = api.http.get("/v1/admin/audit", headers=ADMIN)
    assert trail.status_code == 200
    actions = [e["action"] for e in trail.json()["items"]]
    for action in ("tenant.create", "key.create", "job.cancel", "job.retire", "key.revoke"):
        assert action in actions
    failure = next(e for e in trail.json()["items"] if e["action"] == "auth.failure")
    assert failure["actor"] == key["id"] and failure["outcome"] == "denied"
    assert key["key"].split("_", 2)[2] not in trail.text  # the secret part is never recorded
    only = api.http.get("/v1/admin/audit", params={"action": "job.retire"}, headers=ADMIN).json()
    assert [e["target"] for e in only["items"]] == [job["id"]]
    assert api.http.get("/v1/admin/audit", headers=api.tenant("other")).status_code == 403
