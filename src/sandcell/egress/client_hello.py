"""The server name a TLS ClientHello asks for: what a plain CONNECT tunnel checks before relaying.

A plain tunnel carries TLS end to end, so the proxy never sees a certificate; what it does see is
the ClientHello's server_name (SNI), which picks the site the upstream serves (behind a CDN or a
shared ingress, any site on it). A tunnel admitted for `allowed.test` must not carry a handshake
for `evil.test`, so the handler reads the first ClientHello whole, compares its name with the
CONNECT host, and only then relays the bytes it read, unchanged.

Why a parser here rather than a library: nothing in the lock file reads a ClientHello
(`cryptography` has no TLS layer; mitmproxy has one but is not a dependency, and a large one for
this), and the standard `ssl` module hands the name only to a server that goes on negotiating
with the client. So this reads just the framing that leads to the name: record → handshake →
extensions → server_name (RFC 8446 §5.1, §4.1.2, §4.2; RFC 6066 §3). It is strict: every length
is checked against what encloses it, and anything ambiguous (a repeated extension, more than one
name, a name that is not printable ASCII) is refused rather than guessed at, because the upstream
might read it the other way.

Only the first ClientHello is read. What follows is encrypted or, for a TLS 1.3 HelloRetryRequest,
a second ClientHello the upstream itself must hold to the first (RFC 8446 §4.1.2). Encrypted
Client Hello puts the real name out of reach; its outer name is a different host, so it is
refused like any other mismatch.
"""

from dataclasses import dataclass

from sandcell.egress.errors import EgressDenied
from sandcell.egress.hosts import Host

# Bytes read (records included) before the ClientHello must be complete. Real ones are 0.3-2 KiB,
# post-quantum key shares included; a larger bound only gives a sandbox more memory to hold.
MAX_CLIENT_HELLO = 64 * 1024

_RECORD_HEADER = 5  # content type, legacy version (2), length (2)
_MAX_RECORD = 2**14  # RFC 8446 §5.1: plaintext fragments are at most 2^14 bytes
_HANDSHAKE_RECORD = 0x16
_CLIENT_HELLO = 0x01
_HANDSHAKE_HEADER = 4  # message type, length (3)
_SERVER_NAME = 0x0000
_HOST_NAME = 0x00


@dataclass(frozen=True)
class ClientHello:
    server_name: str | None  # normalised (see `normalize_server_name`); None when not sent


class ClientHelloReader:
    """Takes the tunnel's first bytes as they arrive until the first ClientHello is whole.

    Each byte is looked at once, however the sandbox splits its writes or its records, so a
    sandbox sending one byte at a time costs linear work, not a reparse per read.
    """

    def __init__(self) -> None:
        self.data = bytearray()  # everything received, to be relayed unchanged
        self._handshake = bytearray()  # record fragments, reassembled
        self._offset = 0  # where the next unread record starts in `data`

    def feed(self, chunk: bytes) -> ClientHello | None:
        """The ClientHello once it is whole, else None (feed more).

        Raises EgressDenied: `not_tls` when the bytes do not start a TLS handshake,
        `bad_client_hello` when the ClientHello is malformed, ambiguous or too large.
        """
        self.data += chunk
        while (message := self._message()) is None:
            if not self._next_record():
                if len(self.data) >= MAX_CLIENT_HELLO:
                    raise _malformed(f"no whole ClientHello in {MAX_CLIENT_HELLO} bytes")
                return None
        return ClientHello(_server_name(message))

    def _message(self) -> bytes | None:
        size = _message_size(self._handshake)
        if size is None or len(self._handshake) < size:
            return None
        return bytes(self._handshake[_HANDSHAKE_HEADER:size])

    def _next_record(self) -> bool:
        """Append the next record's fragment to the handshake; False while it is incomplete."""
        start = self._offset
        header = bytes(self.data[start : start + _RECORD_HEADER])
        _check_record_header(header, first=start == 0)
        if len(header) < _RECORD_HEADER:
            return False
        end = start + _RECORD_HEADER + int.from_bytes(header[3:5], "big")
        if len(self.data) < end:
            return False
        self._handshake += self.data[start + _RECORD_HEADER : end]
        self._offset = end
        return True


def normalize_server_name(name: str) -> str:
    """Lowercase, one trailing dot removed: the form a CONNECT host is compared in."""
    return name.lower().removesuffix(".")


