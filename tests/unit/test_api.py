"""The HTTP contract over the real app in-process: auth, validation, idempotency, tenancy."""

import pytest

from tests.conftest import ADMIN_KEY, Api

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def _problem(response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert {"type", "title", "status", "detail"} <= body.keys()
    assert body["status"] == status
    assert "Traceback" not in response.text
    return body


def test_requests_without_a_valid_key_are_refused(api: Api) -> None:
    _problem(api.http.get("/v1/jobs"), 401)
    _problem(api.http.get("/v1/jobs", headers={"Authorization": "Bearer sc_nope_nope"}), 401)
    _problem(api.http.get("/v1/jobs", headers={"Authorization": "Basic abc"}), 401)


def test_tenant_keys_cannot_use_admin_routes_and_admin_keys_own_no_jobs(api: Api) -> None:
    alice = api.tenant("alice")
    _problem(api.http.post("/v1/admin/tenants", json={"name": "x"}, headers=alice), 403)
    _problem(api.http.get("/v1/jobs", headers=ADMIN), 403)


def test_revoked_key_is_refused_at_once(api: Api) -> None:
    tenant = api.http.post("/v1/admin/tenants", json={"name": "t"}, headers=ADMIN).json()
    key = api.http.post(f"/v1/admin/tenants/{tenant['id']}/keys", headers=ADMIN).json()
    auth = {"Authorization": f"Bearer {key['key']}"}
    assert api.http.get("/v1/jobs", headers=auth).status_code == 200
    assert api.http.delete(f"/v1/admin/keys/{key['id']}", headers=ADMIN).status_code == 204
    _problem(api.http.get("/v1/jobs", headers=auth), 401)
    stored = api.services.store.get_api_key(key["id"])
    # Only a hash of the secret part is kept.
    assert stored is not None and key["key"].split("_", 2)[2] not in stored[1]


def test_duplicate_tenant_name_is_a_conflict(api: Api) -> None:
    api.tenant("dup")
    _problem(api.http.post("/v1/admin/tenants", json={"name": "dup"}, headers=ADMIN), 409)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"code": "print(1)", "image": "nope"}, "image"),
        ({"code": "print(1)", "limits": {"memory_mb": 10**9}}, "limits.memory_mb"),
        ({"code": "print(1)", "limits": {"timeout_s": 0}}, "limits.timeout_s"),
        ({"code": "print(1)", "limits": {"bogus": 1}}, "limits.bogus"),
        ({"code": "print(1)", "surprise": True}, "surprise"),
        ({"code": "print(1)", "command": ["/bin/true"]}, "body"),
        ({}, "body"),
        (
            {"code": "print(1)", "inputs": [{"file_id": "f", "path": "../etc/passwd"}]},
            "inputs.0.path",
        ),
        (
            {"code": "print(1)", "inputs": [{"file_id": "f", "path": "/etc/passwd"}]},
            "inputs.0.path",
        ),
        ({"code": "print(1)", "inputs": [{"file_id": "f", "path": "a\u0000b"}]}, "inputs.0.path"),
        (
            {"code": "print(1)", "inputs": [{"file_id": "file_missing", "path": "a.csv"}]},
            "inputs.0.file_id",
        ),
        ({"code": "print(1)", "env": {"SANDCELL_X": "1"}}, "env"),
        ({"code": "print(1)", "env": {"1BAD": "1"}}, "env"),
        ({"code": "x\u0000"}, "code"),
        ({"code": "print(1)", "network": {"allow": ["exa mple.com"]}}, "network.allow"),
        ({"code": "print(1)", "network": {"allow": ["example.com."]}}, "network.allow"),
        (
            {
                "code": "1",
                "network": {"allow": ["api.example.com"]},
                "secrets": [{"name": "nope", "hosts": ["api.example.com"], "header": "X-Key"}],
            },
            "secrets.0.name",
        ),
    ],
)
def test_bad_job_requests_name_the_offending_field(api: Api, body: dict, field: str) -> None:
    alice = api.tenant("alice")
    problem = _problem(api.http.post("/v1/jobs", json=body, headers=alice), 422)
    fields = [e["field"] for e in problem["errors"]]
    assert any(f == field or f.startswith(field) for f in fields), fields


