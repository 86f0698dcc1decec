"""`ProxyEgress`, the Egress port's adapter, driven from the host over its real unix socket.

The sandbox side is covered by tests/security/test_network.py; here: the session directory, the CA
bundle, the environment, the events, and closing. Endpoints are loopback servers only.
"""

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

from sandcell.domain.redaction import REDACTOR
from sandcell.egress import EgressConfigError, ProxyEgress, StaticResolver
from sandcell.ports.egress import GUEST_CA_BUNDLE, SOCKET_NAME, SecretBinding
from tests.integration.egress_servers import EchoServer

IMAGE_CA = b"-----BEGIN CERTIFICATE-----\nimage roots stand-in\n-----END CERTIFICATE-----\n"
SECRET_SPEC = {"name": "crm", "hosts": ["api.secret.test"], "header": "Authorization"}


@pytest.fixture(scope="module")
def echo() -> Iterator[EchoServer]:
    with EchoServer("127.0.0.2") as server:
        yield server


@pytest.fixture
def egress(tmp_path: Path) -> ProxyEgress:
    table = {"allowed.test": "127.0.0.2", "api.secret.test": "127.0.0.2"}
    return ProxyEgress(
        tmp_path / "egress",
        allowed_networks=["127.0.0.0/8"],
        ports=None,
        resolver=StaticResolver(table),
    )


@pytest.fixture
def image_ca(tmp_path: Path) -> Path:
    path = tmp_path / "image-ca.pem"
    path.write_bytes(IMAGE_CA)
    return path


def http_over_unix(path: Path, target: str) -> tuple[int, bytes]:
    """One absolute-form GET through the proxy's unix socket, as the bridge would carry it."""
    host = target.split("/")[2]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_a_session_serves_its_socket_and_records_every_connection(
    egress: ProxyEgress, image_ca: Path, echo: EchoServer
) -> None:
    session = egress.open("job-1-1", ["allowed.test"], [], image_ca)
    sock = session.attachment.socket_dir / SOCKET_NAME
    status, body = http_over_unix(sock, f"http://allowed.test:{echo.port}/hello")
    assert status == 200 and json.loads(body)["path"] == "/hello"
    assert http_over_unix(sock, f"http://other.test:{echo.port}/")[0] == 403
    session.close()
    events = session.events()
    assert [(e["host"], e["decision"], e["reason"]) for e in events] == [
        ("allowed.test", "allowed", "http"),
        ("other.test", "denied", "not_allowed"),
    ]
    assert not session.attachment.socket_dir.parent.exists()
    session.close()  # twice is fine


def test_env_points_at_the_bridge_and_the_guest_ca_bundle(
    egress: ProxyEgress, image_ca: Path
) -> None:
    session = egress.open("job-env-1", ["allowed.test"], [], image_ca)
    try:
        env = session.env()
    finally:
        session.close()
    assert env["HTTPS_PROXY"] == env["http_proxy"] == "http://127.0.0.1:3128"
    assert env["SSL_CERT_FILE"] == env["REQUESTS_CA_BUNDLE"] == GUEST_CA_BUNDLE
    assert env["NO_PROXY"] == ""


def test_the_ca_bundle_is_the_image_roots_plus_the_job_ca_only_with_secrets(
    egress: ProxyEgress, image_ca: Path
) -> None:
    plain = egress.open("job-ca-1", ["allowed.test"], [], image_ca)
    with_secret = egress.open(
        "job-ca-2", ["api.secret.test"], [SecretBinding(SECRET_SPEC, "v-123")], image_ca
    )
    try:
        assert plain.attachment.ca_bundle.read_bytes() == IMAGE_CA
        bundle = with_secret.attachment.ca_bundle.read_bytes()
        assert bundle.startswith(IMAGE_CA) and b"v-123" not in bundle
        job_ca = x509.load_pem_x509_certificate(bundle[len(IMAGE_CA) :])
        assert "job-ca-2" in job_ca.subject.rfc4514_string()
    finally:
        plain.close()
        with_secret.close()


def test_events_are_collected_safely_from_concurrent_connections(
    egress: ProxyEgress, image_ca: Path, echo: EchoServer
) -> None:
    session = egress.open("job-many-1", ["allowed.test"], [], image_ca)
    sock = session.attachment.socket_dir / SOCKET_NAME
    url = f"http://allowed.test:{echo.port}/n"
    threads = [threading.Thread(target=http_over_unix, args=(sock, url)) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    session.close()
    assert len(session.events()) == 20


def test_each_open_gets_its_own_short_directory_and_leaves_others_alone(
    egress: ProxyEgress, image_ca: Path
) -> None:
    first = egress.open("job-dup-1", ["allowed.test"], [], image_ca)
    second = egress.open("job-dup-1", ["allowed.test"], [], image_ca)
    try:
        assert first.attachment.socket_dir != second.attachment.socket_dir
        assert len(first.attachment.socket_dir.parent.name) == 16  # not the (long) session id
        second.close()
        assert (first.attachment.socket_dir / SOCKET_NAME).is_socket()
    finally:
        first.close()


@pytest.mark.parametrize("session_id", ["../escape", "a/b", "", ".hidden", "x" * 200])
def test_session_ids_that_are_not_plain_names_are_refused(
    egress: ProxyEgress, image_ca: Path, session_id: str
) -> None:
    with pytest.raises(ValueError):
        egress.open(session_id, ["allowed.test"], [], image_ca)


def test_a_socket_path_too_long_for_unix_sockets_is_refused(tmp_path: Path, image_ca: Path) -> None:
    deep = ProxyEgress(tmp_path / ("d" * 90))
    with pytest.raises(ValueError, match="too long"):
        deep.open("job-1", ["allowed.test"], [], image_ca)


def test_an_invalid_policy_fails_and_leaves_nothing(
    egress: ProxyEgress, image_ca: Path, tmp_path: Path
) -> None:
    with pytest.raises(EgressConfigError):
        egress.open("job-bad-1", ["*"], [], image_ca)
    assert not (tmp_path / "egress" / "job-bad-1").exists()


def test_reap_removes_what_a_crashed_worker_left(egress: ProxyEgress, image_ca: Path) -> None:
    session = egress.open("job-crash-1", ["allowed.test"], [], image_ca)
    leftover = session.attachment.socket_dir.parent
    assert leftover.is_dir()
    reaped = egress.reap()  # as a restarted worker would, before serving anything
    assert reaped == [f"egress {leftover.name}"] and not leftover.exists()
    session.close()


def test_secret_values_are_masked_in_logs_while_any_session_using_them_is_open(
    egress: ProxyEgress, image_ca: Path
) -> None:
    binding = SecretBinding(SECRET_SPEC, "tok-shared-4711")
    line = "upstream said tok-shared-4711"
    job = egress.open("job-mask", ["api.secret.test"], [binding], image_ca)
    session = egress.open("ses-mask", ["api.secret.test"], [binding], image_ca)
    assert REDACTOR(line) == "upstream said [redacted:crm]"
    job.close()
    assert REDACTOR(line) == "upstream said [redacted:crm]", "the session still uses it"
    session.close()
    assert REDACTOR(line) == line
