"""Which resolved addresses the proxy may connect to.

An address is reachable when it is globally routable, or when the operator named a network that
contains it. `allow_private` is a shorthand for the private ranges an internal API usually lives
in (RFC 1918, CGNAT, IPv6 ULA); loopback, link-local (which holds the cloud metadata endpoint
169.254.169.254) and the rest must be named explicitly in `allowed_networks`. Unspecified,
multicast and broadcast addresses, and IPv6 forms that embed an IPv4 address the host stack would
route as IPv4 (mapped, compatible), are never reachable.
"""

import ipaddress

from sandcell.egress.errors import EgressConfigError
from sandcell.egress.hosts import IPAddress, is_ipv4_compatible

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

PRIVATE_NETWORKS: tuple[Network, ...] = tuple(
    ipaddress.ip_network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
)
# Not global, yet `is_global` says otherwise on Python 3.11.
_NOT_GLOBAL_V6 = tuple(ipaddress.IPv6Network(n) for n in ("fec0::/10", "64:ff9b:1::/48"))
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_BROADCAST = ipaddress.IPv4Address("255.255.255.255")


def blocked_category(
    ip: IPAddress, allow_private: bool, allowed_networks: tuple[Network, ...]
) -> str | None:
    """None when the proxy may connect to `ip`, else a short category for the audit reason."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None or is_ipv4_compatible(ip):
            return "mapped_ipv6"
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            return blocked_category(embedded, allow_private, allowed_networks)
    if ip.is_unspecified or ip.is_multicast or ip == _BROADCAST:
        return "unroutable"
    if any(ip in net for net in allowed_networks):
        return None
    if allow_private and any(ip in net for net in PRIVATE_NETWORKS):
        return None
    if not ip.is_global or any(ip in net for net in _NOT_GLOBAL_V6):
        return _non_global_category(ip)
    return None


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address a 6to4 or NAT64 address reaches: it must pass the same check."""
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _non_global_category(ip: IPAddress) -> str:
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link_local"
    if any(ip in net for net in PRIVATE_NETWORKS):
        return "private"
    return "reserved"


def parse_networks(texts: list[str] | tuple[str, ...], field: str) -> tuple[Network, ...]:
    networks = []
    for index, text in enumerate(texts):
        try:
            networks.append(ipaddress.ip_network(text, strict=True))
        except ValueError as exc:
            raise EgressConfigError(f"{field}[{index}]", "not a network in CIDR form") from exc
    return tuple(networks)
