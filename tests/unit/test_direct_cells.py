"""Direct cells: a token from the API opens one session's cells on its worker, nothing else."""

import time
from datetime import datetime
from typing import Any
from unittest.mock import ANY

import pytest
from fastapi.testclient import TestClient

from sandcell.api.direct import install_direct
from sandcell.api.internal import TOKEN_HEADER, create_internal_app
from sandcell.domain.errors import Unauthorized
from sandcell.services.auth import REVOKED_REFRESH_S, RevokedKeys
from sandcell.services.direct_cells import (
    DIRECT_TTL_S,
    DirectCells,
    DirectGrant,
    DirectTokens,
)
from tests.conftest import ADMIN_KEY, INTERNAL_TOKEN, Api

TOKENS = DirectTokens(INTERNAL_TOKEN)


def test_a_token_names_its_session_tenant_and_key_until_it_expires() -> None:
    expires = int(time.time()) + 60
    token = TOKENS.mint("ses_a", "ten_a", "key_a", expires)
    assert TOKENS.grant_of(token, "ses_a", time.time()) == DirectGrant("ten_a", "key_a")
    refused = [
        (token, "ses_b", time.time()),  # another session
        (token, "ses_a", expires + 1),  # expired
        (token.replace("ten_a", "ten_b"), "ses_a", time.time()),  # another tenant's claim
        (token.replace("key_a", "key_b"), "ses_a", time.time()),  # another key's claim
        (token[:-2] + ("AA" if token[-2:] != "AA" else "BB"), "ses_a", time.time()),
        (DirectTokens("another-deployment").mint("ses_a", "ten_a", "key_a", expires), "ses_a", 0),
        (TOKENS.mint("ses_a", "ten_a", "key_a", expires) + ".x", "ses_a", 0),
        ("ses_a.ten_a.key_a.soon.sig", "ses_a", 0),
        ("", "ses_a", 0),
    ]
    for given, session_id, now in refused:
        with pytest.raises(Unauthorized):
            TOKENS.grant_of(given, session_id, now)


def test_a_direct_token_is_not_the_internal_token_nor_opens_the_internal_routes(
    api: Api,
) -> None:
    alice = api.tenant("alice")
    sid = api.http.post("/v1/sessions", json={}, headers=alice).json()["id"]
    access = api.http.post(f"/v1/sessions/{sid}/direct", headers=alice).json()
    worker = _worker_app(api)
    for headers in (
        {TOKEN_HEADER: access["token"]},
        {"Authorization": f"Bearer {access['token']}"},
    ):
        answer = worker.post(
            f"/internal/sessions/{sid}/execute", json={"code": "1"}, headers=headers
        )
        assert answer.status_code == 401, answer.text


def test_cells_sent_straight_to_the_worker_run_in_the_session_and_join_its_history(
    api: Api,
) -> None:
    alice = api.tenant("alice")
    sid = api.http.post("/v1/sessions", json={}, headers=alice).json()["id"]
    api.http.post(f"/v1/sessions/{sid}/execute", json={"code": "x = 41"}, headers=alice)
    answer = api.http.post(f"/v1/sessions/{sid}/direct", headers=alice)
    assert answer.status_code == 200, answer.text
    access = answer.json()
    # The worker's URL as it registered it ("inproc" here), and the path of this session's cells.
    assert access["execute_url"] == f"inproc/direct/sessions/{sid}/execute"
    left = _seconds_until(access["expires_at"])
    assert DIRECT_TTL_S - 5 < left <= DIRECT_TTL_S
    worker, bearer = _worker_app(api), {"Authorization": f"Bearer {access['token']}"}
    cell = worker.post(
        f"/direct/sessions/{sid}/execute", json={"code": "print(x + 1)"}, headers=bearer
    )
    assert cell.status_code == 200, cell.text
    assert cell.json()["stdout"] == "42\n"  # the same kernel as the API's cells
    history = api.http.get(f"/v1/sessions/{sid}/cells", headers=alice).json()["items"]
    assert [c["code"] for c in history] == ["x = 41", "print(x + 1)"]
    assert history[-1]["stdout"] == "42\n"
    record = api.http.get(f"/v1/sessions/{sid}", headers=alice).json()
    assert record["executions"] == 2


