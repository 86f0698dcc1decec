"""Hosts, authorities and absolute URLs, parsed strictly.

One rule set for what the sandbox sends and for what the operator configures, so the allowlist
and the request are always compared in the same normal form:

- lowercase ASCII; configured names may be Unicode and are converted to IDNA A-labels (UTS 46),
  while names on the wire must already be A-labels (that is what clients send);
- a trailing dot is refused everywhere rather than stripped: `api.example.com.` is a distinct DNS
  name that could resolve elsewhere and it slips past naive suffix checks;
- the only IP literals are canonical dotted-quad IPv4 and bracketed IPv6; anything a URL parser or
  `inet_aton` would read as an IPv4 address (`2130706433`, `0x7f.1`, `0177.0.0.1`, `127.1`) is
  refused, as is every IPv4-mapped or IPv4-compatible IPv6 literal and every zone id;
- no userinfo, no backslashes, no fragments, no percent-encoding in hosts.
"""

import ipaddress
import re
from dataclasses import dataclass

import idna

from sandcell.egress.errors import EgressConfigError, EgressDenied

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_DOTTED_QUAD = re.compile(rf"{_OCTET}(?:\.{_OCTET}){{3}}")
# WHATWG URL parsing treats a host whose last label is numeric as IPv4; so do we, and refuse it.
_NUMERIC_LABEL = re.compile(r"0x[0-9a-f]*|[0-9]+")
_PORT = re.compile(r"[0-9]{1,5}")
_MAX_NAME = 253


@dataclass(frozen=True)
class Host:
    """A validated host: a lowercase A-label name, or an IP literal (then `name` is its text)."""

    name: str
    ip: IPAddress | None = None

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Target:
    host: Host
    port: int
    path: str = "/"  # origin-form path and query, for absolute-form requests


def parse_host(raw: str) -> Host:
    """A host as the sandbox sent it (CONNECT authority, URL or Host header)."""
    if raw.startswith("["):
        return _ipv6_literal(raw)
    host = raw.lower()
    if not host or len(host) > _MAX_NAME:
        raise EgressDenied("bad_host")
    if host.endswith("."):
        raise EgressDenied("trailing_dot")
    if _DOTTED_QUAD.fullmatch(host):
        return Host(host, ipaddress.IPv4Address(host))
    labels = host.split(".")
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        raise EgressDenied("ip_obfuscation")
    if not all(_LABEL.fullmatch(label) for label in labels):
        raise EgressDenied("bad_host")
    if any(label.startswith("xn--") for label in labels):
        _check_a_labels(host)
    return Host(host)


def _ipv6_literal(raw: str) -> Host:
    if not raw.endswith("]") or "%" in raw:
        raise EgressDenied("bad_host")
    try:
        ip = ipaddress.IPv6Address(raw[1:-1])
    except ValueError as exc:
        raise EgressDenied("bad_host") from exc
    if ip.ipv4_mapped is not None or is_ipv4_compatible(ip):
        raise EgressDenied("mapped_ipv6")
    return Host(f"[{ip.compressed}]", ip)


def is_ipv4_compatible(ip: ipaddress.IPv6Address) -> bool:
    """`::a.b.c.d`: deprecated, still routed as IPv4 by some stacks. `::` and `::1` are not."""
    return int(ip) >> 32 == 0 and int(ip) > 1


def _check_a_labels(host: str) -> None:
    # Punycode that does not round-trip is a second spelling of some other name: refuse it.
    try:
        if idna.encode(idna.decode(host)).decode("ascii") != host:
            raise EgressDenied("bad_host")
    except idna.IDNAError as exc:
        raise EgressDenied("bad_host") from exc


def parse_authority(raw: str, default_port: int | None) -> Target:
    """`host[:port]` (CONNECT target or Host header); `default_port=None` requires a port."""
    if "@" in raw:
        raise EgressDenied("userinfo")
    if "\\" in raw or "%" in raw:
        raise EgressDenied("bad_host")
    if raw.startswith("["):
        end = raw.find("]") + 1
        host_text, rest = raw[:end], raw[end:]
        if end == 0 or (rest and not rest.startswith(":")):
            raise EgressDenied("bad_host")
        port_text = rest[1:] if rest else None
    else:
        host_text, colon, port_text_or_empty = raw.partition(":")
        port_text = port_text_or_empty if colon else None
    return Target(parse_host(host_text), _parse_port(port_text, default_port))


def _parse_port(text: str | None, default: int | None) -> int:
    if text is None:
        if default is None:
            raise EgressDenied("bad_target", "a port is required")
        return default
    if not _PORT.fullmatch(text) or not 0 < int(text) < 65536:
        raise EgressDenied("bad_target", "invalid port")
    return int(text)


def parse_absolute_url(raw: str, scheme: str) -> Target:
    """An absolute-form request target `scheme://authority/path?query` (RFC 9112 3.2.2)."""
    prefix = f"{scheme}://"
    if raw[: len(prefix)].lower() != prefix:
        raise EgressDenied("bad_target", f"expected a {scheme}:// absolute URL")
    rest = raw[len(prefix) :]
    if "#" in rest:
        raise EgressDenied("bad_target", "fragment in request target")
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, path = rest[:cut], rest[cut:]
    target = parse_authority(authority, 443 if scheme == "https" else 80)
    if not path.startswith("/"):
        path = "/" + path
    return Target(target.host, target.port, path)


def normalize_configured_host(text: str, field: str) -> str:
    """An operator- or caller-configured host: Unicode allowed, returned as the wire form."""
    if text != text.strip() or not text:
        raise EgressConfigError(field, "must be a non-empty host without spaces")
    if text.endswith("."):
        raise EgressConfigError(field, "trailing dots are not accepted; write the name without it")
    candidate = text if text.startswith("[") or text.isascii() else _to_a_labels(text, field)
    try:
        return parse_host(candidate).name
    except EgressDenied as exc:
        raise EgressConfigError(field, f"not a valid host ({exc.reason})") from exc


def _to_a_labels(text: str, field: str) -> str:
    try:
        return idna.encode(text, uts46=True, transitional=False).decode("ascii")
    except idna.IDNAError as exc:
        raise EgressConfigError(field, "not a valid internationalised domain name") from exc