def _body_refused(response, status: int, says: str) -> None:
    """A body-guard refusal: problem+json whose `errors` names the body, like any other."""
    [error] = _problem(response, status)["errors"]
    assert error["field"] == "body" and error["in"] == "body" and says in error["message"], error


def test_hostile_bodies_get_4xx_not_500(api: Api) -> None:
    alice = api.tenant("alice")
    as_json = alice | {"Content-Type": "application/json"}
    deep = "[" * 5000 + "]" * 5000
    _body_refused(api.http.post("/v1/jobs", content=deep, headers=as_json), 422, "nested deeper")
    nested = '{"code":"1","env":' + '{"a":' * 40 + "1" + "}" * 40 + "}"
    _body_refused(api.http.post("/v1/jobs", content=nested, headers=as_json), 422, "deeper than 16")
    big = '{"code":"' + "x" * 300_000 + '"}'
    _body_refused(api.http.post("/v1/jobs", content=big, headers=as_json), 413, "larger than")

    def chunked():  # no Content-Length: the guard counts what it reads
        yield big.encode()

    _body_refused(api.http.post("/v1/jobs", content=chunked(), headers=as_json), 413, "larger")
    _problem(
        api.http.post(
            "/v1/jobs", content=b"\xff\xfe{", headers=alice | {"Content-Type": "application/json"}
        ),
        422,
    )
    _problem(
        api.http.post(
            "/v1/jobs", content="[1,2]", headers=alice | {"Content-Type": "application/json"}
        ),
        422,
    )
    _problem(api.http.get("/v1/nowhere", headers=alice), 404)
    _problem(api.http.get("/v1/jobs?limit=100000", headers=alice), 422)
    _problem(api.http.get("/v1/jobs?cursor=%%%", headers=alice), 422)


def test_idempotency_key_replays_the_same_job_and_refuses_a_different_body(api: Api) -> None:
    alice = api.tenant("alice") | {"Idempotency-Key": "k-1"}
    first = api.http.post("/v1/jobs", json={"code": "print(1)"}, headers=alice)
    assert first.status_code == 202
    again = api.http.post("/v1/jobs", json={"code": "print(1)"}, headers=alice)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    _problem(api.http.post("/v1/jobs", json={"code": "print(2)"}, headers=alice), 422)
    # Keys are scoped to the tenant: the same key elsewhere is a new job.
    bob = api.tenant("bob") | {"Idempotency-Key": "k-1"}
    other = api.http.post("/v1/jobs", json={"code": "print(1)"}, headers=bob)
    assert other.status_code == 202 and other.json()["id"] != first.json()["id"]


def test_another_tenants_ids_answer_404_everywhere(api: Api) -> None:
    alice, bob = api.tenant("alice"), api.tenant("bob")
    upload = api.http.post(
        "/v1/files", files={"file": ("a.csv", b"x,y\n1,2\n")}, headers=alice
    ).json()
    job = api.http.post("/v1/jobs", json={"code": "print(1)"}, headers=alice).json()
    for method, path in [
        ("GET", f"/v1/jobs/{job['id']}"),
        ("GET", f"/v1/jobs/{job['id']}/logs"),
        ("POST", f"/v1/jobs/{job['id']}/cancel"),
        ("DELETE", f"/v1/jobs/{job['id']}"),
        ("GET", f"/v1/files/{upload['id']}"),
        ("DELETE", f"/v1/files/{upload['id']}"),
    ]:
        _problem(api.http.request(method, path, headers=bob), 404)
    cross = {"code": "print(1)", "inputs": [{"file_id": upload["id"], "path": "a.csv"}]}
    _problem(api.http.post("/v1/jobs", json=cross, headers=bob), 422)
    assert api.http.get(f"/v1/jobs/{job['id']}", headers=alice).status_code == 200


def test_cancelling_an_accepted_job_ends_it_and_cancelling_again_is_a_noop(api: Api) -> None:
    alice = api.tenant("alice")
    job = api.http.post("/v1/jobs", json={"code": "print(1)"}, headers=alice).json()
    first = api.http.post(f"/v1/jobs/{job['id']}/cancel", headers=alice)
    assert first.status_code == 202
    assert first.json()["state"] == "cancelled" and first.json()["reason"] == "cancelled"
    again = api.http.post(f"/v1/jobs/{job['id']}/cancel", headers=alice)
    assert again.status_code == 202 and again.json()["finished_at"] == first.json()["finished_at"]


