"""The dashboard's page and its reads, in-process: headers, who-am-I, and the admin overview."""

from tests.conftest import ADMIN_KEY, Api

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def test_the_page_is_served_with_a_strict_csp_and_no_inline_code(api: Api) -> None:
    page = api.http.get("/ui/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    csp = page.headers["content-security-policy"]
    for directive in (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "object-src 'none'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    ):
        assert directive in csp
    assert "unsafe" not in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    assert "<script>" not in page.text and " style=" not in page.text
    script = api.http.get("/ui/js/main.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert script.headers["content-security-policy"] == csp
    assert api.http.get("/", follow_redirects=False).headers["location"] == "/ui/"


def test_no_script_ever_writes_markup_from_data() -> None:
    from sandcell.api.ui_routes import WEB_ROOT

    for path in WEB_ROOT.rglob("*.js"):
        text = path.read_text()
        sinks = (".innerHTML", ".outerHTML", ".insertAdjacentHTML", "document.write", "eval(")
        for sink in (*sinks, "new Function", "createContextualFragment"):
            assert sink not in text, f"{path.name} uses {sink}"


def test_whoami_names_the_tenant_or_the_admin(api: Api) -> None:
    alice = api.tenant("alice")
    me = api.http.get("/v1/ui/whoami", headers=alice).json()
    assert me["tenant_name"] == "alice" and me["admin"] is False and "jobs" in me["scopes"]
    admin = api.http.get("/v1/ui/whoami", headers=ADMIN).json()
    assert admin == {
        "key_id": "env-admin",
        "tenant_id": None,
        "tenant_name": None,
        "scopes": ["admin"],
        "admin": True,
    }
    assert api.http.get("/v1/ui/whoami").status_code == 401


def test_the_overview_is_admin_only_and_spans_tenants(api: Api) -> None:
    alice, bob = api.tenant("alice"), api.tenant("bob")
    job = api.http.post("/v1/jobs", json={"code": "print(1)"}, headers=alice).json()
    api.http.post("/v1/jobs", json={"code": "print(2)"}, headers=bob)
    for path in (
        "health",
        "tenants",
        "keys",
        "jobs",
        f"jobs/{job['id']}",
        f"jobs/{job['id']}/logs",
    ):
        refused = api.http.get(f"/v1/admin/overview/{path}", headers=alice)
        assert refused.status_code == 403, path
        assert refused.headers["content-type"] == "application/problem+json"
    jobs = api.http.get("/v1/admin/overview/jobs", headers=ADMIN).json()["items"]
    assert len(jobs) == 2 and {j["tenant_id"] for j in jobs} == {
        t["id"] for t in api.http.get("/v1/admin/overview/tenants", headers=ADMIN).json()["items"]
    }
    one = api.http.get(f"/v1/admin/overview/jobs/{job['id']}", headers=ADMIN).json()
    assert one["id"] == job["id"] and one["state"] == "accepted"
    missing = api.http.get("/v1/admin/overview/jobs/job_nope", headers=ADMIN)
    assert missing.status_code == 404
    keys = api.http.get("/v1/admin/overview/keys", headers=ADMIN).json()["items"]
    assert len(keys) == 2 and all("key" not in k and k["revoked_at"] is None for k in keys)


def test_health_reports_images_workers_queue_and_the_metrics_histograms(api: Api) -> None:
    alice = api.tenant("alice")
    api.http.post("/v1/jobs", json={"code": "print(1)"}, headers=alice)
    health = api.http.get("/v1/admin/overview/health", headers=ADMIN).json()
    assert health["store_up"] is True
    assert health["queue_depth"] == 1 and health["jobs_by_state"] == {"accepted": 1}
    assert [w["runtime"] for w in health["workers"]] == ["fake"]
    assert [i["name"] for i in health["images"]] == ["python"]
    names = {h["name"] for h in health["latency"]}
    assert names == {
        "sandcell_submit_ack_seconds",
        "sandcell_job_queue_seconds",
        "sandcell_job_start_seconds",
        "sandcell_job_run_seconds",
    }
    ack = next(h for h in health["latency"] if h["name"] == "sandcell_submit_ack_seconds")
    assert ack["count"] == 1 and ack["cumulative"][-1] == 1
    metrics = api.http.get("/metrics").text
    assert "sandcell_submit_ack_seconds_count 1.0" in metrics


def test_the_tenants_overview_tells_own_quotas_from_defaults(api: Api) -> None:
    api.tenant("alice")
    [tenant] = api.http.get("/v1/admin/overview/tenants", headers=ADMIN).json()["items"]
    assert tenant["quota_overrides"] == {} and tenant["quotas"]["sessions"] == 4
    patched = api.http.patch(
        f"/v1/admin/tenants/{tenant['id']}", json={"quotas": {"sessions": 2}}, headers=ADMIN
    )
    assert patched.status_code == 200, patched.text
    [tenant] = api.http.get("/v1/admin/overview/tenants", headers=ADMIN).json()["items"]
    assert tenant["quota_overrides"] == {"sessions": 2} and tenant["quotas"]["sessions"] == 2


def test_session_charts_may_be_data_urls_and_cells_are_not_kept_in_the_browser(api: Api) -> None:
    csp = api.http.get("/ui/").headers["content-security-policy"]
    assert "img-src 'self' data:" in csp
    page = api.http.get("/ui/js/pages/sessions.js").text
    assert "/cells" in page and "sessionStorage" not in page
