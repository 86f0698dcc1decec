"""The egress proxy over real loopback sockets: allowlist, address rules, host confusion, secrets.

Names resolve through a static table to 127.0.0.x; "unapproved" endpoints are loopback servers
too, so a leak would show up as a request they recorded. A guard makes any connection attempt to
an address outside 127.0.0.0/8 fail the test instead of leaving the host.
"""

import contextlib
import hashlib
import ipaddress
import json
import logging
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509

from sandcell.egress import (
    EgressConfig,
    EgressConfigError,
    EgressEvent,
    EgressPolicy,
    EgressProxy,
    JobCertificateAuthority,
    ProxyLimits,
    Redactor,
    SecretRule,
    StaticResolver,
    ca_bundle,
    sandbox_env,
)
from sandcell.egress import handler as handler_module
from sandcell.egress.hosts import IPAddress
from sandcell.egress.resolve import connect_pinned
from tests.integration.egress_servers import (
    EchoServer,
    SilentServer,
    TestPKI,
    https_get,
    raw_request,
    tunnel,
)

SECRET = "s3cr3t-0f-the-crm-9f8e7d6c5b4a"
LOOPBACK = ["127.0.0.0/8"]
TABLE = {
    "allowed.test": "127.0.0.2",
    "denied.test": "127.0.0.2",
    "a.corp.example": "127.0.0.2",
    "deep.a.corp.example": "127.0.0.2",
    "corp.example": "127.0.0.2",
    "evilcorp.example": "127.0.0.2",
    "api.secret.test": "127.0.0.3",
    "other.test": "127.0.0.3",
    "misnamed.test": "127.0.0.3",  # served by a certificate that does not name it
    "bad.test": "127.0.0.4",
    "rebind.test": ["127.0.0.2", "10.0.0.1"],
    "mapped.test": "::ffff:127.0.0.2",
    "silent.test": "127.0.0.5",
}
ALLOW = ["allowed.test", "*.corp.example", "api.secret.test", "other.test", "bad.test"]
ALLOW += ["rebind.test", "mapped.test", "private.test", "silent.test", "misnamed.test"]
SECRET_HOSTS = ["api.secret.test", "bad.test"]
TLS_NAMES = ["api.secret.test", "other.test", "127.0.0.3"]


class EventLog:
    """Collects events from the proxy thread; `wait` blocks until `n` have arrived."""

    def __init__(self) -> None:
        self.events: list[EgressEvent] = []
        self._cond = threading.Condition()

    def __call__(self, event: EgressEvent) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def wait(self, n: int, timeout: float = 10) -> list[EgressEvent]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.events) >= n, timeout), self.events
            return list(self.events)


@dataclass
class World:
    pki: TestPKI
    plain: EchoServer  # HTTP on 127.0.0.2
    tls: EchoServer  # HTTPS on 127.0.0.3, certificate for api.secret.test, other.test, 127.0.0.3
    plain_secret_host: EchoServer  # HTTP on 127.0.0.3
    bad: EchoServer  # HTTPS on 127.0.0.4, certificate from a CA the proxy does not trust
    silent: SilentServer  # TCP on 127.0.0.5 that never answers


@dataclass
class Proxy:
    addr: tuple[str, int]
    events: EventLog
    ca_pem: bytes | None

    @property
    def url(self) -> str:
        return f"http://{self.addr[0]}:{self.addr[1]}"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    directory = tmp_path_factory.mktemp("pki")
    pki, rogue = TestPKI(directory), TestPKI(directory, "rogue CA")
    with (
        EchoServer("127.0.0.2") as plain,
        EchoServer("127.0.0.3", pki.server_context(TLS_NAMES)) as tls,
        EchoServer("127.0.0.3") as plain_secret_host,
        EchoServer("127.0.0.4", rogue.server_context(["bad.test"])) as bad,
        SilentServer("127.0.0.5") as silent,
    ):
        yield World(pki, plain, tls, plain_secret_host, bad, silent)


@pytest.fixture(autouse=True)
def only_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail, rather than connect, if the proxy ever tries an address off this host."""
    real = connect_pinned

    async def guarded(addresses: Any, *args: Any, **kwargs: Any) -> Any:
        assert all(ip.is_loopback for ip in addresses), f"refusing to leave loopback: {addresses}"
        return await real(addresses, *args, **kwargs)

    monkeypatch.setattr(handler_module, "connect_pinned", guarded)


def _secret_rules(hosts: list[str]) -> tuple[SecretRule, ...]:
    spec = {"name": "crm_token", "hosts": hosts, "header": "Authorization"}
    return (SecretRule.from_spec(spec | {"format": "Bearer {value}"}, SECRET),)


@pytest.fixture
def start_proxy(world: World) -> Iterator[Callable[..., Proxy]]:
    running: list[EgressProxy] = []

    def start(
        allow: list[str] = ALLOW,
        networks: list[str] = LOOPBACK,
        secret_hosts: list[str] = SECRET_HOSTS,
        limits: ProxyLimits | None = None,
    ) -> Proxy:
        policy = EgressPolicy.build(allow, allowed_networks=networks, ports=None)
        rules = _secret_rules(secret_hosts) if secret_hosts else ()
        config = EgressConfig(
            policy, rules, limits or ProxyLimits(), upstream_ca_file=str(world.pki.ca_file)
        )
        events = EventLog()
        proxy = EgressProxy(config, events, StaticResolver(TABLE))
        running.append(proxy)
        return Proxy(proxy.start(), events, proxy.ca_pem)

    yield start
    for proxy in running:
        proxy.stop()


@pytest.fixture
def proxy(start_proxy: Callable[..., Proxy]) -> Proxy:
    return start_proxy()


def sandbox_context(world: World, proxy: Proxy) -> ssl.SSLContext:
    """What a sandbox trusts: the 'image' roots (here the test CA) plus the job CA."""
    assert proxy.ca_pem is not None
    bundle = ca_bundle(world.pki.ca_file.read_bytes(), proxy.ca_pem)
    return ssl.create_default_context(cadata=bundle.decode())


def upstream_trust(world: World) -> ssl.SSLContext:
    """What a sandbox needs for a plain tunnel: the upstream's own CA (here the test CA)."""
    return ssl.create_default_context(cafile=str(world.pki.ca_file))


