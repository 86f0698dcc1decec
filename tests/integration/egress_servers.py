"""Loopback endpoints and raw clients for the egress proxy tests and benchmark.

Everything here binds to 127.0.0.0/8 only. The echo server answers every request with a JSON
description of what it received (method, path, headers), so a test can see exactly what the proxy
forwarded, including any injected header.
"""

import contextlib
import datetime
import ipaddress
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey) -> Any:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


class TestPKI:
    """A test CA on disk, issuing server certificates for loopback servers."""

    __test__ = False  # not a pytest test class

    def __init__(self, directory: Path, label: str = "sandcell test CA") -> None:
        self.directory = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._cert = (
            _builder(_name(label), _name(label), self._key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.ca_file = directory / f"{label.replace(' ', '-')}.pem"
        self.ca_file.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def server_context(self, names: list[str]) -> ssl.SSLContext:
        """A TLS server context with a certificate for `names` (DNS names or IPs)."""
        key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = []
        for name in names:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                sans.append(x509.DNSName(name))
        cert = (
            _builder(_name(names[0]), self._cert.subject, key)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        stem = self.directory / f"server-{abs(hash(tuple(names)))}"
        cert_file, key_file = stem.with_suffix(".crt"), stem.with_suffix(".key")
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        return context


class _EchoHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # head and body are separate writes: no 40 ms delayed-ACK stall
    server: "EchoServer"

    def _read_body(self) -> bytes:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while size := int(self.rfile.readline().split(b";")[0], 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
            return body
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length else b""

    def _answer(self) -> None:
        body = self._read_body()
        record = {
            "method": self.command,
            "path": self.path,
            "headers": [[k.lower(), v] for k, v in self.headers.items()],
            "body": body.decode("latin-1"),
        }
        self.server.requests.append(record)
        if self.path.startswith("/redirect"):
            self._send(302, b"", [("Location", self.path.partition("to=")[2])])
        elif self.path.startswith("/bytes/"):
            self._send(200, b"x" * int(self.path.split("/")[2]), [])
        else:
            self._send(200, json.dumps(record).encode(), [("Content-Type", "application/json")])

    def _send(self, status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_HEAD = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


class EchoServer(ThreadingHTTPServer):
    """An HTTP(S) echo server on a loopback address, in a background thread."""

    daemon_threads = True

    def __init__(self, host: str, tls: ssl.SSLContext | None = None) -> None:
        super().__init__((host, 0), _EchoHandler)
        self.requests: list[dict[str, Any]] = []
        if tls is not None:
            # Handshake in the handler thread, so a client that never finishes cannot stall accept.
            self.socket = tls.wrap_socket(
                self.socket, server_side=True, do_handshake_on_connect=False
            )
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # refused handshakes are what some tests are about

    def __enter__(self) -> "EchoServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(5)


class SilentServer:
    """Accepts connections and reads, but never answers: an upstream that hangs."""

    def __init__(self, host: str) -> None:
        self._listener = socket.create_server((host, 0))
        self.port = int(self._listener.getsockname()[1])
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                self._held.append(self._listener.accept()[0])

    def __enter__(self) -> "SilentServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close() does not
        self._listener.close()
        self._thread.join(5)
        for sock in self._held:
            sock.close()


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes
    sock: socket.socket | None = field(default=None, repr=False)


def _read_head(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response head: {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), headers, rest


def raw_request(proxy: tuple[str, int], head: bytes, timeout: float = 10) -> RawResponse:
    """Send bytes as they are to the proxy; read one response (body up to close/length)."""
    with socket.create_connection(proxy, timeout=timeout) as sock:
        sock.sendall(head)
        status, headers, rest = _read_head(sock)
        length = int(headers.get("content-length", "-1"))
        while len(rest) < length or length < 0:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
        return RawResponse(status, headers, rest)


@contextlib.contextmanager
def tunnel(proxy: tuple[str, int], authority: str, timeout: float = 10) -> Iterator[RawResponse]:
    """CONNECT through the proxy; on 200 the response carries the open socket."""
    sock = socket.create_connection(proxy, timeout=timeout)
    try:
        sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        status, headers, _ = _read_head(sock)
        yield RawResponse(status, headers, b"", sock)
    finally:
        sock.close()


def https_get(sock: socket.socket, context: ssl.SSLContext, host: str, path: str) -> RawResponse:
    """One HTTP/1.1 GET over TLS on an established tunnel; the response body is read whole."""
    with context.wrap_socket(sock, server_hostname=host) as tls:
        tls.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        status, headers, rest = _read_head(tls)
        while chunk := tls.recv(65536):
            rest += chunk
        return RawResponse(status, headers, rest)
