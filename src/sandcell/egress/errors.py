"""Why the egress proxy refused something.

SandcellError
├── EgressDenied        one connection attempt refused; `reason` goes on the audit event
└── InvalidRequest
    └── EgressConfigError  a policy or secret rule that can never be applied (names the field)

Messages name hosts, ports and reason codes only — never a header value, so no secret can ride
out on an exception.
"""

from sandcell.domain.errors import FieldError, InvalidRequest, SandcellError

# The HTTP status the sandbox sees for each reason. One table, so codes stay consistent.
_STATUS: dict[str, int] = {
    "not_allowed": 403,
    "port_not_allowed": 403,
    "ip_literal": 403,
    "blocked_address": 403,
    "bad_request": 400,
    "bad_target": 400,
    "bad_host": 400,
    "userinfo": 400,
    "trailing_dot": 400,
    "ip_obfuscation": 400,
    "mapped_ipv6": 400,
    "host_mismatch": 421,
    "header_too_large": 431,
    "header_timeout": 408,
    "connection_limit": 503,
    "dns_failed": 502,
    "upstream_unreachable": 502,
    "upstream_tls": 502,
    "upstream_protocol": 502,
    "upstream_timeout": 504,
}


class EgressDenied(SandcellError):
    """The egress proxy refused this connection."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        super().__init__(f"{reason}: {detail}" if detail else reason)

    @property
    def status(self) -> int:
        return _STATUS.get(self.reason, 403)


class EgressConfigError(InvalidRequest):
    """The network policy or a secret rule is invalid."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}", [FieldError(field, message)])
