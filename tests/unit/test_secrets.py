"""Secrets are write-only, tenant-scoped, encrypted at rest, and bound to allowed hosts."""

from tests.conftest import Api


def test_secret_values_are_write_only_and_encrypted_at_rest(api: Api) -> None:
    alice, bob = api.tenant("alice"), api.tenant("bob")
    created = api.http.post(
        "/v1/secrets", json={"name": "crm_token", "value": "s3cr3t-value-xyz"}, headers=alice
    )
    assert created.status_code == 201 and "s3cr3t" not in created.text
    listed = api.http.get("/v1/secrets", headers=alice)
    assert [s["name"] for s in listed.json()["items"]] == ["crm_token"]
    assert "s3cr3t" not in listed.text
    assert api.http.get("/v1/secrets", headers=bob).json()["items"] == []
    assert api.http.delete("/v1/secrets/crm_token", headers=bob).status_code == 404
    stored = api.services.store.secret_ciphertexts(_tenant_id(api, alice), ["crm_token"])
    assert b"s3cr3t" not in stored["crm_token"]
    assert api.http.delete("/v1/secrets/crm_token", headers=alice).status_code == 204
    assert api.http.get("/v1/secrets", headers=alice).json()["items"] == []


def _tenant_id(api: Api, headers: dict[str, str]) -> str:
    key_id = headers["Authorization"].split("_")[1]
    found = api.services.store.get_api_key(key_id)
    assert found is not None and found[0].tenant_id is not None
    return found[0].tenant_id


def test_a_job_may_bind_a_secret_only_to_hosts_it_may_reach(api: Api) -> None:
    alice = api.tenant("alice")
    api.http.post("/v1/secrets", json={"name": "tok", "value": "value-123"}, headers=alice)
    binding = {
        "name": "tok",
        "hosts": ["api.crm.example"],
        "header": "Authorization",
        "format": "Bearer {value}",
    }
    ok = api.http.post(
        "/v1/jobs",
        json={"code": "1", "network": {"allow": ["api.crm.example"]}, "secrets": [binding]},
        headers=alice,
    )
    assert ok.status_code == 202, ok.text
    assert "value-123" not in ok.text
    off_list = api.http.post(
        "/v1/jobs",
        json={"code": "1", "network": {"allow": ["other.example"]}, "secrets": [binding]},
        headers=alice,
    )
    assert off_list.status_code == 422
    assert [e["field"] for e in off_list.json()["errors"]] == ["secrets.0.hosts"]
    wildcard = binding | {"hosts": ["*.crm.example"]}
    refused = api.http.post(
        "/v1/jobs",
        json={"code": "1", "network": {"allow": ["*.crm.example"]}, "secrets": [wildcard]},
        headers=alice,
    )
    assert refused.status_code == 422


def test_bad_secret_names_and_values_are_refused(api: Api) -> None:
    alice = api.tenant("alice")
    for body in (
        {"name": "../x", "value": "v"},
        {"name": "ok", "value": ""},
        {"name": "ok", "value": "a\nb"},
        {"name": "ok"},
    ):
        assert api.http.post("/v1/secrets", json=body, headers=alice).status_code == 422