def client(world: World, proxy: Proxy) -> httpx.Client:
    return httpx.Client(proxy=proxy.url, verify=sandbox_context(world, proxy), timeout=10)


def echoed_headers(response: httpx.Response) -> dict[str, str]:
    return dict(response.json()["headers"])


def only_event(proxy: Proxy) -> EgressEvent:
    events = proxy.events.wait(1)
    time.sleep(0.05)  # nothing else may arrive
    assert len(proxy.events.events) == 1, proxy.events.events
    return events[0]


# --- allowed traffic -------------------------------------------------------------------------


def test_allowed_host_over_http(world: World, proxy: Proxy) -> None:
    before = time.time()
    with client(world, proxy) as http:
        response = http.get(f"http://allowed.test:{world.plain.port}/hello?x=1")
    assert response.status_code == 200
    assert response.json()["path"] == "/hello?x=1"
    event = only_event(proxy)
    after = time.time()
    assert before <= event.started_at <= after
    assert 0 <= event.duration_ms <= (after - before) * 1000
    assert (event.host, event.port, event.decision, event.reason) == (
        "allowed.test",
        world.plain.port,
        "allowed",
        "http",
    )
    assert event.bytes_up > 0 and event.bytes_down > len(response.content)


def test_allowed_host_over_https_tunnel(world: World, proxy: Proxy) -> None:
    with client(world, proxy) as http:
        response = http.post(f"https://other.test:{world.tls.port}/upload", content=b"payload")
    assert response.status_code == 200
    assert response.json()["body"] == "payload"
    event = only_event(proxy)
    assert (event.host, event.decision, event.reason) == ("other.test", "allowed", "tunnel")


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_bodies_stream_both_ways(world: World, proxy: Proxy, scheme: str) -> None:
    """Chunked upload, large download and HEAD, plain and through TLS interception."""
    server = world.plain_secret_host if scheme == "http" else world.tls
    base = f"{scheme}://api.secret.test:{server.port}"
    with client(world, proxy) as http:
        upload = http.post(f"{base}/up", content=iter([b"a" * 70000, b"b" * 5]))
        download = http.get(f"{base}/bytes/{3 * 1024 * 1024}")
        head = http.head(f"{base}/bytes/10")
    assert upload.json()["body"] == "a" * 70000 + "bbbbb"
    assert ["transfer-encoding", "chunked"] in upload.json()["headers"]
    assert download.content == b"x" * 3 * 1024 * 1024
    assert head.status_code == 200 and head.headers["content-length"] == "10"
    events = proxy.events.wait(3 if scheme == "http" else 1)  # http: one connection per request
    assert sum(e.bytes_down for e in events) > 3 * 1024 * 1024
    assert sum(e.bytes_up for e in events) > 70000


def test_unallowed_host_denied_and_logged(world: World, proxy: Proxy) -> None:
    before = len(world.plain.requests)
    with client(world, proxy) as http:
        plain = http.get(f"http://denied.test:{world.plain.port}/")
        with pytest.raises(httpx.ProxyError):
            http.get(f"https://denied.test:{world.plain.port}/")
    assert plain.status_code == 403
    assert plain.headers["x-sandcell-egress"] == "not_allowed"
    events = proxy.events.wait(2)
    assert [(e.host, e.decision, e.reason) for e in events] == [
        ("denied.test", "denied", "not_allowed")
    ] * 2
    assert len(world.plain.requests) == before


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("a.corp.example", True),
        ("deep.a.corp.example", True),
        ("corp.example", False),
        ("evilcorp.example", False),
    ],
)
def test_wildcard_matches_subdomains_only(
    world: World, proxy: Proxy, host: str, allowed: bool
) -> None:
    response = raw_request(proxy.addr, _get(f"http://{host}:{world.plain.port}/"))
    assert response.status == (200 if allowed else 403)
    assert only_event(proxy).decision == ("allowed" if allowed else "denied")


# --- address rules ---------------------------------------------------------------------------


