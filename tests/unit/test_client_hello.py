"""The ClientHello reader a plain CONNECT tunnel uses to check the server name (SNI).

Real ClientHellos come from Python's own TLS client (OpenSSL) through memory BIOs; malformed and
ambiguous ones are built by hand, field by field, so each test breaks exactly one thing.
"""

import ipaddress
import ssl

import pytest

from sandcell.egress.client_hello import (
    MAX_CLIENT_HELLO,
    ClientHello,
    ClientHelloReader,
    check_server_name,
)
from sandcell.egress.errors import EgressDenied
from sandcell.egress.hosts import Host


def read_client_hello(data: bytes) -> ClientHello | None:
    return ClientHelloReader().feed(data)


def real_client_hello(server_name: str | None) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname = False  # lets the client send no name at all
    outgoing = ssl.MemoryBIO()
    tls = context.wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def vector(length_size: int, data: bytes) -> bytes:
    return len(data).to_bytes(length_size, "big") + data


def sni_extension(*names: bytes, name_type: int = 0) -> tuple[int, bytes]:
    entries = b"".join(bytes([name_type]) + vector(2, name) for name in names)
    return 0, vector(2, entries)


def crafted(
    extensions: list[tuple[int, bytes]] | None, suites: bytes = b"\x13\x01", trailing: bytes = b""
) -> bytes:
    """One ClientHello in one record; `extensions=None` leaves the extensions block out."""
    body = b"\x03\x03" + bytes(32) + vector(1, b"") + vector(2, suites) + vector(1, b"\x00")
    if extensions is not None:
        body += vector(2, b"".join(k.to_bytes(2, "big") + vector(2, d) for k, d in extensions))
    return record(b"\x01" + vector(3, body + trailing))


def record(fragment: bytes, content_type: int = 0x16) -> bytes:
    return bytes([content_type]) + b"\x03\x01" + vector(2, fragment)


def refragment(data: bytes, size: int) -> bytes:
    """The same handshake bytes in records of at most `size` bytes each."""
    handshake = data[5:]
    return b"".join(record(handshake[i : i + size]) for i in range(0, len(handshake), size))


@pytest.mark.parametrize(
    ("sent", "seen"),
    [
        ("other.test", "other.test"),
        ("Other.TEST", "other.test"),
        ("other.test.", "other.test"),
        ("xn--bcher-kva.example", "xn--bcher-kva.example"),
        (None, None),
        ("127.0.0.3", None),  # RFC 6066: no addresses in SNI, and OpenSSL sends none
    ],
)
def test_real_client_hellos(sent: str | None, seen: str | None) -> None:
    assert read_client_hello(real_client_hello(sent)) == ClientHello(seen)


def test_every_prefix_asks_for_more_and_bytes_after_it_are_ignored() -> None:
    data = real_client_hello("other.test")
    for end in range(len(data)):
        assert read_client_hello(data[:end]) is None
    assert read_client_hello(data + record(b"\x01", content_type=0x14)) == ClientHello("other.test")


def test_fed_one_byte_at_a_time_and_everything_kept_for_the_relay() -> None:
    data = refragment(real_client_hello("other.test"), 50) + b"early data"
    reader = ClientHelloReader()
    results = [reader.feed(data[i : i + 1]) for i in range(len(data))]
    first = next(i for i, result in enumerate(results) if result is not None)
    assert first == len(data) - len(b"early data") - 1
    assert results[first] == ClientHello("other.test")
    assert bytes(reader.data) == data


@pytest.mark.parametrize("size", [1, 3, 100, 2**14])
def test_a_client_hello_split_over_records(size: int) -> None:
    data = refragment(real_client_hello("other.test"), size)
    assert read_client_hello(data) == ClientHello("other.test")
    assert read_client_hello(data[:-1]) is None


def test_no_extensions_means_no_name() -> None:
    assert read_client_hello(crafted(None)) == ClientHello(None)
    assert read_client_hello(crafted([(10, b"\x00\x02\x00\x1d")])) == ClientHello(None)


