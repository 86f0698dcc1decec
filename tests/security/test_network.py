"""The network of a real sandbox, on every runtime: nothing by default; with egress, the job's
proxy only (gVisor: --network=none and the bridge; bwrap: its own network namespace, the same
bridge, the socket directory bound in by the launch chain).

Every endpoint is a loopback server this module starts on the host. Names resolve through a
static table to 127.0.0.x, the operator setting allows 127.0.0.0/8, and a guard makes the proxy
fail the test rather than connect anywhere off loopback. Each sandbox runs one probe program
that tries everything and prints what happened as JSON, so the module stays a few sandboxes long.
"""

import contextlib
import hashlib
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sandcell.domain.images import Image
from sandcell.domain.states import Reason
from sandcell.egress import ProxyEgress, ProxySession, StaticResolver
from sandcell.egress import handler as handler_module
from sandcell.egress.resolve import connect_pinned
from sandcell.ports.egress import GUEST_CA_BUNDLE, SecretBinding
from tests.integration.conftest import GUEST_ENV
from tests.integration.egress_servers import EchoServer, TestPKI
from tests.loopback_dns import LoopbackDns
from tests.security.conftest import Ran, RunCode

SECRET = "s3cr3t-sandbox-net-7c1e9a04d2"
TABLE = {"allowed.test": "127.0.0.2", "denied.test": "127.0.0.2", "api.secret.test": "127.0.0.3"}
SECRET_SPEC = {"name": "crm", "hosts": ["api.secret.test"], "header": "Authorization"}
SECRET_SPEC |= {"format": "Bearer {value}"}


@dataclass
class Endpoints:
    pki: TestPKI
    plain: EchoServer  # HTTP on 127.0.0.2: allowed.test (and denied.test)
    tls: EchoServer  # HTTPS on 127.0.0.3: api.secret.test, the host with a secret
    local: EchoServer  # HTTP on 127.0.0.1: what a sandbox's own "localhost" must not reach
    udp: LoopbackDns  # UDP on 127.0.0.1: records (and answers) every datagram


@pytest.fixture
def endpoints(tmp_path: Path) -> Iterator[Endpoints]:
    """Fresh servers for every test (and every runtime): what each saw is that test's alone."""
    pki = TestPKI(tmp_path)
    udp = LoopbackDns()
    with (
        EchoServer("127.0.0.2") as plain,
        EchoServer("127.0.0.3", pki.server_context(["api.secret.test"])) as tls,
        EchoServer("127.0.0.1") as local,
    ):
        yield Endpoints(pki, plain, tls, local, udp)
    udp.__exit__(None, None, None)


@pytest.fixture(autouse=True)
def only_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail, rather than connect, if the proxy ever tries an address off this host."""

    async def guarded(addresses: Any, *args: Any, **kwargs: Any) -> Any:
        assert all(ip.is_loopback for ip in addresses), f"refusing to leave loopback: {addresses}"
        return await connect_pinned(addresses, *args, **kwargs)

    monkeypatch.setattr(handler_module, "connect_pinned", guarded)


@pytest.fixture
def egress(tmp_path: Path, endpoints: Endpoints) -> ProxyEgress:
    return ProxyEgress(
        tmp_path / "egress",
        allowed_networks=["127.0.0.0/8"],  # the operator setting the loopback servers need
        ports=None,  # they listen on ephemeral ports
        upstream_ca_file=str(endpoints.pki.ca_file),
        resolver=StaticResolver(TABLE),
    )


@pytest.fixture
def session(egress: ProxyEgress, python_image: Image) -> Iterator[ProxySession]:
    secrets = [SecretBinding(SECRET_SPEC, SECRET)]
    image_ca = python_image.rootfs / "etc/ssl/certs/ca-certificates.crt"
    opened = egress.open("net-job-1", ["allowed.test", "api.secret.test"], secrets, image_ca)
    yield opened
    opened.close()


@contextlib.contextmanager
def abstract_listener() -> Iterator[str]:
    """A host unix socket in the abstract namespace (no file to mount): the sandbox's target."""
    name = f"sandcell-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(f"\0{name}")
        listener.listen(1)
        yield name


def probe(run_code: RunCode, body: str, **kwargs: Any) -> tuple[dict[str, Any], Ran]:
    """Run `body` (which fills the dict `out`) in a sandbox; return `out` and the run."""
    code = f"{PROBE_HELPERS}\nout = {{}}\n{body}\nprint(json.dumps(out))\n"
    ran = run_code(code, **kwargs)
    assert ran.result.reason is None, (ran.result, ran.sink.stderr)
    return json.loads(ran.sink.stdout), ran