def test_loopback_refused_by_default_even_for_an_allowed_name(
    world: World, start_proxy: Callable[..., Proxy]
) -> None:
    default = start_proxy(networks=[])
    response = raw_request(default.addr, _get(f"http://allowed.test:{world.plain.port}/"))
    assert response.status == 403
    event = only_event(default)
    assert (event.decision, event.reason) == ("denied", "blocked_address")

    operator_allowed = start_proxy(networks=LOOPBACK)
    response = raw_request(operator_allowed.addr, _get(f"http://allowed.test:{world.plain.port}/"))
    assert response.status == 200


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",  # CGNAT
        "169.254.169.254",  # cloud metadata
        "0.0.0.0",
        "224.0.0.1",
        "255.255.255.255",
        "::1",
        "fd00::1",
        "fe80::1",
        "::",
        "ff02::1",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "::ffff:10.0.0.1",
        "64:ff9b::a9fe:a9fe",  # NAT64 of the metadata address
        "2002:a9fe:a9fe::1",  # 6to4 of the metadata address
    ],
)
def test_non_public_addresses_refused_by_default(
    world: World, start_proxy: Callable[..., Proxy], address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(TABLE, "private.test", address)
    default = start_proxy(networks=[])
    response = raw_request(default.addr, _get("http://private.test/"))
    assert response.status == 403
    assert only_event(default).reason == "blocked_address"


@pytest.mark.parametrize(
    "address", ["169.254.169.254", "10.0.0.1", "::ffff:127.0.0.2", "fe80::1", "0.0.0.0"]
)
def test_loopback_setting_does_not_open_other_ranges(
    start_proxy: Callable[..., Proxy], address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(TABLE, "private.test", address)
    proxy = start_proxy(networks=LOOPBACK)
    assert raw_request(proxy.addr, _get("http://private.test/")).status == 403


def test_one_blocked_address_refuses_the_whole_name(world: World, proxy: Proxy) -> None:
    # rebind.test answers with a loopback (allowed here) and a private address.
    response = raw_request(proxy.addr, _get(f"http://rebind.test:{world.plain.port}/"))
    assert response.status == 403
    assert only_event(proxy).reason == "blocked_address"


def test_each_name_is_resolved_once_and_the_checked_address_is_used(world: World) -> None:
    """DNS pinning: a second answer (here a blocked one) is never asked for, never used."""
    answers = iter(["127.0.0.2", "10.0.0.1"])
    calls: list[str] = []

    class Rebinding:
        async def resolve(self, name: str) -> list[IPAddress]:
            calls.append(name)
            return [ipaddress.ip_address(next(answers))]

    policy = EgressPolicy.build(["allowed.test"], allowed_networks=LOOPBACK, ports=None)
    with EgressProxy(EgressConfig(policy), EventLog(), Rebinding()) as proxy:
        response = raw_request(proxy.address, _get(f"http://allowed.test:{world.plain.port}/"))
    assert response.status == 200
    assert calls == ["allowed.test"]


def test_system_resolver_answers_are_checked_too() -> None:
    """`localhost` comes from the host's own resolver (/etc/hosts), and is loopback."""
    events = EventLog()
    with EgressProxy(EgressConfig(EgressPolicy.build(["localhost"])), events) as proxy:
        response = raw_request(proxy.address, _get("http://localhost/"))
    assert response.status == 403
    assert events.wait(1)[0].reason == "blocked_address"


def test_stop_reports_connections_still_open(world: World) -> None:
    events = EventLog()
    policy = EgressPolicy.build(["other.test"], allowed_networks=LOOPBACK, ports=None)
    proxy = EgressProxy(EgressConfig(policy), events, StaticResolver(TABLE))
    proxy.start()
    try:
        with tunnel(proxy.address, f"other.test:{world.tls.port}") as connected:
            assert connected.status == 200 and connected.sock is not None
            context = upstream_trust(world)
            with context.wrap_socket(connected.sock, server_hostname="other.test"):
                proxy.stop()  # returns only once every connection's event is delivered
            assert [(e.reason, e.decision) for e in events.events] == [("tunnel", "allowed")]
    finally:
        proxy.stop()


def test_operator_allow_private_covers_rfc1918_not_metadata() -> None:
    policy = EgressPolicy.build(["x.test"], allow_private=True)
    for ok in ["10.0.0.1", "172.31.255.1", "192.168.0.1", "100.64.0.1", "fd12::1", "8.8.8.8"]:
        policy.check_address(_ip(ok))
    for blocked in ["127.0.0.1", "169.254.169.254", "fe80::1", "::ffff:10.0.0.1", "0.0.0.0"]:
        with pytest.raises(Exception, match="blocked_address"):
            policy.check_address(_ip(blocked))


# --- host confusion --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_head", "reason"),
    [
        # absolute-form URL and Host header disagree, both ways round
        (
            b"GET http://allowed.test:{p}/ HTTP/1.1\r\nHost: denied.test:{p}\r\n\r\n",
            "host_mismatch",
        ),
        (
            b"GET http://denied.test:{p}/ HTTP/1.1\r\nHost: allowed.test:{p}\r\n\r\n",
            "host_mismatch",
        ),
        # userinfo: `allowed@evil`
        (b"GET http://allowed.test@denied.test:{p}/ HTTP/1.1\r\nHost: x\r\n\r\n", "userinfo"),
        (b"CONNECT allowed.test@denied.test:{p} HTTP/1.1\r\n\r\n", "userinfo"),
        # IP literals are reachable only when listed themselves
        (b"CONNECT 127.0.0.2:{p} HTTP/1.1\r\n\r\n", "ip_literal"),
        (b"GET http://127.0.0.2:{p}/ HTTP/1.1\r\nHost: 127.0.0.2:{p}\r\n\r\n", "ip_literal"),
        # decimal, hex, octal and short IPv4 spellings
        (b"CONNECT 2130706434:{p} HTTP/1.1\r\n\r\n", "ip_obfuscation"),
        (b"CONNECT 0x7f000002:{p} HTTP/1.1\r\n\r\n", "ip_obfuscation"),
        (b"CONNECT 0177.0.0.2:{p} HTTP/1.1\r\n\r\n", "ip_obfuscation"),
        (b"CONNECT 0x7f.0.0.2:{p} HTTP/1.1\r\n\r\n", "ip_obfuscation"),
        (b"CONNECT 127.2:{p} HTTP/1.1\r\n\r\n", "ip_obfuscation"),
        (b"CONNECT 127.0.0.02:{p} HTTP/1.1\r\n\r\n", "ip_obfuscation"),
        # trailing dots
        (b"CONNECT allowed.test.:{p} HTTP/1.1\r\n\r\n", "trailing_dot"),
        (
            b"GET http://allowed.test.:{p}/ HTTP/1.1\r\nHost: allowed.test.:{p}\r\n\r\n",
            "trailing_dot",
        ),
        # IPv4-mapped and -compatible IPv6
        (b"CONNECT [::ffff:127.0.0.2]:{p} HTTP/1.1\r\n\r\n", "mapped_ipv6"),
        (b"CONNECT [::ffff:7f00:2]:{p} HTTP/1.1\r\n\r\n", "mapped_ipv6"),
        (b"CONNECT [::127.0.0.2]:{p} HTTP/1.1\r\n\r\n", "mapped_ipv6"),
        # a name that resolves to a mapped address is refused too
        (
            b"GET http://mapped.test:{p}/ HTTP/1.1\r\nHost: mapped.test:{p}\r\n\r\n",
            "blocked_address",
        ),
        # other ways to smuggle a second host
        (b"GET http://allowed.test:{p}\\@denied.test/ HTTP/1.1\r\nHost: x\r\n\r\n", "userinfo"),
        (b"GET http://allowed%2etest:{p}/ HTTP/1.1\r\nHost: x\r\n\r\n", "bad_host"),
        (b"GET /relative HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "bad_target"),
        (b"GET https://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "bad_target"),
        # request smuggling: two framings, or two Host headers
        (
            b"POST http://allowed.test:{p}/ HTTP/1.1\r\nHost: allowed.test:{p}\r\n"
            b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "bad_request",
        ),
        (
            b"GET http://allowed.test:{p}/ HTTP/1.1\r\nHost: allowed.test:{p}\r\n"
            b"Host: denied.test\r\n\r\n",
            "bad_request",
        ),
    ],
)
def test_host_confusion_refused(
    world: World, proxy: Proxy, request_head: bytes, reason: str
) -> None:
    before = len(world.plain.requests)
    head = _with_connect_host(request_head.replace(b"{p}", str(world.plain.port).encode()))
    response = raw_request(proxy.addr, head)
    assert response.status in (400, 403, 421)
    assert response.headers["x-sandcell-egress"] == reason
    event = only_event(proxy)
    assert (event.decision, event.reason) == ("denied", reason)
    assert len(world.plain.requests) == before


def test_ports_outside_the_operator_list_refused(world: World) -> None:
    policy = EgressPolicy.build(["allowed.test"], allowed_networks=LOOPBACK)  # 80 and 443 only
    events = EventLog()
    with EgressProxy(EgressConfig(policy), events, StaticResolver(TABLE)) as proxy:
        response = raw_request(proxy.address, _get(f"http://allowed.test:{world.plain.port}/"))
        assert response.status == 403
        assert response.headers["x-sandcell-egress"] == "port_not_allowed"
    assert events.wait(1)[0].port == world.plain.port


def test_listed_ip_literal_is_reachable(world: World, start_proxy: Callable[..., Proxy]) -> None:
    proxy = start_proxy(allow=["127.0.0.2", "127.0.0.3"], secret_hosts=[])
    response = raw_request(proxy.addr, _get(f"http://127.0.0.2:{world.plain.port}/ip"))
    assert response.status == 200
    with tunnel(proxy.addr, f"127.0.0.3:{world.tls.port}") as connected:
        assert connected.status == 200 and connected.sock is not None
        # Clients send no SNI for an address (RFC 6066), and none is needed.
        answer = https_get(connected.sock, upstream_trust(world), "127.0.0.3", "/ip")
    assert answer.status == 200
    events = proxy.events.wait(2)
    assert [(e.host, e.reason) for e in events] == [("127.0.0.2", "http"), ("127.0.0.3", "tunnel")]


def test_sni_must_name_the_connect_host_when_intercepted(world: World, proxy: Proxy) -> None:
    context = sandbox_context(world, proxy)
    context.check_hostname = False  # let the client send a different (or no) server name
    for server_name in ["other.test", None]:
        with tunnel(proxy.addr, f"api.secret.test:{world.tls.port}") as connected:
            assert connected.status == 200 and connected.sock is not None
            with pytest.raises((ssl.SSLError, ConnectionError)):
                context.wrap_socket(connected.sock, server_hostname=server_name)
    events = proxy.events.wait(2)
    assert [(e.decision, e.reason) for e in events] == [("denied", "sni_mismatch")] * 2


def test_host_header_inside_an_intercepted_tunnel_must_match(world: World, proxy: Proxy) -> None:
    before = len(world.tls.requests)
    with tunnel(proxy.addr, f"api.secret.test:{world.tls.port}") as connected:
        assert connected.sock is not None
        tls = sandbox_context(world, proxy).wrap_socket(
            connected.sock, server_hostname="api.secret.test"
        )
        with tls:
            tls.sendall(b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n")
            assert tls.recv(100).startswith(b"HTTP/1.1 421")
    assert len(world.tls.requests) == before
    assert only_event(proxy).reason == "host_mismatch"


def test_absolute_url_for_another_host_inside_an_intercepted_tunnel(
    world: World, proxy: Proxy
) -> None:
    with tunnel(proxy.addr, f"api.secret.test:{world.tls.port}") as connected:
        assert connected.sock is not None
        context = sandbox_context(world, proxy)
        with context.wrap_socket(connected.sock, server_hostname="api.secret.test") as tls:
            target = f"https://other.test:{world.tls.port}/"
            tls.sendall(f"GET {target} HTTP/1.1\r\nHost: other.test\r\n\r\n".encode())
            assert tls.recv(100).startswith(b"HTTP/1.1 421")
    assert only_event(proxy).reason == "host_mismatch"


# --- what a plain tunnel carries ------------------------------------------------------------


def python_client_hello(server_name: str) -> bytes:
    """The first flight Python's TLS client sends for `server_name`: one ClientHello."""
    outgoing = ssl.MemoryBIO()
    context = ssl.create_default_context()
    tls = context.wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname=server_name)
    with contextlib.suppress(ssl.SSLWantReadError):  # waiting for the server, as expected
        tls.do_handshake()
    return outgoing.read()


SERVER_HELLO_START = b"\x16\x03\x03\x00\x08\x02\x00\x00\x04\x03\x03\x00\x00"  # TLS, wrong way


def closed_by_proxy(sock: socket.socket) -> bool:
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("server_name", ["evil.test", "api.secret.test", None])
def test_plain_tunnel_refuses_a_handshake_for_another_name(
    world: World, proxy: Proxy, server_name: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    """CONNECT other.test, then a ClientHello for another site (or none) at that address."""
    caplog.set_level(logging.INFO, logger="sandcell.egress")
    before = len(world.tls.requests)
    context = upstream_trust(world)
    context.check_hostname = False  # let the client send a different (or no) server name
    with tunnel(proxy.addr, f"other.test:{world.tls.port}") as connected:
        assert connected.status == 200 and connected.sock is not None
        with pytest.raises((ssl.SSLError, ConnectionError)):
            context.wrap_socket(connected.sock, server_hostname=server_name)
    event = only_event(proxy)
    assert (event.host, event.decision, event.reason) == ("other.test", "denied", "sni_mismatch")
    assert event.bytes_up > 0 and event.duration_ms >= 0
    assert f"egress denied other.test:{world.tls.port} sni_mismatch" in caplog.text
    assert (repr(server_name) if server_name else "no server name") in caplog.text
    assert len(world.tls.requests) == before


def test_plain_tunnel_compares_names_case_insensitively(world: World, proxy: Proxy) -> None:
    with tunnel(proxy.addr, f"other.test:{world.tls.port}") as connected:
        assert connected.sock is not None
        answer = https_get(connected.sock, upstream_trust(world), "OTHER.Test", "/case")
    assert answer.status == 200
    assert only_event(proxy).reason == "tunnel"


@pytest.mark.parametrize(
    ("first_bytes", "reason"),
    [
        (b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n", "not_tls"),
        (b"SSH-2.0-OpenSSH_9.6\r\n", "not_tls"),
        (SERVER_HELLO_START, "bad_client_hello"),
        (python_client_hello("other.test")[:100], "bad_client_hello"),  # then the sandbox hangs up
    ],
)
def test_plain_tunnel_carries_tls_only(
    world: World, proxy: Proxy, first_bytes: bytes, reason: str
) -> None:
    before = len(world.tls.requests)
    with tunnel(proxy.addr, f"other.test:{world.tls.port}") as connected:
        assert connected.status == 200 and connected.sock is not None
        connected.sock.sendall(first_bytes)
        connected.sock.shutdown(socket.SHUT_WR)
        assert closed_by_proxy(connected.sock)
    event = only_event(proxy)
    assert (event.decision, event.reason) == ("denied", reason)
    assert len(world.tls.requests) == before


def test_bytes_pipelined_behind_the_connect_are_checked_too(world: World, proxy: Proxy) -> None:
    authority = f"other.test:{world.tls.port}"
    with socket.create_connection(proxy.addr, timeout=10) as sock:
        sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        sock.sendall(b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 200")
        assert closed_by_proxy(sock)
    assert only_event(proxy).reason == "not_tls"


def test_plain_tunnel_waits_for_a_client_hello_only_so_long(
    world: World, start_proxy: Callable[..., Proxy]
) -> None:
    proxy = start_proxy(limits=ProxyLimits(tls_handshake_timeout_s=0.3))
    with tunnel(proxy.addr, f"other.test:{world.tls.port}") as connected:
        assert connected.status == 200 and connected.sock is not None
        started = time.monotonic()
        assert closed_by_proxy(connected.sock)
        assert time.monotonic() - started < 5
    event = only_event(proxy)
    assert (event.decision, event.reason) == ("denied", "client_hello_timeout")


def test_client_hello_split_over_records_and_writes_is_relayed_unchanged(
    world: World, proxy: Proxy
) -> None:
    """Reassembled for the check, relayed as sent (the upstream's Finished would catch a change)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = upstream_trust(world).wrap_bio(incoming, outgoing, server_hostname="other.test")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    fragments = [hello[5:][i : i + 100] for i in range(0, len(hello) - 5, 100)]
    split = b"".join(b"\x16\x03\x01" + len(f).to_bytes(2, "big") + f for f in fragments)
    with tunnel(proxy.addr, f"other.test:{world.tls.port}") as connected:
        sock = connected.sock
        assert sock is not None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for start in range(0, len(split), 150):
            sock.sendall(split[start : start + 150])
            time.sleep(0.01)
        _drive(sock, incoming, outgoing, tls.do_handshake)
        tls.write(b"GET /split HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n")
        head = _drive(sock, incoming, outgoing, lambda: tls.read(100))
    assert head.startswith(b"HTTP/1.1 200")
    assert world.tls.requests[-1]["path"] == "/split"
    assert only_event(proxy).reason == "tunnel"


def _drive(
    sock: socket.socket, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO, step: Callable[[], Any]
) -> Any:
    """Run one memory-BIO TLS step to completion over `sock`."""
    while True:
        try:
            result = step()
        except ssl.SSLWantReadError:
            sock.sendall(outgoing.read())
            data = sock.recv(65536)
            assert data, "the tunnel closed"
            incoming.write(data)
            continue
        sock.sendall(outgoing.read())
        return result


# --- redirects -------------------------------------------------------------------------------


def test_redirect_is_relayed_not_followed(world: World, proxy: Proxy) -> None:
    before = len(world.plain.requests)
    location = f"http://denied.test:{world.plain.port}/landing"
    with client(world, proxy) as http:
        response = http.get(f"http://allowed.test:{world.plain.port}/redirect?to={location}")
    assert response.status_code == 302
    assert response.headers["location"] == location
    assert len(world.plain.requests) == before + 1  # only the redirecting request
    assert only_event(proxy).reason == "http"


# --- secrets ---------------------------------------------------------------------------------


def test_secret_header_only_for_the_exact_host(
    world: World, proxy: Proxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    port = world.tls.port
    with client(world, proxy) as http:
        matching = http.get(f"https://api.secret.test:{port}/", headers={"Authorization": "mine"})
        other = http.get(f"https://other.test:{port}/")
        plain = http.get(f"http://api.secret.test:{world.plain_secret_host.port}/")
    with client(world, proxy) as http:  # a fresh connection: the Host names another host
        sneaky = http.get(f"https://api.secret.test:{port}/", headers={"Host": "other.test"})
    assert echoed_headers(matching)["authorization"] == f"Bearer {SECRET}"
    assert SECRET not in other.text and "authorization" not in echoed_headers(other)
    assert SECRET not in plain.text  # never added to clear-text HTTP
    assert sneaky.status_code == 421 and SECRET not in sneaky.text
    events = proxy.events.wait(4)
    assert {e.reason for e in events} == {"tls_intercept", "tunnel", "http", "host_mismatch"}
    for event in events:
        assert SECRET not in repr(event) and SECRET not in json.dumps(event.to_dict())
    assert SECRET not in caplog.text


CLIENTS = """
import hashlib, json, sys
import httpx, requests

def fetch(get):
    try:
        echoed = get(sys.argv[1], timeout=10).json()["headers"]
    except Exception as exc:
        unverified = "CERTIFICATE_VERIFY_FAILED" in str(exc)
        return {"error": type(exc).__name__, "unverified": unverified}
    # digests only: this test's output should not hold the secret either
    auth = [v for k, v in echoed if k == "authorization"]
    return {"auth": [hashlib.sha256(v.encode()).hexdigest() for v in auth]}

print(json.dumps({"requests": fetch(requests.get), "httpx": fetch(httpx.get)}))
"""


def run_with_sandbox_env(proxy: Proxy, bundle: Path, url: str) -> dict[str, Any]:
    """requests and httpx, configured by nothing but what a job's environment holds."""
    env = sandbox_env(proxy.url, str(bundle))
    done = subprocess.run(
        [sys.executable, "-c", CLIENTS, url], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_requests_and_httpx_use_the_proxy_and_trust_the_job_ca_from_the_environment(
    world: World, proxy: Proxy, tmp_path: Path
) -> None:
    assert proxy.ca_pem is not None
    image_roots = world.pki.ca_file.read_bytes()  # the "image's" bundle: the upstream test CA
    bundle, without_job_ca = tmp_path / "ca-bundle.pem", tmp_path / "image-only.pem"
    bundle.write_bytes(ca_bundle(image_roots, proxy.ca_pem))
    without_job_ca.write_bytes(image_roots)
    url = f"https://api.secret.test:{world.tls.port}/clients"
    before = len(world.tls.requests)

    trusted = run_with_sandbox_env(proxy, bundle, url)
    expected = hashlib.sha256(f"Bearer {SECRET}".encode()).hexdigest()
    assert trusted == {"requests": {"auth": [expected]}, "httpx": {"auth": [expected]}}
    assert len(world.tls.requests) == before + 2

    # Control: the same clients refuse the proxy's certificate without the job CA, so it was
    # verification against the job CA (not verification switched off) that let them through.
    untrusted = run_with_sandbox_env(proxy, without_job_ca, url)
    assert untrusted["requests"] == {"error": "SSLError", "unverified": True}
    assert untrusted["httpx"] == {"error": "ConnectError", "unverified": True}
    assert len(world.tls.requests) == before + 2
    events = proxy.events.wait(4)
    assert [e.reason for e in events].count("tls_intercept") == 2


def test_secret_never_reaches_a_wildcard_sibling(
    world: World, start_proxy: Callable[..., Proxy]
) -> None:
    proxy = start_proxy(allow=["*.corp.example"], secret_hosts=["a.corp.example"])
    response = raw_request(proxy.addr, _get(f"http://deep.a.corp.example:{world.plain.port}/"))
    assert response.status == 200 and SECRET not in response.body.decode()


def test_sandbox_sees_a_certificate_from_the_job_ca(world: World, proxy: Proxy) -> None:
    assert proxy.ca_pem is not None
    job_ca_only = ssl.create_default_context(cadata=proxy.ca_pem.decode())
    job_ca_only.verify_flags |= ssl.VERIFY_X509_STRICT  # what Python 3.13+ does by default
    with tunnel(proxy.addr, f"api.secret.test:{world.tls.port}") as connected:
        assert connected.sock is not None
        with job_ca_only.wrap_socket(connected.sock, server_hostname="api.secret.test") as tls:
            certificate = tls.getpeercert()
    assert certificate is not None
    assert "sandcell egress CA" in str(certificate["issuer"])

    upstream_ca_only = ssl.create_default_context(cafile=str(world.pki.ca_file))
    with tunnel(proxy.addr, f"api.secret.test:{world.tls.port}") as connected:
        assert connected.sock is not None
        with pytest.raises(ssl.SSLCertVerificationError):
            upstream_ca_only.wrap_socket(connected.sock, server_hostname="api.secret.test")


def test_job_ca_is_constrained_to_the_secret_hosts(proxy: Proxy) -> None:
    assert proxy.ca_pem is not None
    ca = x509.load_pem_x509_certificate(proxy.ca_pem)
    constraints = ca.extensions.get_extension_for_class(x509.NameConstraints)
    assert constraints.critical
    permitted = {name.value for name in constraints.value.permitted_subtrees or []}
    assert permitted == {"api.secret.test", "bad.test"}
    with pytest.raises(ValueError):
        JobCertificateAuthority(["api.secret.test"]).server_context("other.test", lambda _: True)


def test_upstream_with_untrusted_certificate_refused(world: World, proxy: Proxy) -> None:
    before = len(world.bad.requests)
    with tunnel(proxy.addr, f"bad.test:{world.bad.port}") as connected:
        assert connected.status == 502
        assert connected.headers["x-sandcell-egress"] == "upstream_tls"
    assert only_event(proxy).reason == "upstream_tls"
    assert len(world.bad.requests) == before


def test_upstream_certificate_for_another_name_refused(
    world: World, start_proxy: Callable[..., Proxy], caplog: pytest.LogCaptureFixture
) -> None:
    """A certificate from a trusted CA, but for other names, is still refused."""
    caplog.set_level(logging.INFO, logger="sandcell.egress")
    proxy = start_proxy(secret_hosts=["api.secret.test", "misnamed.test"])
    before = len(world.tls.requests)
    with tunnel(proxy.addr, f"misnamed.test:{world.tls.port}") as connected:
        assert connected.status == 502
        assert connected.headers["x-sandcell-egress"] == "upstream_tls"
    event = only_event(proxy)
    assert (event.host, event.decision, event.reason) == ("misnamed.test", "denied", "upstream_tls")
    assert "hostname mismatch" in caplog.text.lower()
    assert len(world.tls.requests) == before
    # the same server, under a name its certificate carries, is fine
    assert https_get_via(proxy, world, "api.secret.test", "/").status == 200


def https_get_via(proxy: Proxy, world: World, host: str, path: str) -> Any:
    with tunnel(proxy.addr, f"{host}:{world.tls.port}") as connected:
        assert connected.sock is not None
        return https_get(connected.sock, sandbox_context(world, proxy), host, path)


# --- audit and bounds ------------------------------------------------------------------------


def test_every_attempt_produces_exactly_one_event(world: World, proxy: Proxy) -> None:
    port = world.plain.port
    attempts: list[Callable[[], object]] = [
        lambda: raw_request(proxy.addr, _get(f"http://allowed.test:{port}/")),
        lambda: raw_request(proxy.addr, _get(f"http://denied.test:{port}/")),
        lambda: raw_request(proxy.addr, _with_connect_host(b"CONNECT 0x7f.1:443 HTTP/1.1\r\n\r\n")),
        lambda: raw_request(proxy.addr, b"NONSENSE\r\n\r\n"),
        lambda: socket.create_connection(proxy.addr).close(),  # connect, say nothing
        lambda: https_get_via(proxy, world, "api.secret.test", "/"),
        lambda: https_get_via(proxy, world, "other.test", "/"),
    ]
    for attempt in attempts:
        attempt()
    events = proxy.events.wait(len(attempts))
    time.sleep(0.1)
    assert len(proxy.events.events) == len(attempts)
    expected = ["http", "not_allowed", "ip_obfuscation", "bad_request", "no_request"]
    expected += ["tls_intercept", "tunnel"]
    assert sorted(e.reason for e in events) == sorted(expected)


def test_oversized_header_refused(world: World, proxy: Proxy) -> None:
    head = _get(f"http://allowed.test:{world.plain.port}/", extra=b"X-Big: " + b"a" * 40000)
    response = raw_request(proxy.addr, head)
    assert response.status == 431
    assert only_event(proxy).reason == "header_too_large"


def test_connection_limit(world: World, start_proxy: Callable[..., Proxy]) -> None:
    proxy = start_proxy(limits=ProxyLimits(max_connections=2))
    held = [socket.create_connection(proxy.addr) for _ in range(2)]
    try:
        time.sleep(0.1)
        response = raw_request(proxy.addr, _get(f"http://allowed.test:{world.plain.port}/"))
        assert response.status == 503
    finally:
        for sock in held:
            sock.close()
    reasons = [e.reason for e in proxy.events.wait(3)]
    assert reasons.count("connection_limit") == 1


def test_slow_header_idle_tunnel_and_hung_upstream_are_closed(
    world: World, start_proxy: Callable[..., Proxy]
) -> None:
    limits = ProxyLimits(header_timeout_s=0.3, idle_timeout_s=0.3)
    proxy = start_proxy(limits=limits)
    response = raw_request(proxy.addr, b"GET http://allowed.test/ HTTP/1.1\r\n")
    assert response.status == 408
    with tunnel(proxy.addr, f"other.test:{world.tls.port}") as connected:
        assert connected.status == 200 and connected.sock is not None
        context = upstream_trust(world)
        with context.wrap_socket(connected.sock, server_hostname="other.test") as tls:
            started = time.monotonic()
            assert tls.recv(10) == b""  # the proxy closed the idle tunnel
            assert time.monotonic() - started < 5
    hung = raw_request(proxy.addr, _get(f"http://silent.test:{world.silent.port}/"))
    assert hung.status == 504
    reasons = [(e.decision, e.reason) for e in proxy.events.wait(3)]
    assert reasons == [("denied", "header_timeout"), ("allowed", "tunnel"), ("allowed", "http")]


# --- configuration and helpers ---------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern", ["example.com.", "*.com", "*", "*.127.0.0.1", "exa mple.com", "0x7f.1", "::1"]
)
def test_bad_allowlist_entries_refused(pattern: str) -> None:
    with pytest.raises(EgressConfigError):
        EgressPolicy.build([pattern])


def test_allowlist_is_normalised() -> None:
    policy = EgressPolicy.build(["API.Example.COM", "bücher.example", "*.Corp.Example"])
    assert policy.exact == {"api.example.com", "xn--bcher-kva.example"}
    assert policy.suffixes == (".corp.example",)


@pytest.mark.parametrize(
    "spec",
    [
        {"name": "t", "hosts": ["*.corp.example"], "header": "Authorization"},
        {"name": "t", "hosts": ["127.0.0.1"], "header": "Authorization"},
        {"name": "t", "hosts": ["a.test"], "header": "Host"},
        {"name": "t", "hosts": ["a.test"], "header": "Bad Header"},
        {"name": "t", "hosts": ["a.test"], "header": "X", "format": "no placeholder"},
        {"name": "t", "hosts": [], "header": "X"},
    ],
)
def test_bad_secret_rules_refused(spec: dict[str, Any]) -> None:
    with pytest.raises(EgressConfigError) as error:
        SecretRule.from_spec(spec, SECRET)
    assert SECRET not in str(error.value)


def test_secret_with_control_characters_refused_without_echoing_it() -> None:
    spec = {"name": "t", "hosts": ["a.test"], "header": "X-Key"}
    with pytest.raises(EgressConfigError) as error:
        SecretRule.from_spec(spec, "abc\r\nX-Injected: 1")
    assert "X-Injected" not in str(error.value)
    rule = SecretRule.from_spec(spec, SECRET)
    assert SECRET not in repr(rule)


def test_secret_host_must_be_allowed() -> None:
    with pytest.raises(EgressConfigError):
        EgressConfig(EgressPolicy.build(["other.test"]), _secret_rules(["api.secret.test"]))


def test_redactor_scrubs_secret_values() -> None:
    """The proxy's own scrubbing of denial details; logs go through sandcell.logs' redaction."""
    redactor = Redactor({"crm_token": SECRET, "short": "abc"})
    assert redactor.redact(f"Bearer {SECRET} abc") == "Bearer [redacted:crm_token] [redacted:short]"


def test_sandbox_env(tmp_path: Path) -> None:
    env = sandbox_env("http://10.200.0.1:3128", "/etc/sandcell/ca-bundle.pem")
    assert env["HTTPS_PROXY"] == env["http_proxy"] == "http://10.200.0.1:3128"
    assert env["NO_PROXY"] == ""
    assert env["SSL_CERT_FILE"] == env["REQUESTS_CA_BUNDLE"] == "/etc/sandcell/ca-bundle.pem"
    assert "SSL_CERT_FILE" not in sandbox_env("http://10.200.0.1:3128")
    assert ca_bundle(b"A", b"B") == b"A\nB"


def _get(url: str, extra: bytes = b"") -> bytes:
    authority = url.split("/")[2]
    head = f"GET {url} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n".encode()
    return head + (extra + b"\r\n" if extra else b"") + b"\r\n"


def _with_connect_host(head: bytes) -> bytes:
    """HTTP/1.1 requires a Host header; a CONNECT's names its own target."""
    if not head.startswith(b"CONNECT ") or b"Host:" in head:
        return head
    authority = head.split(b" ")[1]
    return head.replace(b"\r\n", b"\r\nHost: " + authority + b"\r\n", 1)


def _ip(text: str) -> IPAddress:
    return ipaddress.ip_address(text)