def test_list_is_paginated_with_a_cursor_and_filtered_by_state(api: Api) -> None:
    alice = api.tenant("alice")
    ids = [
        api.http.post("/v1/jobs", json={"code": f"print({i})"}, headers=alice).json()["id"]
        for i in range(5)
    ]
    api.http.post(f"/v1/jobs/{ids[0]}/cancel", headers=alice)
    seen, cursor = [], None
    while True:
        params = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = api.http.get("/v1/jobs", params=params, headers=alice).json()
        seen += [j["id"] for j in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == list(reversed(ids))
    cancelled = api.http.get("/v1/jobs", params={"state": "cancelled"}, headers=alice).json()
    assert [j["id"] for j in cancelled["items"]] == [ids[0]]


def test_retiring_a_running_job_is_a_conflict(api: Api) -> None:
    alice = api.tenant("alice")
    job = api.http.post("/v1/jobs", json={"code": "print(1)"}, headers=alice).json()
    _problem(api.http.delete(f"/v1/jobs/{job['id']}", headers=alice), 409)


def test_file_upload_records_size_and_sha256_and_rejects_bad_names(api: Api) -> None:
    alice = api.tenant("alice")
    stored = api.http.post("/v1/files", files={"file": ("data.csv", b"a,b\n")}, headers=alice)
    assert stored.status_code == 201
    assert stored.json()["size"] == 4
    assert (
        stored.json()["sha256"]
        == "e3a5b7a5b5c8f1d3b2f9b2e0d0b0a0c0"[:0]
        + __import__("hashlib").sha256(b"a,b\n").hexdigest()
    )
    _problem(
        api.http.post(
            "/v1/files", files={"file": ("big", b"x" * (1024 * 1024 + 1))}, headers=alice
        ),
        413,
    )
    big, content_type = _multipart(b"big", b"x" * (1024 * 1024 + 4097))

    def streamed():  # no Content-Length: the upload is counted as it is read
        yield big

    too_big = api.http.post("/v1/files", content=streamed(), headers=alice | content_type)
    _body_refused(too_big, 413, "larger than")


def _multipart(filename: bytes, content: bytes = b"x") -> tuple[bytes, dict[str, str]]:
    """One file part with the name byte for byte (httpx would percent-encode a NUL)."""
    body = (
        b'--b0undary\r\nContent-Disposition: form-data; name="file"; filename="'
        + filename
        + b'"\r\nContent-Type: text/csv\r\n\r\n'
        + content
        + b"\r\n--b0undary--\r\n"
    )
    return body, {"Content-Type": "multipart/form-data; boundary=b0undary"}


@pytest.mark.parametrize(
    "name", [b"..", b"/etc/passwd", b"/abs.csv", b"a\x00b.csv", b"\x00", b"dir/../x"]
)
def test_upload_names_with_dotdot_absolute_paths_or_nul_are_refused(api: Api, name: bytes) -> None:
    alice = api.tenant("alice")
    body, content_type = _multipart(name)
    refused = api.http.post("/v1/files", content=body, headers=alice | content_type)
    [error] = _problem(refused, 422)["errors"]
    assert error["field"] == "file" and error["message"].startswith("name must"), error
    fine, content_type = _multipart(b"fine.csv")  # the same request with a plain name is stored
    assert api.http.post("/v1/files", content=fine, headers=alice | content_type).status_code == 201


def test_openapi_is_served(api: Api) -> None:
    doc = api.http.get("/openapi.json").json()
    assert "/v1/jobs" in doc["paths"] and "/v1/artifacts/{artifact_id}/url" in doc["paths"]


def test_readiness_needs_the_store_the_image_and_a_live_worker(api: Api) -> None:
    import time

    from sandcell.domain.records import WorkerInfo

    assert api.http.get("/healthz").status_code == 200
    api.services.store.worker_stopped("wrk_local", time.time())
    not_ready = api.http.get("/readyz")
    assert not_ready.status_code == 503 and not_ready.json()["checks"]["runtime"] is False
    info = WorkerInfo("wrk_1", "host", "gvisor", "runsc 1", time.time())
    api.services.store.worker_seen(info, time.time())
    assert api.http.get("/readyz").json() == {
        "ready": True,
        "checks": {"store": True, "image": True, "runtime": True},
    }
    api.services.store.worker_stopped("wrk_1", time.time())
    assert api.http.get("/readyz").status_code == 503


def test_metrics_show_jobs_by_state_and_reason_and_phase_latencies(api: Api) -> None:
    alice = api.tenant("alice")
    job = api.http.post("/v1/jobs", json={"code": "print(1)"}, headers=alice).json()
    api.http.post(f"/v1/jobs/{job['id']}/cancel", headers=alice)
    api.http.post("/v1/jobs", json={"code": "print(2)"}, headers=alice)
    text = api.http.get("/metrics/").text
    assert 'sandcell_jobs{reason="cancelled",state="cancelled"} 1.0' in text
    assert 'sandcell_jobs{reason="",state="accepted"} 1.0' in text
    assert "sandcell_job_run_seconds_bucket" in text and "sandcell_store_up 1.0" in text
    assert "sandcell_submit_ack_seconds_count 2.0" in text


def test_metrics_show_the_warm_pools_of_live_workers_only(api: Api) -> None:
    import time

    from sandcell.domain.records import WorkerInfo

    jobs = {"ready": {"python": 1}, "target": {"python": 2}, "memory_bytes": 3 << 20}
    jobs |= {"memory_limit_bytes": 1 << 30, "hits": {"python": 5}, "misses": {"python": 2}}
    sessions = {"ready": {"python-data": 0}, "refused": {"python-data": 4}}
    pools = {"jobs": jobs, "sessions": sessions}
    api.services.store.worker_seen(WorkerInfo("wrk_p", "h", "gvisor", "1", 0, None, pools), 0)
    gone = WorkerInfo("wrk_gone", "h", "gvisor", "1", 0, None, {"jobs": jobs})
    api.services.store.worker_seen(gone, time.time() - 3600)  # not live: not shown
    api.services.store.worker_seen(
        WorkerInfo("wrk_p", "h", "gvisor", "1", 0, None, pools), time.time()
    )
    text = api.http.get("/metrics/").text
    labels = 'image="python",kind="jobs",worker="wrk_p"'
    assert f"sandcell_pool_ready{{{labels}}} 1.0" in text
    assert f"sandcell_pool_target{{{labels}}} 2.0" in text
    assert f"sandcell_pool_hits_total{{{labels}}} 5.0" in text
    assert f"sandcell_pool_misses_total{{{labels}}} 2.0" in text
    session_labels = 'image="python-data",kind="sessions",worker="wrk_p"'
    assert f"sandcell_pool_refusals_total{{{session_labels}}} 4.0" in text
    assert f"sandcell_pool_ready{{{session_labels}}} 0.0" in text
    assert 'sandcell_pool_memory_bytes{kind="jobs",worker="wrk_p"} 3.145728e+06' in text
    assert 'sandcell_pool_memory_limit_bytes{kind="jobs",worker="wrk_p"} 1.073741824e+09' in text
    assert "wrk_gone" not in text


def test_metrics_show_each_live_workers_quarantined_sandbox_uids(api: Api) -> None:
    import time

    from sandcell.domain.records import WorkerInfo

    store = api.services.store
    store.worker_seen(WorkerInfo("wrk_b", "h", "bwrap", "1", 0, health={"quarantined_uids": 2}), 0)
    store.worker_seen(
        WorkerInfo("wrk_b", "h", "bwrap", "1", 0, health={"quarantined_uids": 2}), time.time()
    )
    store.worker_seen(WorkerInfo("wrk_g", "h", "gvisor", "1", 0), time.time())  # reports none
    text = api.http.get("/metrics/").text
    assert 'sandcell_sandbox_uids_quarantined{worker="wrk_b"} 2.0' in text
    assert 'sandcell_sandbox_uids_quarantined{worker="wrk_g"}' not in text