PROBE_HELPERS = """
import hashlib, json, os, socket, ssl, stat, urllib.error, urllib.request

def outcome(fn):
    try:
        return ["ok", fn()]
    except Exception as exc:
        return [type(exc).__name__, str(exc)[:200]]

def tcp(host, port):
    with socket.create_connection((host, port), timeout=3) as s:
        s.sendall(b"GET /direct HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
        return s.recv(100).decode("latin-1")

def udp_send(port):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        return s.sendto(b"sandbox-datagram", ("127.0.0.1", port))

def unix(address, bind=False):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(address) if bind else s.connect(address)

def sockets_in_the_tree():
    found = []
    for root, dirs, files in os.walk("/"):
        if root == "/":
            dirs[:] = [d for d in dirs if d not in ("proc", "sys")]
        for name in files:
            path = os.path.join(root, name)
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                found.append(path)
    return found

def fetch(url, **kwargs):
    try:
        with urllib.request.urlopen(url, timeout=10, **kwargs) as r:
            return [r.status, json.loads(r.read())]
    except urllib.error.HTTPError as exc:
        return [exc.code, exc.headers.get("x-sandcell-egress")]
"""


# --- no egress: nothing at all ----------------------------------------------------------------


def test_without_egress_there_is_no_network(run_code: RunCode, endpoints: Endpoints) -> None:
    local, udp = endpoints.local.port, endpoints.udp.port
    with abstract_listener() as abstract_name:
        out, _ = probe(
            run_code,
            f"""
out["tcp_local"] = outcome(lambda: tcp("127.0.0.1", {local}))
out["tcp_other"] = outcome(lambda: tcp("127.0.0.2", {endpoints.plain.port}))
out["proxy_port"] = outcome(lambda: tcp("127.0.0.1", 3128))
out["udp"] = outcome(lambda: udp_send({udp}))
out["host_abstract"] = outcome(lambda: unix("\\0{abstract_name}"))
out["sockets"] = sockets_in_the_tree()
out["dns"] = outcome(lambda: socket.getaddrinfo("allowed.test", 80))
out["raw"] = outcome(lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
out["packet"] = outcome(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))
out["interfaces"] = [name for _, name in socket.if_nameindex()]
out["egress_dir"] = os.listdir("/run/sandcell/egress")
out["ca_bundle"] = os.path.getsize("/etc/sandcell/ca-bundle.pem")
""",
        )
    for name in ("tcp_local", "tcp_other", "proxy_port"):
        assert out[name][0] in {"ConnectionRefusedError", "OSError", "TimeoutError"}, out[name]
    assert out["dns"][0] == "gaierror", out["dns"]
    assert out["raw"][0] == "PermissionError" and out["packet"][0] == "PermissionError", out
    assert out["interfaces"] == ["lo"]
    assert out["host_abstract"][0] == "ConnectionRefusedError", out  # the host's namespace
    assert out["sockets"] == []  # no host socket of any kind is mounted in
    assert out["egress_dir"] == [] and out["ca_bundle"] == 0  # the image's empty mount points
    assert not endpoints.local.requests and not endpoints.plain.requests
    # A datagram "sent" to the sandbox's own loopback goes nowhere; the host's server never sees it.
    assert out["udp"][0] in {"ok", "ConnectionRefusedError", "OSError"}, out["udp"]
    time.sleep(0.2)  # a datagram that had left would have arrived by now
    assert not endpoints.udp.queries


# --- with egress: the job's proxy, and only it -------------------------------------------------