@pytest.mark.parametrize(
    "data",
    [
        b"GET / HTTP/1.1\r\n",
        b"SSH-2.0-OpenSSH_9.6\r\n",
        b"\x80\x2e\x01\x03\x01",  # SSLv2-compatible ClientHello
        b"\x16\x02",  # handshake content type, then not a 3.x version
        b"\x17\x03\x03\x00\x10",  # application data first
    ],
)
def test_not_tls(data: bytes) -> None:
    with pytest.raises(EgressDenied) as denied:
        read_client_hello(data)
    assert denied.value.reason == "not_tls"


@pytest.mark.parametrize(
    "data",
    [
        record(b"\x02" + vector(3, bytes(40))),  # a ServerHello
        b"\x16\x03\x01\x00\x00",  # empty handshake record
        b"\x16\x03\x01\x40\x01",  # a record over 2^14 bytes
        record(b"\x01\x00") + record(b"\x01", content_type=0x15),  # an alert inside the hello
        record(b"\x01" + (MAX_CLIENT_HELLO).to_bytes(3, "big")),  # announces too much
        crafted([sni_extension(b"a.test"), sni_extension(b"b.test")]),  # SNI twice
        crafted([sni_extension(b"a.test"), (10, b""), (10, b"")]),  # any extension twice
        crafted([sni_extension(b"a.test", b"b.test")]),  # two names in one extension
        crafted([sni_extension(b"a.test", name_type=1)]),  # an unknown name type
        crafted([sni_extension(b"")]),
        crafted([sni_extension(b"a.test\x00.evil.test")]),
        crafted([sni_extension(b"a test")]),
        crafted([sni_extension("bücher.test".encode())]),
        crafted([(0, b"")]),  # an empty server_name extension (only servers send that)
        crafted([(0, vector(2, b"\x00\x00\x05a.te"))]),  # name longer than its extension
        crafted([(0, vector(2, b"\x00" + vector(2, b"a.test")) + b"x")]),  # bytes after the list
        crafted([sni_extension(b"a.test")], trailing=b"x"),  # bytes after the extensions
        crafted([sni_extension(b"a.test")], suites=b"\x13"),  # odd cipher suite list
        crafted(None, suites=b""),
    ],
)
def test_malformed_or_ambiguous_client_hellos_are_refused(data: bytes) -> None:
    with pytest.raises(EgressDenied) as denied:
        read_client_hello(data)
    assert denied.value.reason == "bad_client_hello"


def test_size_is_bounded_even_in_tiny_records() -> None:
    # A length that is allowed, delivered one byte per record: the framing alone hits the bound.
    header = b"\x01" + (MAX_CLIENT_HELLO - 1000).to_bytes(3, "big")
    reader = ClientHelloReader()
    with pytest.raises(EgressDenied, match="bad_client_hello"):
        for byte in header + bytes(MAX_CLIENT_HELLO):
            reader.feed(record(bytes([byte])))
    assert len(reader.data) <= MAX_CLIENT_HELLO + 5
    # a real one fits, even at one byte per record
    assert read_client_hello(refragment(real_client_hello("other.test"), 1)) is not None


@pytest.mark.parametrize(
    ("host", "server_name", "allowed"),
    [
        (Host("other.test"), "other.test", True),
        (Host("other.test"), "evil.test", False),
        (Host("other.test"), "other.test.evil.test", False),
        (Host("other.test"), None, False),  # a name needs SNI
        (Host("127.0.0.3", ipaddress.ip_address("127.0.0.3")), None, True),
        (Host("127.0.0.3", ipaddress.ip_address("127.0.0.3")), "127.0.0.3", True),
        (Host("127.0.0.3", ipaddress.ip_address("127.0.0.3")), "evil.test", False),
        (Host("[::1]", ipaddress.ip_address("::1")), "::1", True),
    ],
)
def test_server_name_must_be_the_connect_host(
    host: Host, server_name: str | None, allowed: bool
) -> None:
    if allowed:
        check_server_name(host, server_name)
    else:
        with pytest.raises(EgressDenied, match="sni_mismatch"):
            check_server_name(host, server_name)
