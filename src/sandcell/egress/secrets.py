"""Secret header rules and the redaction of secret values.

A job names secrets and the hosts they are for; the trusted side looks the values up and builds
`SecretRule`s. The value lives only in the worker's memory: it has no repr, it is validated here
so that h11 can never echo it in a protocol error, and `Redactor` scrubs it from any text.
"""

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sandcell.egress.errors import EgressConfigError
from sandcell.egress.hosts import normalize_configured_host, parse_host

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 field-name
_FIELD_VALUE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")  # visible ASCII, no CR/LF
_PLACEHOLDER = "{value}"
# Never let a secret replace what makes the proxy itself work or what names the upstream.
_RESERVED_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer"}
)


@dataclass(frozen=True)
class SecretRule:
    """Add `header: format.replace("{value}", value)` to requests for exactly these hosts."""

    name: str
    hosts: frozenset[str]
    header: str
    format: str
    value: str = field(repr=False)

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any], value: str, index: int = 0) -> "SecretRule":
        """`spec` is the job's `{"name", "hosts", "header", "format"}`; `value` the trusted one."""
        where = f"secrets[{index}]"
        name, header = str(spec.get("name", "")), str(spec.get("header", "Authorization"))
        fmt = str(spec.get("format", _PLACEHOLDER))
        if not name:
            raise EgressConfigError(f"{where}.name", "a secret needs a name")
        if not _TOKEN.fullmatch(header) or header.lower() in _RESERVED_HEADERS:
            raise EgressConfigError(f"{where}.header", "not a header this proxy may set")
        if fmt.count(_PLACEHOLDER) != 1:
            raise EgressConfigError(f"{where}.format", "must contain {value} exactly once")
        hosts = _exact_hosts(spec.get("hosts", []), f"{where}.hosts")
        # str.format would let a caller-written format reach attributes of the value; replace
        # cannot. Validate the final header value so no control byte reaches the wire.
        if not _FIELD_VALUE.fullmatch(fmt.replace(_PLACEHOLDER, value)):
            raise EgressConfigError(f"{where}.format", f"secret {name!r} is not a valid header")
        return cls(name, hosts, header.lower(), fmt, value)

    def header_value(self) -> bytes:
        return self.format.replace(_PLACEHOLDER, self.value).encode("ascii")


def _exact_hosts(hosts: Iterable[Any], field: str) -> frozenset[str]:
    names = []
    for index, host in enumerate(hosts):
        text = str(host)
        if text.startswith("*"):
            raise EgressConfigError(f"{field}[{index}]", "secrets bind to exact hosts only")
        name = normalize_configured_host(text, f"{field}[{index}]")
        if parse_host(name).ip is not None:
            raise EgressConfigError(f"{field}[{index}]", "secrets bind to names, not addresses")
        names.append(name)
    if not names:
        raise EgressConfigError(field, "a secret must name at least one host")
    return frozenset(names)


class Redactor:
    """Replaces every known secret value in a text with `[redacted:<name>]`."""

    def __init__(self, secrets: Mapping[str, str]) -> None:
        # Longest first, so a value that contains another is replaced whole.
        self._pairs = sorted(
            ((value, f"[redacted:{name}]") for name, value in secrets.items() if value),
            key=lambda pair: len(pair[0]),
            reverse=True,
        )

    @classmethod
    def for_rules(cls, rules: Iterable[SecretRule]) -> "Redactor":
        return cls({rule.name: rule.value for rule in rules})

    def redact(self, text: str) -> str:
        for value, marker in self._pairs:
            text = text.replace(value, marker)
        return text

    def __bool__(self) -> bool:
        return bool(self._pairs)
