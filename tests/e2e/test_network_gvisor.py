"""Network policy end to end: default deny, the allowlist through the proxy, secrets outside."""

import hashlib
import json
import time

import httpx
import pytest

from tests.e2e.conftest import Server, run_job
from tests.integration.egress_servers import EchoServer, TestPKI

pytestmark = pytest.mark.gvisor

FETCH = """
import hashlib, json, urllib.request
results = {}
for name, url in URLS.items():
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            echoed = json.loads(answer.read())["headers"]
            # Only a digest of what the server saw: the job's output must never hold a secret.
            auth = [hashlib.sha256(v.encode()).hexdigest()
                    for k, v in echoed if k == "authorization"]
            results[name] = {"status": answer.status, "auth": auth}
    except Exception as exc:
        results[name] = {"error": type(exc).__name__, "status": getattr(exc, "code", None)}
import socket
s = socket.socket(); s.settimeout(3)
try:
    s.connect(("127.0.0.1", DIRECT_PORT)); results["direct"] = "connected"
except OSError as exc:
    results["direct"] = type(exc).__name__
print(json.dumps(results))
"""


def _program(urls: dict[str, str], direct_port: int) -> str:
    return FETCH.replace("URLS", repr(urls)).replace("DIRECT_PORT", str(direct_port))


def _facts(server: Server, headers: dict[str, str], job: dict) -> dict:
    with httpx.Client(base_url=server.url, headers=headers) as http:
        return json.loads(http.get(f"/v1/jobs/{job['id']}/logs").json()["stdout"])


def test_allowed_host_works_others_are_denied_and_direct_connections_go_nowhere(
    server: Server,
) -> None:
    alice = server.tenant("net-allow")
    with EchoServer("127.0.0.1") as echo:
        urls = {
            "allowed": f"http://api.allowed.test:{echo.port}/hello",
            "other": f"http://other.test:{echo.port}/hello",
        }
        body = {"code": _program(urls, echo.port), "network": {"allow": ["api.allowed.test"]}}
        before = time.time()
        job = run_job(server, alice, body)
        after = time.time()
        assert job["state"] == "completed", job
        facts = _facts(server, alice, job)
        assert facts["allowed"]["status"] == 200
        assert facts["other"]["status"] == 403
        assert facts["direct"] != "connected"
        assert [r["path"] for r in echo.requests] == ["/hello"]  # only the allowed one arrived
    egress = job["egress"]
    assert sorted((e["host"], e["port"], e["decision"], e["reason"]) for e in egress) == [
        ("api.allowed.test", echo.port, "allowed", "http"),
        ("other.test", echo.port, "denied", "not_allowed"),
    ]
    for entry in egress:
        assert entry["bytes_up"] > 0 and entry["bytes_down"] > 0  # a request; a response or 403
        assert before <= entry["started_at"] <= after
        assert 0 <= entry["duration_ms"] <= (after - before) * 1000


def test_without_network_nothing_is_reachable_even_through_the_proxy_address(
    server: Server,
) -> None:
    alice = server.tenant("net-none")
    with EchoServer("127.0.0.1") as echo:
        urls = {"proxy": f"http://api.allowed.test:{echo.port}/x"}
        program = "import os\nos.environ['HTTP_PROXY'] = 'http://127.0.0.1:3128'\n"
        job = run_job(server, alice, {"code": program + _program(urls, echo.port)})
        facts = _facts(server, alice, job)
        assert "error" in facts["proxy"] and facts["direct"] != "connected"
        assert echo.requests == []
    assert job["egress"] == []


def test_a_secret_reaches_only_its_host_and_never_the_caller(server: Server, pki: TestPKI) -> None:
    alice = server.tenant("net-secret")
    secret = "crm-token-" + hashlib.sha256(b"e2e").hexdigest()[:16]
    with httpx.Client(base_url=server.url, headers=alice) as http:
        http.post("/v1/secrets", json={"name": "crm", "value": secret}).raise_for_status()
    tls = pki.server_context(["secure.allowed.test", "api.allowed.test"])
    with EchoServer("127.0.0.1", tls) as secure, EchoServer("127.0.0.1") as plain:
        urls = {
            "matching": f"https://secure.allowed.test:{secure.port}/echo",
            "other_host": f"http://api.allowed.test:{plain.port}/echo",
        }
        binding = {
            "name": "crm",
            "hosts": ["secure.allowed.test"],
            "header": "Authorization",
            "format": "Bearer {value}",
        }
        body = {
            "code": _program(urls, secure.port),  # FETCH reports digests, never the values
            "network": {"allow": ["secure.allowed.test", "api.allowed.test"]},
            "secrets": [binding],
        }
        job = run_job(server, alice, body)
        assert job["state"] == "completed", job
        facts = _facts(server, alice, job)
        seen = [dict(r["headers"]).get("authorization") for r in secure.requests]
        seen += [dict(r["headers"]).get("authorization") for r in plain.requests]
    expected = hashlib.sha256(f"Bearer {secret}".encode()).hexdigest()
    assert facts["matching"]["auth"] == [expected]
    assert facts["other_host"]["auth"] == []
    assert sorted(seen, key=str) == sorted([f"Bearer {secret}", None], key=str)
    with httpx.Client(base_url=server.url, headers=alice) as http:
        everything = json.dumps(http.get(f"/v1/jobs/{job['id']}").json())
        everything += json.dumps(http.get(f"/v1/jobs/{job['id']}/logs").json())
        everything += json.dumps(http.get("/v1/secrets").json())
    assert secret not in everything
    assert secret not in (server.data_dir / "serve.log").read_text()


REQUESTS_FETCH = """
import hashlib, requests
answer = requests.get(URL, timeout=10)
echoed = answer.json()["headers"]
# Only a digest of what the server saw: the job's output must never hold a secret.
print(answer.status_code, [hashlib.sha256(v.encode()).hexdigest()
                           for k, v in echoed if k == "x-api-key"])
"""


def test_requests_on_python_data_goes_through_the_proxy_and_gets_the_secret(
    server: Server, pki: TestPKI
) -> None:
    """`requests`, which agents' code reaches for first, trusts the job CA and takes the proxy
    from the environment: the secret is added outside the sandbox, over TLS."""
    alice = server.tenant("net-requests")
    secret = "api-token-" + hashlib.sha256(b"requests").hexdigest()[:16]
    with httpx.Client(base_url=server.url, headers=alice) as http:
        http.post("/v1/secrets", json={"name": "api", "value": secret}).raise_for_status()
    with EchoServer("127.0.0.1", pki.server_context(["secure.allowed.test"])) as secure:
        url = f"https://secure.allowed.test:{secure.port}/echo"
        body = {
            "image": "python-data",
            "code": REQUESTS_FETCH.replace("URL", repr(url)),
            "network": {"allow": ["secure.allowed.test"]},
            "secrets": [{"name": "api", "hosts": ["secure.allowed.test"], "header": "X-Api-Key"}],
        }
        job = run_job(server, alice, body, timeout=120)
        assert job["state"] == "completed", job
        assert [dict(r["headers"]).get("x-api-key") for r in secure.requests] == [secret]
    with httpx.Client(base_url=server.url, headers=alice) as http:
        logs = http.get(f"/v1/jobs/{job['id']}/logs").json()["stdout"]
    digest = hashlib.sha256(secret.encode()).hexdigest()
    assert logs.strip() == f"200 ['{digest}']"
