"""Everything one job's proxy needs, checked once when it is built."""

from collections.abc import Sequence
from dataclasses import dataclass, field

from sandcell.egress.errors import EgressConfigError
from sandcell.egress.hosts import Host
from sandcell.egress.policy import EgressPolicy
from sandcell.egress.secrets import SecretRule


@dataclass(frozen=True)
class ProxyLimits:
    max_connections: int = 64  # concurrent sandbox connections; more are refused with 503
    max_header_bytes: int = 32 * 1024  # request or response head, each
    header_timeout_s: float = 10.0  # to receive a full request head (slow-loris)
    idle_timeout_s: float = 60.0  # nothing moved either way on a connection
    connect_timeout_s: float = 10.0  # DNS, TCP connect and upstream TLS handshake, each
    tls_handshake_timeout_s: float = 10.0  # the sandbox's handshake with the proxy


@dataclass(frozen=True)
class EgressConfig:
    policy: EgressPolicy
    secrets: tuple[SecretRule, ...] = ()
    limits: ProxyLimits = field(default_factory=ProxyLimits)
    upstream_ca_file: str | None = None  # None: the system trust store
    listen_host: str = "127.0.0.1"  # in production: the worker's end of the job's veth pair
    listen_port: int = 0
    ca_label: str = "job"  # goes into the per-job CA's common name, e.g. the job id

    def __post_init__(self) -> None:
        seen: set[tuple[str, str]] = set()
        for index, rule in enumerate(self.secrets):
            for host in rule.hosts:
                if not self.policy.allows_host(Host(host)):
                    raise EgressConfigError(f"secrets[{index}].hosts", f"{host} is not allowed")
                if (host, rule.header) in seen:
                    raise EgressConfigError(f"secrets[{index}].header", "set twice for a host")
                seen.add((host, rule.header))

    def rules_for(self, host: str) -> Sequence[SecretRule]:
        """Rules whose host list names exactly `host` (never a wildcard, never a parent)."""
        return [rule for rule in self.secrets if host in rule.hosts]

    @property
    def intercepted_hosts(self) -> frozenset[str]:
        return frozenset(host for rule in self.secrets for host in rule.hosts)
