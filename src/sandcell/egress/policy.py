"""What one job may reach: the caller's allowlist within the operator's address rules.

Allowlist entries are exact hosts (`api.example.com`), wildcards (`*.corp.example`: one or more
labels under `corp.example`, never `corp.example` itself, never `evilcorp.example`) and IP
literals (`203.0.113.7`, `[2001:db8::1]`). An IP literal is reachable only when it is listed
itself; no wildcard ever matches one. Entries are normalised by `hosts.normalize_configured_host`,
so they compare equal to what clients send.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field

from sandcell.egress.addresses import Network, blocked_category, parse_networks
from sandcell.egress.errors import EgressConfigError, EgressDenied
from sandcell.egress.hosts import Host, IPAddress, normalize_configured_host

DEFAULT_PORTS = frozenset({80, 443})


@dataclass(frozen=True)
class EgressPolicy:
    """Use `EgressPolicy.build`; the fields hold normalised values."""

    exact: frozenset[str] = frozenset()
    suffixes: tuple[str, ...] = ()  # ".corp.example" for "*.corp.example"
    allow_private: bool = False
    allowed_networks: tuple[Network, ...] = ()
    ports: frozenset[int] | None = DEFAULT_PORTS  # None: any port
    patterns: tuple[str, ...] = field(default=(), compare=False)  # as configured, for display

    @classmethod
    def build(
        cls,
        allow: Iterable[str],
        *,
        allow_private: bool = False,
        allowed_networks: Iterable[str] = (),
        ports: Iterable[int] | None = DEFAULT_PORTS,
    ) -> "EgressPolicy":
        """`allow` comes from the job; the keyword settings are the operator's."""
        patterns = tuple(allow)
        exact, suffixes = set(), []
        for index, pattern in enumerate(patterns):
            name = f"network.allow[{index}]"
            if pattern.startswith("*."):
                suffixes.append("." + _wildcard_base(pattern[2:], name))
            else:
                exact.add(normalize_configured_host(pattern, name))
        return cls(
            exact=frozenset(exact),
            suffixes=tuple(suffixes),
            allow_private=allow_private,
            allowed_networks=parse_networks(tuple(allowed_networks), "allowed_networks"),
            ports=None if ports is None else _ports(ports),
            patterns=patterns,
        )

    def allows_host(self, host: Host) -> bool:
        if host.ip is not None:
            return host.name in self.exact
        return host.name in self.exact or host.name.endswith(self.suffixes)

    def check_target(self, host: Host, port: int) -> None:
        """Raise EgressDenied unless the allowlist and the port rules admit host:port."""
        if self.ports is not None and port not in self.ports:
            raise EgressDenied("port_not_allowed", f"{host}:{port}")
        if not self.allows_host(host):
            raise EgressDenied("ip_literal" if host.ip else "not_allowed", str(host))

    def check_address(self, ip: IPAddress) -> None:
        """Raise EgressDenied unless the proxy may open a connection to `ip`."""
        category = blocked_category(ip, self.allow_private, self.allowed_networks)
        if category is not None:
            raise EgressDenied("blocked_address", f"{ip} is {category}")


def _wildcard_base(text: str, field: str) -> str:
    base = normalize_configured_host(text, field)
    if base.startswith("[") or base.replace(".", "").isdigit():
        raise EgressConfigError(field, "a wildcard must cover a domain name, not an address")
    if "." not in base:
        raise EgressConfigError(field, "a wildcard needs at least two labels: *.example.com")
    return base


def _ports(ports: Iterable[int]) -> frozenset[int]:
    chosen = frozenset(ports)
    if not all(0 < p < 65536 for p in chosen):
        raise EgressConfigError("ports", "ports must be between 1 and 65535")
    return chosen