def test_with_egress_only_the_proxy_is_reachable(
    run_code: RunCode, endpoints: Endpoints, session: ProxySession
) -> None:
    plain, tls = endpoints.plain.port, endpoints.tls.port
    image_bundle = "/etc/ssl/certs/ca-certificates.crt"
    with abstract_listener() as abstract_name:
        out, ran = probe(
            run_code,
            f"""
out["allowed"] = fetch("http://allowed.test:{plain}/page")
out["direct"] = outcome(lambda: tcp("127.0.0.2", {plain}))
out["direct_local"] = outcome(lambda: tcp("127.0.0.1", {endpoints.local.port}))
out["denied"] = fetch("http://denied.test:{plain}/nope")
out["dns"] = outcome(lambda: socket.getaddrinfo("allowed.test", 80))
out["udp"] = outcome(lambda: udp_send({endpoints.udp.port}))
status, echoed = fetch("https://api.secret.test:{tls}/with-secret")
headers = dict(echoed["headers"]) if status == 200 else {{}}
auth = headers.get("authorization", "")
out["secret_request"] = [status, hashlib.sha256(auth.encode()).hexdigest()]
out["without_job_ca"] = outcome(lambda: fetch(
    "https://api.secret.test:{tls}/untrusted",
    context=ssl.create_default_context(cafile="{image_bundle}"),
))
out["cafile"] = ssl.get_default_verify_paths().cafile
out["interfaces"] = [name for _, name in socket.if_nameindex()]
out["sockets"] = sockets_in_the_tree()
out["proxy_socket"] = stat.S_ISSOCK(os.stat("/run/sandcell/egress/proxy.sock").st_mode)
out["host_abstract"] = outcome(lambda: unix("\\0{abstract_name}"))
out["bind_in_egress_dir"] = outcome(lambda: unix("/run/sandcell/egress/mine.sock", bind=True))
# Everything of the sandbox that could hold the secret, as files (stdout is kept small).
with open("/output/environ", "wb") as f:
    f.write(open("/proc/self/environ", "rb").read())
with open("/output/ca-bundle.pem", "wb") as f:
    f.write(open("{GUEST_CA_BUNDLE}", "rb").read())
with open("/output/cmdlines", "wb") as f:
    for p in (p for p in os.listdir("/proc") if p.isdigit()):
        f.write(open(f"/proc/{{p}}/cmdline", "rb").read() + b"\\n")
""",
            env=GUEST_ENV | session.env(),
            egress=session.attachment,
        )
    assert out["allowed"][0] == 200 and out["allowed"][1]["path"] == "/page"
    assert out["direct"][0] != "ok" and out["direct_local"][0] != "ok", out
    assert out["denied"] == [403, "not_allowed"]
    assert out["dns"][0] == "gaierror"
    assert out["interfaces"] == ["lo"]
    assert out["host_abstract"][0] == "ConnectionRefusedError", out  # the host's namespace
    # The proxy's socket is the one host socket in reach, and its directory is not listable.
    assert out["sockets"] == [] and out["proxy_socket"] is True
    assert out["udp"][0] in {"ok", "ConnectionRefusedError", "OSError"}, out["udp"]
    assert out["bind_in_egress_dir"][0] in {"PermissionError", "OSError"}, out
    # Through the proxy, TLS terminated with the job CA (verified by the sandbox's own ssl
    # through SSL_CERT_FILE), the header added upstream; the image's roots alone do not verify.
    expected = hashlib.sha256(f"Bearer {SECRET}".encode()).hexdigest()
    assert out["secret_request"] == [200, expected]
    assert out["cafile"] == GUEST_CA_BUNDLE
    assert "CERTIFICATE_VERIFY_FAILED" in out["without_job_ca"][1]
    assert [r["path"] for r in endpoints.plain.requests] == ["/page"]  # no direct request got in
    upstream = [dict(r["headers"]) for r in endpoints.tls.requests]
    assert upstream == [upstream[0]] and upstream[0]["authorization"] == f"Bearer {SECRET}"
    # The secret is nowhere in the sandbox: environment, CA bundle, command lines, output.
    files = ran.sink.files
    assert files["ca-bundle.pem"] == session.attachment.ca_bundle.read_bytes()
    assert b"HTTPS_PROXY=http://127.0.0.1:3128" in files["environ"]
    assert b"-I\0-S\0-c" in files["cmdlines"]  # the bridge's command line is among them
    for text in (*files.values(), ran.sink.stdout.encode(), ran.sink.stderr.encode()):
        assert SECRET.encode() not in text
    session.close()
    events = session.events()
    assert SECRET not in json.dumps(events)
    seen = {(e["host"], e["decision"], e["reason"]) for e in events}
    assert ("allowed.test", "allowed", "http") in seen
    assert ("denied.test", "denied", "not_allowed") in seen
    assert ("api.secret.test", "allowed", "tls_intercept") in seen
    assert {e["host"] for e in events} == {"allowed.test", "denied.test", "api.secret.test"}
    assert not endpoints.udp.queries  # the datagram had nowhere to go


def test_the_bridge_does_not_count_against_the_process_budget(
    run_code: RunCode, session: ProxySession
) -> None:
    forks = """
import os, sys, time
kids = []
for _ in range(int(sys.argv[1]) - 1):  # the children plus this process
    pid = os.fork()
    if pid == 0:
        time.sleep(1.5)
        os._exit(0)
    kids.append(pid)
print(sum(os.waitstatus_to_exitcode(os.waitpid(k, 0)[1]) for k in kids))
"""
    at_budget = run_code(
        forks, argv=["/usr/bin/python3.11", "/job/main.py", "4"], egress=session.attachment, pids=4
    )
    assert at_budget.result.reason is None and at_budget.sink.stdout == "0\n", at_budget.result
    over = run_code(
        forks, argv=["/usr/bin/python3.11", "/job/main.py", "5"], egress=session.attachment, pids=4
    )
    assert over.result.reason is Reason.PIDS, over.result


def test_the_proxy_socket_is_private_to_the_worker(session: ProxySession) -> None:
    socket_dir = session.attachment.socket_dir
    state_dir = socket_dir.parent.parent
    assert state_dir.stat().st_mode & 0o777 == 0o700  # what keeps other host users out
    assert socket_dir.stat().st_mode & 0o777 == 0o711
    assert session.attachment.ca_bundle.stat().st_mode & 0o777 == 0o644
    session.close()
    assert not socket_dir.parent.exists()