def test_direct_cells_refuse_a_missing_wrong_or_stale_token_and_hostile_bodies(api: Api) -> None:
    alice, bob = api.tenant("alice"), api.tenant("bob")
    mine = api.http.post("/v1/sessions", json={}, headers=alice).json()["id"]
    other = api.http.post("/v1/sessions", json={}, headers=alice).json()["id"]
    assert api.http.post(f"/v1/sessions/{mine}/direct", headers=bob).status_code == 404
    token = api.http.post(f"/v1/sessions/{other}/direct", headers=alice).json()["token"]
    worker, url = _worker_app(api), f"/direct/sessions/{mine}/execute"
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": f"Bearer {token}"}):
        answer = worker.post(url, json={"code": "1"}, headers=headers)
        assert answer.status_code == 401, answer.text  # none, garbage, another session's
        assert answer.headers["content-type"] == "application/problem+json"
    token = api.http.post(f"/v1/sessions/{mine}/direct", headers=alice).json()["token"]
    bearer = {"Authorization": f"Bearer {token}"}
    too_big = worker.post(url, content=b'{"code": "' + b"1" * 300_000 + b'"}', headers=bearer)
    assert too_big.status_code == 413, too_big.text
    internal = {TOKEN_HEADER: INTERNAL_TOKEN, "content-type": "application/json"}
    big = b'{"code": "x = ' + b"1" * 300_000 + b'", "timeout_s": 5}'
    relayed = worker.post(f"/internal/sessions/{other}/execute", content=big, headers=internal)
    assert relayed.status_code == 200, relayed.text  # the guard is the direct paths' alone
    invalid = [
        (b"{}", "code"),
        (b'{"code": "1", "timeout_s": -1}', "timeout_s"),
        (b'{"code": "1", "extra": 1}', "extra"),
        (b"not json", "body"),
    ]
    for body, field in invalid:
        answer = worker.post(url, content=body, headers=bearer)
        assert answer.status_code == 422, answer.text
        assert answer.headers["content-type"] == "application/problem+json"
        assert answer.json()["errors"][0] == {"field": field, "in": "body", "message": ANY}
    deep = worker.post(url, content=b"[" * 100 + b"]" * 100, headers=bearer)
    assert deep.status_code == 422, deep.text
    assert api.http.delete(f"/v1/sessions/{mine}", headers=alice).status_code == 200
    gone = worker.post(url, json={"code": "1"}, headers=bearer)
    assert gone.status_code == 409, gone.text  # the token outlives the session, not its cells
    assert api.http.get(f"/v1/sessions/{mine}/cells", headers=alice).json()["items"] == []
    stopped = api.http.post(f"/v1/sessions/{mine}/direct", headers=alice)
    assert stopped.status_code == 409, stopped.text


def test_revoking_the_key_that_minted_a_token_ends_its_direct_cells_within_a_second(
    api: Api,
) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    tenant = api.http.post("/v1/admin/tenants", json={"name": "alice"}, headers=admin).json()
    keys = [
        api.http.post(f"/v1/admin/tenants/{tenant['id']}/keys", headers=admin).json()
        for _ in range(2)
    ]
    alice, spare = ({"Authorization": f"Bearer {key['key']}"} for key in keys)
    sid = api.http.post("/v1/sessions", json={}, headers=alice).json()["id"]
    worker, url = _worker_app(api), f"/direct/sessions/{sid}/execute"
    tokens = {
        name: api.http.post(f"/v1/sessions/{sid}/direct", headers=key).json()["token"]
        for name, key in (("revoked", alice), ("spare", spare))
    }
    assert _direct(worker, url, tokens["revoked"]).status_code == 200
    assert api.http.delete(f"/v1/admin/keys/{keys[0]['id']}", headers=admin).status_code == 204
    time.sleep(REVOKED_REFRESH_S)
    refused = _direct(worker, url, tokens["revoked"])
    assert refused.status_code == 401, refused.text
    assert "revoked" in refused.json()["detail"]
    assert _direct(worker, url, tokens["spare"]).status_code == 200  # the tenant's other key


def test_the_worker_reads_revoked_keys_at_most_once_a_second() -> None:
    class Counting:
        def __init__(self) -> None:
            self.reads: list[float] = []

        def revoked_key_ids(self, since: float) -> list[str]:
            self.reads.append(since)
            return ["key_gone"]

    store = Counting()
    revoked = RevokedKeys(store, 2 * DIRECT_TTL_S)  # type: ignore[arg-type]
    assert "key_gone" in revoked and "key_kept" not in revoked
    assert len(store.reads) == 1
    # Every key revoked within twice a token's lifetime: only those can have minted one still
    # valid, with room for clocks that differ between the API's host and the worker's.
    assert time.time() - 2 * DIRECT_TTL_S - 5 < store.reads[0] <= time.time() - 2 * DIRECT_TTL_S
    time.sleep(REVOKED_REFRESH_S)
    assert "key_gone" in revoked
    assert len(store.reads) == 2


def _direct(worker: TestClient, url: str, token: str) -> Any:
    return worker.post(url, json={"code": "1"}, headers={"Authorization": f"Bearer {token}"})


def _worker_app(api: Api) -> TestClient:
    """The worker's internal server as `sandcell worker` builds it, over the test's session
    host and store (build_internal_app)."""
    store = api.services.store
    app = create_internal_app(api.session_host, store, INTERNAL_TOKEN)
    cells = DirectCells(api.session_host, store, DirectTokens(INTERNAL_TOKEN))
    install_direct(app, cells, max_json_bytes=256 * 1024, max_depth=16)
    return TestClient(app)


def _seconds_until(iso_time: str) -> float:
    return datetime.fromisoformat(iso_time.replace("Z", "+00:00")).timestamp() - time.time()