def check_server_name(host: Host, server_name: str | None) -> None:
    """Refuse a ClientHello for anything but the CONNECT host (raise EgressDenied).

    A named host needs SNI: without it the upstream serves its default site, which on a shared
    front is not necessarily the allowed one, and every current TLS client sends SNI for a name
    anyway. An address needs none: RFC 6066 forbids addresses in SNI, so clients leave it out,
    and a name there would pick a site behind that address that the allowlist never named. The
    address itself is tolerated, as some clients send it regardless.
    """
    if host.ip is not None:
        if server_name is not None and server_name != str(host.ip):
            raise EgressDenied("sni_mismatch", f"server name {server_name[:100]!r} for {host}")
    elif server_name is None:
        raise EgressDenied("sni_mismatch", f"no server name sent for {host}")
    elif server_name != host.name:
        raise EgressDenied("sni_mismatch", f"server name {server_name[:100]!r} for {host}")


def _check_record_header(header: bytes, first: bool) -> None:
    """Check as much of a record header as has arrived, so non-TLS bytes are refused at once."""
    wrong_type = header[:1] not in (b"", bytes([_HANDSHAKE_RECORD]))
    wrong_version = header[1:2] not in (b"", b"\x03")  # every TLS and SSLv3 record is 3.x
    if wrong_type or wrong_version:
        if first:
            raise EgressDenied("not_tls", "the tunnel did not start with a TLS handshake")
        raise _malformed("a record inside the ClientHello that is not a handshake record")
    if len(header) == _RECORD_HEADER and not 0 < int.from_bytes(header[3:5], "big") <= _MAX_RECORD:
        raise _malformed("handshake record of invalid length")


def _message_size(handshake: bytearray) -> int | None:
    if len(handshake) < _HANDSHAKE_HEADER:
        return None
    if handshake[0] != _CLIENT_HELLO:
        raise _malformed("the first handshake message is not a ClientHello")
    size = _HANDSHAKE_HEADER + int.from_bytes(handshake[1:4], "big")
    if size > MAX_CLIENT_HELLO:
        raise _malformed(f"ClientHello larger than {MAX_CLIENT_HELLO} bytes")
    return size


def _server_name(message: bytes) -> str | None:
    hello = _Reader(message)
    hello.take(2 + 32)  # legacy_version, random
    if len(hello.vector(1)) > 32:  # legacy_session_id
        raise _malformed("session id longer than 32 bytes")
    suites = hello.vector(2)
    if not suites or len(suites) % 2:
        raise _malformed("bad cipher suite list")
    if not hello.vector(1):
        raise _malformed("no compression methods")
    if hello.done():
        return None  # no extensions at all: allowed before TLS 1.3, and then no SNI either
    extensions = _Reader(hello.vector(2))
    hello.end()
    return _server_name_extension(extensions)


def _server_name_extension(extensions: "_Reader") -> str | None:
    seen: set[int] = set()
    name = None
    while not extensions.done():
        kind, data = extensions.number(2), extensions.vector(2)
        if kind in seen:  # RFC 8446 §4.2: never twice; two names would be read either way
            raise _malformed(f"extension {kind} repeated")
        seen.add(kind)
        if kind == _SERVER_NAME:
            name = _host_name(data)
    return name


def _host_name(extension: bytes) -> str:
    outer = _Reader(extension)
    names = _Reader(outer.vector(2))
    outer.end()
    kind, host = names.number(1), names.vector(2)
    names.end()  # exactly one name: RFC 6066 allows one per type, and host_name is the only type
    if kind != _HOST_NAME:
        raise _malformed("server name of an unknown type")
    if not host or not all(0x21 <= byte <= 0x7E for byte in host):
        raise _malformed("server name is not printable ASCII")
    return normalize_server_name(host.decode("ascii"))


class _Reader:
    """Bounds-checked reads from one enclosing structure."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, size: int) -> bytes:
        if size > len(self.data) - self.pos:
            raise _malformed("truncated")
        chunk = self.data[self.pos : self.pos + size]
        self.pos += size
        return chunk

    def number(self, size: int) -> int:
        return int.from_bytes(self.take(size), "big")

    def vector(self, length_size: int) -> bytes:
        return self.take(self.number(length_size))

    def done(self) -> bool:
        return self.pos == len(self.data)

    def end(self) -> None:
        if not self.done():
            raise _malformed("trailing bytes")


def _malformed(detail: str) -> EgressDenied:
    return EgressDenied("bad_client_hello", detail)
